"""The console a run prints to, which may fail while the run need not: a Slurm output file on a full
quota, a stdout the scheduler closed (``>&-``), a pipe that ``| head`` closed. Each stopped the run with
a traceback (exit 1, the steps since the last checkpoint lost), though its log holds every step; a
console that fails now gets one WARNING on stderr, and the run trains on without it."""

from __future__ import annotations

import os
import sys
from typing import IO, Any


class KeptGoing:
    """``stream`` (a text stream, or None where it was closed), whose writes never raise: after the first
    that fails, one WARNING goes to stderr (if it can) and what follows is dropped."""

    def __init__(self, stream: IO[str] | None, what: str) -> None:
        self._stream = stream if stream is not None else open(os.devnull, "w")  # noqa: SIM115
        self._what = what
        self.failed: BaseException | None = None

    def write(self, text: str) -> int:
        if self.failed is None:
            try:
                return self._stream.write(text)
            except (OSError, ValueError) as e:  # ValueError: a closed file
                self._fail(e)
        return len(text)

    def flush(self) -> None:
        if self.failed is None:
            try:
                self._stream.flush()
            except (OSError, ValueError) as e:
                self._fail(e)

    def isatty(self) -> bool:
        try:
            return self.failed is None and self._stream.isatty()
        except (OSError, ValueError):
            return False

    def _fail(self, e: BaseException) -> None:
        self.failed = e
        try:
            print(f"WARNING {self._what} cannot be written ({type(e).__name__}: {e}): the run trains on, "
                  "its log (metrics.jsonl) holding every step", file=sys.__stderr__, flush=True)  # fmt: skip
        except (OSError, ValueError, AttributeError):  # stderr into the same full file, or closed
            pass

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, ...: the stream's own
        return getattr(self._stream, name)
