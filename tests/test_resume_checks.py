"""Resume validation: every injected fault is named by its check on the first resumed step, clean resumes
(at many steps, with harmless option changes) raise no flag, and the policy options do what they say."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from birdjepa import exit_codes
from birdjepa.config import DataConfig, LogConfig, OptimConfig, PretrainConfig
from birdjepa.pretrain.loop import pretrain
from birdjepa.resume import checks as resume_check
from birdjepa.resume.checks import CHECKS, NextStep, check_resume, config_diff
from birdjepa.resume.compare import compare_runs
from birdjepa.resume.restored import Restored
from birdjepa.rundir.checkpoint import Checkpointer
from birdjepa.rundir.metrics_log import metrics_by_step, read_metrics
from birdjepa.train.state import TrainState
from birdjepa.verify.catalogue import EXPECTED_CHECK, FAULTS
from birdjepa.verify.fault_matrix import CLEAN, Row, not_as_expected, resume_with, run_matrix
from birdjepa.verify.faults import inject

RESUME_AT = 4  # after step 4 of a 2-batch accumulation: one micro-batch into update 2


def config(demo_dir: Path, runs: Path, run: str, **kw: object) -> PretrainConfig:
    # --data.shuffle-initial 4: the 48-clip shuffle buffer starts drawing at 4 clips and grows by one per
    # draw, so every checkpoint of these 10 steps of 8 clips up to step 4 holds a buffer still growing.
    data = DataConfig(
        train=str(demo_dir / "train"), eval=str(demo_dir / "eval"), batch_size=8, shuffle_initial=4
    )
    return PretrainConfig(
        run=run, steps=10, eval_every=0, ckpt_every=4, monitor_interval=1, prng="checkpointed",
        data=data, optim=OptimConfig(grad_accum=2), log=LogConfig(runs_dir=runs), **kw,
    )  # fmt: skip


def events(run_dir: Path, kind: str) -> list[dict]:
    return [x for x in read_metrics(run_dir) if x.get("event") == kind]


# ------------------------------------------------------------------------------------------- unit level
def test_config_diff_splits_harmless_from_breaking() -> None:
    a = {
        "seed": 0,
        "log_every": 1,
        "data": {"batch_size": 8, "n_workers": 2, "train": "/a"},
        "log": {"wandb": "x"},
    }
    b = {
        "seed": 0,
        "log_every": 5,
        "data": {"batch_size": 16, "n_workers": 1, "train": "/b", "audio_root": "/local"},
        "log": {"wandb": "y"},
    }
    harmless, breaking = config_diff(a, b)
    assert breaking == ["data.batch_size:8->16"]
    assert harmless == ["data.audio_root:<absent>->/local", "data.n_workers:2->1", "data.train:/a->/b",
                        "log.wandb:x->y", "log_every:1->5"]  # fmt: skip
    assert config_diff(a, a) == ([], [])
    assert config_diff(a, {**a, "optim": {"lr": 1.0}})[1] == ["optim.lr:<absent>->1.0"]
    # An option one side lacks is harmless only where the other holds its default: a default of None
    # matched the lacking side's None, and a --debug.plant given at a resume passed as harmless.
    assert config_diff(a, {**a, "debug": {"plant": "x"}}) == ([], ["debug.plant:<absent>->x"])
    assert config_diff(a, {**a, "debug": {"plant": None}}) == (["debug.plant:<absent>->None"], [])
    # Values as they are: every space was taken out ("/data/birdsong", a path that does not exist).
    spaced = config_diff({"data": {"eval": "/bird song"}}, {"data": {"eval": "/bird songs"}})
    assert spaced == (["data.eval:/bird song->/bird songs"], [])
    # A preset's own value given at a resume (--model.depth 2 on a tiny run) was refused as None->2.
    tiny = {"model": {"preset": "tiny", "depth": None, "dim": None}}
    assert config_diff(tiny, {"model": {"preset": "tiny", "depth": 2, "dim": None}}) == ([], [])
    deeper = {"model": {"preset": "tiny", "depth": 3, "dim": None}}
    assert config_diff(tiny, deeper) == ([], ["model.depth:2->3"])


def test_batch_fingerprint_sees_every_array_bit() -> None:
    batch = {"index": np.arange(4), "spectrogram": np.zeros((4, 3), np.float32)}
    fp = resume_check.batch_fingerprint(batch)
    assert fp == resume_check.batch_fingerprint({k: v.copy() for k, v in batch.items()})
    flipped = batch["spectrogram"].copy()
    flipped.view(np.uint32)[2, 1] ^= 1  # one ulp in one value
    assert resume_check.batch_fingerprint({**batch, "spectrogram": flipped}) != fp
    assert resume_check.batch_fingerprint({**batch, "index": batch["index"][::-1].copy()}) != fp


def _meta(rec: NextStep) -> dict:
    cfg = {"seed": 0, "data": {"batch_size": 8}}
    return {
        "next_step": rec.to_json(),
        "config": cfg,
        "dataset_fingerprint": "d",
        "norms": {"param_norm": 2.0, "param_norm/encoder": 1.5, "opt_state_norm": 3.0},
    }


def _check(meta: dict, now: NextStep, **kw: object) -> dict[str, resume_check.CheckResult]:
    args: dict = {
        "config": meta["config"], "dataset": "d", "loader_error": None, "norms": meta["norms"],
        "opt_state_spec": [("a", (2,), "float32")], "expected_opt_state_spec": [("a", (2,), "float32")],
        "grad_accum": 2, "allow_config_change": False,
    }  # fmt: skip
    args.update(kw)
    return {r.name: r for r in check_resume(meta, now, **args)}


def test_check_resume_is_exact_and_names_each_difference() -> None:
    rec = NextStep(step=5, batch="b", key=[1, 2], update=2, lr=0.5, accumulation=1, loss=1.25, n_devices=1)
    meta = _meta(rec)
    assert all(r.ok for r in _check(meta, rec).values())
    assert list(_check(meta, rec)) == list(CHECKS)
    # One ulp of loss, a norm of one component, a leaf dtype: each fails exactly its own check.
    nudged = dataclasses.replace(rec, loss=float(np.nextafter(1.25, 2.0)))
    assert [n for n, r in _check(meta, nudged).items() if not r.ok] == ["next_loss"]
    norms = {**meta["norms"], "param_norm/encoder": 1.5000000000000002}
    res = _check(meta, rec, norms=norms)
    assert [n for n, r in res.items() if not r.ok] == ["param_norms"]
    assert res["param_norms"].line() == (
        "RESUME_CHECK name=param_norms ok=False expected=param_norm/encoder=1.5 "
        "got=param_norm/encoder=1.5000000000000002"
    )
    res = _check(meta, rec, opt_state_spec=[("a", (2,), "float16")])
    assert [n for n, r in res.items() if not r.ok] == ["opt_state_structure"]
    # The LR check wants the update the step belongs to, not only an LR that happens to match.
    res = _check(meta, dataclasses.replace(rec, update=3))
    assert not res["lr"].ok and res["lr"].expected == "update=2,lr=0.5" and res["lr"].got == "update=3,lr=0.5"
    res = _check(meta, dataclasses.replace(rec, accumulation=0))
    assert not res["accumulation"].ok and res["accumulation"].expected == "1/2"
    # A refused loader state is quoted (it has spaces) so the line stays parseable.
    res = _check(meta, rec, loader_error="refused: other data")
    assert res["loader_state"].line().endswith('got="refused: other data"')


def test_a_loss_term_or_a_gradient_changed_under_the_totals_rounding_fails_the_gradient_check() -> None:
    # The case one float32 total hid: a term one ulp off with the same total (0.30026564 vs 0.30026561).
    terms = {"loss": 2.5, "sigreg": 0.30026564, "probe_ce": 0.5}
    grads = {"encoder/patch_embed/kernel": "00ab", "probe/kernel": "00cd"}
    rec = NextStep(5, "b", [1], 2, 0.5, 1, 2.8362224, 1, terms, grads)
    res = _check(_meta(rec), rec)
    assert res["next_gradient"].ok and res["next_gradient"].expected == "3_terms,2_gradients"
    nudged = dataclasses.replace(rec, terms={**terms, "sigreg": 0.30026561})
    res = _check(_meta(rec), nudged)
    assert [n for n, r in res.items() if not r.ok] == ["next_gradient"]
    assert res["next_gradient"].line().endswith("expected=sigreg=0.30026564 got=sigreg=0.30026561")
    # A backward pass changed (the forward, so every term, the same): the first parameter it moved.
    backward = dataclasses.replace(rec, gradients={**grads, "probe/kernel": "00ce"})
    assert (
        _check(_meta(rec), backward)["next_gradient"]
        .line()
        .endswith("expected=gradient[probe/kernel]=00cd got=gradient[probe/kernel]=00ce")
    )
    both = dataclasses.replace(backward, terms={**terms, "probe_ce": 0.25})
    assert _check(_meta(rec), both)["next_gradient"].got == "probe_ce=0.25(+1_more)"
    # Where the loss has its tolerance the bits move: not compared, and the line says so.
    res = _check(_meta(rec), dataclasses.replace(nudged, n_devices=4))
    assert res["next_gradient"].ok and res["next_gradient"].expected == "not_compared(devices:1->4)"
    # A checkpoint written before the record: nothing to compare, said.
    old = dataclasses.replace(rec, terms=None, gradients=None)
    meta = _meta(old)
    meta["next_step"] = {k: v for k, v in meta["next_step"].items() if k not in ("terms", "gradients")}
    res = _check(meta, nudged)
    assert res["next_gradient"].ok and res["next_gradient"].expected == "unrecorded"


def test_check_resume_loss_tolerance_only_across_device_counts() -> None:
    rec = NextStep(step=5, batch="b", key=[1], update=2, lr=0.5, accumulation=1, loss=1.0, n_devices=4)
    close = dataclasses.replace(rec, loss=1.0 + 1e-7, n_devices=1)
    res = _check(_meta(rec), close)
    assert res["next_loss"].ok and "rtol=1e-05,devices:4->1" in res["next_loss"].expected
    assert not _check(_meta(rec), dataclasses.replace(close, loss=1.001))["next_loss"].ok
    assert not _check(_meta(rec), dataclasses.replace(close, n_devices=4))["next_loss"].ok
    # bfloat16's loss moves by more there (7.3e-5 from 4 devices to 1): refused, exit 65, not requeued.
    bf16 = {**_meta(rec), "config": {**_meta(rec)["config"], "model": {"dtype": "bfloat16"}}}
    res = _check(bf16, dataclasses.replace(close, loss=1.0 + 7.3e-5), config=bf16["config"])
    assert res["next_loss"].ok and "rtol=0.001,devices:4->1" in res["next_loss"].expected
    assert not _check(bf16, dataclasses.replace(close, loss=1.002), config=bf16["config"])["next_loss"].ok
    # A step that is not finite (--on-nonfinite skip) was refused here, exit 65: nan is not within 1e-5.
    for bad in (math.nan, math.inf):
        res = _check(_meta(dataclasses.replace(rec, loss=bad)), dataclasses.replace(close, loss=bad))
        assert res["next_loss"].ok, bad
    assert not _check(_meta(dataclasses.replace(rec, loss=math.inf)), close)["next_loss"].ok


def test_on_another_kind_of_machine_the_loss_is_compared_to_the_tolerance_and_the_line_says_why() -> None:
    rec = NextStep(step=5, batch="b", key=[1], update=2, lr=0.5, accumulation=1, loss=1.0, n_devices=1)
    close = dataclasses.replace(rec, loss=1.0 + 1e-7)
    assert not _check(_meta(rec), close)["next_loss"].ok  # the same machine: exact
    res = _check(_meta(rec), close, machine_changed=["device", "jaxlib"])
    assert res["next_loss"].ok and res["next_loss"].expected == "1.0(rtol=1e-05,machine:device+jaxlib)"
    far = dataclasses.replace(rec, loss=1.001, n_devices=4)
    res = _check(_meta(rec), far, machine_changed=["device"])
    assert not res["next_loss"].ok and "(rtol=1e-05,devices:1->4,machine:device)" in res["next_loss"].expected


def test_machine_changes_name_what_differs_and_nothing_for_a_checkpoint_that_did_not_record_it() -> None:
    here = {"jax": "0.10.2", "jaxlib": "0.10.2", "device": "AMD EPYC (avx512f)"}
    assert resume_check.machine_changes(here, here) == {}
    assert resume_check.machine_changes(None, here) == {}
    there = {**here, "jaxlib": "0.10.1", "device": "Intel Xeon (avx2)"}
    moved = resume_check.machine_changes(there, here)
    assert moved == {"device": ("Intel Xeon (avx2)", "AMD EPYC (avx512f)"), "jaxlib": ("0.10.1", "0.10.2")}
    assert resume_check.describe_changes(moved) == (
        "device: Intel Xeon (avx2) -> AMD EPYC (avx512f); jaxlib: 0.10.1 -> 0.10.2"
    )
    # A field recorded only now (the lock, since this version) has nothing to compare with; one recorded
    # then and changed is named.
    locked = {**here, "lock": "a" * 12}
    assert resume_check.machine_changes(here, locked) == {}
    assert resume_check.machine_changes({**locked, "lock": "b" * 12}, locked) == {
        "lock": ("b" * 12, "a" * 12)
    }
    # A JAX setting recorded then and no longer (the default PRNG, since the run's keys pin theirs) is
    # not compared; one recorded in both and changed is.
    then = {**here, "jax_config": "jax_threefry_partitionable=True jax_default_prng_impl=threefry2x32"}
    assert resume_check.machine_changes(then, {**here, "jax_config": "jax_threefry_partitionable=True"}) == {}
    moved = resume_check.machine_changes(then, {**here, "jax_config": "jax_threefry_partitionable=False"})
    assert list(moved) == ["jax_config"]


def test_the_xla_flags_recorded_are_those_that_move_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    # A dump of the programs for a look at them made the resume "another machine".
    from birdjepa.train.determinism import xla_flags

    flags = "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4 --xla_cpu_use_thunk_runtime=false"
    monkeypatch.setenv("XLA_FLAGS", f"{flags} --xla_dump_hlo_as_text")
    assert xla_flags() == "--xla_cpu_use_thunk_runtime=false"
    # PJRT_NPROC as XLA reads it: -1 and 0 ran one thread (they were recorded as the core count).
    from birdjepa.cores import schedulable_cpus
    from birdjepa.train.determinism import cpu_threads

    cores = schedulable_cpus()
    for value, threads in (("-1", 1), ("0", 1), ("3", 3), ("abc", cores), ("", cores)):
        monkeypatch.setenv("PJRT_NPROC", value)
        assert cpu_threads(1) == threads, value


LAPACK_PROBE = """
import json, numpy as np, jax.numpy as jnp
from birdjepa.diagnostics.collapse import effective_rank
from birdjepa.train.determinism import machine_kind
z = jnp.asarray(np.random.default_rng(0).normal(size=(256, 64)).astype(np.float32))
print(json.dumps({"rank": np.asarray(effective_rank(z)).tobytes().hex(), "machine": machine_kind()}))
"""


NOT_X86 = platform.machine() != "x86_64" and not os.environ.get("CI")
"""Never true under CI: there, another architecture fails the test (its OpenBLAS names other cores)."""


@pytest.mark.skipif(NOT_X86, reason="OpenBLAS's x86 cores")
def test_a_process_whose_lapack_kernels_differ_computes_other_ranks_and_its_machine_kind_says_so() -> None:
    # Two AVX-512 EPYCs of one model name once computed the same step bit for bit but for the ranks: their
    # OpenBLAS picked other LAPACK kernels ("Haswell", "SkylakeX"). Forced here (both run on any AVX CPU).
    seen = {}
    for core in ("Haswell", "Sandybridge"):
        env = {**os.environ, "OPENBLAS_CORETYPE": core}
        done = subprocess.run([sys.executable, "-c", LAPACK_PROBE], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        seen[core] = json.loads(done.stdout.splitlines()[-1])
    haswell, sandy = seen["Haswell"], seen["Sandybridge"]
    assert haswell["rank"] != sandy["rank"]  # the premise: the kernels move the rank's last bits
    assert resume_check.machine_changes(haswell["machine"], sandy["machine"]) == {
        "lapack": ("Haswell", "Sandybridge")
    }


def test_breaking_config_change_fails_unless_allowed() -> None:
    rec = NextStep(step=5, batch="b", key=[1], update=2, lr=0.5, accumulation=1, loss=1.0, n_devices=1)
    meta = _meta(rec)
    changed = {"seed": 1, "data": {"batch_size": 8}, "log_every": 3}
    res = _check(meta, rec, config=changed)["config"]
    assert not res.ok and res.got == "seed:0->1"
    allowed = _check(meta, rec, config=changed, allow_config_change=True)["config"]
    assert allowed.ok and allowed.expected == "breaking_changes_allowed" and allowed.got == "seed:0->1"
    harmless = _check(meta, rec, config={**meta["config"], "log_every": 3})["config"]
    assert harmless.ok and harmless.got == "harmless:log_every:<absent>->3"
    # An allowed change that moves the next step's loss (a helper's --objective.lejepa.lam 0.1): its
    # record is of the old options, and it failed next_loss and next_gradient, "fix the cause".
    moved = dataclasses.replace(rec, loss=1.5)
    res = _check(meta, moved, config=changed, allow_config_change=True)
    assert res["next_loss"].ok and res["next_loss"].expected == "not_compared(config_changed:seed)"
    assert res["next_gradient"].ok and not _check(meta, moved, config=changed)["next_loss"].ok
    # The optimizer's options act after the loss: it is still compared, exactly.
    lr = {**meta["config"], "optim": {"lr": 2.0}}
    assert not _check(meta, moved, config=lr, allow_config_change=True)["next_loss"].ok


# ------------------------------------------------------------------------------------ in the real loop
@dataclasses.dataclass(frozen=True)
class Matrix:
    base: PretrainConfig
    """The run stopped after RESUME_AT; each resume is a copy named ``<run>-<fault>`` beside it."""
    rows: list[Row]
    said: str
    """What the matrix's runs printed."""

    def row(self, fault: str) -> Row:
        return next(r for r in self.rows if r.fault == fault)

    def run_dir(self, fault: str) -> Path:
        return self.base.log.runs_dir / f"{self.base.run}-{fault}"


