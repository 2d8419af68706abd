"""One writer per run: a second trainer on a held run directory says who holds it and touches nothing
(exit 2 by hand, exit 75 after waiting when Slurm started it), and a stale lease is taken over with a
WARNING and an event. Two real processes race for one run directory."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tyro

from birdjepa import exit_codes
from birdjepa.cli import main
from birdjepa.config import PretrainConfig
from birdjepa.pretrain.loop import pretrain
from birdjepa.rundir.layout import LEASE_FILE, METRICS_FILE
from birdjepa.rundir.lease import LEASE_WAIT_ENV, _take_over, acquire
from birdjepa.rundir.metrics_log import read_metrics


def flags(demo_dir: Path, runs: Path, steps: int, *extra: str) -> list[str]:
    return ["--run", "r", "--log.runs-dir", str(runs), "--steps", str(steps), "--eval-every", "0",
            "--data.batch-size", "4", "--data.train", str(demo_dir / "train"), "--data.eval",
            str(demo_dir / "eval"), *extra]  # fmt: skip


def held_by(pid: int, run_dir: Path, job: str | None = None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    lease = {"host": socket.gethostname(), "pid": pid, "job": job, "started": time.time(),
             "token": "0123456789abcdef", "heartbeat": time.time()}  # fmt: skip
    (run_dir / LEASE_FILE).write_text(json.dumps(lease))


@pytest.mark.slow  # two trainings; the racers below prove one winner in the suite
def test_two_trainers_race_for_one_run_directory(demo_dir: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain"]
    first = subprocess.Popen([*cmd, *flags(demo_dir, tmp_path, 40)], stdout=subprocess.PIPE, text=True)
    lease = tmp_path / "r" / LEASE_FILE
    deadline = time.monotonic() + 120
    while not lease.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.2)
    assert lease.exists(), "the first trainer never held the run"
    other = flags(demo_dir, tmp_path, 40, "--optim.lr", "0.003")
    second = subprocess.run([*cmd, *other], capture_output=True, text=True, timeout=300)
    assert first.wait(timeout=600) == 0
    lines = [line for line in second.stdout.splitlines() if "ERROR" in line]
    assert second.returncode == exit_codes.USAGE
    assert len(lines) == 1 and f"run r is held by pid {first.pid} on {socket.gethostname()}" in lines[0]
    logged = [r for r in read_metrics(tmp_path / "r") if "event" not in r]
    assert [r["step"] for r in logged] == list(range(40))  # one run, logged once
    assert {json.loads(Path(tmp_path / "r" / "config.json").read_text())["optim"]["lr"]} == {0.001}
    assert not lease.exists()  # released at the end


def test_a_slurm_requeue_waits_for_the_holder_then_exits_75_and_a_dead_holder_is_taken_over(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = subprocess.Popen(["sleep", "60"])
    held_by(holder.pid, tmp_path / "r", job="912345")  # this job's earlier start, still saving
    monkeypatch.setenv("SLURM_JOB_ID", "912345")
    monkeypatch.setenv(LEASE_WAIT_ENV, "1.5")
    t0 = time.monotonic()
    assert pretrain(tyro.cli(PretrainConfig, args=flags(demo_dir, tmp_path, 2))) == exit_codes.REQUEUE
    assert 1.5 <= time.monotonic() - t0 < 30
    assert f"is held by pid {holder.pid}" in capsys.readouterr().out
    assert not (tmp_path / "r" / METRICS_FILE).exists()  # nothing touched
    # Another job (the sweep submitted twice) or a trainer started by hand: it requeued itself every
    # 2 min, holding its allocation, until that one ended. Not requeued now (after the same wait: none).
    monkeypatch.setenv(LEASE_WAIT_ENV, "0")
    for job in ("912344", None):
        held_by(holder.pid, tmp_path / "r", job=job)
        assert pretrain(tyro.cli(PretrainConfig, args=flags(demo_dir, tmp_path, 2))) == exit_codes.USAGE
        said = capsys.readouterr().out
        assert said.endswith(
            "; this job (912345) is not requeued: one trainer of the run at a time; exit 2\n"
        )
    holder.kill()
    holder.wait()
    monkeypatch.delenv("SLURM_JOB_ID")
    assert pretrain(tyro.cli(PretrainConfig, args=flags(demo_dir, tmp_path, 2))) == 0
    assert "took over a stale lease of pid" in capsys.readouterr().out
    taken = [r for r in read_metrics(tmp_path / "r") if r.get("event") == "lease_taken_over"]
    assert len(taken) == 1 and taken[0]["pid"] == holder.pid and "no longer runs" in taken[0]["why"]


def test_a_lease_without_heartbeat_is_stale_and_a_live_one_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from birdjepa.rundir import lease as lease_lib

    monkeypatch.setattr(lease_lib, "WATCH_S", 0.3)  # another host's silence, watched: the suite's time
    run = tmp_path / "r"
    held_by(os.getpid(), run)  # this process: alive
    with pytest.raises(RuntimeError, match="is held by pid"):
        acquire(run)
    # This host's clock stepped back under a live holder of it: its heartbeat from the future says nothing.
    lease = json.loads((run / LEASE_FILE).read_text())
    (run / LEASE_FILE).write_text(json.dumps({**lease, "heartbeat": time.time() + 3600}))
    with pytest.raises(RuntimeError, match="is held by pid"):
        acquire(run)
    lease = json.loads((run / LEASE_FILE).read_text())
    lease["host"], lease["heartbeat"] = "another-node", time.time() - 3600  # a node that went silent
    (run / LEASE_FILE).write_text(json.dumps(lease))
    taken = acquire(run)
    assert taken.took_over is not None and "no heartbeat for" in taken.took_over["why"]
    taken.release()
    assert not (run / LEASE_FILE).exists()
    # Not JSON: "took over a stale lease of pid None on None (no heartbeat for 1796529485 s)"; JSON that is
    # no lease, and a link to nowhere: taken for released, again and again, at full CPU, for ever; a list,
    # a heartbeat of text: a traceback.
    damage = ["garbage{", "null", "[]", '{"heartbeat": null}', '{"heartbeat": "x"}', None]
    for text in damage:
        if text is None:
            (run / LEASE_FILE).symlink_to(tmp_path / "nowhere")
        else:
            (run / LEASE_FILE).write_text(text)
        capsys.readouterr()
        acquire(run).release()
        said = f"WARNING {run / LEASE_FILE}: took over an unreadable lease (not a lease's JSON)\n"
        assert capsys.readouterr().out == said, text
        assert not os.path.lexists(run / LEASE_FILE)


def test_the_heartbeat_is_renewed_and_stops_once_taken_over(tmp_path: Path, monkeypatch) -> None:
    from birdjepa.rundir import lease as lease_lib

    monkeypatch.setattr(lease_lib, "HEARTBEAT_S", 0.05)
    run = tmp_path / "r"
    held = acquire(run)
    beats = []
    for _ in range(4):
        time.sleep(0.2)
        beats.append(json.loads((run / LEASE_FILE).read_text())["heartbeat"])
    assert beats == sorted(beats) and len(set(beats)) == 4  # renewed between every two reads
    # Another process took the run over (this one was presumed dead), as takers do: the heartbeat leaves
    # its lease be.
    other = {**json.loads((run / LEASE_FILE).read_text()), "token": "f" * 16, "heartbeat": 1.0}
    while not _take_over(run / LEASE_FILE, held.holder, other):  # the heartbeat holds the marker now
        time.sleep(0.01)
    time.sleep(0.3)
    assert json.loads((run / LEASE_FILE).read_text()) == other
    held.release()  # not its lease any more: it stays
    assert json.loads((run / LEASE_FILE).read_text()) == other


def test_a_run_folder_moved_or_removed_under_its_trainer_stops_it_before_its_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    # Moved while training: the heartbeat thread died in a FileNotFoundError traceback and the next step's
    # check raised another (exit 1); or the next save recreated the old path, the run split in two, and
    # the trainer said it "went 15 s without renewing its lease (suspended, or cut off)".
    from birdjepa.rundir import lease as lease_lib
    from birdjepa.rundir.lease import RunDirGone

    monkeypatch.setattr(lease_lib, "HEARTBEAT_S", 0.02)

    def replaced(run: Path) -> None:  # another folder (made first: another inode) renamed into its place
        (tmp_path / "other").mkdir()
        run.rename(tmp_path / "moved-too")
        (tmp_path / "other").rename(run)

    for what, change in (
        ("was moved or removed", lambda run: run.rename(tmp_path / "moved")),
        ("was moved or removed, and another folder put at its name", replaced),
        (
            "lost its lease (the folder replaced, or the file removed)",
            lambda run: (run / LEASE_FILE).unlink(),
        ),
    ):
        run = tmp_path / "r"
        held = acquire(run)
        held.check()
        change(run)
        time.sleep(0.1)  # beats meet the move
        said = f"the run directory {run} {what} while this trainer ran;"
        with pytest.raises(RunDirGone, match=f"^{re.escape(said)}"):
            held.still_held()  # as a save's commit asks, from Orbax's thread (it said "suspended" before)
        with pytest.raises(RunDirGone, match=f"^{re.escape(said)}"):
            held.check()
        assert "Traceback" not in capfd.readouterr().err  # the heartbeat's, before
        held.release()
        assert not (tmp_path / "r" / LEASE_FILE).exists()

    # On NFS a folder removed on another client is ESTALE; an EIO may pass, and is looked at again.
    def stat_fails(err: int) -> Callable[[Path], tuple[int, int]]:
        def fails(folder: Path) -> tuple[int, int]:
            raise OSError(err, os.strerror(err))

        return fails

    held = acquire(tmp_path / "r")
    for err, gone in ((errno.EIO, False), (errno.ESTALE, True)):
        with monkeypatch.context() as m:
            m.setattr(lease_lib, "_identity", stat_fails(err))
            with pytest.raises(RunDirGone) if gone else contextlib.nullcontext():
                held.check()
    held.release()


def test_a_copy_of_a_live_run_says_its_lease_came_with_the_copy(tmp_path: Path) -> None:
    # `cp -r` of a live run copied its lease: the copy was "held by pid N" (the original's trainer), said
    # as if that trainer ran it, until the copied heartbeat aged a minute. Not taken over for it: the same
    # folder through another mount (a FUSE mount: another device) would then have two writers.
    from birdjepa.rundir.lease import LeaseHeld

    held = acquire(tmp_path / "live")
    with pytest.raises(LeaseHeld) as e:  # the folder itself: held, as before
        acquire(tmp_path / "live")
    assert "its lease names another folder" not in str(e.value)
    shutil.copytree(tmp_path / "live", tmp_path / "copy")
    said = r"nothing was touched \(its lease names another folder than this one: copied with it, as cp -r of "
    with pytest.raises(LeaseHeld, match=said + "a live run does, and stale 60 s after the copy"):
        acquire(tmp_path / "copy")
    held.release()


def test_a_holder_woken_after_a_long_stop_renews_its_lease_or_finds_it_taken(tmp_path: Path) -> None:
    from birdjepa.rundir.lease import STALE_AFTER_S, LeaseLost

    path = tmp_path / "r" / LEASE_FILE
    held = acquire(path.parent)
    held.check()  # heartbeats on time: a clock read
    # Stopped longer than a taker waits (SIGSTOP, a suspended job), and not taken over: renewed now, before
    # a taker finds it stale.
    held.renewed -= STALE_AFTER_S + 1
    before = json.loads(path.read_text())["heartbeat"]
    held.check()
    assert json.loads(path.read_text())["heartbeat"] > before and held.renewed > before
    # Stopped again, and taken over meanwhile: told before it writes.
    held.renewed -= STALE_AFTER_S + 1
    taker = {**held.holder, "token": "f" * 16, "pid": 4242, "heartbeat": time.time()}
    while not _take_over(path, held.holder, taker):  # the heartbeat holds the marker now
        time.sleep(0.01)
    with pytest.raises(LeaseLost, match="went 6[12] s without renewing its lease .* held by pid 4242"):
        held.check()
    held.release()
    assert json.loads(path.read_text()) == taker


def test_a_takeover_is_never_written_back_over_by_the_holders_heartbeat(tmp_path: Path, monkeypatch) -> None:
    # The heartbeat reads its lease, then writes it renewed. A taker replacing it in between (a thread of
    # the holder keeping the CPU, as a training step does) was written back over in 34 of 50 takeovers
    # and once in CI; both now change the lease only under the takeover marker.
    from birdjepa.rundir import lease as lease_lib

    monkeypatch.setattr(lease_lib, "HEARTBEAT_S", 0.002)
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            sum(range(10_000))

    threading.Thread(target=busy, daemon=True).start()
    written_over = 0
    try:
        for i in range(10):
            path = tmp_path / f"r{i}" / LEASE_FILE
            held = acquire(path.parent)
            time.sleep(0.01)
            taker = {**held.holder, "token": "f" * 16, "heartbeat": time.time()}
            while not _take_over(path, held.holder, taker):  # the heartbeat holds the marker now
                time.sleep(0.001)
            time.sleep(0.02)
            written_over += json.loads(path.read_text())["token"] != taker["token"]
            held.release()
    finally:
        stop.set()
    assert written_over == 0


RACER = """
import sys, time
from pathlib import Path
from birdjepa.rundir import lease
from birdjepa.rundir.lease import LeaseHeld, acquire
lease.WATCH_S = 0.5  # another host's silence, watched: the suite's time
run, start = Path(sys.argv[1]), float(sys.argv[2])
time.sleep(max(start - time.time(), 0))  # every racer starts at the same instant
try:
    held = acquire(run)
