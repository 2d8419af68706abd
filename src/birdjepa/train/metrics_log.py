"""One JSON line per logged step in the run directory: the source of truth for analysis.

Every segment of a run (each start and resume) appends to the same ``metrics.jsonl``; a line carries
the step, the restart counter and the metrics, and a resume writes an explicit event line. Floats are
written with Python's ``repr`` (shortest round-trip form), so values read back compare with ``==``.
wandb, when enabled, mirrors the same dicts; it is never read back.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


def _plain(value: Any) -> Any:
    """JSON-able value: numpy/jax scalars become Python floats/ints exactly."""
    if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # 'nan' / 'inf' as strings: JSON has no literal for them
    return value


class MetricsLog:
    def __init__(self, run_dir: Path, *, restart: int, wandb_run: Any | None = None) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.restart = restart
        self.wandb_run = wandb_run
        self._file = self.path.open("a", buffering=1)  # line-buffered: a kill loses at most one line

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        line = {"step": step, "restart": self.restart, "time": time.time()}
        line.update({k: _plain(v) for k, v in metrics.items()})
        self._file.write(json.dumps(line) + "\n")
        if self.wandb_run is not None:
            self.wandb_run.log({k: v for k, v in line.items() if k not in ("step", "time")}, step=step)

    def event(self, kind: str, step: int, **fields: Any) -> None:
        line = {"event": kind, "step": step, "restart": self.restart, "time": time.time()}
        line.update({k: _plain(v) for k, v in fields.items()})
        self._file.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self._file.close()


class NullLog(MetricsLog):
    """The log of a process that does not write one (every process but 0 of a multi-process run)."""

    def __init__(self) -> None:
        self.restart = 0
        self.wandb_run = None

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        pass

    def event(self, kind: str, step: int, **fields: Any) -> None:
        pass

    def close(self) -> None:
        pass


def read_metrics(run_dir: Path) -> Iterator[dict[str, Any]]:
    """Every line of a run's metrics file, in order (events included)."""
    with (Path(run_dir) / METRICS_FILE).open() as f:
        for line in f:
            if line.strip():
                yield json.loads(line)
