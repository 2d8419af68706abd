"""What a run that stopped on an error keeps, said in its one line."""

from __future__ import annotations

from pathlib import Path

from birdjepa.rundir import layout
from birdjepa.rundir.checkpoint.space import TMP_SUFFIX

#: What a run with no checkpoint keeps, as every line that stops one says it.
NONE_YET = "no checkpoint was written yet: the same command starts the run over"


def saved(run_dir: Path) -> list[int]:
    """The steps of the checkpoints on disk (none where the folder cannot be read)."""
    try:
        return layout.checkpoint_steps(run_dir)
    except OSError:
        return []


def intact(run_dir: Path) -> str:
    """The checkpoints on disk and what the same command does with them: "the checkpoints ... intact"
    where none was written yet sent a user looking for them."""
    if not (steps := saved(run_dir)):
        return NONE_YET
    return f"the checkpoints written are intact, and the same command resumes from the newest ({steps[-1]})"


def interrupted(run_dir: Path) -> str:
    """`intact`, after a second Ctrl-C: a checkpoint still being written is given up (it was printed as
    saved, and "the next start resumes" was said where none had been written)."""
    try:
        writing = any(layout.checkpoints(run_dir).glob(f"*{TMP_SUFFIX}*"))
    except OSError:
        writing = False
    return f"{'the checkpoint being written is given up; ' if writing else ''}{intact(run_dir)}"