except LeaseHeld:
    print("held", flush=True)
else:
    print("won", flush=True)
    time.sleep(1.5)  # hold it while the others look
    held.release()
"""


def test_racers_for_a_free_or_stale_lease_give_exactly_one_winner(tmp_path: Path) -> None:
    free, stale = tmp_path / "free", tmp_path / "stale"
    held_by(1, stale)  # a holder on a node that went silent an hour ago
    lease = json.loads((stale / LEASE_FILE).read_text())
    lease["host"], lease["heartbeat"] = "another-node", time.time() - 3600
    (stale / LEASE_FILE).write_text(json.dumps(lease))
    # Four racers a folder, both races at once; an interpreter starts in ~0.1 s.
    start = time.time() + 2.0  # after every interpreter has started
    racers = {run: [subprocess.Popen([sys.executable, "-c", RACER, str(run), str(start)],
                                     stdout=subprocess.PIPE, text=True) for _ in range(4)]
              for run in (free, stale)}  # fmt: skip
    for run, procs in racers.items():
        outcomes = sorted(p.communicate(timeout=60)[0].strip().splitlines()[-1] for p in procs)
        assert outcomes == ["held", "held", "held", "won"], run  # a takeover's WARNING comes before
        assert not (run / LEASE_FILE).exists()  # the winner let go


@pytest.mark.parametrize("skew", [-600.0, 600.0])
def test_another_host_s_clock_neither_takes_a_live_run_over_nor_holds_a_dead_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], skew: float
) -> None:
    # Heartbeats stamped by a node's clock, read against this one's: a node 10 min ahead took a live run
    # over (two writers, the healthy trainer stopped); a dead holder whose clock ran 10 min ahead held the
    # run (a Slurm requeue waiting and exiting 75) until the clocks caught up.
    from birdjepa.rundir import lease as lease_lib

    monkeypatch.setattr(lease_lib, "WATCH_S", 1.5)  # 30 heartbeats of the holder below, on a busy machine
    run = tmp_path / "r"
    held_by(4242, run)
    path = run / LEASE_FILE
    holder = {**json.loads(path.read_text()), "host": "another-node"}
    path.write_text(json.dumps({**holder, "heartbeat": time.time() + skew}))  # before any taker looks
    stop = threading.Event()

    def beats() -> None:  # the live holder, renewing by its clock, as leases are written: aside, renamed
        while not stop.is_set():
            aside = path.with_name(".lease.json.beat")
            aside.write_text(json.dumps({**holder, "heartbeat": time.time() + skew}))
            os.replace(aside, path)
            time.sleep(0.05)

    beating = threading.Thread(target=beats)
    beating.start()
    try:
        with pytest.raises(lease_lib.LeaseHeld) as e:
            acquire(run, poll_s=0.02)
    finally:
        stop.set()
        beating.join()
    way = "behind" if skew < 0 else "ahead of"
    assert f"(it renews its lease, by a clock 600 s {way} this host's)" in str(e.value), str(e.value)
    # It stopped: its lease, unchanged while watched, is taken over, whichever way its clock was.
    taken = acquire(run, poll_s=0.02)
    why = "no heartbeat for 6" if skew < 0 else "a heartbeat 6"
    assert taken.took_over is not None and taken.took_over["why"].startswith(why), taken.took_over
    taken.release()


def test_a_takeover_marker_is_timed_by_this_process_s_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its age was this host's clock against the file system's stamp: a trainer 3 min behind stalled for the
    # difference, deaf to SIGTERM; one ahead removed a marker in use at once.
    from birdjepa.rundir import lease as lease_lib

    monkeypatch.setattr(lease_lib, "TAKEOVER_MARKER_S", 0.3)
    run = tmp_path / "r"
    held = acquire(run)
    marker = run / f"{LEASE_FILE}.takeover"
    for stamped in (time.time() + 3600, time.time() - 3600):  # a file system's clock ahead, behind
        marker.touch()
        os.utime(marker, (stamped, stamped))
        t0 = time.monotonic()
        taker = {**held.holder, "token": "f" * 16}
        while not _take_over(run / LEASE_FILE, held.holder, taker):
            time.sleep(0.01)
        assert 0.3 <= time.monotonic() - t0 < 5
        held.holder = taker
    held.release()


@pytest.mark.slow  # two trainings and a trace: a minute; CI runs it beside the suite
def test_read_only_commands_answer_on_a_live_run_take_no_lease_and_change_nothing(
    demo_dir: Path, tmp_path: Path, capsys
) -> None:
    """compare, analyze, trace, bisect and evaluate --out on a run whose trainer is mid-run (stopped with
    SIGSTOP after its checkpoint 1, so the commands meet it there every time): each answers, the lease
    stays the trainer's, and the run, resumed with SIGCONT, equals its straight run."""
    import signal

    from birdjepa.cli import main
    from birdjepa.resume.compare import compare_runs

    steps = ("--ckpt-every", "2")
    assert pretrain(tyro.cli(PretrainConfig, args=flags(demo_dir, tmp_path / "straight", 8, *steps))) == 0
    straight, run = tmp_path / "straight" / "r", tmp_path / "live" / "r"
    cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain", *flags(demo_dir, tmp_path / "live", 8, *steps)]
    trainer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (run / "checkpoints" / "1").is_dir() and time.monotonic() < deadline and trainer.poll() is None:
        time.sleep(0.05)
    trainer.send_signal(signal.SIGSTOP)
    try:
        lease = json.loads((run / LEASE_FILE).read_text())
        assert lease["pid"] == trainer.pid
        codes = {}
        for name, args in [
            ("compare", [str(run), str(straight)]),
            ("analyze", [str(run), "--out", str(tmp_path / "analysis")]),
            ("trace", [str(run), "--step", "1", "--out", str(tmp_path / "t.npz")]),
            ("bisect", [str(run), str(straight)]),
            ("evaluate", [str(run), "--out", str(tmp_path / "eval.json")]),
        ]:
            try:
                main([name, *args])
                codes[name] = 0
            except SystemExit as e:
                codes[name] = e.code
        out = capsys.readouterr()
        said = out.out[-3000:] + out.err[-3000:]
        # compare: a step only the straight run logged differs. Where the trainer stopped past checkpoint
        # 1 depends on the machine's load (an async save lands while later steps run), so read it.
        from birdjepa.rundir.metrics_log import metrics_by_step

        first_missing = max(metrics_by_step(run)) + 1
        assert first_missing < 8, "the trainer finished before it was stopped: nothing live to meet"
        assert codes == {"compare": 1, "analyze": 0, "trace": 0, "bisect": 0, "evaluate": 0}, said
        assert set(json.loads((tmp_path / "eval.json").read_text())["rows"]) == {
            "encoder",
            "random_init",
            "raw",
        }
        assert f"step {first_missing}: (None, " in out.out, said
        assert f"step {first_missing - 1}: (" not in out.out and "Traceback" not in said
        assert json.loads((run / LEASE_FILE).read_text()) == lease  # still the trainer's, untouched
    finally:
        trainer.send_signal(signal.SIGCONT)
    assert trainer.wait(timeout=600) == 0, trainer.stdout.read()[-3000:]
    diffs = compare_runs(straight, run)
    assert diffs and all(d.max_abs == 0.0 for d in diffs), [d for d in diffs if d.max_abs]


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[None]:
    """``folder`` unwritable while inside: mode 0o555, or for root (who writes past modes) ``chattr +i``."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(folder)]).returncode:
        why = "root, and chattr +i is unavailable here: no folder is read-only to root"
        if os.environ.get("CI"):  # CI's machine has it: never skipped there
            pytest.fail(why)
        pytest.skip(why)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def test_a_read_only_runs_or_run_folder_is_one_line_and_exit_74_with_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The lease is the first write, before the data opens or anything compiles (a PermissionError
    # traceback from it before); the demo set, unnamed, is not even generated.
    def refused(runs: Path) -> str:
        args = ["--run", "r", "--log.runs-dir", str(runs), "--steps", "2", "--eval-every", "0"]
        assert pretrain(tyro.cli(PretrainConfig, args=args)) == exit_codes.IOERR
        out = capsys.readouterr().out
        (line,) = [line for line in out.splitlines() if "ERROR" in line]
        assert line.endswith("; exit 74") and "Traceback" not in out, out
        return line

    fresh = tmp_path / "fresh"  # a fresh run: its run directory cannot be created
    fresh.mkdir()
    with read_only(fresh):
        line = refused(fresh)
    assert line.startswith(f"ERROR: cannot create the run directory {fresh / 'r'}: ") and line.endswith(
        "Make it writable or give another --log.runs-dir, then run the same command; exit 74"
    )
    assert not list(fresh.iterdir())
    run = tmp_path / "resumed" / "r"  # a run to resume whose folder cannot be written
    (run / "checkpoints").mkdir(parents=True)
    (run / METRICS_FILE).write_text("")
    with read_only(run):
        line = refused(run.parent)
    # Another runs folder would start another run: a run that trained is told to make its own writable.
    assert line.startswith(f"ERROR: cannot write the lease {run / LEASE_FILE}: ") and line.endswith(
        "nothing was touched. Make it writable, then run the same command; exit 74"
    ), line
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", METRICS_FILE]


def test_evaluate_on_a_read_only_run_is_one_line_that_points_to_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "r"
    (run / "checkpoints").mkdir(parents=True)
    with read_only(run), pytest.raises(SystemExit) as e:
        main(["evaluate", str(run)])
    assert e.value.code == exit_codes.IOERR
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"birdjepa evaluate: error: cannot write the lease {run / LEASE_FILE}: ")
    assert "--out FILE" in line, line
    assert [p.name for p in run.iterdir()] == ["checkpoints"]


def test_analyze_on_a_read_only_run_is_one_line_that_points_to_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # It wrote its figures into RUN/analysis: a traceback from mkdir on an archived or shared run.
    run = tmp_path / "r"
    run.mkdir()
    (run / METRICS_FILE).write_text("".join(json.dumps({"step": s, "train/loss": 1.0 / (s + 1)}) + "\n"
                                            for s in range(30)))  # fmt: skip
    with read_only(run), pytest.raises(SystemExit) as e:
        main(["analyze", str(run)])
    assert e.value.code == exit_codes.IOERR
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: {run / 'analysis'}: cannot be written (") and line.endswith(
        "; give --out FOLDER"
    )
    main(["analyze", str(run), "--out", str(tmp_path / "figures")])
    assert (tmp_path / "figures" / "summary.md").is_file()


def test_a_run_folder_that_is_a_symbolic_link_to_nowhere_is_said_so(tmp_path: Path) -> None:
    # A link to a node's scratch folder that is gone, or a loop: "File exists ... Make it writable".
    from birdjepa.rundir.lease import LeaseUnwritable

    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for run in ("gone", "loop"):
        with pytest.raises(LeaseUnwritable, match=r"\(a symbolic link to nowhere, or a loop\)"):
            acquire(tmp_path / run)
    (tmp_path / "afile").write_text("")  # "File exists; ... Make it writable"
    with pytest.raises(LeaseUnwritable, match=r"afile \(a file is there, not a folder\): File exists"):
        acquire(tmp_path / "afile")
