"""A full disk during a save: one WARNING early (fewer than two more checkpoints fit), then one ERROR line
naming what could not be written, where, the free space and the newest intact checkpoint; exit 74; no
traceback, no temporary folder, nothing deleted; and the run moved to a larger disk resumes exactly.

The small disk is a real tmpfs in a private mount namespace that ends with the trainer
(`birdjepa.verify.fs_fault_matrix.on_small_disk`, the matrix's full-disk row), so no mount outlives
the test.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import tyro

from birdjepa import exit_codes
from birdjepa.config import PretrainConfig
from birdjepa.outputs import unwritable, write_whole
from birdjepa.pretrain import loop as train_loop
from birdjepa.pretrain.loop import pretrain
from birdjepa.resume.compare import compare_runs
from birdjepa.rundir.checkpoint.space import TMP_SUFFIX, folder_bytes, quiet_orbax_errors
from birdjepa.rundir.metrics_log import read_metrics
from birdjepa.verify.fs_fault_matrix import on_small_disk


def said_lines(out: str) -> list[str]:
    """The WARNING and ERROR lines, but the one of these runs' warmup (10) outlasting their 6 steps."""
    lines = [x for x in out.splitlines() if x.startswith(("WARNING", "ERROR"))]
    return [x for x in lines if "--optim.warmup-steps" not in x]


#: A run moved off a full disk is resumed at its new place: the same command started it over.
ELSEWHERE = "(or move the run directory to another disk and give its new parent as --log.runs-dir)"


def flags(demo_dir: Path, runs: Path) -> list[str]:
    return ["--run", "r", "--log.runs-dir", str(runs), "--steps", "6", "--eval-every", "0",
            "--ckpt-every", "1", "--ckpt-keep", "10", "--data.batch-size", "4",
            "--data.train", str(demo_dir / "train"), "--data.eval", str(demo_dir / "eval")]  # fmt: skip


