"""Disk space and failed writes: what a save that could not be written leaves, and what it says.

A full disk (or any I/O error) shows in Orbax's background writer: `Checkpointer.wait` re-raises it, and
Orbax logs it first, with tracebacks, from each of its threads. `Checkpointer` reports it once, as one
`CheckpointWriteError` naming the checkpoint, the folder, the free space and the newest intact checkpoint,
and removes the ``*.orbax-checkpoint-tmp`` folders the failed write left.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import sys
import traceback
import warnings
from pathlib import Path

from birdjepa.rundir.checkpoint.format import CheckpointError

#: The errors of a write that retrying on the same disk would not fix.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})

#: Orbax's suffix for a step (and its items) still being written.
TMP_SUFFIX = ".orbax-checkpoint-tmp"


#: How a run moves off a full disk: the same command looked for it where it was, and started it over.
MOVED = "(or move the run directory to another disk and give its new parent as --log.runs-dir)"


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (a full disk, a quota, an I/O error). What was on disk before it
    is intact; the failed write's temporary folders are gone."""

    def fix(self) -> str:
        """What to do before the same command: space was not the reason where the folder cannot be written
        (a read-only mount, permissions) or a limit of the process was met (open files, file size,
        threads), and freeing it then changed nothing."""
        denied = (os.strerror(n) for n in (errno.EROFS, errno.EACCES, errno.EPERM))
        if any(f": {why} (" in str(self) for why in denied):
            return "Make the checkpoints folder writable"
        return limit_fix(str(self)) or f"Free space {MOVED}"


def limit_fix(error: str) -> str | None:
    """What to raise where a write failed at a limit of the process (``error`` names it), or None."""
    return next((fix for why, fix in _LIMITS.items() if why in error), None)


#: A write that failed at a limit of the process, not of the disk: what to raise.
_LIMITS = {
    os.strerror(errno.EMFILE): "Raise the limit on open files (ulimit -n)",
    os.strerror(errno.ENFILE): "Raise the system's limit on open files (fs.file-max)",
    os.strerror(errno.EFBIG): "Raise the limit on a file's size (ulimit -f)",
    "can't start new thread": "Raise the limit on threads (ulimit -u, a cgroup's pids.max)",
    os.strerror(errno.EAGAIN): "Raise the limit on threads (ulimit -u, a cgroup's pids.max)",
}


def folder_bytes(where: Path) -> int:
    return sum(f.stat().st_size for f in where.rglob("*") if f.is_file())


def reason(e: BaseException) -> str:
    """The operating system's words for a failed write, when the error carries them (Orbax's tensorstore
    errors carry the errno as ``[os_error_code='28']``), else the error's first line."""
    if isinstance(e, OSError) and e.errno is not None:
        return os.strerror(e.errno)
    found = re.search(r"os_error_code='(\d+)'", str(e))
    if found:
        return os.strerror(int(found.group(1)))
    first = (str(e).splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:200]}"


def remove_temporaries(directory: Path) -> None:
    """Delete the ``*.orbax-checkpoint-tmp`` folders in ``directory`` (with one writer per run, the only
    ones are a failed or killed write's)."""
    for tmp in directory.glob(f"*{TMP_SUFFIX}*"):  # Orbax 0.12.8's name, and its later "-<time>" one
        shutil.rmtree(tmp, ignore_errors=True)


class _DropOrbaxTracebacks(logging.Filter):
    """Orbax logs every failure of its background writer at ERROR with a traceback, once per thread
    (66 lines for one full disk). The same exception reaches `Checkpointer`, which says it in one line.
    Its warnings are said once each: a checkpoint without its ``_CHECKPOINT_METADATA`` (which verifies
    all the same: its hashes are birdjepa's) printed "Metadata file does not exist" at each of its 10
    reads in one resume."""

    def __init__(self) -> None:
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        orbax = _in_orbax(record.pathname) or _raised_in_orbax(record)
        if orbax and record.levelno < logging.ERROR:
            message = record.getMessage()
            if message in self.said:
                return False
            self.said.add(message)
            return True
        return not (record.levelno >= logging.ERROR and orbax)


def _in_orbax(path: str) -> bool:
    return f"{os.sep}orbax{os.sep}" in path


def _raised_in_orbax(record: logging.LogRecord) -> bool:
    """An error whose exception was raised in Orbax: asyncio logs each of a failed write's chunks
    ("Future exception was never retrieved") when its future is collected, with a traceback (a CI run
    under load printed four after the one line of a full disk)."""
    tb = record.exc_info[2] if record.exc_info else None
    return tb is not None and any(_in_orbax(frame.filename) for frame in traceback.extract_tb(tb))


_FILTER = _DropOrbaxTracebacks()


def _late_write_callback(unraisable: sys.UnraisableHookArgs) -> bool:
    """After one chunk of a write failed, Orbax closes the write's event loop; tensorstore's other chunks
    then finish and their callbacks find the loop closed. Tensorstore prints each as an unraisable
    exception (up to hundreds of tracebacks): noise after a failure already reported."""
    tb = traceback.extract_tb(unraisable.exc_traceback) if unraisable.exc_traceback else []
    return (
        unraisable.exc_type is RuntimeError
        and str(unraisable.exc_value) == "Event loop is closed"
        and any(frame.name == "call_soon_threadsafe" for frame in tb)
    )


def quiet_orbax_errors() -> None:
    """Leave a failed write's report to `Checkpointer`: no Orbax tracebacks, no tensorstore noise."""
    for logger in (logging.getLogger("absl"), logging.getLogger("asyncio")):
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    # A write that failed before its coroutines ran leaves them unawaited: one warning each at exit (8
    # lines after the one that says what failed, a read-only folder's).
    # (birdjepa runs no coroutine of its own.)
    warnings.filterwarnings("ignore", message=r"coroutine '.*' was never awaited", category=RuntimeWarning)
    previous = sys.unraisablehook
    if getattr(previous, "birdjepa", False):
        return

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if not _late_write_callback(unraisable):
            previous(unraisable)

    hook.birdjepa = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
