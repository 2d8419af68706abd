"""Nothing lost, whatever happens, in the real loop: a step that is not finite is never applied or
saved (stop: the run ends there and its last checkpoint resumes; skip: the skipped update is part of
the state and resumes exactly), and damaged checkpoints are passed over for the newest one that
verifies (the run then equals the straight run), or the run stops with one line and exit 65. An
error that stops the run (a device's, a loader worker's) goes up after what the run finished is written."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import a_demo_shard_beside_its_vocabulary
from test_loader_bad_input import read_table, with_corrupt_rows, write_table

from birdjepa import exit_codes
from birdjepa.config import DataConfig, DebugConfig, LogConfig, OptimConfig, PretrainConfig
from birdjepa.pretrain import loop as train_loop
from birdjepa.pretrain.loop import pretrain
from birdjepa.resume.compare import compare_runs
from birdjepa.rundir.checkpoint import DAMAGED_DIR, Checkpointer
from birdjepa.rundir.metrics_log import metrics_by_step, read_metrics

STEPS = 6


def config(demo_dir: Path, runs: Path, run: str, **kw: object) -> PretrainConfig:
    """The shape of test_train_resume's runs (6 steps of 8 clips), checkpoints after steps 1, 3 and 5,
    no evaluation."""
    data = DataConfig(train=str(demo_dir / "train"), eval=str(demo_dir / "eval"), batch_size=8)
    options: dict = {"steps": STEPS, "eval_every": 0, "ckpt_every": 2, **kw}
    return PretrainConfig(run=run, data=data, log=LogConfig(runs_dir=runs), **options)


def events(run_dir: Path, kind: str) -> list[dict]:
    return [x for x in read_metrics(run_dir) if x.get("event") == kind]


def differing(a: Path, b: Path) -> list[str]:
    return [f"{d.name} at step {d.first_step}: {d.first_values}" for d in compare_runs(a, b) if d.max_abs]


def steps_on_disk(run_dir: Path) -> list[int]:
    return Checkpointer(run_dir, keep=None, async_save=False).all_steps()


@pytest.fixture(scope="module")
def straight(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = config(demo_dir, tmp_path_factory.mktemp("straight"), "straight")
    assert pretrain(cfg) == 0
    return cfg.run_dir


@pytest.fixture(scope="module")
def stopped(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The straight run's options, stopped after step 3 (checkpoints 1 and 3): each test resumes a copy."""
    cfg = config(demo_dir, tmp_path_factory.mktemp("stopped"), "stopped")
    assert pretrain(dataclasses.replace(cfg, stop_at_step=3)) == 0
    return cfg.run_dir


