"""Mirror of the metrics to Weights & Biases (the JSON lines in the run directory stay the source of truth).

Every segment of a run (each start and resume) logs to the same wandb run: its id is created once and
kept in ``<run_dir>/wandb_id``, and ``wandb.init(resume="allow")`` continues it. Offline mode writes
under ``<run_dir>/wandb/`` and needs no network (``wandb sync`` uploads it later); disabled mode never
imports wandb.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any, Literal

from birdjepa.rundir.layout import WANDB_ID_FILE

WandbMode = Literal["disabled", "offline", "online"]


def run_id(run_dir: Path, run: str) -> str:
    """The wandb id of this run directory, created on first use, with the folder it was created in. A copy
    of a run's folder (``cp -r``, to try another learning rate from its checkpoint) mirrors to a new id
    once it finds the folder it was copied from still holding that id: both histories went to one wandb
    run. A moved folder (the old one gone) and one reached by another path keep theirs."""
    path = run_dir / WANDB_ID_FILE
    here = str(Path(run_dir).resolve())
    safe = "".join(c if _id_char(c) else "-" for c in run)[:48]
    new = f"{safe}-{secrets.token_hex(4)}"
    if path.exists():
        kept, *made_in = [
            line.strip() for line in path.read_bytes().decode(errors="replace").splitlines()
        ] or [""]
        origin = made_in[0] if made_in else None
        if not kept or not all(map(_id_char, kept)):
            # Emptied (a write cut short, a full disk): "could not start (ValueError: not enough values
            # to unpack)" at every start, the file unnamed.
            print(f"WARNING {path} holds no wandb id ({kept[:40]!r}): this run mirrors to a new one, {new}",
                  flush=True)  # fmt: skip
        elif origin is None or origin == here or not _holds_apart(Path(origin) / WANDB_ID_FILE, path, kept):
            if origin != here:  # an older file, or a moved folder: this one's from now on
                _write(path, f"{kept}\n{here}\n")
            return kept
        else:
            print(f"WARNING {run_dir} is a copy of the run folder {origin}, which mirrors to wandb run "
                  f"{kept}: this copy mirrors to a new one, {new} (one id took both histories)",
                  flush=True)  # fmt: skip
    _write(path, f"{new}\n{here}\n")
    return new


def _id_char(c: str) -> bool:
    """What an id this module makes is made of (a run name's letters, ``-`` and ``_``)."""
    return c.isalnum() or c in "-_"


def _write(path: Path, text: str) -> None:
    """Whole or not at all: a kill mid-write left an empty file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _holds_apart(other: Path, mine: Path, wandb_id: str) -> bool:
    """``other`` is another file than ``mine`` (not the same folder by another path: a node's other
    mount) and holds ``wandb_id``."""
    try:
        return not other.samefile(mine) and other.read_text().split()[:1] == [wandb_id]
    except (OSError, UnicodeDecodeError):
        return False


def open_run(
    mode: WandbMode, run_dir: Path, run: str, project: str, config: dict[str, Any], restart: int
) -> Any | None:
    """A wandb run to mirror metrics into, or None when disabled, or when wandb cannot start (no API key,
    no network on a compute node): a WARNING, and the run trains on, its log the source of truth. It
    stopped the run with wandb's traceback."""
    if mode == "disabled":
        return None
    try:
        import wandb  # only when asked for: it is slow to import (and a broken install fails here)

        wb = wandb.init(
            project=project,
            id=run_id(run_dir, run),
            name=run,
            dir=str(run_dir),
            mode=mode,
            resume="allow",
            config=config,
            # Its ~50-line run summary at every segment's exit, in a Slurm log that requeues many times.
            settings=wandb.Settings(quiet=True),
        )
    except Exception as e:  # wandb's own errors (UsageError, CommError, ...) have no common base to name
        said = " ".join(str(e).split())
        print(f"WARNING the wandb mirror could not start ({type(e).__name__}: {said}); the run trains on, "
              f"logged to {run_dir} only (--log.wandb offline needs no network)", flush=True)  # fmt: skip
        return None
    wb.summary["restart"] = restart
    return wb