@pytest.fixture(scope="module")
def straight(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run both faults must end up equal to."""
    runs = tmp_path_factory.mktemp("straight")
    assert pretrain(tyro.cli(PretrainConfig, args=flags(demo_dir, runs))) == 0
    return runs / "r"


@pytest.mark.slow  # a run on a small filesystem, moved and resumed: half a minute; CI runs it
def test_a_full_disk_stops_the_run_in_one_line_and_the_moved_run_resumes_exactly(
    demo_dir: Path, straight: Path, tmp_path: Path
) -> None:
    checkpoint = folder_bytes(straight / "checkpoints" / "0")
    moved = tmp_path / "moved"
    moved.mkdir()
    # Room for four checkpoints and a half: saves 0-3 fit, save 3 leaves fewer than two, save 4 fails.
    size = int(4.5 * checkpoint)
    # Saves in the step's thread: written in the background, save 4 filled the disk as the next step's log
    # line was written, and under load that write failed first (CI, once). Either way one line, exit 74;
    # this test reads the checkpoint's.
    args = ["pretrain", *flags(demo_dir, tmp_path / "disk"), "--no-ckpt-async"]
    done = on_small_disk(args, tmp_path / "disk", size, moved)

    assert done.returncode == exit_codes.IOERR, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    said = said_lines(done.stdout)
    assert len(said) == 2, said
    assert said[0].startswith("WARNING") and "fewer than two more fit" in said[0]
    assert said[1].startswith("ERROR: could not write checkpoint 4 to ")
    assert "No space left on device" in said[1]
    assert "the newest intact checkpoint is 3" in said[1] and said[1].endswith("exit 74")
    assert f"Free space {ELSEWHERE}, then run the same command: it resumes exactly" in said[1]
    run = moved / "r"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0", "1", "2", "3"]  # no temporaries
    assert not any(p.name.endswith(TMP_SUFFIX) for p in run.rglob("*"))
    events = {r["event"]: r for r in read_metrics(run) if "event" in r}
    assert events["disk_low"]["step"] == 3 and events["save_failed"]["exit_code"] == exit_codes.IOERR

    assert pretrain(tyro.cli(PretrainConfig, args=flags(demo_dir, moved))) == 0  # on the larger disk
    diffs = compare_runs(straight, run)
    assert diffs and all(d.max_abs == 0.0 for d in diffs), [d for d in diffs if d.max_abs]


def test_a_checkpoints_folder_that_cannot_be_written_says_so_not_free_space(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A read-only mount (GBs free) was told to free space.
    from test_lease import read_only

    args = [*flags(demo_dir, tmp_path), "--no-ckpt-async"]
    assert pretrain(tyro.cli(PretrainConfig, args=[*args, "--stop-at-step", "0"])) == 0
    capsys.readouterr()
    with read_only(tmp_path / "r" / "checkpoints"):
        assert pretrain(tyro.cli(PretrainConfig, args=args)) == exit_codes.IOERR
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ERROR")]
    assert line.startswith("ERROR: could not write checkpoint 1 to ") and line.endswith("; exit 74"), line
    assert "Make the checkpoints folder writable, then run the same command: it resumes exactly" in line, line
    # Its first save: "it resumes exactly", and the same command started the run over.
    (tmp_path / "n" / "checkpoints").mkdir(parents=True)
    with read_only(tmp_path / "n" / "checkpoints"):
        assert pretrain(tyro.cli(PretrainConfig, args=[*args, "--run", "n"])) == exit_codes.IOERR
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("ERROR")]
    assert line.startswith("ERROR: could not write checkpoint 0 to "), line
    assert line.endswith("then run the same command: it starts the run over, none being saved; exit 74"), line


@pytest.mark.parametrize(
    ("why", "fix"),
    [
        (
            "No space left on device",
            f"Free space {ELSEWHERE}",
        ),
        ("Too many open files", "Raise the limit on open files (ulimit -n)"),
        ("File too large", "Raise the limit on a file's size (ulimit -f)"),
        (
            "RuntimeError: can't start new thread",
            "Raise the limit on threads (ulimit -u, a cgroup's pids.max)",
        ),
    ],  # fmt: skip
)
def test_a_save_stopped_by_a_limit_of_the_process_says_which_not_free_space(why: str, fix: str) -> None:
    # Out of descriptors (ulimit -n), threads (a cgroup's pids.max) or a file-size cap (ulimit -f): each
    # told to "free space", with GBs free.
    from birdjepa.rundir.checkpoint.space import CheckpointWriteError

    e = CheckpointWriteError(
        f"could not write checkpoint 1 to runs/r/checkpoints: {why} (7.0 MiB free there)"
    )
    assert e.fix() == fix


@pytest.mark.slow  # a minute; CI runs it beside the suite
def test_a_log_that_cannot_be_written_stops_the_run_in_one_line_and_it_resumes_exactly(
    demo_dir: Path, straight: Path, tmp_path: Path
) -> None:
    """metrics.jsonl alone on a full disk (a symlink into an 8 KiB tmpfs): the run stops in one ERROR line
    with exit 74, its checkpoints intact; the log copied back beside them, the same command resumes and
    the run equals the straight one."""
    import os
    import shlex
    import subprocess
    import sys

    from birdjepa.rundir.layout import METRICS_FILE

    runs, disk, saved = tmp_path / "runs", tmp_path / "logdisk", tmp_path / "saved.jsonl"
    (runs / "r").mkdir(parents=True)
    disk.mkdir()
    (runs / "r" / METRICS_FILE).symlink_to(disk / METRICS_FILE)
    cmd = shlex.join([sys.executable, "-m", "birdjepa.cli", "pretrain", *flags(demo_dir, runs)])
    script = (f"mount -t tmpfs -o size=8192 tmpfs {disk} && {{ {cmd}; code=$?; "
              f"cp {disk}/{METRICS_FILE} {saved}; exit $code; }}")  # fmt: skip
    namespace = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    done = subprocess.run([*namespace, "sh", "-c", script], capture_output=True, text=True, timeout=900)

    assert done.returncode == exit_codes.IOERR, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stdout + done.stderr, done.stderr[-3000:]
    said = said_lines(done.stdout)
    assert len(said) == 1 and said[0].startswith("ERROR: could not write ") and METRICS_FILE in said[0], said
    assert "No space left on device" in said[0] and said[0].endswith("exit 74")
    run = runs / "r"
    kept = sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit())
    assert kept and kept == list(range(len(kept)))  # every step's checkpoint up to the failure
    (run / METRICS_FILE).unlink()  # the log moved to a disk with room, as a user would
    (run / METRICS_FILE).write_bytes(saved.read_bytes())
    assert pretrain(tyro.cli(PretrainConfig, args=flags(demo_dir, runs))) == 0
    diffs = compare_runs(straight, run)
    assert diffs and all(d.max_abs == 0.0 for d in diffs), [d for d in diffs if d.max_abs]


def test_futures_of_a_failed_orbax_write_are_not_reported_but_others_are(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A full disk fails each chunk of Orbax's write; asyncio reports every future whose exception was
    never retrieved, with a traceback, when it is collected (a CI run under load printed four after the
    run's one line). Those are dropped; a future failed anywhere else is still reported."""
    quiet_orbax_errors()
    gc.collect()  # an earlier test's futures (a damaged checkpoint's reads) are reported now, not below
    loop = asyncio.new_event_loop()
    futures = []
    for raised_in in ("orbax", "elsewhere"):
        where = os.path.join(os.sep, "site-packages", raised_in, "serialization.py")
        error = f"RESOURCE_EXHAUSTED: No space left on device ({raised_in})"
        source = f"def write():\n    raise ValueError({error!r})\n"
        namespace: dict = {}
        exec(compile(source, where, "exec"), namespace)  # noqa: S102 (a function whose frames name that file)
        futures.append(loop.create_future())
        try:
            namespace["write"]()
        except ValueError as e:
            futures[-1].set_exception(e)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        del futures
        gc.collect()  # one collection for both: each costs ~0.7 s in a worker's heap
    loop.close()
    said = [r.getMessage() for r in caplog.records]
    reported = [
        m for m in said if "never retrieved" in m and "RESOURCE_EXHAUSTED" in m
    ]  # this test's futures
    assert [("(orbax)" in m, "(elsewhere)" in m) for m in reported] == [(False, True)], said


@pytest.mark.parametrize(
    ("error", "fix"),
    [
        (
            errno.EPERM,
            f"Free space or make it writable {ELSEWHERE}",
        ),
        # A file-size limit (ulimit -f) said "Free space" with GBs free.
        (errno.EFBIG, "Raise the limit on a file's size (ulimit -f)"),
    ],
)
def test_a_log_the_run_may_not_write_is_one_line_and_exit_74(
    demo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    error: int, fix: str,
) -> None:  # fmt: skip
    # An immutable or read-only metrics.jsonl (EPERM, EACCES) was a PermissionError traceback, exit 1.
    from birdjepa.pretrain import trainer

    def denied(run_dir: Path, **_: object) -> None:
        raise OSError(error, os.strerror(error), str(run_dir / "metrics.jsonl"))

    monkeypatch.setattr(trainer, "MetricsLog", denied)
    assert pretrain(tyro.cli(PretrainConfig, args=flags(demo_dir, tmp_path))) == exit_codes.IOERR
    (line,) = said_lines(capsys.readouterr().out)
    log = tmp_path / "r" / "metrics.jsonl"
    assert line.startswith(f"ERROR: could not write {log}: {os.strerror(error)}"), line
    # Nothing saved: "the checkpoints already written are intact" sent the user looking for them.
    said = f"; no checkpoint was written yet: the same command starts the run over. {fix}, then run the same"
    assert said in line and line.endswith(" command; exit 74"), line


def test_an_old_checkpoint_the_retention_cannot_remove_is_a_warning_event_in_the_run_s_log(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Said on the console alone: `analyze` and the log's readers never saw it.
    import orbax.checkpoint as ocp

    from birdjepa.rundir.metrics_log import read_metrics

    def denied(self: ocp.CheckpointManager, step: int) -> None:
        raise PermissionError(13, "Permission denied", str(step))

    monkeypatch.setattr(ocp.CheckpointManager, "delete", denied)
    args = [*flags(demo_dir, tmp_path), "--stop-at-step", "2", "--ckpt-keep", "1"]  # the 6-step build
    assert pretrain(tyro.cli(PretrainConfig, args=args)) == 0
    # Checkpoint 0 found as checkpoint 2's save began, 1 at the segment's last wait (a console line alone).
    events = [r for r in read_metrics(tmp_path / "r") if r.get("event") == "warning"]
    assert [(e["step"], e["message"][:34]) for e in events] == [
        (2, "checkpoint 0 could not be removed "),
        (2, "checkpoint 1 could not be removed "),
    ], events
    # And at the wait of a run an error stops (after checkpoint 1's save, checkpoint 0's removal failed).
    real = train_loop.advance

    def fails(fns: Any, cfg: PretrainConfig, state: Any, batch: Any) -> Any:
        if int(state.step) == 2:
            raise RuntimeError("planted: the step fails")
        return real(fns, cfg, state, batch)

    monkeypatch.setattr(train_loop, "advance", fails)
    with pytest.raises(RuntimeError, match="planted"):
        pretrain(tyro.cli(PretrainConfig, args=[*args, "--run", "e"]))
    events = [r for r in read_metrics(tmp_path / "e") if r.get("event") == "warning"]
    assert [(e["step"], e["message"][:34]) for e in events] == [(1, "checkpoint 0 could not be removed ")]


def test_a_process_whose_threads_never_end_exits_with_its_code(tmp_path: Path) -> None:
    # Orbax's save threads, after a save that could not be written, waited for ever: the process said
    # "exit 74" and ran on until the job's time limit. Their join raises TimeoutError (Orbax's own).
    import subprocess
    import sys

    code = (
        "import threading\n"
        "from birdjepa.exit_codes import exit_past_stuck_threads\n"
        "class Stuck(threading.Thread):\n"
        "    def join(self, timeout=None):\n"
        "        raise TimeoutError('Orbax-style')\n"
        "before = set(threading.enumerate())\n"
        "Stuck(target=threading.Event().wait).start()\n"
        "exit_past_stuck_threads(74, set(threading.enumerate()) - before, wait_s=0.5)\n"
        "print('not reached')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 74 and "not reached" not in done.stdout, done.stderr[-2000:]
    # A pool worker stuck in its task (Orbax's metadata store's or the parameter norms', a write or a
    # device copy that never returns): the interpreter's exit joins it before the main thread is marked
    # ended, and the process ran on for ever.
    code = (
        "import threading\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from birdjepa.exit_codes import exit_past_stuck_threads\n"
        "ThreadPoolExecutor(1).submit(threading.Event().wait)\n"
        "exit_past_stuck_threads(74, set(), wait_s=0.5)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 74, done.stderr[-2000:]


def test_the_exit_past_stuck_threads_leaves_the_atexit_hooks_their_time(tmp_path: Path) -> None:
    # They run once every thread ended: a process group's shutdown barrier, which waits for its peers,
    # is not a stuck thread to cut short.
    import subprocess
    import sys

    code = (
        "import atexit, time\n"
        "from birdjepa.exit_codes import exit_past_stuck_threads\n"
        "atexit.register(lambda: (time.sleep(1.0), print('hook ran', flush=True)))\n"
        "exit_past_stuck_threads(75, set(), wait_s=0.2)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (75, "hook ran\n"), done.stderr[-2000:]


def test_a_run_that_stops_with_a_code_does_not_wait_for_its_idle_pool_threads(tmp_path: Path) -> None:
    # Idle pool threads end at the interpreter's exit, not at a join: joined, the parameter norms' made
    # every exit 75 (a preemption) come 30 s after "stopping ...", past a Slurm job's KillWait, which
    # killed the job before it could requeue; Orbax's metadata store's, every taken-over trainer's exit 2.
    import subprocess
    import sys

    code = (
        "import threading\n"
        "import jax.numpy as jnp, numpy as np, orbax.checkpoint as ocp\n"
        "from birdjepa import exit_codes\n"
        "from birdjepa.config import PretrainConfig\n"
        "from birdjepa.pretrain import loop\n"
        "from birdjepa.train import param_norms\n"
        "kept = []\n"
        "def pretrain(cfg):\n"
        "    param_norms.later({'w': jnp.ones(3)}).result()\n"
        f"    kept.append(ocp.CheckpointManager({str(tmp_path / 'c')!r}))\n"
        "    kept[0].save(0, args=ocp.args.StandardSave({'a': np.ones(3)}))\n"
        "    kept[0].wait_until_finished()\n"
        "    print(sorted(t.name for t in threading.enumerate()), flush=True)\n"
        "    return 75\n"
        "loop.pretrain = pretrain\n"
        "exit_codes.exit_past_stuck_threads.__defaults__ = (600.0,)  # waited for: the run times out\n"
        "loop.cli(PretrainConfig())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 75, (done.stdout, done.stderr[-2000:])
    # Both were alive as it stopped (an Orbax 'asyncio_0' thread may be too, ending).
    assert {"'metadata_store_0'", "'param-norms_0'"} <= set(done.stdout.strip("[]\n").split(", ")), (
        done.stdout
    )


@pytest.mark.slow  # two processes start and compile; CI runs it
def test_an_async_save_into_a_folder_that_cannot_be_written_exits_74(demo_dir: Path, tmp_path: Path) -> None:
    # Orbax's save threads waited for ever after the failed write: "exit 74" printed, no exit (a helper's
    # hunt: a Slurm job would hold its node until its time limit).
    import subprocess
    import sys

    from test_lease import read_only

    args = [sys.executable, "-m", "birdjepa.cli", "pretrain", *flags(demo_dir, tmp_path)]
    assert subprocess.run([*args, "--stop-at-step", "0"], capture_output=True, timeout=600).returncode == 0
    # The stuck threads waited out for 2 s, not the command's 30 (`exit_past_stuck_threads`'s default).
    waits_2_s = ("import runpy; from birdjepa import exit_codes; "
                 "exit_codes.exit_past_stuck_threads.__defaults__ = (2.0,); "
                 "runpy.run_module('birdjepa.cli', run_name='__main__')")  # fmt: skip
    with read_only(tmp_path / "r" / "checkpoints"):
        done = subprocess.run([sys.executable, "-c", waits_2_s, *args[3:]], capture_output=True, text=True,
                              timeout=600)  # fmt: skip
    assert done.returncode == exit_codes.IOERR, done.stdout[-2000:] + done.stderr[-2000:]
    assert said_lines(done.stdout)[-1].startswith("ERROR: could not write checkpoint 1 to "), done.stdout


WRITE_ON_A_FULL_DISK = """
import sys
from pathlib import Path
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from birdjepa.outputs import WriteError, write_whole
out = Path(sys.argv[1]) / "e.parquet"
write_whole(out, lambda p: pq.write_table(pa.table({"x": np.arange(10)}), p))
try:
    write_whole(out, lambda p: pq.write_table(pa.table({"x": np.random.default_rng(0).random(100_000)}), p))
except WriteError as e:
    print(e)
print(pq.read_table(out).num_rows, sorted(p.name for p in out.parent.iterdir()))
"""


def test_an_export_or_embeddings_that_do_not_fit_keep_what_was_there(tmp_path: Path) -> None:
    # `embed` over its earlier result on a full disk: a traceback, and the earlier result gone; `export`
    # left its 200 KiB partial weights, which kept the disk full.
    disk = tmp_path / "disk"
    disk.mkdir()
    write = f"{sys.executable} -c '{WRITE_ON_A_FULL_DISK}' {disk}"
    script = f"mount -t tmpfs -o size=65536 tmpfs {disk} && {write}"
    namespace = ["unshare", "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    done = subprocess.run([*namespace, "sh", "-c", script], capture_output=True, text=True, timeout=120)
    said, left = done.stdout.splitlines()
    assert said.startswith(f"cannot write {disk}/e.parquet: ") and "No space left on device" in said, done
    assert said.endswith("free there); what it held before is kept"), said
    assert left == "10 ['e.parquet']", done.stdout  # the earlier result whole, no partial file


def test_a_result_written_whole_follows_a_link_and_writes_a_pipe_in_place(tmp_path: Path) -> None:
    # `evaluate --out latest.json`, a link to the newest record: the rename replaced the link, and its
    # target kept the old record; a pipe (or /dev/stdout) would have been renamed over.
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "record.json").write_text("old")
    (tmp_path / "latest.json").symlink_to("keep/record.json")
    write_whole(tmp_path / "latest.json", b"new")
    assert (tmp_path / "latest.json").is_symlink() and (
        tmp_path / "keep" / "record.json"
    ).read_text() == "new"
    assert sorted(p.name for p in (tmp_path / "keep").iterdir()) == ["record.json"]
    os.mkfifo(tmp_path / "pipe")
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append((tmp_path / "pipe").read_bytes()))
    reader.start()
    write_whole(tmp_path / "pipe", b"through")
    reader.join(timeout=10)
    assert got == [b"through"] and stat.S_ISFIFO((tmp_path / "pipe").stat().st_mode)
    # /dev/stdout redirected to a log: a link to it, renamed over (every earlier line lost), or opened
    # for writing (truncated). Appended.
    log = tmp_path / "all.log"
    log.write_text("earlier\n")
    write = "from pathlib import Path; from birdjepa.outputs import write_whole; "
    write += "write_whole(Path('/dev/stdout'), b'record\\n'); print('after')"
    with log.open("a") as out:
        subprocess.run([sys.executable, "-c", write], stdout=out, check=True, timeout=60)
    assert log.read_text() == "earlier\nrecord\nafter\n"
    # A link into a folder not made yet: made, as --out makes a missing folder; checked there before.
    (tmp_path / "ahead.json").symlink_to("later/record.json")
    assert unwritable(tmp_path / "ahead.json") is None
    write_whole(tmp_path / "ahead.json", b"x")
    assert (tmp_path / "later" / "record.json").read_bytes() == b"x"