@pytest.fixture(scope="module")
def matrix(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Matrix:
    cfg = config(demo_dir, tmp_path_factory.mktemp("faults"), "fm")
    with contextlib.redirect_stdout(io.StringIO()) as said:
        rows = run_matrix(cfg, RESUME_AT)
    return Matrix(dataclasses.replace(cfg, stop_at_step=RESUME_AT), rows, said.getvalue())


def test_clean_resume_raises_no_flag(matrix: Matrix) -> None:
    clean = matrix.rows[0]
    assert clean.fault == CLEAN and clean.exit_code == 0 and clean.failed == []
    assert not events(matrix.run_dir(CLEAN), "warning")  # a healthy run: no monitor warnings either


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_is_named_on_the_first_resumed_step(matrix: Matrix, fault: str) -> None:
    row = matrix.row(fault)
    assert row.no_effect is None  # mid-update, checkpointed keys: every fault changes something
    assert not row.checks[EXPECTED_CHECK[fault]], (fault, row.failed)
    assert row.exit_code == exit_codes.RESUME_CHECK
    # The run stopped before training anything past the checkpoint.
    run_dir = matrix.run_dir(fault)
    trained = [s for s, m in metrics_by_step(run_dir).items() if "train/loss" in m]
    assert max(trained) == RESUME_AT
    (failed,) = events(run_dir, "resume_check_failed")
    assert failed["step"] == RESUME_AT + 1 and EXPECTED_CHECK[fault] in failed["failed"]
    if fault == "shard_relabelled":  # the shard named: its digest, recorded at the save, differs
        assert "+changed_shards:" in failed["got"]["dataset"], failed


def test_warn_mode_reports_and_goes_on(matrix: Matrix) -> None:
    # With a breaking option given too: the change is recorded as --allow-config-change records it (no
    # event, and `trace` of the steps after said the run itself was wrong).
    lr = 2 * matrix.base.optim.lr
    warn = dataclasses.replace(
        matrix.base, resume_checks="warn", optim=dataclasses.replace(matrix.base.optim, lr=lr)
    )
    row = resume_with(warn, "perturb_params", RESUME_AT)
    assert row.exit_code == 0 and not row.checks["param_norms"] and not row.checks["config"]
    run_dir = matrix.run_dir("perturb_params")
    trained = sorted(s for s, m in metrics_by_step(run_dir).items() if "train/loss" in m)
    assert trained == list(range(matrix.base.steps))
    (failed,) = events(run_dir, "resume_check_failed")
    assert failed["action"] == "warn" and "param_norms" in failed["failed"]
    (changed,) = events(run_dir, "config_changed")
    assert changed["step"] == RESUME_AT + 1 and changed["changes"] == [
        f"optim.lr:{matrix.base.optim.lr}->{lr}"
    ]


def test_allowed_config_change_passes_the_config_check_loudly(
    matrix: Matrix, capsys: pytest.CaptureFixture
) -> None:
    capsys.readouterr()
    # Refused, the line names what changed and the flag that allows it (extending a run is the common case).
    lr = 2 * matrix.base.optim.lr
    retuned = dataclasses.replace(matrix.base, optim=dataclasses.replace(matrix.base.optim, lr=lr))
    assert resume_with(retuned, None, RESUME_AT).exit_code == exit_codes.RESUME_CHECK
    assert (
        f"lines). Nothing was trained. Options that change the run were given (optim.lr:"
        f"{matrix.base.optim.lr}->{lr}): pass --allow-config-change to train on under them (the run is then "
        "no longer exact), or leave them out, or pass --resume-checks warn"
    ) in capsys.readouterr().out
    # The batch stream cannot continue at another batch size, the flag given or not: said at once (the
    # first refusal advised the flag, and the second refused it; before, it said "Fix the cause").
    stream = (
        "Nothing was trained. The options changed (data.batch_size:8->16) lay out the data stream or the "
        "step keys (loader_state, next_batch differ), which cannot change within a run, "
        "--allow-config-change neither (warned past, the data starts over at its first batch): train the "
        "change in a new run, or leave them out, or pass --resume-checks warn"
    )
    assert matrix.row("batch_size_change").exit_code == exit_codes.RESUME_CHECK and stream in matrix.said
    allowed = dataclasses.replace(matrix.base, allow_config_change=True)
    row = resume_with(allowed, "batch_size_change", RESUME_AT)
    out = capsys.readouterr().out
    assert row.checks["config"]
    assert (
        "RESUME_CHECK name=config ok=True expected=breaking_changes_allowed got=data.batch_size:8->16" in out
    )
    assert not row.checks["loader_state"] and row.exit_code == exit_codes.RESUME_CHECK and stream in out
    # Other step keys alone leave the loader's state as it was: no "the data starts over" said of them.
    row = resume_with(dataclasses.replace(allowed, prng="stateless"), None, RESUME_AT)
    keys = "(prng differ), which cannot change within a run, --allow-config-change neither: train the change"
    assert row.exit_code == exit_codes.RESUME_CHECK and keys in capsys.readouterr().out
    # Warned past, the stream started over at its first batch, exit 0, and nothing said so.
    warned = dataclasses.replace(allowed, resume_checks="warn")
    assert resume_with(warned, "batch_size_change", RESUME_AT).exit_code == 0
    assert "continuing; the data starts over at its first batch" in capsys.readouterr().out


def test_clean_resumes_with_harmless_changes_raise_no_flag(demo_dir: Path, tmp_path: Path) -> None:
    straight = config(demo_dir, tmp_path, "straight")
    assert pretrain(straight) == 0
    run = config(demo_dir, tmp_path, "seg")
    # Resumes after steps 1, 4 and 6 (on an update boundary, then mid-update), changing only options that
    # may change: worker count and checkpoint cadence, then monitor interval (each back at the next).
    segments = [
        dict(stop_at_step=1),
        dict(stop_at_step=4, ckpt_every=3, data=dataclasses.replace(run.data, n_workers=1)),
        dict(stop_at_step=6, monitor_interval=2),
        dict(),
    ]
    before = signal.getsignal(signal.SIGTERM)
    for i, seg in enumerate(segments):
        # The third under another default PRNG ($JAX_DEFAULT_PRNG_IMPL=rbg): its restore was JAX's
        # traceback (the checkpoint's chain of 2 words, where rbg's keys have 4). The run's keys keep theirs.
        jax.config.update("jax_default_prng_impl", "rbg" if i == 2 else "threefry2x32")
        try:
            assert pretrain(dataclasses.replace(run, **seg)) == 0
        finally:
            jax.config.update("jax_default_prng_impl", "threefry2x32")
        assert signal.getsignal(signal.SIGTERM) is before  # the run's stop handler is gone again
    assert [e["step"] for e in events(run.run_dir, "resume")] == [2, 5, 7]
    checks = [m for m in metrics_by_step(run.run_dir, everything=True).values() if "resume/failed" in m]
    assert len(checks) == 3 and all(m["resume/failed"] == 0.0 for m in checks)
    assert not events(run.run_dir, "resume_check_failed") and not events(run.run_dir, "warning")
    # The checkpoint after step 3 (4 batches of 8) holds a buffer of 4 + 32 = 36, still growing.
    meta = Checkpointer(straight.run_dir, keep=None, async_save=False).read_meta(3)
    assert len(meta["loader_state"]["plan"]["buffer"]) == 36
    # ... and the run is the uninterrupted one, bit for bit (monitor metrics only where both checked).
    diffs = [d for d in compare_runs(straight.run_dir, run.run_dir) if d.max_abs and "monitor/" not in d.name]
    assert diffs == []
    # Started again once finished: with its own options, nothing to do; with another learning rate, refused
    # (it said "nothing to do", exit 0, as if an edited sweep config had run), and config.json still the
    # options that trained it (it took the new ones, and trace then replayed step 0 with them).
    config_file = run.run_dir / "config.json"
    trained = config_file.read_bytes()
    resumes = [e for e in read_metrics(run.run_dir) if e.get("event") == "resume"]
    assert pretrain(run) == 0
    assert [e for e in read_metrics(run.run_dir) if e.get("event") == "resume"] == resumes  # analyze saw one
    assert pretrain(dataclasses.replace(run, optim=dataclasses.replace(run.optim, lr=0.5))) == 65
    assert config_file.read_bytes() == trained


def test_a_fault_with_nothing_to_act_on_is_no_effect_not_a_miss() -> None:
    # On an update boundary the accumulator is empty: dropping it changes nothing.
    params = {"w": jnp.ones(3)}
    tx = optax.MultiSteps(optax.sgd(0.1), every_k_schedule=2)
    boundary = tx.init(params)
    chain = jnp.zeros(2, jnp.uint32)
    r = Restored(PretrainConfig(), ["a", "b"], TrainState(0, 0, params, boundary, chain))
    after, no_effect = inject("drop_accumulation", r, tx, chain)
    assert after.state.opt_state is boundary and no_effect is not None and "update boundary" in no_effect
    mid = boundary._replace(mini_step=jnp.ones_like(boundary.mini_step))
    _, no_effect = inject("drop_accumulation", r.with_state(opt_state=mid), tx, chain)
    assert no_effect is None

    passed = {c: True for c in CHECKS}
    clean = Row(CLEAN, 0, passed)
    quiet = Row("drop_accumulation", 0, passed, no_effect="resumed on an update boundary")
    missed = Row("drop_accumulation", 0, passed)
    assert not_as_expected([clean, quiet]) == []
    assert not_as_expected([clean, missed]) == ["drop_accumulation"]


def test_a_resume_across_step_revisions_names_each_and_an_unknown_newer_one_may_move_training() -> None:
    """`revisions.between` lists the declared changes a resume crosses, either way; a revision newer
    than the code reading the checkpoint is one it cannot describe, so it counts as moving training."""
    from birdjepa.train import revisions

    now = revisions.REVISION
    assert revisions.between(now) == []
    assert revisions.between(1) == revisions.between(1, now) == list(revisions.REVISIONS[1:])
    assert revisions.between(now, 1) == revisions.between(1, now)
    (newer,) = revisions.between(now + 1)
    assert newer.training and "newer than this code" in newer.what


def test_a_revision_of_some_runs_moves_only_their_training() -> None:
    """Revision 5 recomputes the predictor's and MAE decoder's blocks under --model.remat: it moves the
    bits of those runs only; the unknown newer revision moves every run's."""
    from birdjepa.config import resolve
    from birdjepa.train import revisions

    def run(**options: object) -> PretrainConfig:
        return resolve(PretrainConfig(), options, "test")

    (fifth,) = revisions.between(4, 5)
    assert "predictor's and the MAE decoder's blocks" in fifth.what
    moved = {
        "plain": run(),
        "remat": run(**{"model.remat": True}),
        "remat, predictor": run(**{"model.remat": True, "model.predictor_depth": 1}),
        "remat, mae": run(**{"model.remat": True, "objective.kind": "mae"}),
        "mae": run(**{"objective.kind": "mae"}),
        "remat, patch read-out": run(**{"model.remat": True, "objective.lejepa.patch_weight": 0.5}),
    }
    assert {k for k, cfg in moved.items() if revisions.moves_training([fifth], cfg)} == {
        "remat, predictor", "remat, mae"}  # fmt: skip
    newer = revisions.between(revisions.REVISION + 1)
    assert revisions.moves_training(newer, run())


def test_a_shard_relabelled_at_the_same_size_keeps_the_fingerprint_and_the_dataset_check_names_it(
    demo_dir: Path, tmp_path: Path
) -> None:
    # A second `prepare` with one label corrected: the fingerprint reads a shard's size and its ends only,
    # and every check passed; the run was no longer exact (a helper's hunt, compare: 0.53 at step 8).
    import pyarrow as pa

    from birdjepa.data import Loader
    from birdjepa.data.shards import read_shard
    from birdjepa.resume.checks import dataset_check
    from birdjepa.verify.faults import relabelled_copy

    shard = sorted((demo_dir / "train").glob("*.arrow"))[0]
    table = read_shard(shard)
    (tmp_path / "two").mkdir()  # its rows in two record batches: the first one's labels clear of the ends
    two = tmp_path / "two" / shard.name
    with pa.OSFile(str(two), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=len(table) // 2 + 1)
    (tmp_path / "two" / "vocab.json").write_bytes((shard.parent / "vocab.json").read_bytes())
    relabelled_copy(two, tmp_path / "relabelled")
    before, after = (Loader(str(tmp_path / f), batch_size=4, train=False) for f in ("two", "relabelled"))
    assert before.fingerprint == after.fingerprint
    meta = {"dataset_fingerprint": before.fingerprint, "dataset_shards": before.shard_digests()}
    result = dataset_check(meta, after.fingerprint, after.shard_digests())
    assert not result.ok and result.got == f"{after.fingerprint}+changed_shards:{shard.name}"
    assert dataset_check(meta, before.fingerprint, before.shard_digests()).ok
    # Its vocab.json's names are in the digest, not its spacing.
    vocab = tmp_path / "two" / "vocab.json"
    vocab.write_text(vocab.read_text() + "\n\n")
    assert Loader(str(tmp_path / "two"), batch_size=4, train=False).shard_digests() == meta["dataset_shards"]
    # A shard added or removed is said so (it read as "changed", as a shard rewritten).
    grown = {**meta["dataset_shards"], "extra.arrow": "0"}
    assert dataset_check(meta, "other", grown).got == "other+changed_shards:extra.arrow(added)"
    assert dataset_check({**meta, "dataset_shards": grown}, "x", meta["dataset_shards"]).got == (
        "x+changed_shards:extra.arrow(removed)"
    )
    # A checkpoint written before the digests were recorded is compared by its fingerprint, as it was.
    assert dataset_check({"dataset_fingerprint": before.fingerprint}, after.fingerprint, {}).ok
    # A glob over two folders `prepare` wrote, one file name in each: each shard has its own digest (one
    # digest stood for both, and a shard relabelled in one folder passed the check).
    for where, first in (("p", two), ("q", tmp_path / "relabelled" / shard.name)):
        for folder, source in (("x", first), ("y", two)):
            (tmp_path / where / folder).mkdir(parents=True)
            shutil.copy(source, tmp_path / where / folder / shard.name)
            shutil.copy(tmp_path / "two" / "vocab.json", tmp_path / where / folder)
    p, q = (Loader([str(tmp_path / w / f) for f in "xy"], batch_size=4, train=False) for w in "pq")
    assert p.fingerprint == q.fingerprint and list(p.shard_digests()) == [
        f"x/{shard.name}",
        f"y/{shard.name}",
    ]
    meta = {"dataset_fingerprint": p.fingerprint, "dataset_shards": p.shard_digests()}
    assert (
        dataset_check(meta, q.fingerprint, q.shard_digests()).got
        == f"{q.fingerprint}+changed_shards:x/{shard.name}"
    )
    # An older checkpoint's one digest for the two, under the bare name: the fingerprint decides, as then.
    older = {
        "dataset_fingerprint": p.fingerprint,
        "dataset_shards": {shard.name: p.shard_digests()[f"y/{shard.name}"]},
    }
    assert dataset_check(older, q.fingerprint, q.shard_digests()).ok


@pytest.mark.slow  # two segments with an evaluation: ~18 s
def test_an_eval_split_changed_between_segments_is_said_and_logged(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every check "ok", and only `compare` found eval/knn_acc differing from the step after the resume.
    import pyarrow as pa
    import pyarrow.ipc as ipc

    held_out = shutil.copytree(demo_dir / "eval", tmp_path / "eval")
    run = config(demo_dir, tmp_path, "ev", eval_linear=False)
    run = dataclasses.replace(run, steps=2, eval_every=2, ckpt_every=1, optim=OptimConfig(),
                              data=dataclasses.replace(run.data, eval=str(held_out)))  # fmt: skip
    assert pretrain(dataclasses.replace(run, stop_at_step=0)) == 0
    shard = sorted(held_out.glob("*.arrow"))[0]
    with ipc.open_file(shard) as f:
        fewer = f.read_all().slice(0, 3)
    with pa.OSFile(str(shard), "wb") as sink, ipc.new_file(sink, fewer.schema) as writer:
        writer.write_table(fewer)
    capsys.readouterr()
    assert pretrain(run) == 0
    assert "WARNING the eval split is other data than checkpoint 0's (fingerprint " in capsys.readouterr().out
    (changed,) = events(run.run_dir, "eval_data_changed")
    assert changed["step"] == 1 and changed["fingerprint"][0] != changed["fingerprint"][1]
