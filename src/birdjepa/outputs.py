"""Where a command writes its result: checked before the work whose result goes there, so a path that
cannot be written costs one line, not the work (`birdjepa export`, `embed`, `trace`, `bisect --save`);
and written whole or not at all (`write_whole`), what was there before kept where the write fails."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def unwritable(path: Path, *, folder: bool = False) -> str | None:
    """Why ``path`` cannot be written (None: it can), checked before the work whose result goes there.
    ``folder``: ``path`` is a folder to write files into, else a file. Missing folders are fine (the
    write creates them) but nothing is created here, so a command that fails later leaves no empty one:
    the nearest existing folder gets a file created and removed in it, which also catches a read-only
    file system or an immutable folder, which permission bits do not show to root."""
    path = Path(path)
    if path.exists() and path.is_dir() != folder:
        return f"{path}: exists and is not a folder" if folder else f"{path}: is a folder, not a file"
    # A link is written through (`write_whole`): its target's folder is the one written.
    target = path if folder or in_place(path) else written_at(path)
    existing = target if folder else target.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{path}: cannot be written ({existing} is a file, not a folder)"
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".birdjepa-write-check-"):
            pass
        if not folder and path.exists() and not os.access(path, os.W_OK):  # a write-protected file
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as e:
        return f"{path}: cannot be written ({e.strerror or e})"
    return None


#: The file a script's scratch folder holds (`scratch_folder`): what it may remove next time.
SCRATCH_MARKER = ".birdjepa-scratch"


def scratch_folder(path: Path, what: str) -> Path:
    """``path`` emptied for ``what`` (a script's runs), made and marked as its own; ValueError, with
    nothing removed, where it holds anything no such script wrote (``--runs-dir`` a user's folder of
    runs was removed whole, without a word)."""
    path = Path(path)
    if path.exists() and any(path.iterdir()) and not (path / SCRATCH_MARKER).is_file():
        raise ValueError(f"{path}: holds files {what} did not write: give an empty or a new folder")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    (path / SCRATCH_MARKER).write_text(f"{what}: this folder is removed and made again at its next run\n")
    return path


def mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:.1f} MiB"


def free_bytes(where: Path) -> int:
    """Free space for this user on the file system that holds ``where`` (or its nearest parent)."""
    while not where.exists():
        where = where.parent
    return shutil.disk_usage(where).free


class WriteError(OSError):
    """A result that could not be written (a full disk, a quota): what was there before is kept. Its
    ``errno``, ``strerror`` and ``filename`` are the failed write's (a trainer's handler of a full disk
    reads them); its text says the file, why, the free space, and that nothing was lost."""

    def __init__(self, e: OSError, path: Path) -> None:
        super().__init__(e.errno, e.strerror or str(e), str(path))
        free = mib(free_bytes(path.parent))
        self.said = f"cannot write {path}: {self.strerror} ({free} free there); what it held before is kept"

    def __str__(self) -> str:
        return self.said


def in_place(path: Path) -> bool:
    """Whether ``path`` is written in place, not through a hidden file renamed over it: a stream
    (``/dev/stdout``, redirected to a log or not: the rename replaced the log, every earlier line lost)
    or a file that is no regular one (a FIFO)."""
    return str(path).startswith(("/dev/", "/proc/")) or (path.exists() and not written_at(path).is_file())


def written_at(path: Path) -> Path:
    """The file a write of ``path`` lands in: a link's target (renamed over, the link was replaced and
    its target kept the old result), else ``path``."""
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def write_whole(path: Path, data: bytes | Callable[[Path], None], partial: Path | None = None) -> None:
    """``path`` written whole or not at all: ``data`` (bytes, or a function that writes the file at the
    path it is given) into ``partial`` (default: ``.<name>.partial`` beside it), renamed over ``path``,
    and removed where the write fails (a full disk kept it, and the disk full; an earlier result at
    ``path`` was lost, or cut short). A symbolic link is written through (the rename replaced the link,
    its target kept the old result); a path that is no regular file (``/dev/stdout``, a FIFO) is written
    in place. Raises `WriteError`."""
    if in_place(path):
        partial = path
    else:
        name = f".{path.name}.partial" if partial is None else partial.name
        path = written_at(path)
        partial = path.with_name(name)
    try:
        partial.parent.mkdir(parents=True, exist_ok=True)  # a link to a folder not made yet
        if callable(data):
            data(partial)
        elif partial == path:  # appended: opened for writing, /dev/stdout truncated the log it goes to
            with path.open("ab") as stream:
                stream.write(data)
        else:
            partial.write_bytes(data)
        if partial != path:
            partial.replace(path)
    except OSError as e:
        if partial != path:
            partial.unlink(missing_ok=True)
        raise WriteError(e, path) from None