def test_an_update_that_overflows_with_finite_gradients_stops_the_run_in_one_line(
    demo_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The probe's LR 1e30 times its gradients overflows its parameters: the loss and the gradients were
    # finite, so the guard let the update through, and the save that refused the state was a traceback.
    from birdjepa.config import OptimConfig
    from birdjepa.pretrain.trainer import Trainer

    real_close = Trainer.close

    def close(self, exit_code: int) -> None:  # a Ctrl-C as the run closes said "exit 130", and it was 70
        os.kill(os.getpid(), signal.SIGINT)
        real_close(self, exit_code)

    monkeypatch.setattr(Trainer, "close", close)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    cfg = config(demo_dir, tmp_path, "over", optim=OptimConfig(probe_lr_scale=1e30), ckpt_every=1)
    try:
        assert pretrain(cfg) == exit_codes.NONFINITE
    finally:
        signal.signal(signal.SIGINT, previous)
    out, err = capfd.readouterr()
    assert f"Ctrl-C: the run is stopping already, exit {exit_codes.NONFINITE} (the line above" in err, err
    (line,) = [x for x in out.splitlines() if x.startswith("ERROR")]
    assert re.match(r"ERROR: the state after step \d is not finite \(param_norm=inf\) though its loss and "
                    r"gradients were: an update overflowed", line), line  # fmt: skip
    (event,) = events(cfg.run_dir, "nonfinite")
    assert event["action"] == "stop" and event["metrics"] == ["param_norm"]


def test_a_diverging_step_stops_the_run_unsaved_and_its_last_checkpoint_resumes(
    demo_dir: Path, straight: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Step 3's batch is NaN (--debug.nonfinite-steps): its loss and every gradient are not finite.
    cfg = config(demo_dir, tmp_path, "nan", debug=DebugConfig(nonfinite_steps=(3,)))
    assert pretrain(cfg) == exit_codes.NONFINITE
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ERROR")]
    assert line.startswith("ERROR: step 3 is not finite: train/loss") and "newest checkpoint (1)" in line
    assert line.endswith(f"exit {exit_codes.NONFINITE}")
    # Nothing after step 1 was saved, although --ckpt-every 2 asked for a save after step 3.
    assert steps_on_disk(cfg.run_dir) == [1]
    (event,) = events(cfg.run_dir, "nonfinite")
    assert event["step"] == 3 and event["action"] == "stop" and "train/loss" in event["metrics"]
    assert "encoder/patch_embed/kernel" in event["params"]
    logged = metrics_by_step(cfg.run_dir)
    assert logged[3]["train/loss"] == "nan" and 4 not in logged  # (JSON has no NaN: the log says 'nan')
    # The same command without the bad batch resumes from checkpoint 1 and trains the straight run.
    assert pretrain(dataclasses.replace(cfg, debug=DebugConfig())) == 0
    assert [e["checkpoint"] for e in events(cfg.run_dir, "resume")] == [1]
    assert differing(straight, cfg.run_dir) == []


def test_a_non_finite_stop_says_where_the_checkpoints_finite_parameters_blew_up() -> None:
    # --optim.lr 1e3 --on-nonfinite skip: every checkpoint finite, their parameters' norm 41 -> 1.6e10,
    # and the line advised a resume from the newest, which could only blow up again; measured against the
    # oldest kept checkpoint, a growth before it (--ckpt-keep 3) advised the same, and so did a line with
    # no checkpoint at all ("no checkpoint yet. Resume from it").
    from birdjepa.pretrain.trainer import what_to_resume

    assert what_to_resume({0: 41.4, 1: 41.5, 2: 1.59e10}, 41.0) == (
        "the newest checkpoint (2) is finite, but its parameters' norm is 1.59e+10, 3.88e+08x step 0's: move "
        "the checkpoints after 1 aside",
        True,
    )
    assert what_to_resume({7: 4.8e11, 11: 4.8e11}, 41.0) == (
        "the newest checkpoint (11) is finite, but its parameters' norm is 4.8e+11, 1.17e+10x step 0's, and "
        "every checkpoint's grew so: none is worth resuming; train it in a new run",
        False,
    )
    assert what_to_resume({}, 41.0) == ("no checkpoint was written yet: the same command starts the run over",
                                        False)  # fmt: skip
    # An older one's growth (recovered since) is not the newest's: it named the newest to move aside.
    recovered = {10: 41.0, 20: 1e6, 30: 60.0}
    assert what_to_resume(recovered, 41.0) == ("the newest checkpoint (30) is finite", True)
    for norms, start in (({0: 41.4, 3: 45.0}, 41.0), ({3: 45.0}, 0.0)):  # from zeros: no ZeroDivisionError
        assert what_to_resume(norms, start) == ("the newest checkpoint (3) is finite", True)


def test_skip_mode_skips_the_update_and_resumes_exactly_across_it(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    skip = {"on_nonfinite": "skip", "debug": DebugConfig(nonfinite_steps=(3,)), "ckpt_every": 0}
    straight = config(demo_dir, tmp_path, "skip", **skip)
    assert pretrain(straight) == 0
    logged = metrics_by_step(straight.run_dir, everything=True)
    assert [logged[s]["train/skipped_updates"] for s in range(STEPS)] == [0, 0, 0, 1, 1, 1]
    assert logged[3]["train/update_norm"] == 0.0
    assert logged[3]["train/param_norm"] == logged[2]["train/param_norm"]
    assert [e["action"] for e in events(straight.run_dir, "nonfinite")] == ["skip"]
    # Stopped right after the skipped step and resumed: the same run, bit for bit.
    seg = config(demo_dir, tmp_path, "seg", **skip)
    assert pretrain(dataclasses.replace(seg, stop_at_step=3)) == 0
    meta = Checkpointer(seg.run_dir, keep=None, async_save=False).read_meta(3)
    assert (meta["skipped"], meta["skip_streak"]) == (1, 1)
    assert pretrain(seg) == 0
    assert differing(straight.run_dir, seg.run_dir) == []
    # Under accumulation a skipped micro-step moves every later update one micro-step on: the monitor's
    # checks, by step number, then met no update, and said every parameter was frozen. A check due at a
    # skipped step is made at the next applied one: a streak of skips read every parameter as frozen.
    accum = config(demo_dir, tmp_path, "accum", on_nonfinite="skip", monitor_interval=1, ckpt_every=0,
                   debug=DebugConfig(nonfinite_steps=(1,)), optim=OptimConfig(grad_accum=2))  # fmt: skip
    assert pretrain(accum) == 0
    logged = metrics_by_step(accum.run_dir, everything=True)
    checked = [s for s in range(STEPS) if "monitor/frozen" in logged[s]]
    assert checked == [2, 4] and all(logged[s]["monitor/frozen"] == 0 for s in checked), logged
    # Too many in a row: the run stops as it would have without skipping.
    many = config(
        demo_dir,
        tmp_path,
        "many",
        on_nonfinite="skip",
        max_skips=2,
        debug=DebugConfig(nonfinite_steps=(2, 3, 4)),
    )
    capsys.readouterr()
    assert pretrain(many) == exit_codes.NONFINITE
    assert [(e["step"], e["action"]) for e in events(many.run_dir, "nonfinite")] == [(2, "skip"), (3, "stop")]
    # It advised "--on-nonfinite skip", the mode it was in.
    assert (
        "--allow-config-change, or with a --max-skips above 2 (0: never stop); exit 70"
        in capsys.readouterr().out
    )


def damage(run_dir: Path, step: int) -> None:
    """Flip one byte in the middle of checkpoint ``step``'s largest array file."""
    state = run_dir / "checkpoints" / str(step) / "state"
    files = sorted(state.rglob("d/*"), key=lambda p: p.stat().st_size)
    data = bytearray(files[-1].read_bytes())
    data[len(data) // 2] ^= 0x40
    files[-1].write_bytes(bytes(data))


def test_a_damaged_checkpoint_falls_back_and_the_run_equals_the_straight_one(
    demo_dir: Path, straight: Path, stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = config(demo_dir, tmp_path, "damaged")
    shutil.copytree(stopped, cfg.run_dir)
    damage(cfg.run_dir, 3)
    capsys.readouterr()
    assert pretrain(cfg) == 0
    out = capsys.readouterr().out
    assert "WARNING checkpoint 3 is damaged" in out
    (fallback,) = events(cfg.run_dir, "ckpt_fallback")
    assert fallback["step"] == 2 and fallback["checkpoint"] == 3
    assert fallback["moved_to"] == str(cfg.run_dir / DAMAGED_DIR / "3")
    assert [e["checkpoint"] for e in events(cfg.run_dir, "resume")] == [1]
    assert (cfg.run_dir / DAMAGED_DIR / "3").is_dir()
    assert differing(straight, cfg.run_dir) == [] and not events(cfg.run_dir, "checkpoint_missing")
    # Removed by hand (or lost with a disk), not damaged: the resume from 1 retrained 2-3 without a word.
    cfg = config(demo_dir, tmp_path, "removed")
    shutil.copytree(stopped, cfg.run_dir)
    shutil.rmtree(cfg.run_dir / "checkpoints" / "3")
    capsys.readouterr()
    assert pretrain(cfg) == 0
    said = "checkpoint 3, which the log says this run saved when it stopped, is gone from"
    assert f"WARNING {said}" in capsys.readouterr().out
    (missing,) = events(cfg.run_dir, "checkpoint_missing")
    assert missing["step"] == 2 and missing["why"].startswith(said)
    assert missing["why"].endswith("resuming from checkpoint 1, steps 2-3 train again")
    assert differing(straight, cfg.run_dir) == []


def test_a_bare_resume_past_a_damaged_checkpoint_takes_the_options_of_the_one_it_resumes(
    demo_dir: Path, straight: Path, stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Checkpoint 4 holds a declared change (lr 0.002) and is damaged: its options were read all the same,
    # and the resume of checkpoint 3 was refused for them, "leave them out" of a command that gave none.
    from birdjepa.cli import main

    cfg = config(demo_dir, tmp_path, "declared")
    shutil.copytree(stopped, cfg.run_dir)
    run = ["pretrain", "--run", "declared", "--log.runs-dir", str(tmp_path)]
    main([*run, "--optim.lr", "0.002", "--allow-config-change", "--stop-at-step", "4"])
    damage(cfg.run_dir, 4)
    capsys.readouterr()
    main(run)  # exit 0: a non-zero code is a SystemExit
    out = capsys.readouterr().out
    assert "run declared: options from checkpoint 3's config" in out
    assert "WARNING checkpoint 4 is damaged" in out
    assert [e["checkpoint"] for e in events(cfg.run_dir, "resume")] == [3, 3]
    assert differing(straight, cfg.run_dir) == []


def test_an_option_that_shapes_the_state_changed_at_a_resume_is_named(
    straight: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # The refusal was 1,500 characters of tree paths ("in checkpoint only: ...") naming no option.
    from birdjepa.cli import main

    shutil.copytree(straight, tmp_path / "copy")
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["pretrain", "--run", "copy", "--log.runs-dir", str(tmp_path), "--optim.name", "muon"])
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ERROR")]
    assert e.value.code == exit_codes.RESUME_CHECK and len(line) < 600, line
    said = "ERROR: cannot resume: the options optim.name:adamw->muon changed since checkpoint 5"
    assert line.startswith(said), line


def test_a_class_added_to_the_data_at_a_resume_is_named_with_its_vocabulary(
    demo_dir: Path, straight: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # A second `prepare` of the folder with one more class: "checkpoint 5 holds a state of another shape
    # than these options build (leaf params/probe/head/bias saved as shape=[16] ...)", naming no data.
    from birdjepa.cli import main

    shutil.copytree(straight, tmp_path / "copy")
    n = len(json.loads((demo_dir / "train" / "vocab.json").read_text())["names"])
    for split in ("train", "eval"):  # the shards linked, each split's vocabulary one class longer
        (tmp_path / split).mkdir()
        for shard in (demo_dir / split).glob("*.arrow"):
            (tmp_path / split / shard.name).symlink_to(shard)
        vocab = json.loads((demo_dir / split / "vocab.json").read_text())
        (tmp_path / split / "vocab.json").write_text(
            json.dumps({**vocab, "names": [*vocab["names"], "zzznew"]})
        )
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["pretrain", "--run", "copy", "--log.runs-dir", str(tmp_path),
              "--data.train", str(tmp_path / "train"), "--data.eval", str(tmp_path / "eval")])  # fmt: skip
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ERROR")]
    vocab = tmp_path / "train" / "vocab.json"
    said = f"ERROR: cannot resume: the train data holds {n + 1} classes ({vocab}), checkpoint 5's probe {n}"
    assert e.value.code == exit_codes.RESUME_CHECK and line.startswith(said), line


def test_no_checkpoint_that_verifies_is_one_line_and_exit_65(
    demo_dir: Path, straight: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = config(demo_dir, tmp_path, "all-damaged")
    shutil.copytree(straight, cfg.run_dir)
    for step in steps_on_disk(cfg.run_dir):
        damage(cfg.run_dir, step)
    capsys.readouterr()
    assert pretrain(cfg) == exit_codes.RESUME_CHECK
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ERROR")]
    assert line.startswith("ERROR: cannot resume: no checkpoint in") and "verifies" in line
    # It advised nothing, and the same command then started the run over without a word of why.
    assert line.endswith(
        f"; the next start begins the run over at step 0: to resume, put a good copy of one "
        f"(a backup) in {cfg.run_dir / 'checkpoints'} first; exit {exit_codes.RESUME_CHECK}"
    )
    assert steps_on_disk(cfg.run_dir) == []


@pytest.mark.parametrize("failing", [3, 4], ids=["right-after-a-save", "a-step-later"])
def test_an_error_that_stops_the_run_leaves_the_checkpoint_being_written_and_the_row_being_held(
    failing: int, demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step of call ``failing`` raises (a device error, say). Right after step 1's save, that
    checkpoint is still being written in the background (the process left only Orbax's temporary
    folder); a step later, step 2's row is held for its norms (it was lost). The error goes up as it
    is, once both are written."""
    advance = train_loop.advance
    calls = []

    def fails(*args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        if len(calls) == failing:
            raise RuntimeError("planted: the step fails")
        return advance(*args, **kwargs)

    monkeypatch.setattr(train_loop, "advance", fails)
    cfg = config(demo_dir, tmp_path, "failing")
    with pytest.raises(RuntimeError, match="planted: the step fails"):
        pretrain(cfg)
    rows = [r for r in read_metrics(cfg.run_dir) if "event" not in r]
    assert [r["step"] for r in rows] == list(range(failing - 1)), rows
    assert all(isinstance(r["train/param_norm"], float) for r in rows), rows
    assert sorted(p.name for p in (cfg.run_dir / "checkpoints").iterdir()) == ["1"]


@pytest.mark.parametrize(
    ("during", "rows", "saved"),
    # It checks before its first write, after each step, and before a save; its saves' commits too.
    [
        ("start", None, []),
        ("step", [0, 1], [1]),
        ("callbacks", [0], []),
        ("last save", [0, 1, 2, 3, 4, 5], [1, 3]),
        ("sync save", [0, 1, 2, 3], [1]),
    ],
)
def test_a_trainer_whose_run_was_taken_over_while_it_was_stopped_stops_before_its_next_write(
    during: str, rows: list[int] | None, saved: list[int], demo_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
) -> None:  # fmt: skip
    """Stopped (a suspended job, a paused node) for longer than a taker waits, as it started (restoring
    and compiling), during step 2, during step 1's callbacks, before its save, or with a save written but
    not yet renamed into place (the last, in the background; step 3's, synchronous), and taken over
    meanwhile. Woken, it trained on into the taker's run: its rows logged beside the taker's, its
    rotation deleting the taker's checkpoints, then a traceback; its save in flight was committed into
    the taker's run after the loop stopped. Now it writes nothing more: one line, exit 2, and the taker's
    lease stays."""
    from birdjepa.pretrain.trainer import Trainer
    from birdjepa.rundir import lease as lease_lib

    held: list[lease_lib.Lease] = []
    taker: dict[str, Any] = {}
    # The "save" cases: the process stops once the save is written, before its rename (its commit asks
    # whether the lease is still its own then), and wakes taken over.
    in_flight, taken, commits = threading.Event(), threading.Event(), []
    real_still_held, real_save = lease_lib.Lease.still_held, Trainer.save

    def still_held(lease: lease_lib.Lease) -> None:
        if in_flight.is_set():
            stopped_and_taken_over()
        real_still_held(lease)

    def save(trainer: Trainer, state: Any, *args: Any, **kwargs: Any) -> Any:
        commits.append(trainer.ckpt)
        if int(state.step) != {"last save": 6, "sync save": 4}.get(during):
            return real_save(trainer, state, *args, **kwargs)
        in_flight.set()
        out = real_save(trainer, state, *args, **kwargs)
        # The loop goes on once the commit asked (or, where nothing asks, once it renamed the save).
        deadline, written = time.monotonic() + 120, trainer.ckpt.directory / str(int(state.step) - 1)
        while not taken.is_set() and not written.is_dir() and time.monotonic() < deadline:
            time.sleep(0.01)
        stopped_and_taken_over()
        return out

    def acquire(*args: Any, **kwargs: Any) -> lease_lib.Lease:
        held.append(lease_lib.acquire(*args, **kwargs))
        return held[0]

    def stopped_and_taken_over() -> None:
        (lease,) = held
        lease.renewed -= lease_lib.STALE_AFTER_S + 1  # no heartbeat while it was stopped
        if taken.is_set():
            return
        taker.update({**lease.holder, "token": "f" * 16, "pid": 4242, "heartbeat": time.time()})
        while not lease_lib._take_over(lease.path, lease.holder, taker):  # the heartbeat holds it
            time.sleep(0.01)
        taken.set()

    real_open, real_advance, real_make_callbacks = (
        train_loop.open_segment,
        train_loop.advance,
        train_loop.make_callbacks,
    )

    def open_segment(*args: Any, **kwargs: Any) -> Any:
        segment = real_open(*args, **kwargs)
        if during == "start":
            stopped_and_taken_over()
        return segment

    def advance(fns: Any, cfg: PretrainConfig, state: Any, batch: Any) -> Any:
        out = real_advance(fns, cfg, state, batch)
        if during == "step" and int(state.step) == 2:
            # Stopped once step 1's background save was on disk: on a loaded machine it was still being
            # written when the takeover came, and the checkpoint this test expects was not there yet.
            deadline = time.monotonic() + 120
            while steps_on_disk(cfg.run_dir) != [1] and time.monotonic() < deadline:
                time.sleep(0.05)
            stopped_and_taken_over()
        return out

    def make_callbacks(*args: Any) -> Any:
        callbacks = real_make_callbacks(*args)
        step_end = callbacks.step_end

        def taken_at_step_1(end: Any) -> Any:
            if end.step == 1:
                stopped_and_taken_over()
            return step_end(end)

        callbacks.step_end = taken_at_step_1 if during == "callbacks" else step_end
        return callbacks

    monkeypatch.setattr(train_loop, "acquire", acquire)
    monkeypatch.setattr(train_loop, "open_segment", open_segment)
    monkeypatch.setattr(train_loop, "advance", advance)
    monkeypatch.setattr(train_loop, "make_callbacks", make_callbacks)
    monkeypatch.setattr(lease_lib.Lease, "still_held", still_held)
    monkeypatch.setattr(Trainer, "save", save)
    cfg = config(demo_dir, tmp_path, "taken")  # saves after steps 1, 3 and 5
    # A synchronous save commits in the loop's thread: its refusal was said as a failed write, exit 74,
    # and that report removed the run's temporary folders (a taker's save among them).
    cfg = dataclasses.replace(cfg, ckpt_async=during != "sync save")
    capsys.readouterr()
    assert pretrain(cfg) == exit_codes.USAGE
    for ckpt in commits[-1:]:  # the background write of the last save, ended (the process goes on)
        with contextlib.suppress(Exception):
            ckpt._mngr.wait_until_finished()
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ERROR")]
    assert re.fullmatch(
        r"ERROR: this trainer went \d+ s without renewing its lease \(suspended, or cut off\), "
        r"and run taken is held by pid 4242 on .*; it stops without writing; exit 2",
        line,
    ), line
    if rows is None:  # nothing written: no log, no config
        assert sorted(p.name for p in cfg.run_dir.iterdir()) == ["checkpoints", "lease.json"]
    else:
        assert [r["step"] for r in read_metrics(cfg.run_dir) if "event" not in r] == rows
    assert steps_on_disk(cfg.run_dir) == saved
    assert json.loads((cfg.run_dir / "lease.json").read_text()) == taker


def test_a_record_the_loader_cannot_read_is_a_warning_naming_its_shard_and_row(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # Rows 1 and 4 of a shard are not audio: the run trains on without them and says so as it happens.
    train = tmp_path / "train"
    shard = a_demo_shard_beside_its_vocabulary(demo_dir, train)
    write_table(with_corrupt_rows(read_table(shard), {1, 4}), train / "a.arrow")
    cfg = config(demo_dir, tmp_path, "skips", stop_at_step=1)  # the straight run's step
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, train=str(train)))
    assert pretrain(cfg) == 0
    said = [e["message"] for e in events(cfg.run_dir, "warning")]
    assert said and all(
        m.startswith(f"skipped a record the loader cannot read: {train / 'a.arrow'} row ") for m in said
    ), said
    assert {m.split(" row ")[1].split(":")[0] for m in said} == {"1", "4"}, said
    assert f"WARNING {said[0]}" in capsys.readouterr().out  # on the console too


def test_a_start_with_no_checkpoint_to_resume_keeps_the_earlier_log_apart(
    demo_dir: Path, straight: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # The run's checkpoints removed (or a kill -9 before its first save): the next start begins at step 0,
    # and its rows followed the earlier start's under the same step numbers, both restart 0.
    cfg = config(demo_dir, tmp_path, "again")
    shutil.copytree(straight, cfg.run_dir)
    earlier = (cfg.run_dir / "metrics.jsonl").read_text()
    shutil.rmtree(cfg.run_dir / "checkpoints")
    capsys.readouterr()
    # Another option than its config.json's (a bare command line took this birdjepa's defaults): said.
    assert pretrain(dataclasses.replace(cfg, stop_at_step=1, ckpt_keep=cfg.ckpt_keep + 2)) == 0
    kept = cfg.run_dir / "metrics.earlier-1.jsonl"
    said = capsys.readouterr().out
    assert f"the log of an earlier start there is kept as {kept}" in said
    assert (
        f"begins at step 0, with other options than its config.json (ckpt_keep: {cfg.ckpt_keep + 2} -> "
        in said
    )
    assert kept.read_text() == earlier
    steps = [r["step"] for r in read_metrics(cfg.run_dir) if "event" not in r]
    assert steps == [0, 1], steps
    again, first = metrics_by_step(cfg.run_dir), metrics_by_step(straight)
    assert all(again[s][k] == first[s][k] for s in steps for k in ("train/loss", "train/param_norm"))


def test_a_model_larger_than_the_memory_is_one_line_before_an_array_is_allocated(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    # 9.6e9 parameters x 4 copies at --model.dim 20000 (here 2.4e11): the parameters were allocated one by
    # one, until XLA's RESOURCE_EXHAUSTED (a traceback) or, on a host that lets them through, the kernel's
    # out-of-memory killer (no word at all).
    cfg = config(demo_dir, tmp_path, "huge", model=dataclasses.replace(PretrainConfig().model, dim=100_000))
    assert pretrain(cfg) == exit_codes.USAGE
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert re.fullmatch(
        r"error: the model's 240,[\d,]+ parameters, their gradients and the optimizer state take [\d.]+ "
        r"GiB on one cpu device, which holds [\d.]+ GiB, before a step's activations: train a smaller .*",
        line,
    ), line
    assert steps_on_disk(cfg.run_dir) == []
    # Under `ulimit -v` (or -d) a state 3x too large passed the check, and XLA's RESOURCE_EXHAUSTED came
    # after the compile, told to use a smaller batch.
    import resource

    from birdjepa.train import memory_fit

    real = resource.getrlimit
    for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        capped = lambda r, which=which: (2**30, resource.RLIM_INFINITY) if r == which else real(r)  # noqa: E731
        with pytest.MonkeyPatch.context() as m:
            m.setattr(resource, "getrlimit", capped)
            assert memory_fit.host_bytes() == 2**30


@pytest.mark.slow  # 26 s: the step compiles (ahead, in a thread the process waits for) before the failure
def test_a_device_out_of_memory_is_one_line_and_exit_2(demo_dir: Path, tmp_path: Path) -> None:
    # A state that fits the host, in a process whose address space does not hold it (as a GPU's memory
    # would not): XLA's RESOURCE_EXHAUSTED was a traceback, exit 1.
    import subprocess
    import sys

    limited = ["bash", "-c", 'ulimit -v 6291456 && exec "$@"', "-"]  # 6 GiB (no preexec_fn: JAX's threads)
    args = [*limited, sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", "r",
            "--log.runs-dir", str(tmp_path),
            "--data.train", str(demo_dir / "train"), "--data.eval", str(demo_dir / "eval"), "--steps", "2",
            "--eval-every", "0", "--data.batch-size", "2", "--model.dim", "3072"]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    said = [line for line in done.stdout.splitlines() if line.startswith("ERROR")]
    assert done.returncode == exit_codes.USAGE and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(said) == 1 and said[0].startswith("ERROR: the device ran out of memory (RESOURCE_EXHAUSTED: ")


def test_a_thread_that_cannot_start_is_one_line_and_exit_2(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # ulimit -u, a cgroup's pids.max met by the norms' thread: a traceback, exit 1.
    from birdjepa.train import param_norms

    def no_thread(*_: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(param_norms, "later", no_thread)
    assert pretrain(config(demo_dir, tmp_path, "threads")) == exit_codes.USAGE
    (said,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ERROR")]
    assert said.startswith("ERROR: a thread could not be started (can't start new thread): a limit on this "
                           "process's threads (ulimit -u, a cgroup's pids.max) was met"), said  # fmt: skip
    assert said.endswith("; no checkpoint was written yet: the same command starts the run over; exit 2")


def test_a_device_out_of_memory_after_a_checkpoint_advises_what_goes_on_with_the_run(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # XLA's error planted at step 2 (no device runs out here): the line advised a smaller batch or model,
    # which the resume then refused (they change what the run trains), and --model.remat without the flag
    # it needs. Followed, its advice goes on with the run.
    real = train_loop.advance

    def out_of_memory(fns, cfg, state, batch):  # noqa: ANN001, ANN202
        if int(state.step) == 2 and not cfg.model.remat:
            raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00GiB.")
        return real(fns, cfg, state, batch)

    monkeypatch.setattr(train_loop, "advance", out_of_memory)
    cfg = config(demo_dir, tmp_path, "oom")  # the file's 6-step build: saves after step 1
    assert pretrain(cfg) == exit_codes.USAGE
    (said,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ERROR")]
    assert said == (
        "ERROR: the device ran out of memory (RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
        "1.00GiB.): --model.remat --allow-config-change goes on with this run (activations recomputed, the "
        "same parameters); a smaller --data.batch-size (--optim.grad-accum keeps the batch an update sees) "
        "or a smaller model trains in a new run; the checkpoints written are intact, and the same command "
        "resumes from the newest (1); exit 2"
    ), said
    model = dataclasses.replace(cfg.model, remat=True)
    assert pretrain(dataclasses.replace(cfg, model=model, allow_config_change=True, stop_at_step=2)) == 0
    assert [e["checkpoint"] for e in events(cfg.run_dir, "resume")] == [1]
