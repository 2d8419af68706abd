"""Load a run's metrics as one timeline, and find where it was resumed.

Sources:

* our run directory (or its ``metrics.jsonl``): every segment appends to one file and each resume writes
  an explicit ``resume`` event, so the boundaries are exact;
* a CSV, e.g. a wandb export, with a step column (``step`` or ``_step``) and optionally a timestamp
  column (``_timestamp``, ``timestamp`` or ``time``: seconds, or ISO 8601): logs of other tools carry no
  resume events, so a resume is inferred where the step goes back or where consecutive rows are more than
  ``gap_s`` seconds apart (600 s by default: a requeued job waits minutes, a healthy step never does).

A segment that restarts at an earlier step than the previous one reached (the previous one trained past
its last checkpoint before it was killed) replaces those steps: the timeline is the run as it went on.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import datetime
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from birdjepa.rundir import layout
from birdjepa.rundir.metrics_log import MetricsFileError, read_metrics_file
from birdjepa.train import revisions

#: Rows further apart than this (seconds) in a log without resume events start a new segment.
DEFAULT_GAP_S = 600.0
STEP_COLUMNS = ("step", "_step")
TIME_COLUMNS = ("_timestamp", "timestamp", "time")
#: Bookkeeping columns, never treated as metrics.
NOT_METRICS = frozenset({"step", "_step", "restart", "time", "_timestamp", "timestamp", "_runtime", "event"})


class LogError(MetricsFileError):
    """A log that cannot be analysed (named with its row where there is one): no logged step, no step
    column, no numeric metric, a step or a metric value that is not a number."""


@dataclasses.dataclass(frozen=True)
class Resume:
    step: int
    """First step of the resumed segment."""
    segment: int
    """Its segment number (the first start is segment 0)."""
    reason: str
    """How it was found: ``resume event (checkpoint 149)``, ``step went back from 160``,
    ``time gap 3600 s``."""
    gap_s: float
    """Wall-clock seconds between the last row before it and its first row (nan without timestamps)."""


@dataclasses.dataclass
class RunLog:
    """One run as a timeline: ``steps`` strictly increasing, each metric a float64 array aligned with it
    (nan where the metric was not logged at that step)."""

    name: str
    steps: np.ndarray
    time: np.ndarray
    metrics: dict[str, np.ndarray]
    resumes: list[Resume]
    non_finite: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    """The steps at which each metric was logged NaN or inf (a diverged or skipped step): a NaN is left
    out of `series` and the windows' means as if not logged, so the report names them."""

    def series(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) where ``metric`` was logged."""
        if metric not in self.metrics:
            raise KeyError(f"{self.name}: no metric {metric!r} (it has {len(self.metrics)}: "
                           f"{', '.join(sorted(self.metrics)[:12])}, ...)")  # fmt: skip
        values = self.metrics[metric]
        keep = ~np.isnan(values)
        return self.steps[keep], values[keep]


@dataclasses.dataclass
class _Row:
    step: int
    time: float
    values: dict[str, float]


def _number(value: Any) -> float | None:
    """A metric value as float; None for what is not a number (text columns, empty CSV cells)."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # also 'nan' / 'inf', as our log writes them
        except ValueError:
            return None
    return None


def _seconds(value: Any) -> float | None:
    """A time cell as seconds: a number, or an ISO 8601 date and time (ignored before: a 2-hour gap
    between two such rows found no resume)."""
    seconds = _number(value)
    if seconds is None and isinstance(value, str):
        with contextlib.suppress(ValueError):
            when = datetime.datetime.fromisoformat(value.strip())
            # One without a zone is read as UTC, not in the reader's zone: the night clocks went back,
            # New York found a resume where UTC found none.
            seconds = (when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)).timestamp()
    return seconds


def _row(step: int, time: float, items: Iterable[tuple[str, Any]]) -> _Row:
    values = {}
    for k, v in items:
        if k not in NOT_METRICS and (x := _number(v)) is not None:
            values[k] = x
    return _Row(step, time, values)


