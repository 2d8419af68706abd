"""Mirror of the metrics to Weights & Biases (the JSON lines in the run directory stay the source of truth).

Every segment of a run (each start and resume) logs to the same wandb run: its id is created once and
kept in ``<run_dir>/wandb_id``, and ``wandb.init(resume="allow")`` continues it. Offline mode writes
under ``<run_dir>/wandb/`` and needs no network (``wandb sync`` uploads it later); disabled mode never
imports wandb.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Literal

from birdjepa.rundir.layout import WANDB_ID_FILE

WandbMode = Literal["disabled", "offline", "online"]


def run_id(run_dir: Path, run: str) -> str:
    """The wandb id of this run directory, created on first use."""
    path = run_dir / WANDB_ID_FILE
    if not path.exists():
        safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in run)[:48]
        path.write_text(f"{safe}-{secrets.token_hex(4)}\n")
    return path.read_text().strip()


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
