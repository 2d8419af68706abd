"""Shared by the issue notebooks' reproduce.py scripts: run a birdjepa command into a console log."""

from __future__ import annotations

import subprocess
from pathlib import Path


def call(cmd: list[str], log: Path, ok: tuple[int, ...] = (0,), env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` (``python -m birdjepa.cli ...``; in ``env``, else this process's environment),
    appending the command line and its output to ``log``; an exit code not in ``ok`` stops the script and
    names the log. Returns the exit code."""
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd[2:])}\n")
        f.flush()
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if done.returncode not in ok:
        raise SystemExit(f"`{' '.join(cmd[2:])}` exited {done.returncode}; see {log}")
    return done.returncode
