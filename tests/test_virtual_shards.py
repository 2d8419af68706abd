"""``--train.virtual-shards V``: training that is the same, bit for bit, on every device count that
divides V (simulated host devices here), resumed across device counts, and re-executed on one device.

The resume across device counts runs at XLA's default level, as users run (``default_level``: CI runs
it with BIRDJEPA_TEST_XLA_DEFAULT=1): at the suite's -O0 a process with 4 devices and one with 1
computed the same bits even while at the default level they did not (the CPU thread pool followed the
device count)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import tyro

from birdjepa import exit_codes
from birdjepa.cli import main
from birdjepa.config import PretrainConfig
from birdjepa.divergence import trace_file
from birdjepa.pretrain.loop import pretrain
from birdjepa.pretrain.trainer import check_device_options
from birdjepa.resume.compare import compare_runs
from birdjepa.rundir.checkpoint import Checkpointer
from birdjepa.rundir.metrics_log import metrics_by_step
from birdjepa.validation import OptionError, check

HERE = Path(__file__).parent

#: Every stochastic part of the LeJEPA step on: dropout, drop-path, augmentation, two local crops, the
#: masked-span predictor; every term (the patch read-out too); and an update every second step.
LEJEPA = ["--model.dropout", "0.1", "--model.drop-path", "0.1", "--augment.gain-db", "3",
          "--objective.lejepa.local-views", "2", "--objective.lejepa.span-weight", "0.5",
          "--model.predictor-depth", "1", "--objective.lejepa.patch-weight", "0.5",
          "--optim.grad-accum", "2"]  # fmt: skip


def devices_env(n: int) -> dict[str, str]:
    flags = os.environ.get("XLA_FLAGS", "")
    return {**os.environ, "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={n}".strip()}


def steps_on(counts: list[int], args: list[str], out: Path) -> dict[int, dict[str, np.ndarray]]:
    """Two steps on each device count (`virtual_shard_steps.py`, one process with 4 devices)."""
    cmd = [sys.executable, str(HERE / "virtual_shard_steps.py"), str(out), ",".join(map(str, counts)), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=devices_env(max(counts)))
    assert done.returncode == 0, done.stderr[-3000:]
    return {d: dict(np.load(out / f"{d}.npz")) for d in counts}


@pytest.mark.slow  # 3 device counts x 5 configurations, each device compiling its own executables
@pytest.mark.parametrize(
    "config",
    [
        LEJEPA,
        ["--objective.kind", "supervised", "--optim.grad-accum", "2"],
        ["--model.dtype", "bfloat16"],
        [
            "--objective.kind",
            "mae",
            "--objective.mae.masking",
            "time",
            "--model.dropout",
            "0.1",
            "--optim.grad-accum",
            "2",
        ],
        [
            "--model.rope",
            "--model.qk-norm",
            "--model.swiglu",
            "--model.layer-scale",
            "0.1",
            "--model.registers",
            "2",
        ],
    ],  # fmt: skip
    ids=["lejepa-local-span-accum", "supervised-accum", "bfloat16", "mae-accum", "encoder-options"],
)
def test_one_two_and_four_devices_compute_the_same_bits(config: list[str], tmp_path: Path) -> None:
    args = ["--model.preset", "tiny", "--data.batch-size", "8", "--train.virtual-shards", "4", *config]
    runs = steps_on([1, 2, 4], args, tmp_path)
    names = sorted(runs[1])
    assert any("train/loss" in n for n in names) and any("['encoder']" in n for n in names)
    for d in (2, 4):
        assert sorted(runs[d]) == names
        differing = [n for n in names if not np.array_equal(runs[1][n], runs[d][n], equal_nan=True)]
        assert differing == [], (d, differing[:5])


def run_flags(demo_dir: Path, runs: Path, run: str, *extra: str) -> list[str]:
    return [
        "--run", run, "--log.runs-dir", str(runs), "--steps", "6", "--eval-every", "0", "--ckpt-every", "2",
        "--ckpt-keep", "10",
        "--data.batch-size", "8", "--data.train", str(demo_dir / "train"), "--data.eval",
        str(demo_dir / "eval"), "--train.virtual-shards", "8", *extra,
    ]  # fmt: skip


def birdjepa(*args: str, devices: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "birdjepa.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=devices_env(devices))


@pytest.mark.slow  # five processes on 4, 1 and 2 devices, compiling at the default level
@pytest.mark.default_level
def test_a_run_trained_on_four_devices_resumed_on_one_and_finished_on_two_equals_its_straight_run(
    demo_dir: Path, tmp_path: Path
) -> None:
    """At XLA's default level: 12 steps on 4 devices, straight; the same run stopped at step 6 (mid
    accumulation, between the checkpoints every 5 steps), resumed on 1 device, stopped at 8, finished on
    2. `compare` gives 0.0, and step 9 of the 4-device run, re-executed on 1 device, equals what the run
    logged and checkpointed. Dropout, augmentation, accumulation and the patch term on (the local crops
    and masked spans, which triple the compiling, are the one-process test's)."""
    stochastic = ("--model.dropout", "0.1", "--augment.gain-db", "3", "--optim.grad-accum", "2",
                  "--objective.lejepa.patch-weight", "0.5")  # fmt: skip
    knn = ("--eval-every", "4", "--no-eval-linear")  # the frozen-encoder kNN, logged every 4 steps
    length = ("--steps", "12", "--ckpt-every", "5")

    def segment(run: str, devices: int, *extra: str) -> str:
        args = run_flags(demo_dir, tmp_path, run, *stochastic, *knn, *length, *extra)
        done = birdjepa("pretrain", *args, devices=devices)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert f"devices={devices}" in done.stdout
        # The resume checks compare the next loss with == across device counts: nothing to allow for.
        assert "rtol" not in done.stdout and "ok=False" not in done.stdout, done.stdout
        return done.stdout

    segment("straight", 4)
    for devices, stop in ((4, "6"), (1, "8"), (2, None)):
        segment("moved", devices, *(["--stop-at-step", stop] if stop else []))
    assert [d.name for d in compare_runs(tmp_path / "straight", tmp_path / "moved") if d.max_abs] == []
    steps = metrics_by_step(tmp_path / "moved")
    assert sorted(steps) == list(range(12)) and "eval/knn_acc" in steps[11], steps[11]
    assert steps[6]["train/accum_progress"] == 1.0  # stopped with half an update
    with Checkpointer(tmp_path / "straight", keep=None, async_save=False) as a:
        with Checkpointer(tmp_path / "moved", keep=None, async_save=False) as b:
            assert a.all_steps()[-1] == b.all_steps()[-1] == 11  # the last step's
            # every parameter and optimizer leaf
            assert a.read_meta(11)["hashes"] == b.read_meta(11)["hashes"]

    # Step 9 of the 4-device run, replayed from its checkpoint 4 and re-executed on one device: what the
    # run logged and checkpointed.
    out = tmp_path / "t9.npz"
    done = birdjepa("trace", str(tmp_path / "straight"), "--step", "9", "--out", str(out), devices=1)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "outputs equal its logged metrics and its checkpoint" in done.stdout, done.stdout
    t = trace_file.read(out)
    assert t.manifest["devices"] == 1 and t.manifest["restored_from"] == 4
    assert t.manifest["matches_run"] == {"logged_metrics_equal": True, "checkpoint_equal": True}


@pytest.mark.slow  # two segments compiling the virtual-shard step (about 40 s)
def test_changing_the_virtual_shards_between_segments_is_refused_in_one_line(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    def segment(shards: str, *extra: str) -> int:
        args = run_flags(demo_dir, tmp_path, "v", "--steps", "3", *extra)
        args[args.index("--train.virtual-shards") + 1] = shards
        return pretrain(tyro.cli(PretrainConfig, args=args))

    assert segment("2", "--stop-at-step", "1") == 0
    capsys.readouterr()
    assert segment("4") == exit_codes.RESUME_CHECK
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("RESUME_CHECK name=config")]
    assert "ok=False" in line and "train.virtual_shards:2->4" in line, line


def test_virtual_shards_that_cannot_cut_the_batch_are_refused_before_the_run() -> None:
    def refused(*args: str) -> str:
        with pytest.raises(OptionError) as e:
            check(tyro.cli(PretrainConfig, args=list(args)), data=False)
        return str(e.value)

    assert refused("--data.batch-size", "8", "--train.virtual-shards", "3").startswith(
        "--train.virtual-shards 3: must divide --data.batch-size (8)"
    )
    assert "proj-norm layer" in refused("--train.virtual-shards", "2", "--model.proj-norm", "batch")
    assert refused("--train.virtual-shards", "-1").startswith("--train.virtual-shards -1: must be >= 0")


def test_a_device_count_that_does_not_divide_the_virtual_shards_and_several_processes_are_refused(
    demo_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = birdjepa("pretrain", *run_flags(demo_dir, tmp_path, "r"), "--data.batch-size", "24", devices=3)
    assert done.returncode == exit_codes.USAGE
    assert "--train.virtual-shards 8: the 3 devices must divide it" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "r").exists()  # refused before a run directory, a lease or a checkpointer
    plain = run_flags(demo_dir, tmp_path, "b")
    plain[plain.index("--train.virtual-shards") + 1] = "0"  # the batch of 8 cut over 3 devices
    monkeypatch.setattr(jax, "device_count", lambda: 3)  # the same check, in this process
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["pretrain", *plain])
    assert e.value.code == exit_codes.USAGE and not (tmp_path / "b").exists()
    assert "--data.batch-size 8: must divide over the 3 devices" in capfd.readouterr().err
    # Two processes (a group over gloo, as `birdjepa sweep --local --slurm.ntasks 2` forms it): refused
    # before anything compiles, since the step moves each shard's results within one process (by the
    # check the subprocess above met first; a group of two processes costs ~4 s to start).
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(OptionError, match="runs in one process, not 2"):
        check_device_options(tyro.cli(PretrainConfig, args=run_flags(demo_dir, tmp_path, "p")))
