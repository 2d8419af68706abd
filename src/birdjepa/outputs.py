"""Where a command writes its result: checked before the work whose result goes there, so a path that
cannot be written costs one line, not the work (`birdjepa export`, `embed`, `trace`, `bisect --save`)."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
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
    existing = path if folder else path.parent
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
