"""What a resume learns from the run's metrics log, read once.

A resume asks the log five things: the highest restart it holds (a segment killed before its first save
logged under its checkpoint's restart), whether it is still the log of the steps the checkpoint holds
(`damage`), whether a checkpoint the log says was saved is gone (`lost`), whether its row of the
checkpoint's step is what the checkpoint recorded (`other`), and whether that step was evaluated (a stop
saved without its evaluation evaluates it first, once). A long run's log is hundreds of MB: each
question read and parsed it whole again (15 s at a resume of a 210 MB log), so one streaming pass collects
what all four need, before the writer opens the log (which cuts a torn last line off: skipped here too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from birdjepa.rundir.layout import CHECKPOINTS, DAMAGED_DIR
from birdjepa.rundir.metrics_log import NOT_COMPARED, TORN, parsed_lines, plain

#: The metric every evaluation's row holds (`birdjepa.evaluation.report.metrics`).
EVALUATED = "eval/knn_acc"


@dataclass(frozen=True)
class LogAtResume:
    """One pass over a run's metrics log at a resume from checkpoint ``checkpoint``."""

    path: Path
    checkpoint: int
    bad: str | None = None  # the first line compare and analyze refuse, said as they say it
    last_step: int = -1  # the newest training row's step
    saved: int = -1  # the newest `stop` event's step: that checkpoint was on disk
    restart: int = -1  # the highest restart any line holds
    row: Mapping[str, Any] | None = None  # the newest training row of the checkpoint's step
    evaluated: bool = False  # an evaluation's row of the checkpoint's step is there

    def damage(self, slack: int) -> str | None:
        """Why the log is not the log of the steps the checkpoint holds, in one line (None: it is): a line
        compare and analyze refuse, or no step row within ``slack`` steps of the checkpoint (the log was
        emptied, removed or replaced). Said at the resume: it was found only by a later `compare`."""
        if self.bad is not None:
            return f"{self.bad}: compare and analyze refuse the log until it is repaired"
        if self.last_step + slack > self.checkpoint:
            return None
        upto = f"up to step {self.last_step} only" if self.last_step >= 0 else "no step"
        return (f"{self.path} holds rows of {upto}, and checkpoint {self.checkpoint} was written after step "
                f"{self.checkpoint}: the log lost rows (emptied, removed or replaced); compare will lack "
                "them")  # fmt: skip

    def lost(self, run_dir: Path) -> str | None:
        """Why the resume retrains steps the run had saved, in one line (None: it does not): the log's
        newest `stop` event (written once that step's checkpoint was on disk) is past the checkpoint, and
        that checkpoint is neither in ``checkpoints/`` nor set aside as damaged (which the resume says
        itself): removed by hand, or lost with a disk. The resume is exact all the same; it was silent.
        A log with a bad line is `damage`'s to say."""
        damaged = Path(run_dir) / DAMAGED_DIR
        if self.bad is not None or self.saved <= self.checkpoint:
            return None
        if (Path(run_dir) / CHECKPOINTS / str(self.saved)).exists() or (damaged / str(self.saved)).exists():
            return None
        if any(damaged.glob(f"{self.saved}-*")):
            return None
        return (f"checkpoint {self.saved}, which the log says this run saved when it stopped, is gone from "
                f"{Path(run_dir) / CHECKPOINTS}: resuming from checkpoint {self.checkpoint}, steps "
                f"{self.checkpoint + 1}-{self.saved} train again")  # fmt: skip

    def other(self, recorded: Mapping[str, Any]) -> str | None:
        """Why the log is not the history the checkpoint continues, in one line (None: it is, or the log
        holds no training row of the checkpoint's step to tell): that row differs from what the
        checkpoint recorded of it (``recorded``: its ``last_metrics``). Another run's checkpoints (or log)
        copied into a run resumed it without a word, and `compare` and `analyze` then read two runs as
        one. Clocks differ between two segments that trained the step (a kill -9, then another
        --log-every): left out; the loss named first."""
        row = self.row or {}
        differ = sorted((k != "train/loss", k) for k in recorded
                        if k in row and k not in NOT_COMPARED and plain(recorded[k]) != row[k])  # fmt: skip
        if not differ:
            return None
        k = differ[0][1]
        return (f"{self.path}'s row of step {self.checkpoint} is not what checkpoint {self.checkpoint} "
                f"recorded of it ({k}: logged {row[k]}, checkpointed {plain(recorded[k])}): the checkpoints "
                "or the log are another run's (copied in?), and compare and analyze will read the two as "
                "one run")  # fmt: skip


def read_at_resume(path: Path, checkpoint: int) -> LogAtResume:
    """`LogAtResume` of the log at ``path`` (none there: an empty one), streamed line by line; a torn last
    line is the writer's to cut off (`birdjepa.rundir.metrics_log.repair_torn_tail`), not damage."""
    found: dict[str, Any] = {"last_step": -1, "saved": -1, "restart": -1, "row": None, "evaluated": False}
    bad: str | None = None
    for i, row, why, _ in parsed_lines(path) if path.exists() else ():
        if not why:
            _take(found, row, checkpoint)
        elif why != TORN and bad is None:
            bad = f"{path}:{i}: {why}"
    return LogAtResume(path, checkpoint, bad=bad, **found)


def _take(found: dict[str, Any], row: dict[str, Any], checkpoint: int) -> None:
    step = row["step"]
    if type(row.get("restart")) is int:
        found["restart"] = max(found["restart"], row["restart"])
    if row.get("event") == "stop":
        found["saved"] = max(found["saved"], step)
    elif "event" not in row:
        found["last_step"] = max(found["last_step"], step)
        # The training row: an evaluation's row of the same step, written after it, holds no train/ value.
        if step == checkpoint and "train/loss" in row:
            found["row"] = row
        found["evaluated"] |= step == checkpoint and EVALUATED in row
