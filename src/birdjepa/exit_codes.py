"""The exit codes of birdjepa's commands, each defined once (docs/pretraining.md's exit-code table lists
them).

They follow sysexits.h where one fits, so a job script can tell "requeue me" from "requeueing would
fail the same way".
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from typing import NoReturn

#: The command's answer is no (two runs or traces differ, a sweep's job failed); also what
#: ``SystemExit("message")`` exits with.
FAILED = 1
#: A command line that cannot work (the shell's and argparse's usage error): an option out of range, or
#: an input it names that cannot be used (a run, checkpoint, shard, audio file or output path), in every
#: command alike (evaluate and prepare said 1 for what export and embed said 2).
USAGE = 2
#: A resume check failed or no checkpoint verifies: requeueing would fail the same way (EX_DATAERR).
RESUME_CHECK = 65
#: The process group of a multi-process run broke (EX_UNAVAILABLE): another process is gone (killed,
#: crashed, its node lost) while this one waited for it in a collective (its own output says why), or
#: the group could not form (its coordinator's port in use).
GROUP_BROKEN = 69
#: A step was not finite and the run stopped before applying it (EX_SOFTWARE): not requeued, since the
#: same step would diverge again; resume from the last checkpoint with a change.
NONFINITE = 70
#: A checkpoint or log could not be written (a full disk, a quota, an I/O error; EX_IOERR): not requeued,
#: since the disk would be as full; free space or move the run, then resume.
IOERR = 74
#: After a SIGTERM/SIGUSR1 save: the job should be requeued (EX_TEMPFAIL).
REQUEUE = 75
#: The reader of standard output went away (``birdjepa benchmark --table R | head``): what it read is what
#: it asked for; the shell's code for a command a closed pipe stopped (128 + SIGPIPE), as a C tool's.
PIPE_CLOSED = 141
#: After a Ctrl-C (SIGINT) save: the shell's code for an interrupted command; not requeued (a user
#: stopped it), and the same command resumes.
INTERRUPTED = 130
#: Any command but pretrain (which saves and exits 75), stopped by a SIGTERM (`kill PID`, `scancel`): the
#: shell's code for a terminated command (128 + SIGTERM), in one line, its lease released; it died
#: without a word, its lease left to go stale.
TERMINATED = 143
#: After a SIGHUP save (the terminal closed: an ssh session dropped): the shell's code for a hung-up
#: command (128 + SIGHUP); not requeued, and the same command resumes.
HUNG_UP = 129


def exit_now(code: int) -> NoReturn:
    """Exit ``code`` at once, past the interpreter's teardown (its threads, its atexit hooks), once what
    was printed is flushed: for a process whose teardown would hang or crash."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or full console: the code is what counts
            stream.flush()
    os._exit(code)


#: How long a process that stops waits for its other threads before it exits without them.
STUCK_THREADS_S = 30.0


def exit_past_stuck_threads(
    code: int, started: set[threading.Thread], wait_s: float = STUCK_THREADS_S
) -> NoReturn:
    """Exit ``code`` as the interpreter exits, but within ``wait_s`` even where a thread it waits for
    never ends: Orbax's save threads, after a save that could not be written (an immutable checkpoints
    folder), waited for a signal that never came, and the process said "exit 74" and ran on until the
    job's time limit. What the run saved is on disk by then. Idle pool threads (the parameter norms',
    Orbax's metadata store's) end at the interpreter's exit, not at a join: joined here, each exit with
    a code (a preemption's 75, a taken-over trainer's 2) came 30 s late, past a Slurm job's KillWait.
    The step compiled ahead is waited for: it ends, and keeps its program for the next start
    (`recording.RecordableStep.compile_ahead`)."""
    deadline = time.monotonic() + wait_s
    for t in started:
        if t.name == "compile-ahead":
            t.join()

    # The interpreter's exit begins with threading's exit hooks, the last registered first: this one, then
    # concurrent.futures', which joins every pool worker (one stuck in its task, a write that never
    # returns, held the exit there for ever: the watchdog, waiting for the main thread's end, gave up).
    # The atexit hooks run once every thread ended: past them (a process group's shutdown barrier, which
    # waits for its peers) the watchdog has nothing to cut short.
    exiting, joined = threading.Event(), threading.Event()
    # CPython's own hook (3.9-3.13; concurrent.futures registers with it); without it, the countdown
    # starts now.
    if (register := getattr(threading, "_register_atexit", None)) is not None:
        register(exiting.set)
    else:
        exiting.set()
    atexit.register(joined.set)

    def watchdog() -> None:
        # Not where a caller caught the SystemExit (a test, in its process): no exit began by then.
        if exiting.wait(wait_s) and not joined.wait(max(0.0, deadline - time.monotonic())):
            exit_now(code)

    threading.Thread(target=watchdog, name="exit-watchdog", daemon=True).start()
    raise SystemExit(code)
