"""Resume is a non-event: `birdjepa verify-resume` trains uninterrupted and interrupted (new processes,
by --stop-at-step and by SIGTERM, mid gradient accumulation, with another worker count) and finds every
logged metric bit-identical; the legacy mode visibly is not (to the checks and to `birdjepa compare`).
Plus what a resume must carry besides the metrics: the LR schedule, device-count portability, the
debug roundtrip, the wandb mirror."""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import os
import runpy
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import tyro

from birdjepa import exit_codes
from birdjepa.analysis import analyze
from birdjepa.cli import main
from birdjepa.config import OptimConfig, PretrainConfig
from birdjepa.divergence import trace_file
from birdjepa.divergence.trace import trace_step
from birdjepa.pretrain import loop as train_loop
from birdjepa.pretrain.stop import USER_SIGNALS, StopRequest
from birdjepa.resume.checks import CHECKS
from birdjepa.resume.compare import compare_runs
from birdjepa.rundir.checkpoint import Checkpointer
from birdjepa.rundir.metrics_log import metrics_by_step, read_metrics
from birdjepa.train.digest import SMALL, hex_digest, summarize
from birdjepa.train.optim import make_schedule

STEPS = 6


def data_flags(demo_dir: Path) -> list[str]:
    return ["--data.train", str(demo_dir / "train"), "--data.eval", str(demo_dir / "eval")]


