"""The run directory's names: every file and folder a run holds, named here and nowhere else.

    <run_dir>/
      config.json          the options the run was started with (`write_config`, `read_config`)
      checkpoints/<step>/  Orbax checkpoints (`birdjepa.rundir.checkpoint`)
      metrics.jsonl        one JSON line per logged step, every segment (`birdjepa.rundir.metrics_log`)
      metrics.earlier-N.jsonl  the log of an earlier start that saved no checkpoint (`set_aside_log`)
      lease.json           the one writer's lease, while it runs (`birdjepa.rundir.lease`)
      eval/<step>.json     `birdjepa evaluate`'s report of a checkpoint
      analysis/            `birdjepa analyze`'s figures and report

Other modules ask these functions for a path; none spells a name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"
CHECKPOINTS = "checkpoints"
#: Where a restore moves a checkpoint that does not verify (``5``, then ``5-1``, ...).
DAMAGED_DIR = "checkpoints.damaged"
METRICS_FILE = "metrics.jsonl"
LEASE_FILE = "lease.json"
WANDB_ID_FILE = "wandb_id"
EVAL = "eval"
ANALYSIS = "analysis"


def config_file(run_dir: Path) -> Path:
    return Path(run_dir) / CONFIG_FILE


def checkpoints(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def checkpoint(run_dir: Path, step: int) -> Path:
    return checkpoints(run_dir) / str(step)


def checkpoint_steps(run_dir: Path) -> list[int]:
    """The steps of the checkpoint folders there, oldest first (not yet verified: see `Checkpointer`)."""
    folder = checkpoints(run_dir)
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def has_checkpoints(run_dir: Path) -> bool:
    return checkpoints(run_dir).is_dir()


def metrics_file(run_dir: Path) -> Path:
    return Path(run_dir) / METRICS_FILE


def set_aside_log(run_dir: Path) -> Path | None:
    """Before a start that resumes no checkpoint: the log of an earlier start there (one killed before its
    first save, or whose checkpoints were removed) is not this run's, whose steps would follow its rows
    under the same numbers. Renamed to ``metrics.earlier-N.jsonl`` (the first free N) and kept, its wandb
    id to ``wandb_id.earlier-N``; returns that path, or None where there is no log with a line in it."""
    log = metrics_file(run_dir)
    if not log.is_file() or not log.read_bytes().strip():
        return None
    n = 1
    while (earlier := Path(run_dir) / f"metrics.earlier-{n}.jsonl").exists():
        n += 1
    # Its wandb id too: the new start's rows, mirrored under it, joined the earlier start's run (offline;
    # online, wandb drops steps below the ones it holds).
    wandb_id = Path(run_dir) / WANDB_ID_FILE
    if wandb_id.is_file():
        wandb_id.rename(Path(run_dir) / f"{WANDB_ID_FILE}.earlier-{n}")
    log.rename(earlier)
    return earlier


def lease_file(run_dir: Path) -> Path:
    return Path(run_dir) / LEASE_FILE


def eval_report(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / EVAL / f"{step}.json"


def analysis_dir(run_dir: Path) -> Path:
    return Path(run_dir) / ANALYSIS


RUN_MARKERS = f"{METRICS_FILE}, {CHECKPOINTS}/ or {CONFIG_FILE}"
"""What `is_run` looks for, as an error message says it."""


def is_run(run_dir: Path) -> bool:
    """Whether anything of a run is there: its metrics, checkpoints or config."""
    return any(p.exists() for p in (metrics_file(run_dir), checkpoints(run_dir), config_file(run_dir)))


def no_run_at(path: Path, markers: str = RUN_MARKERS) -> str:
    """Why ``path`` holds no run (``markers``: what of a run was looked for): where it does not exist, "no
    such folder" and the runs beside it (`make demo` names its run demo-<date>-<time>, which the docs
    call runs/demo: "not a run directory (no checkpoints/ folder in it)" sent a newcomer looking inside)."""
    path = Path(path)
    if path.exists():
        return f"{path}: not a run directory (no {markers})"
    parent = path.parent
    beside = sorted(p.name for p in parent.iterdir() if p.is_dir() and is_run(p)) if parent.is_dir() else []
    more = f", ... ({len(beside)} in all)" if len(beside) > 5 else ""
    runs = f" (runs in {parent}: {', '.join(beside[:5])}{more})" if beside else ""
    return f"{path}: no such folder{runs}"


def nesting(runs_dir: Path, run_dir: Path) -> str | None:
    """Why ``run_dir`` cannot hold a run, or None: it lies inside another run's folder (``--run a/b`` beside
    a run ``a``), or it is no run and holds runs (``--run sweep`` over ``sweep/a``). Either way one
    run's folder would hold another's: `birdjepa analyze` and `compare` of the outer one would read them
    as one, and removing it to start over would remove the inner ones."""
    for outer in run_dir.relative_to(runs_dir).parents:
        if outer != Path(".") and is_run(runs_dir / outer):
            return f"lies inside the run {runs_dir / outer}: give a name outside it"
    if run_dir.is_dir() and not is_run(run_dir):
        inner = next((p.parent for p in sorted(run_dir.rglob(CONFIG_FILE))), None)
        if inner is not None:
            return f"{run_dir} holds the run {inner}: give another --run"
    return None


def read_config(run_dir: Path) -> dict[str, Any]:
    return json.loads(config_file(run_dir).read_text())


def write_config(run_dir: Path, config: dict[str, Any]) -> Path:
    path = config_file(run_dir)
    path.write_text(json.dumps(config, indent=1) + "\n")
    return path
