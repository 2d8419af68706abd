"""The processes a command starts and waits on (`sweep --local`'s trainers, `verify-resume`'s runs), and
the stop signals the command is sent while it waits.

A terminal's Ctrl-C reaches every process of its group, the children too: each trainer saves and exits
130, and the command waits for them (a KeyboardInterrupt in it would leave them unwaited for). A SIGTERM
(`kill PID`, a job scheduler's) reaches the command alone: passed on to each live child, which saves and
exits 75 as a preempted trainer does. Without it the command died and its trainer trained on, an orphan,
and the next start of the same command found the run held.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
from collections.abc import Iterator
from typing import Any


class Children:
    """Started with `start`, forgotten with `done`; `stopped` is the first stop signal received while
    `handling` (None: none)."""

    def __init__(self) -> None:
        self.live: set[subprocess.Popen] = set()
        self.stopped: int | None = None
        # Children start and end on several threads (verify-resume's); reentrant, as the handler runs on
        # the main thread, which may hold it.
        self._lock = threading.RLock()

    def start(self, argv: list[str], **popen: Any) -> subprocess.Popen:
        """``argv`` started (stopped at once where a SIGTERM came before it)."""
        with self._lock:
            proc = subprocess.Popen(argv, **popen)
            self.live.add(proc)
            if self.stopped == signal.SIGTERM:
                proc.send_signal(signal.SIGTERM)
        return proc

    def done(self, proc: subprocess.Popen) -> None:
        with self._lock:
            self.live.discard(proc)

    def _on(self, sig: int, _frame: Any) -> None:
        with self._lock:
            self.stopped = self.stopped or sig
            if sig == signal.SIGTERM:
                for proc in self.live:
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGTERM)

    @contextlib.contextmanager
    def handling(self) -> Iterator[Children]:
        """SIGINT and SIGTERM noted (and a SIGTERM passed on) while the block runs, in the main thread;
        the handlers before are restored after it. Set after a child starts, the handlers are not its:
        a child inherits an ignored signal, not a handler, and these are handlers."""
        previous = {sig: signal.signal(sig, self._on) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