def birdjepa(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "birdjepa.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def pretrain_flags(demo_dir: Path, runs: Path, run: str, *extra: str) -> list[str]:
    return [
        "--run", run, "--log.runs-dir", str(runs), "--steps", str(STEPS), "--eval-every", "3",
        "--ckpt-every", "3", "--data.batch-size", "8", *data_flags(demo_dir), *extra,
    ]  # fmt: skip


def pretrain(demo_dir: Path, runs: Path, run: str, *extra: str, **kw: object) -> subprocess.CompletedProcess:
    """`birdjepa pretrain` in a new process."""
    return birdjepa("pretrain", *pretrain_flags(demo_dir, runs, run, *extra), **kw)


def pretrain_here(demo_dir: Path, runs: Path, run: str, *extra: str) -> int:
    """The same command line trained in this process (no second start of Python and JAX)."""
    return train_loop.pretrain(tyro.cli(PretrainConfig, args=pretrain_flags(demo_dir, runs, run, *extra)))


# Runs whose test is about the training state, not the evaluation (which the straight run, the debug
# roundtrip and the three-resume verification cover), skip it: a linear probe costs seconds.
NO_EVAL = ("--eval-every", "0")


def differing(a: Path, b: Path) -> list[str]:
    return [
        f"{d.name} first at step {d.first_step}: {d.first_values}" for d in compare_runs(a, b) if d.max_abs
    ]


def resumed_differs(demo_dir: Path, runs: Path, *args: str, stop: int = 2) -> list[str]:
    """Trains ``straight`` and ``resumed`` (stopped after step ``stop``, then resumed) in this process
    with ``args``; the metrics that differ between them (empty: an exact resume)."""
    assert pretrain_here(demo_dir, runs, "straight", *args) == 0
    assert pretrain_here(demo_dir, runs, "resumed", *args, "--stop-at-step", str(stop)) == 0
    assert pretrain_here(demo_dir, runs, "resumed", *args) == 0
    assert events(runs / "resumed", "resume")
    return differing(runs / "straight", runs / "resumed")


def events(run_dir: Path, kind: str) -> list[dict]:
    return [x for x in read_metrics(run_dir) if x.get("event") == kind]


@pytest.fixture(scope="module")
def straight(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("runs")
    # The online probe's held-out metrics at each evaluation; the linear probe's fit (seconds) is
    # tests/test_evaluation.py's.
    assert pretrain_here(demo_dir, runs, "straight", "--no-eval-linear") == 0
    return runs / "straight"


def test_straight_run_logs_every_step(straight: Path) -> None:
    steps = metrics_by_step(straight)
    assert sorted(steps) == list(range(STEPS))
    for s, m in steps.items():
        for k in ("train/loss", "train/lr", "train/grad_norm", "train/update_norm", "train/param_norm"):
            assert isinstance(m[k], float), (s, k)
    assert "eval/probe_acc" in steps[2] and "eval/probe_acc" in steps[5]
    # A step's row is written once its norms are in (on a thread, while the next step runs), and still
    # before the evaluation's row of its step: the rows in the order the loop logged them.
    rows = [(x["step"], "train/loss" in x) for x in read_metrics(straight) if "event" not in x]
    assert rows == sorted(rows, key=lambda r: (r[0], not r[1])) and rows.count((2, False)) == 1, rows
    # Each checkpoint records the norms the log shows for its step (post-update), per component too.
    for step in (2, 5):
        meta = Checkpointer(straight, keep=None, async_save=False).read_meta(step)
        assert meta["norms"]["param_norm"] == steps[step]["train/param_norm"]
        for part in ("encoder", "projector", "probe"):
            assert meta["norms"][f"param_norm/{part}"] == steps[step][f"train/param_norm/{part}"]
        assert meta["step"] == step and meta["loader_state"] and meta["git"]["commit"]


def test_checkpoint_norms_recomputed_from_disk_equal_the_logged_ones(
    straight: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Path(__file__).resolve().parents[1] / "scripts" / "compare_ckpt_param_norms.py"
    out = tmp_path / "norms.csv"
    monkeypatch.setattr(sys, "argv", [str(script), str(straight), "--out", str(out)])
    with pytest.raises(SystemExit) as done:  # the script as `python scripts/...` runs it, in this process
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0
    rows = list(csv.DictReader(out.open()))
    assert {r["step"] for r in rows} == {"2", "5"}
    assert {r["norm"] for r in rows} >= {"param_norm", "param_norm/encoder", "param_norm/probe"}
    assert all(float(r["delta"]) == 0.0 and float(r["checkpoint"]) > 0 for r in rows)


def test_logged_lr_is_the_schedule_of_each_update(straight: Path) -> None:
    # The logged LR is read from the optimizer state (optim.applied_lr); test_optim shows that state is
    # what the optimizer applied. Here: the trainer's step s is update s, from schedule(0) on.
    cfg = PretrainConfig()
    schedule = make_schedule(OptimConfig(), STEPS)
    assert cfg.optim == OptimConfig()
    logged = {s: m["train/lr"] for s, m in metrics_by_step(straight).items()}
    assert logged == {s: float(schedule(s)) for s in range(STEPS)}
    assert logged[0] > 0


def command(capsys: pytest.CaptureFixture, *args: object) -> int:
    """Exit status of ``birdjepa ARGS`` run by the console script's entry point in this process."""
    capsys.readouterr()
    try:
        main([str(a) for a in args])
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    return 0


def verify_resume(demo_dir: Path, runs: Path, *args: str) -> subprocess.CompletedProcess:
    return birdjepa(
        "verify-resume", "--run", "v", "--log.runs-dir", str(runs), "--data.batch-size", "8",
        *data_flags(demo_dir), *args,
    )  # fmt: skip


def test_a_run_resumed_mid_update_in_a_new_process_with_another_worker_count_equals_the_straight_run(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The suite's exact resume: 8 micro-steps of 2-batch accumulation trained straight and in three
    segments: the first here, stopped by a first Ctrl-C during step 4 (mid-update: 5 micro-batches done;
    exit 130, saved at the step it finished); the second in a new process with 1 loader worker, sent a
    SIGTERM as it opens (its restore: before the loop's handler it killed the trainer without a word,
    exit -15, its lease left behind), which stops it after its first step, saved, exit 75; the third
    here. Every logged metric is equal, and the 11 resume checks pass. (The three-resume test below adds
    verify-resume's own command; CI runs it.)"""
    args = ("--steps", "8", "--optim.grad-accum", "2", *NO_EVAL, "--ckpt-every", "4")
    assert pretrain_here(demo_dir, tmp_path, "straight", *args) == 0
    resumed = tmp_path / "resumed"
    real = train_loop.advance

    def advance(fns, cfg, state, batch):  # noqa: ANN001, ANN202
        if state.step == 4:
            os.kill(os.getpid(), signal.SIGINT)  # the handler records it: the step runs on
        return real(fns, cfg, state, batch)

    with monkeypatch.context() as m:
        m.setattr(train_loop, "advance", advance)
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
        try:
            assert pretrain_here(demo_dir, tmp_path, "resumed", *args) == 130
        finally:
            signal.signal(signal.SIGINT, previous)
    out, err = capfd.readouterr()
    assert "Ctrl-C: stopping after this step, with a checkpoint (exit 130; the same command resumes)" in err
    assert "stopping after step 4 (signal 2); exit 130" in out, out[-3000:]
    (stop,) = events(resumed, "stop")
    assert (stop["step"], stop["reason"], stop["exit_code"]) == (4, f"signal {int(signal.SIGINT)}", 130)
    assert Checkpointer(resumed).latest_step() == 4
    cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain",
           *pretrain_flags(demo_dir, tmp_path, "resumed", *args, "--data.n-workers", "1")]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # the trainer's first line, printed as the run opens, before the restore
        if line.startswith("devices="):
            proc.send_signal(signal.SIGTERM)
            break
    said = [line]
    for line in proc.stdout:
        said.append(line)
        if "stopping after step" in line:
            # Past a soft CPU-time limit the kernel sends SIGXCPU again each CPU second, to the last: its
            # default action killed the run as it closed, saved and said "exit 75" (exit 152, not
            # requeued), whether it stopped for the SIGXCPU or for a preemption before it.
            threading.Thread(target=repeat_until_exit, args=(proc, signal.SIGXCPU), daemon=True).start()
            break
    out = "".join(said) + proc.communicate(timeout=300)[0]
    assert proc.returncode == exit_codes.REQUEUE, out[-5000:]
    stop = events(resumed, "stop")[1]
    assert stop["reason"] == f"signal {int(signal.SIGTERM)}" and stop["exit_code"] == exit_codes.REQUEUE
    assert stop["step"] in (5, 6) and Checkpointer(resumed).latest_step() == stop["step"], stop
    assert not (resumed / "lease.json").exists()
    assert out.count("RESUME_CHECK") == len(CHECKS) and "ok=False" not in out
    assert json.loads((resumed / "config.json").read_text())["data"]["n_workers"] == 1
    # No step lost or redone: resumed once more, here, the run equals the straight one.
    assert pretrain_here(demo_dir, tmp_path, "resumed", *args) == 0
    assert differing(tmp_path / "straight", resumed) == []
    logged = metrics_by_step(resumed)
    assert sorted(logged) == list(range(8))
    assert logged[4]["train/accum_progress"] == 1.0 and logged[5]["train/accum_progress"] == 0.0
    assert [e["restart"] for e in events(resumed, "resume")] == [1, 2]
    assert not events(resumed, "resume_check_failed")


@pytest.mark.slow  # four processes, two minutes: CI runs it; the test above is the suite's exact resume
def test_verify_resume_three_resumes_signal_accumulation_and_workers(demo_dir: Path, tmp_path: Path) -> None:
    # 30 micro-steps of 2-batch accumulation; stops after step 8 (mid-update: 9 micro-batches
    # done), a SIGTERM once step 14 is logged, and after step 22; 1 loader worker after the first resume.
    # No evaluation: test_distributed compares one after a resume with the straight run's.
    # --sequential: the segments load the straight run's compiled step instead of compiling it beside it.
    done = verify_resume(
        demo_dir, tmp_path, "--steps", "30", "--optim.grad-accum", "2", *NO_EVAL,
        "--ckpt-every", "10", "--sequential", "--resume-at", "8", "22",
        "--signal-at", "14", "--workers-after-resume", "1",
        "--monitor-interval", "5",  # every 5 updates: micro-steps 9, 19, 29
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "max_abs_diff=0.0"
    resumed = tmp_path / "verify-v" / "resumed"
    stops = events(resumed, "stop")
    assert [e["reason"] for e in stops] == ["stop_at_step", "signal 15", "stop_at_step"]
    assert stops[0]["step"] == 8 and 14 <= stops[1]["step"] < 22 and stops[2]["step"] == 22
    assert [e["restart"] for e in events(resumed, "resume")] == [1, 2, 3]
    # The first resume happened mid-accumulation, and the segment after it used one worker.
    logged = metrics_by_step(resumed)
    assert logged[8]["train/accum_progress"] == 1.0 and logged[9]["train/accum_progress"] == 0.0
    console = (resumed / "console.log").read_text()
    assert console.count("CKPT_RESTORE") == 3 and "ratio=1.0" in console
    # Every resume check passed at every resume, and the diagnostics were part of the comparison.
    assert console.count("RESUME_CHECK") == 3 * len(CHECKS) and "ok=False" not in console
    assert not events(resumed, "resume_check_failed")
    for s in (9, 15, 23):  # first steps after the resumes (the signal stop lands on 14 or later)
        if s in logged:
            assert "dataloader/bucket_lag1/hash" in logged[s] and logged[s]["dataloader/window_batches"] > 1
    assert "monitor/update_ratio/median" in logged[9] and "monitor/update_ratio/median" in logged[19]
    config = json.loads((resumed / "config.json").read_text())
    assert config["data"]["n_workers"] == 1
    # The analysis finds the three resumes from the log's events and sees nothing at any of them.
    result = analyze(resumed, other=tmp_path / "verify-v" / "straight", window=4)
    assert [j.resume_step for j in result.jumps if j.metric == "train/loss"] == [9, stops[1]["step"] + 1, 23]
    assert result.max_abs_diff == 0.0 and all(j.other_max_abs == 0.0 for j in result.jumps)


def test_compare_names_the_steps_one_run_logged_alone_and_the_difference_over_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # A run extended past another (or stopped early) differs, and says where: the steps only one run
    # logged, and over the steps both logged the difference alone (here none).
    from birdjepa.rundir.layout import METRICS_FILE

    for run, steps in (("short", range(4)), ("long", [*range(6), 9])):
        (tmp_path / run).mkdir()
        lines = [{"step": s, "restart": 0, "train/loss": 1.0 / (s + 1)} for s in steps]
        (tmp_path / run / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert command(capsys, "compare", tmp_path / "short", tmp_path / "long") == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-3:] == [f"steps only {tmp_path / 'long'} logged: 4-5, 9 (3)",
                        "over the 4 steps both logged: max_abs_diff=0.0", "max_abs_diff=inf"]  # fmt: skip
    assert command(capsys, "compare", tmp_path / "long", tmp_path / "long") == 0
    assert "steps only" not in capsys.readouterr().out
    # A resumed segment's first row under --log-every 3 holds its resume/* checks alone: no step logged.
    with (tmp_path / "long" / METRICS_FILE).open("a") as f:
        f.write(json.dumps({"step": 10, "restart": 1, "resume/failed": 0}) + "\n")
    assert command(capsys, "compare", tmp_path / "long", tmp_path / "short") == 1
    assert f"steps only {tmp_path / 'long'} logged: 4-5, 9 (3)" in capsys.readouterr().out


def test_the_legacy_resume_bug_is_caught_by_the_checks_and_by_compare(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Cold loader and restarted key chain: identical up to the resume, different from it on. The
    # resume checks see it first (they would stop the run; `warn` lets it go on to be compared). In this
    # process: verify-resume's machinery is the three-resume test's; what matters here is the catch.
    legacy = ("--prng", "legacy", "--resume-checks", "warn", *NO_EVAL)
    assert pretrain_here(demo_dir, tmp_path, "straight", *legacy) == 0
    assert pretrain_here(demo_dir, tmp_path, "resumed", *legacy, "--stop-at-step", "1") == 0
    capsys.readouterr()
    assert pretrain_here(demo_dir, tmp_path, "resumed", *legacy) == 0
    console = capsys.readouterr().out
    for name in ("loader_state", "next_batch", "prng", "next_loss"):
        assert f"RESUME_CHECK name={name} ok=False" in console, name
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    (loss,) = compare_runs(straight, resumed, ["train/loss"])
    assert loss.max_abs > 0 and loss.first_step == 2
    # `birdjepa compare` names the first differing step and fails; a run equals itself.
    assert command(capsys, "compare", straight, resumed, "--metrics", "train/loss") == 1
    assert "step 2: (" in capsys.readouterr().out
    assert command(capsys, "compare", straight, straight) == 0
    assert capsys.readouterr().out.strip().endswith("max_abs_diff=0.0")
    # `birdjepa analyze` puts the difference at the resume: nothing before it, the loss after it.
    # (A window of 4 covers steps 0..5: the table's largest difference is the loss's over the run.)
    analyzed = ("analyze", resumed, "--other", straight, "--window", "4", "--metrics", "train/loss")
    assert command(capsys, *analyzed) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 2 | train/loss |")]
    assert row.split("|")[-2].strip() == f"{loss.max_abs:.4g}"
    assert (resumed / "analysis" / "window-train_loss.png").stat().st_size > 5000


def test_a_resume_by_code_whose_backward_pass_alone_changed_names_the_parameter(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The probe's logits pass through an identity whose gradient is scaled by 1 + 2^-10: the forward,
    # so the loss and every term, is the same to the bit; only the gradients of the probe's head move.
    import jax

    from birdjepa.objectives import health
    from birdjepa.train import compiled

    @jax.custom_vjp
    def identity(x: jax.Array) -> jax.Array:
        return x

    identity.defvjp(lambda x: (x, None), lambda _, g: (g * (1 + 2.0**-10),))
    terms = health.terms
    flags = NO_EVAL
    assert pretrain_here(demo_dir, tmp_path, "run", *flags, "--stop-at-step", "1") == 0
    monkeypatch.setattr(
        health, "terms", lambda out, b: terms({**out, "probe_logits": identity(out["probe_logits"])}, b)
    )
    # This process's functions were built by the code before: a cache of its own for the changed code,
    # the one the other tests share kept as it is.
    monkeypatch.setattr(compiled, "_build", functools.lru_cache(maxsize=4)(compiled._build.__wrapped__))
    capsys.readouterr()
    assert pretrain_here(demo_dir, tmp_path, "run", *flags) == exit_codes.RESUME_CHECK
    lines = {
        ln.split()[1]: ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("RESUME_CHECK")
    }
    assert "ok=True" in lines["name=next_loss"]
    assert "ok=False expected=gradient[probe/" in lines["name=next_gradient"], lines["name=next_gradient"]


@pytest.mark.slow  # a second run; the suite's exact-resume test is the three-resume one above
def test_debug_roundtrip_does_not_change_the_run(
    demo_dir: Path, straight: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    capsys.readouterr()
    roundtrip = ("--no-eval-linear", "--debug.roundtrip-steps", "1", "4")
    assert pretrain_here(demo_dir, tmp_path, "rt", *roundtrip) == 0
    out = capsys.readouterr().out
    assert out.count("DEBUG_ROUNDTRIP") == 2 and "identical=True" in out
    assert differing(straight, tmp_path / "rt") == []


@pytest.mark.slow  # four processes; tests/test_checkpoint.py restores 4 devices' save on 1 in the suite
def test_resume_on_another_device_count_with_the_wandb_mirror(demo_dir: Path, tmp_path: Path) -> None:
    # 1 -> 2 devices through the whole trainer (the resume checks compare the loss to a tolerance on
    # another device count); 2 -> 1 is test_checkpoint's replicated-save-then-one-device-restore.
    # Both segments mirror to wandb offline, with no network: one wandb run joins them.
    before, after = 1, 2

    def env(devices: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
        env["WANDB_BASE_URL"] = "http://127.0.0.1:9"  # unreachable: offline must not try it
        if devices == 1:  # the default: no flag, so the step is the other runs' (flags key the cache)
            return env
        flags = env.get("XLA_FLAGS", "")
        return {**env, "XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count={devices}"}

    wandb = ("--log.wandb", "offline", *NO_EVAL)
    first = pretrain(demo_dir, tmp_path, "d", "--stop-at-step", "1", *wandb, env=env(before))
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"devices={before}" in first.stdout
    second = pretrain(demo_dir, tmp_path, "d", *wandb, env=env(after))
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"devices={after}" in second.stdout
    # Said in a line of its own and an event (next_loss's tolerance said it alone).
    assert f"WARNING resumed on {after} devices, checkpoint 1 was written on {before}: " in second.stdout
    moved = [e for e in read_metrics(tmp_path / "d") if e.get("event") == "devices_changed"]
    assert [e["devices"] for e in moved] == [[before, after]]
    (restore,) = [x for x in second.stdout.splitlines() if x.startswith("CKPT_RESTORE")]
    assert "ratio=1.0" in restore, restore
    saved = [x for x in first.stdout.splitlines() if x.startswith("CKPT_SAVE step=1")]
    assert saved and saved[0].split("param_norm=")[1].split()[0] in restore
    run_dir = tmp_path / "d"
    assert sorted(metrics_by_step(run_dir)) == list(range(STEPS))

    run_id = (run_dir / "wandb_id").read_text().split()[0]  # the id, then the folder it was made in
    segments = sorted((run_dir / "wandb").glob(f"offline-run-*-{run_id}*/run-{run_id}.wandb"))
    assert len(segments) == 2  # one per process, one wandb id: `wandb sync` joins them
    mirrored = b"".join(p.read_bytes() for p in segments)
    for m in metrics_by_step(run_dir).values():
        assert repr(m["train/loss"]).encode() in mirrored


@pytest.mark.slow  # a second straight run in bfloat16; CI runs it beside the suite
def test_bfloat16_compute_resumes_exactly(demo_dir: Path, straight: Path, tmp_path: Path) -> None:
    bf16 = ("--model.dtype", "bfloat16", *NO_EVAL)
    assert resumed_differs(demo_dir, tmp_path, *bf16) == []
    # The arithmetic was bfloat16: the first loss differs from the float32 run's, a little.
    loss16, loss32 = (metrics_by_step(run)[0]["train/loss"] for run in (tmp_path / "straight", straight))
    assert loss16 != loss32 and abs(loss16 - loss32) < 0.05 * abs(loss32), (loss16, loss32)
    # The trace of a bfloat16 step: its outputs are the training step's (what the run logged), and so
    # is its record, which the training executable made (a step compiled apart to record moved the
    # last bits of the embedding here: XLA's bfloat16 rounding where it fused otherwise).
    t = trace_step(tmp_path / "resumed", 3, keep=("params_out",))
    matched = t.manifest["matches_run"]
    assert matched["logged_metrics_equal"] is True and False not in matched.values(), matched
    assert any(e.dtype == "bfloat16" for e in t.entries if e.stage == "forward")
    assert t.manifest["inexact"] is None and t.manifest["recorded_apart"] is None, t.manifest["inexact"]


@pytest.mark.slow  # three processes compiling at the default level: 2 min on 2 cores
@pytest.mark.default_level
def test_resume_is_bit_exact_at_the_optimisation_level_users_run(demo_dir: Path, tmp_path: Path) -> None:
    """`verify-resume` in processes whose environment carries none of the suite's XLA flags (so XLA's
    default optimisation level, and the determinism flags the command sets itself): a stop
    mid-accumulation and a SIGTERM, compared with == (max_abs_diff=0.0)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    args = ["verify-resume", "--run", "v", "--log.runs-dir", str(tmp_path), "--data.batch-size", "4",
            *data_flags(demo_dir), "--steps", "10", "--optim.grad-accum", "2", *NO_EVAL, "--ckpt-every", "0",
            "--sequential", "--resume-at", "2", "--signal-at", "5"]  # fmt: skip
    done = birdjepa(*args, env=env)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "max_abs_diff=0.0"
    resumed = tmp_path / "verify-v" / "resumed"
    stops = events(resumed, "stop")
    assert [e["reason"] for e in stops] == ["stop_at_step", "signal 15"]
    assert metrics_by_step(resumed)[2]["train/accum_progress"] == 1.0  # stopped with half an update
    # A trace at this level of the step the SIGTERM's checkpoint saved (6 or later, as the signal lands):
    # its outputs equal what the run logged and saved, and its record is the training executable's own
    # (a step compiled apart to record moved last bits of the embedding at this level: it said so in a
    # WARNING). The forward pass kept whole comes from a step compiled apart: where its bits are not
    # the training step's, the trace names the first such tensor.
    signalled = str(stops[1]["step"])
    out = tmp_path / "t.npz"
    done = birdjepa("trace", str(resumed), "--step", signalled, "--keep", "forward", "--out", str(out),
                    env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "outputs equal its logged metrics and its checkpoint" in done.stdout, done.stdout
    t = trace_file.read(out)
    kept = [e for e in t.entries if e.stage == "forward" and e.array is not None and e.array.size > SMALL]
    assert kept and t.manifest["recorded_apart"] == "the tensors kept whole"
    differ = [e.key for e in kept if hex_digest(summarize([e.array], [True])[0]["digest"]) != e.digest]
    assert t.manifest["inexact"] == (differ[0] if differ else None), (t.manifest["inexact"], differ[:3])
    assert ("WARNING" in done.stdout) == bool(differ), done.stdout


def test_a_terminal_that_hangs_up_stops_the_run_after_its_step_with_a_checkpoint(
    demo_dir: Path, tmp_path: Path
) -> None:
    # A run started in an ssh session that dropped: SIGHUP killed it, every step since the last save
    # lost. In a real terminal (a pty whose far end closes), where every later write to it fails.
    import select

    run = tmp_path / "hup"
    argv = ["birdjepa", "pretrain", *pretrain_flags(demo_dir, tmp_path, "hup", *NO_EVAL, "--ckpt-every", "0")]
    # The child: a session of its own (not forked from this threaded process in Python: subprocess's exec
    # is), the pty its controlling terminal; SIGHUP as a terminal's process has it (a runner under nohup,
    # CI's, ignores it, and a child inherits that; a run under nohup is one asked to outlive the terminal).
    start = ("import fcntl, runpy, signal, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
             f"signal.signal(signal.SIGHUP, signal.SIG_DFL); sys.argv = {argv!r}; "
             "runpy.run_module('birdjepa.cli', run_name='__main__')")  # fmt: skip
    terminal, far = os.openpty()
    proc = subprocess.Popen([sys.executable, "-c", start], stdin=far, stdout=far, stderr=far,
                            start_new_session=True)  # fmt: skip
    os.close(far)
    said = b""
    while b"devices=" not in said:  # the trainer's first line, as the run opens, before the loop
        if select.select([terminal], [], [], 0.05)[0]:
            said += os.read(terminal, 65536)  # drained: a full pty would block the run's writes
        assert proc.poll() is None, said.decode(errors="replace")
    os.close(terminal)  # the terminal hangs up: the kernel sends SIGHUP
    assert proc.wait(timeout=300) == exit_codes.HUNG_UP, said.decode(errors="replace")
    (stop,) = events(run, "stop")
    assert stop["reason"] == f"signal {int(signal.SIGHUP)}" and stop["exit_code"] == exit_codes.HUNG_UP
    assert stop["step"] < STEPS - 1 and Checkpointer(run).latest_step() == stop["step"]
    assert not (run / "lease.json").exists()


@pytest.mark.slow  # two segments in processes of their own: ~20 s
def test_a_console_that_fails_stops_no_run(demo_dir: Path, tmp_path: Path) -> None:
    # A Slurm output file on a full quota (/dev/full here) and a stdout the scheduler closed (`>&-`): each
    # a traceback, exit 1, the steps since the last save lost (the run's log holds every step).
    flags = shlex.join(pretrain_flags(demo_dir, tmp_path, "con", *NO_EVAL))
    start = f"exec {shlex.quote(sys.executable)} -m birdjepa.cli pretrain {flags}"
    for console, stop in ((">/dev/full", " --stop-at-step 3"), (">&-", "")):
        done = subprocess.run(["sh", "-c", f"{start}{stop} {console}"], capture_output=True, text=True,
                              timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        said = "WARNING the console (standard output) cannot be written (OSError: [Errno 28] No space left"
        assert (said in done.stderr) == (console == ">/dev/full") and "Traceback" not in done.stderr, done
    assert sorted(metrics_by_step(tmp_path / "con")) == list(range(STEPS))


@pytest.mark.parametrize(
    ("sig", "during"),
    [
        (signal.SIGUSR1, "step"),
        (signal.SIGINT, "step"),
        (signal.SIGINT, "save"),
        (signal.SIGINT, "last save"),
    ],
    ids=["USR1", "INT", "INT-in-save", "INT-in-last-save"],
)
def test_a_preemption_or_a_ctrl_c_during_the_last_step_finishes_the_run(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str],
    sig: signal.Signals, during: str,
) -> None:  # fmt: skip
    # It exited 75: a requeue only to say "nothing to do", and the closing summary was in no log. A Ctrl-C
    # there said "stopping after this step, with a checkpoint (exit 130)", and the run finished, exit 0;
    # so did one during the save before the last step (the loop sees it at the last step's end), and one
    # during the last step's own save (the run ends after it, the Ctrl-C not acted on).
    from birdjepa.pretrain.trainer import Trainer

    real, real_save = train_loop.advance, Trainer.save

    def advance(fns, cfg, state, batch):  # noqa: ANN001, ANN202
        if during == "step" and state.step == cfg.steps - 1:
            os.kill(os.getpid(), sig)  # the handler records it: the step runs on
        return real(fns, cfg, state, batch)

    def save(self, state, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if during == "save" and state.step == self.cfg.steps - 1:  # the save of the step before the last
            os.kill(os.getpid(), sig)
        if during == "last save" and state.step == self.cfg.steps:
            os.kill(os.getpid(), sig)
        return real_save(self, state, *args, **kwargs)

    monkeypatch.setattr(train_loop, "advance", advance)
    monkeypatch.setattr(Trainer, "save", save)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        # The file's steps: the straight run's build of the step. Saved after step 4 (the save before the
        # last) and the last.
        assert pretrain_here(demo_dir, tmp_path, "last", *NO_EVAL, "--ckpt-every", "5") == 0
    finally:
        signal.signal(signal.SIGINT, previous)
    stops = [(e["step"], e["exit_code"], e["reason"]) for e in events(tmp_path / "last", "stop")]
    assert stops == ([] if during == "last save" else [(STEPS - 1, 0, f"signal {int(sig)} at the last step")])
    out, err = capfd.readouterr()
    assert f"done: {STEPS} steps in" in out
    if sig == signal.SIGINT:
        assert "Ctrl-C: the run stops after this step anyway (its last, or --stop-at-step), with a " in err, (
            err
        )


def test_a_second_ctrl_c_says_what_the_run_keeps_and_gives_up(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # It said "the next start resumes from the newest checkpoint that verifies" where none was written (the
    # next start began at step 0), and nothing of the checkpoint being written (printed as saved) that it
    # gave up.
    from birdjepa.pretrain.trainer import Trainer
    from birdjepa.rundir.checkpoint.space import TMP_SUFFIX

    real_save = Trainer.save
    at = {"step": 1}

    def save(self, state, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if int(state.step) == at["step"] + 1:  # the save of step ``at``
            if at["step"]:  # as Orbax leaves a write in flight: the tmp folder of the checkpoint
                (tmp_path / "r" / "checkpoints" / f"{at['step']}{TMP_SUFFIX}").mkdir()
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)  # the second raises KeyboardInterrupt
            time.sleep(1)  # the handler runs in the main thread, between two bytecodes
        return real_save(self, state, *args, **kwargs)

    monkeypatch.setattr(Trainer, "save", save)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    try:
        for step, said in (
            (0, "interrupted: no checkpoint was written yet: the same command starts the run over; exit 130"),
            (1, "interrupted: the checkpoint being written is given up; the checkpoints written are intact, "
                "and the same command resumes from the newest (0); exit 130"),
        ):  # fmt: skip
            at["step"] = step
            args = pretrain_flags(demo_dir, tmp_path, "r", *NO_EVAL, "--ckpt-every", "1", "--no-ckpt-async")
            with pytest.raises(SystemExit) as e:
                train_loop.cli(tyro.cli(PretrainConfig, args=args))
            assert e.value.code == 130
            assert capfd.readouterr().err.strip().splitlines()[-1] == said
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_preemption_and_a_ctrl_c_in_either_order_stop_for_the_preemption_and_ctrl_c_twice_quits() -> None:
    # INT then TERM said "exit 130" and exited 75; TERM then INT exited 130 (a preempted job not requeued);
    # INT, TERM, INT: the second Ctrl-C did not quit, the TERM between had overwritten the first. Slurm's
    # warning (USR1) then its TERM recorded the TERM: the first preemption is the reason.
    from birdjepa.pretrain.stop import STOP_SIGNALS, StopRequest

    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (a worker may ignore it)
    try:
        for order in ((signal.SIGINT, signal.SIGTERM), (signal.SIGTERM, signal.SIGINT)):
            stop = StopRequest()
            for sig in order:
                os.kill(os.getpid(), sig)
            assert stop.signal == signal.SIGTERM, order
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs in the main thread, between two bytecodes
        stop = StopRequest()
        for sig in (signal.SIGUSR1, signal.SIGTERM):
            os.kill(os.getpid(), sig)
        assert stop.signal == signal.SIGUSR1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_every_stop_signal_is_recorded_from_the_moment_the_run_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    # The exact-resume test sends its second segment SIGTERM as it opens; the hang-up test, SIGHUP. The
    # others reach the same handler, installed by `pretrain` before anything opens; SIGXCPU's stop exits
    # 75 (requeued).
    came: dict[int, tuple[int | None, bool]] = {}

    def opens(sig: int) -> Callable[..., int]:
        def held(cfg: PretrainConfig, stop: StopRequest) -> int:
            # Asked first: a signal not handled would end the test's process (its default action).
            assert signal.getsignal(sig) == stop._handle, f"{signal.Signals(sig).name} is not handled"
            os.kill(os.getpid(), sig)
            time.sleep(0.01)  # the handler runs in the main thread, between two bytecodes
            came[sig] = (stop.signal, stop.cpu_limit)
            return 0

        return held

    previous = signal.getsignal(signal.SIGXCPU)
    try:
        for sig in (signal.SIGUSR1, signal.SIGXCPU):
            monkeypatch.setattr(train_loop, "_held", opens(sig))
            assert train_loop.pretrain(PretrainConfig()) == 0
    finally:
        signal.signal(signal.SIGXCPU, previous)  # a run that met SIGXCPU leaves it ignored
    assert came == {signal.SIGUSR1: (signal.SIGUSR1, False), signal.SIGXCPU: (signal.SIGXCPU, True)}
    assert signal.SIGXCPU not in USER_SIGNALS  # so its stop exits REQUEUE (75), as SIGTERM's


def test_a_ctrl_c_or_a_hang_up_the_shell_ignores_stays_ignored() -> None:
    # A job put in the background without job control (`cmd &` in a script) ignores SIGINT, and a run
    # under nohup SIGHUP: the run keeps it so. A preemption's signal is the run's to take, ignored or not.
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)}
    try:
        for sig in before:
            signal.signal(sig, signal.SIG_IGN)
        StopRequest(tuple(before), speaks=False)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)
        StopRequest((signal.SIGINT,), speaks=False)
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_group_stops_for_a_preemption_wherever_it_came_else_for_its_user() -> None:
    # One process's Ctrl-C made the others exit 75 (requeue) and it 130, logged "signal on another process".
    from birdjepa.pretrain.stop import group_stop

    term, ctrl_c, hup = int(signal.SIGTERM), int(signal.SIGINT), int(signal.SIGHUP)
    assert group_stop([0, 0]) is None
    assert group_stop([0, ctrl_c]) == group_stop([ctrl_c, 0]) == ctrl_c
    assert group_stop([ctrl_c, term]) == group_stop([term, hup]) == term
    assert group_stop([hup, ctrl_c]) == hup  # the lowest process's, where both are the user's


def repeat_until_exit(proc: subprocess.Popen, sig: int) -> None:
    while proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        time.sleep(0.01)


@pytest.mark.slow  # two trainers compile and start: CI runs it
def test_a_sigterm_stops_verify_resume_once_both_runs_saved_and_a_second_one_is_refused(
    demo_dir: Path, tmp_path: Path
) -> None:
    # A SIGTERM (`kill PID`, a scheduler's) reached verify-resume alone: it died, and its two trainers
    # trained on, orphans. A second verify-resume of the same --run removed the first's runs as they
    # trained. (A Ctrl-C, which the terminal sends the trainers too: the sweep's Ctrl-C test; one
    # implementation, `birdjepa.children`.)
    argv = ["birdjepa", "verify-resume", "--run", "v", "--log.runs-dir", str(tmp_path), "--data.batch-size",
            "8", *data_flags(demo_dir), "--steps", "400", *NO_EVAL, "--ckpt-every", "1000", "--resume-at",
            "300"]  # fmt: skip
    start = f"import sys, runpy; sys.argv = {argv!r}; runpy.run_module('birdjepa.cli', run_name='__main__')"
    proc = subprocess.Popen([sys.executable, "-c", start], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    runs = [tmp_path / "verify-v" / name for name in ("straight", "resumed")]
    while not all((r / "metrics.jsonl").exists() and metrics_by_step(r) for r in runs):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    second = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stdout + second.stderr
    assert f"ERROR: verify-resume: run verify-v is held by pid {proc.pid} on " in second.stdout, second.stdout
    os.kill(proc.pid, signal.SIGTERM)  # to verify-resume alone
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Traceback" not in out, out
    last = out.strip().splitlines()[-1]
    assert last.startswith("verify-resume: interrupted (SIGTERM); both runs saved where they stopped"), out
    for run in runs:  # each trainer saved where the SIGTERM found it, and exited as a preempted one does
        (stop,) = events(run, "stop")
        assert stop["exit_code"] == 75 and Checkpointer(run).latest_step() == stop["step"] < 299, stop


def test_resume_never_refuses_a_run_directory_that_already_holds_a_run(
    demo_dir: Path, straight: Path, capsys: pytest.CaptureFixture
) -> None:
    before = sorted(p.name for p in (straight / "checkpoints").iterdir())
    log = (straight / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["pretrain", *pretrain_flags(demo_dir, straight.parent, "straight", "--resume", "never")])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --resume 'never': {straight} already holds a run: give another --run, or remove that folder "
        "to start this one over"
    )
    assert sorted(p.name for p in (straight / "checkpoints").iterdir()) == before
    assert (straight / "metrics.jsonl").read_bytes() == log  # nothing written: not a second run beside it


def test_verify_resume_signals_a_segment_once_it_logged_the_step_not_its_resume_event(tmp_path: Path) -> None:
    # The resume event a segment writes at its first step, before it trains, counted as that step logged:
    # --resume-at 2 --signal-at 3 sent the SIGTERM before the trainer's handler was there (exit -15).
    from birdjepa.resume.verify import _last_logged_step

    lines = [{"step": 2, "train/loss": 1.0}, {"event": "resume", "step": 3}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert _last_logged_step(tmp_path) == 2


@pytest.mark.parametrize(
    "args,line",
    [
        (["--resume-at", "10"], "verify-resume: error: --resume-at 10: must be a step in [0, 4]"),
        (["--resume-at", "2", "--run", "../x"], "verify-resume: error: --run '../x': must be a folder name"),
        # The segment stopped past the end (or the next --resume-at), a failure minutes in.
        (["--signal-at", "2"], "verify-resume: error: --signal-at 2: must leave 4 steps before the next"),
        (
            [],
            "verify-resume: error: --resume-at (): give at least one --resume-at step or --signal-at",
        ),  # a traceback
        # A traceback: past the file system's 255 bytes with the verification's prefix (in every command).
        (["--resume-at", "2", "--run", "x" * 250], "verify-resume: error: --run 'xxx"),
        # Each failed only once both runs had trained, as a failed resume (max_abs_diff=inf).
        (
            ["--steps", "12", "--log-every", "4", "--signal-at", "4", "--resume-at", "8"],
            "verify-resume: error: --signal-at 4: must leave 7 steps before the next --resume-at",
        ),
        (
            ["--resume-at", "2", "--workers-after-resume", "2000"],
            "verify-resume: error: --workers-after-resume 2000: must be at most 1024",
        ),
    ],
    ids=[
        "resume-at-past-the-run",
        "run-outside-the-runs-folder",
        "signal-at-too-late",
        "no-interruption",
        "run-name-too-long",
        "signal-at-too-late-for-its-logged-row",
        "workers-after-resume-out-of-range",
    ],
)
def test_verify_resume_refuses_an_option_that_cannot_work_in_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, args: list[str], line: str
) -> None:
    # --resume-at past the run exited 1, as if the runs had differed; a --run outside the runs folder
    # reached the subprocesses (and the rmtree of an earlier verification's folder) unchecked.
    argv = ["verify-resume", "--run", "v", "--log.runs-dir", str(tmp_path), "--steps", "6",
            "--data.batch-size", "4", "--eval-every", "0", *args]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["birdjepa", *argv])  # what it passes on to pretrain, unrefused
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    (said,) = capsys.readouterr().err.strip().splitlines()
    assert said.startswith(line), said
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_verify_resume_over_a_folder_that_holds_something_else_is_refused_and_touches_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run named verify-x: `verify-resume --run x` removed its checkpoints, config and log as an earlier
    # verification's output, exit 0. An earlier verification's own output is still started afresh.
    run = tmp_path / "verify-x"
    (run / "checkpoints" / "5").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    argv = ["verify-resume", "--run", "x", "--log.runs-dir", str(tmp_path), "--steps", "6",
            "--data.batch-size", "4", "--eval-every", "0", "--resume-at", "3"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["birdjepa", *argv])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        f"error: verify-resume writes its two runs into {run}, which holds checkpoints, metrics.jsonl, "
        "not an earlier verification's output: give another --run or --log.runs-dir; nothing was touched; "
        "exit 2\n"
    )
    assert sorted(p.name for p in run.rglob("*")) == ["5", "checkpoints", "metrics.jsonl"]


def test_verify_resume_passes_none_of_its_own_options_on_whichever_way_they_are_spelled() -> None:
    # tyro takes --resume_at too: passed on, every trainer refused it, and verify-resume ended in a traceback.
    from birdjepa.resume.verify import pretrain_args

    argv = [
        "--resume_at",
        "2",
        "3",
        "--steps",
        "6",
        "--signal_at=4",
        "--workers_after_resume",
        "1",
        "--sequential",
    ]
    assert pretrain_args(argv) == ["--steps", "6"]


def test_verify_resume_into_a_folder_it_cannot_write_is_one_line_exit_74(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read-only --log.runs-dir: LeaseUnwritable's traceback, exit 1 (pretrain says this line).
    (tmp_path / "runs").write_text("")  # a file where the runs folder goes: as unwritable as read-only
    argv = ["verify-resume", "--run", "v", "--log.runs-dir", str(tmp_path / "runs" / "in"), "--steps", "6",
            "--data.batch-size", "4", "--eval-every", "0", "--resume-at", "2"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["birdjepa", *argv])
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(argv)
    out = capsys.readouterr().out
    assert e.value.code == 74 and "ERROR: verify-resume: cannot create the run directory" in out, out


PUMP = """
import sys
import threading
from pathlib import Path
from birdjepa.resume.verify import _pump
_pump((f"step {i}\\n" for i in range(20000)), "[straight] ", Path(sys.argv[1]))
print("pumped", file=sys.stderr)
"""


def test_verify_resume_reads_its_trainers_on_when_its_console_closes(tmp_path: Path) -> None:
    # `verify-resume ... | head -1`: the readers of the trainers' output died at the first broken pipe,
    # so both trainers blocked writing theirs, for good (a SIGTERM did not end it); console.log cut short.
    log = tmp_path / "console.log"
    proc = subprocess.Popen([sys.executable, "-c", PUMP, str(log)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "[straight] step 0\n"
    proc.stdout.close()  # as `head -1` does
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0 and "pumped" in err and "Traceback" not in err, err
    assert "WARNING the console cannot be written (Broken pipe): the runs go on" in err, err
    assert log.read_text().splitlines() == [f"step {i}" for i in range(20000)]