def _timeline(name: str, segments: list[list[_Row]], resumes: list[Resume]) -> RunLog:
    """Merges the segments' rows: rows of one step within a segment are merged, and a segment drops the
    rows of earlier segments at or after its first step."""
    by_step: dict[int, _Row] = {}
    for rows in segments:
        if rows:
            first = rows[0].step
            by_step = {s: r for s, r in by_step.items() if s < first}
        for r in rows:
            if r.step in by_step:
                by_step[r.step].values.update(r.values)
                by_step[r.step].time = r.time
            else:
                by_step[r.step] = _Row(r.step, r.time, dict(r.values))
    steps = np.array(sorted(by_step), dtype=np.int64)
    names = sorted({k for r in by_step.values() for k in r.values})
    metrics = {k: np.full(len(steps), np.nan) for k in names}
    for i, s in enumerate(steps):
        for k, v in by_step[int(s)].values.items():
            metrics[k][i] = v
    time = np.array([by_step[int(s)].time for s in steps], dtype=np.float64)
    non_finite = {k: [int(s) for s in steps[~np.isfinite(v) & ~np.isnan(v)]] for k, v in metrics.items()}
    for r in by_step.values():  # a NaN is told from "not logged" by the row that logged it
        for k, v in r.values.items():
            if math.isnan(v):
                non_finite[k].append(r.step)
    non_finite = {k: sorted(v) for k, v in non_finite.items() if v}
    return RunLog(name, steps, time, metrics, resumes, non_finite)


def _revised(event: dict[str, Any]) -> str:
    saved, now = event["revision"]
    redefined = revisions.redefined_at(event)
    more = f", which redefines {', '.join(redefined)}" if redefined else ""
    return f"by another revision of the step ({saved} -> {now}{more})"


def _moved(event: dict[str, Any]) -> str:
    changed = [k for k, v in event.items() if isinstance(v, list)]  # each as [saved, now]
    return f"on another kind of machine ({', '.join(changed)})"


#: Events the trainer logs at a resume that say its metrics may move for a reason besides the resume.
AT_A_RESUME: dict[str, Callable[[dict[str, Any]], str]] = {
    "step_revised": _revised,
    "machine_changed": _moved,
    "eval_data_changed": lambda event: "on another eval split (its eval metrics move)",
    "decode_revised": lambda event: "by a decoder of another revision ({} -> {})".format(
        *(r or "unrecorded" for r in event["revision"])
    ),
}


def _line_number(path: Path, index: int) -> int:
    """The 1-based line of the ``index``-th row `read_metrics_file` yields (it skips blank lines)."""
    lines = path.read_bytes().split(b"\n")
    return [i + 1 for i, line in enumerate(lines) if line.strip()][index]


def _shown(value: Any, most: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= most else f"{text[: most - 3]}..."


def _ours(path: Path, name: str) -> RunLog:
    """Our JSON lines: segments split at the explicit ``resume`` events."""
    segments: list[list[_Row]] = [[]]
    resumes: list[Resume] = []
    last_time = math.nan
    numeric: set[str] = set()  # keys with a number in some row
    text: dict[str, tuple[int, Any]] = {}  # key -> the first row (index) and value that is not a number
    refused = False  # the last resume's checks failed and stopped it (exit 65): its one row is theirs
    for index, line in enumerate(read_metrics_file(path)):
        seconds = _seconds(line.get("time"))  # null or an ISO time: as a CSV's time column reads
        time = math.nan if seconds is None else seconds
        if line.get("event") == "resume":
            if resumes and (refused or not segments[-1]) and resumes[-1].step == int(line["step"]):
                resumes.pop()  # a resume refused: it trained nothing
                segments.pop()
            refused = False
            resumes.append(
                Resume(int(line["step"]), len(segments), f"resume event (checkpoint "
                       f"{line.get('checkpoint')})", time - last_time)
            )  # fmt: skip
            segments.append([])
        elif line.get("event") == "resume_check_failed" and line.get("action") != "warn":
            refused = bool(resumes) and resumes[-1].step == line.get("step")
        elif line.get("event") in AT_A_RESUME and resumes and resumes[-1].step == line.get("step"):
            said = AT_A_RESUME[line["event"]](line)
            resumes[-1] = dataclasses.replace(resumes[-1], reason=f"{resumes[-1].reason}; {said}")
        elif "event" not in line:
            segments[-1].append(row := _row(int(line["step"]), time, line.items()))
            last_time = time
            numeric.update(row.values)
            for k, v in line.items():  # null: not logged, as an empty CSV cell
                if v is not None and k not in row.values and k not in NOT_METRICS:
                    text.setdefault(k, (index, v))
    # As in a CSV: a key of text (or lists) only is no metric, but text among its numbers is damage.
    bad = sorted((index, k, v) for k, (index, v) in text.items() if k in numeric)
    if bad:
        index, key, value = bad[0]
        raise LogError(f"{path}:{_line_number(path, index)}: {key!r}: {_shown(value)} is not a number (other "
                       "rows log it as one)")  # fmt: skip
    return _timeline(name, segments, resumes)


def _split_foreign(rows: list[_Row], gap_s: float) -> tuple[list[list[_Row]], list[Resume]]:
    """Segments of a log without resume events: a new one where the step goes back or the clock jumps."""
    segments: list[list[_Row]] = [[]]
    resumes: list[Resume] = []
    for r in rows:
        prev = segments[-1][-1] if segments[-1] else None
        if prev is not None and r.step != prev.step:
            gap = r.time - prev.time
            reason = None
            if r.step < prev.step:
                reason = f"step went back from {prev.step}"
            elif gap > gap_s:
                reason = f"time gap {gap:.0f} s"
            elif gap < -gap_s:  # a segment on a node whose clock is behind: not found at all
                reason = f"the clock went back {-gap:.0f} s"
            if reason:
                resumes.append(Resume(r.step, len(segments), reason, gap))
                segments.append([])
        segments[-1].append(r)
    return segments, resumes


def _first_column(row: Mapping[str, Any], names: Iterable[str], where: str, *, required: bool) -> str | None:
    """The first of ``names`` the row has a value for (CSV rows give "" for an empty cell)."""
    for n in names:
        if row.get(n) not in (None, ""):
            return n
    if required:
        if any(n in row for n in names):  # the column is there: "no step column" sent one looking for it
            raise LogError(f"{where}: its {next(n for n in names if n in row)!r} cell is empty")
        raise LogError(f"{where}: no step column (one of {', '.join(names)}) in {sorted(row)[:12]}")
    return None


def _foreign(name: str, records: Iterable[Mapping[str, Any]], where: str, gap_s: float) -> RunLog:
    """Rows of another tool's log (dicts with a step and maybe a timestamp column); resumes inferred."""
    rows = []
    numeric: set[str] = set()  # columns with a number in some row
    text: dict[str, tuple[int, str]] = {}  # column -> the first row and text of a value that is not one
    for i, rec in enumerate(records):
        step_col = _first_column(rec, STEP_COLUMNS, f"{where} row {i + 1}", required=True)
        time_col = _first_column(rec, TIME_COLUMNS, where, required=False)
        step = _number(rec[step_col])
        if step is None or not float(step).is_integer():
            raise LogError(f"{where} row {i + 1}: step {rec[step_col]!r} is not an integer")
        t = _seconds(rec[time_col]) if time_col else None
        rows.append(_row(int(step), math.nan if t is None else t, rec.items()))
        numeric.update(rows[-1].values)
        for k, v in rec.items():
            if isinstance(v, str) and v.strip() and k not in rows[-1].values and k not in NOT_METRICS:
                text.setdefault(k, (i + 1, v))
    # A column of text is no metric, but text among a metric's numbers is a damaged value, not a gap.
    bad = sorted((row, k, v) for k, (row, v) in text.items() if k in numeric)
    if bad:
        row, column, value = bad[0]
        raise LogError(f"{where} row {row}: column {column!r}: {value!r} is not a number")
    segments, resumes = _split_foreign(rows, gap_s)
    return _timeline(name, segments, resumes)


def load_run(path: str | Path, *, gap_s: float = DEFAULT_GAP_S, name: str | None = None) -> RunLog:
    """A run directory, its ``metrics.jsonl``, or a CSV export (see the module docstring)."""
    path = Path(path)
    if not path.exists() and not path.suffix:  # a run folder not there: "runs/demo: no metrics log"
        raise FileNotFoundError(layout.no_run_at(path))
    if path.is_dir():
        name = name or path.name
        path = layout.metrics_file(path)
    name = name or path.stem
    if not path.exists():
        raise FileNotFoundError(f"{path}: no metrics log")
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8-sig") as f:  # a spreadsheet's BOM: "no step column"
            log = _foreign(name, csv.DictReader(f), str(path), gap_s)
    else:
        log = _ours(path, name)
    if not len(log.steps):  # nothing to plot or to measure a jump on
        raise LogError(f"{path}: no logged step (an empty log, or a header or events only)")
    if not log.metrics:  # a matplotlib traceback, after the analysis folder was made
        raise LogError(
            f"{path}: no numeric metric (its values besides step and time are text, lists or empty)"
        )
    return log


def from_rows(name: str, rows: Iterable[Mapping[str, Any]], *, gap_s: float = DEFAULT_GAP_S) -> RunLog:
    """A timeline from in-memory rows (e.g. wandb's ``scan_history()``), read like a CSV export."""
    return _foreign(name, rows, name, gap_s)
