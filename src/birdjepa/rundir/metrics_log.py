"""One JSON line per logged step in the run directory: the source of truth for analysis.

Every segment of a run (each start and resume) appends to the same ``metrics.jsonl``; a line carries
the step, the restart counter and the metrics, and a resume writes an explicit event line. Floats are
written with Python's ``repr`` (shortest round-trip form), so values read back compare with ``==``.
wandb, when enabled, mirrors the same dicts; it is never read back.

A node that dies in the middle of an append leaves a torn last line. Opening the log for writing cuts
such a tail off into ``metrics.jsonl.torn`` (`repair_torn_tail`), so every append starts on a new line;
every reader (`read_metrics`, and through it ``compare``, ``analyze``, ``evaluate`` and the notebooks)
skips a torn last line of a live file with a warning, and stops at any other line that does not parse,
naming the file and the line.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Protocol

from birdjepa.rundir.layout import CHECKPOINTS, DAMAGED_DIR, METRICS_FILE

TORN_SUFFIX = ".torn"


class Later(Protocol):
    """Values of a row still being computed (`birdjepa.train.param_norms.Norms`)."""

    def result(self) -> Mapping[str, float]: ...


class MetricsFileError(ValueError):
    """A line of a metrics file that is not JSON and not a torn last line."""


#: How `_plain` writes a float JSON has no literal for.
NON_FINITE = ("nan", "inf", "-inf")


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
        #: What `repair_torn_tail` cut off when the log was opened (None: nothing); the loop logs it.
        self.repaired = repair_torn_tail(self.path)
        self._file = self.path.open("a", buffering=1)  # line-buffered: a kill loses at most one line
        self._held: tuple[int, MutableMapping[str, Any], Later] | None = None

    def log(self, step: int, metrics: MutableMapping[str, Any], later: Later | None = None) -> None:
        """Writes the row of ``step``; with ``later``, holds it until `flush`, then adds ``later``'s
        values to ``metrics`` (the caller's dict, in place) and writes it. Any write flushes a held row
        first, so the rows keep the order of the calls; a kill loses at most the held row and the line
        being written (a resume writes both again)."""
        self.flush()
        if later is not None:
            self._held = (step, metrics, later)
        else:
            self._write_row(step, metrics)

    def flush(self) -> None:
        """Writes the held row, if any, once its values are in."""
        if self._held is None:
            return
        step, metrics, later = self._held
        self._held = None
        metrics.update(later.result())
        self._write_row(step, metrics)

    def _write_row(self, step: int, metrics: Mapping[str, Any]) -> None:
        line = {"step": step, "restart": self.restart, "time": time.time()}
        line.update({k: _plain(v) for k, v in metrics.items()})
        self._write(line)
        if self.wandb_run is not None:  # numbers, NaN too: the log's "nan" made a series of mixed types
            numbers = {k: float(v) if v in NON_FINITE else v for k, v in line.items()}
            try:
                self.wandb_run.log({k: v for k, v in numbers.items() if k not in ("step", "time")}, step=step)
            except Exception as e:  # noqa: BLE001 (its service killed: the run stopped, its steps lost)
                self.mirror_stopped(e)

    def mirror_stopped(self, e: BaseException) -> None:
        """The wandb mirror failed (its service process killed, by the OOM killer say): a WARNING, and
        the run trains on, its log the source of truth, as where the mirror could not start."""
        said = " ".join(str(e).split())
        print(f"WARNING the wandb mirror stopped ({type(e).__name__}: {said}); the run trains on, logged to "
              f"{self.path} only", flush=True)  # fmt: skip
        self.wandb_run = None
        wandb = sys.modules.get("wandb")
        if wandb is not None:  # its exit hook, which printed a 30-line traceback at the run's exit, gone
            with contextlib.suppress(Exception):
                wandb.teardown()

    def event(self, kind: str, step: int, **fields: Any) -> None:
        self.flush()
        line = {"event": kind, "step": step, "restart": self.restart, "time": time.time()}
        line.update({k: _plain(v) for k, v in fields.items()})
        self._write(line)

    def _write(self, line: dict[str, Any]) -> None:
        try:
            self._file.write(json.dumps(line) + "\n")
        except OSError as e:  # a full disk: the error names the log, so the one line that stops the run does
            raise OSError(e.errno, e.strerror, str(self.path)) from e

    def close(self) -> None:
        try:
            self.flush()
        finally:
            try:
                self._file.close()
            except OSError:  # the last buffered bytes on a full disk: the write before already said so
                pass


class NullLog(MetricsLog):
    """The log of a process that does not write one (every process but 0 of a multi-process run): it
    holds and completes rows as the log does (the caller's dict gets ``later``'s values), writes none."""

    def __init__(self) -> None:
        self.restart = 0
        self.wandb_run = None
        self.repaired = None
        self._held = None

    def _write_row(self, step: int, metrics: Mapping[str, Any]) -> None:
        pass  # not even the line: a row a step on every process but the first

    def _write(self, line: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        self.flush()


def _parses(text: bytes) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def repair_torn_tail(path: Path) -> dict[str, Any] | None:
    """Before a writer appends: a last line that does not parse (a writer killed mid-append) is moved to
    ``<path>.torn`` and cut off, with a WARNING; a complete last record that only lacks its newline gets
    one. Returns what was done (None when the file was whole)."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    data = path.read_bytes()
    cut = data.rstrip(b"\n").rfind(b"\n") + 1  # where the last line starts
    tail = data[cut:]
    if _parses(tail):
        if data.endswith(b"\n"):
            return None
        with path.open("ab") as f:  # a whole record that lost only its newline
            f.write(b"\n")
        return None
    torn = path.with_name(path.name + TORN_SUFFIX)
    with torn.open("ab") as f:
        f.write(tail if tail.endswith(b"\n") else tail + b"\n")
    with path.open("r+b") as f:
        f.truncate(cut)
    line = data[:cut].count(b"\n") + 1
    print(f"WARNING {path}:{line}: a torn last line ({len(tail)} bytes, a writer killed mid-append) was "
          f"moved to {torn}", flush=True)  # fmt: skip
    return {"line": line, "bytes": len(tail), "moved_to": str(torn)}


def log_damage(path: Path, checkpoint: int, slack: int) -> str | None:
    """Why a resumed run's log is not the log of the steps its checkpoint holds, in one line (None: it
    is): a line that does not parse (compare and analyze refuse the log), or no step row within
    ``slack`` steps of checkpoint ``checkpoint`` (the log was emptied, removed or replaced). Said at the
    resume: it was found only by a later `compare`."""
    rows = path.read_bytes().split(b"\n") if path.exists() else []
    last = -1
    for i, line in enumerate(rows):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            return f"{path}:{i + 1}: not a JSON line: compare and analyze refuse the log until it is repaired"
        if isinstance(row, dict) and "event" not in row and isinstance(row.get("step"), int):
            last = max(last, row["step"])
    if last + slack <= checkpoint:
        upto = f"up to step {last} only" if last >= 0 else "no step"
        return (f"{path} holds rows of {upto}, and checkpoint {checkpoint} was written after step "
                f"{checkpoint}: the log lost rows (emptied, removed or replaced); compare will lack "
                "them")  # fmt: skip
    return None


#: How `MetricsLog` writes a line's restart (``{"step": 3, "restart": 1, ...}``, an event's alike).
_RESTART = re.compile(rb'"restart": (\d+)')


def logged_restart(log: bytes) -> int:
    """The highest ``restart`` any line of a log's bytes holds (-1: none). A segment killed before its
    first save logged rows under the restart its checkpoint gave, and the next resume, from the same
    checkpoint, logged the same number: two segments that no field told apart. Searched as bytes (a long
    run's log is hundreds of MB), not parsed."""
    return max(map(int, _RESTART.findall(log)), default=-1)


def other_history(path: Path, log: bytes, checkpoint: int, recorded: Mapping[str, Any]) -> str | None:
    """Why the log at ``path`` (its bytes: ``log``) is not the history checkpoint ``checkpoint``
    continues, in one line (None: it is, or the log holds no row of that step to tell): its row of that
    step differs from what the checkpoint recorded of it (``recorded``: its ``last_metrics``). Another
    run's checkpoints (or log) copied into a run resumed it without a word, every resume check passing,
    and `compare` and `analyze` then read two runs as one."""
    # The lines of the step, found without splitting the whole log (hundreds of MB on a long run).
    lines = re.findall(rb'^.*"step": %d,.*$' % checkpoint, log, re.MULTILINE) if recorded else []
    # The newest training row of the step: an evaluation's row of the same step, written after it, holds
    # no train/ value (the check never fired where a save met an evaluation: every default cadence's).
    rows = map(_json_or_none, reversed(lines))
    row = next((r for r in rows if isinstance(r, dict) and "event" not in r and r.get("step") == checkpoint
                and "train/loss" in r), None)  # fmt: skip
    # Clocks differ between two segments that trained the step (a kill -9, then another --log-every):
    # left out; the loss named first.
    differ = sorted((k != "train/loss", k) for k in recorded if row is not None and k in row
                    and k not in NOT_COMPARED and _plain(recorded[k]) != row[k])  # fmt: skip
    if not differ:
        return None
    k = differ[0][1]
    return (f"{path}'s row of step {checkpoint} is not what checkpoint {checkpoint} recorded of it ({k}: "
            f"logged {row[k]}, checkpointed {_plain(recorded[k])}): the checkpoints or the log are another "
            "run's (copied in?), and compare and analyze will read the two as one run")  # fmt: skip


def _json_or_none(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


def lost_checkpoint(run_dir: Path, checkpoint: int) -> str | None:
    """Why a resume from ``checkpoint`` retrains steps the run had saved, in one line (None: it does
    not): the log's newest `stop` event (written once that step's checkpoint was on disk) is past it,
    and that checkpoint is neither in ``checkpoints/`` nor set aside as damaged (which the resume says
    itself): removed by hand, or lost with a disk. The resume is exact all the same; it was silent. A
    log that does not parse is `log_damage`'s to say (its first bad line stopped the resume here)."""
    try:
        rows = list(read_metrics(run_dir)) if (Path(run_dir) / METRICS_FILE).exists() else []
    except MetricsFileError:
        return None
    stops = [r["step"] for r in rows if r.get("event") == "stop" and isinstance(r.get("step"), int)]
    saved = max(stops, default=-1)
    damaged = Path(run_dir) / DAMAGED_DIR
    aside = (damaged / str(saved)).exists() or any(damaged.glob(f"{saved}-*"))
    if saved <= checkpoint or (Path(run_dir) / CHECKPOINTS / str(saved)).exists() or aside:
        return None
    return (f"checkpoint {saved}, which the log says this run saved when it stopped, is gone from "
            f"{Path(run_dir) / CHECKPOINTS}: resuming from checkpoint {checkpoint}, steps {checkpoint + 1}-"
            f"{saved} train again")  # fmt: skip


def read_metrics(run_dir: Path) -> Iterator[dict[str, Any]]:
    """Every line of a run's metrics file, in order (events included); see `read_metrics_file`."""
    return read_metrics_file(Path(run_dir) / METRICS_FILE)


def read_metrics_file(path: Path) -> Iterator[dict[str, Any]]:
    """Every line of a metrics file, in order. A torn last line (a live writer mid-append, or one that
    was killed) is skipped with a warning; any other line that does not parse raises `MetricsFileError`
    naming the file and the line."""
    with Path(path).open("rb") as f:
        lines = f.read().split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            if i == last:
                print(f"WARNING {path}:{i + 1}: a torn last line is ignored (a writer mid-append or killed)",
                      flush=True)  # fmt: skip
                return
            raise MetricsFileError(f"{path}:{i + 1}: not a JSON line ({e})") from None
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):  # a KeyError's or TypeError's traceback
            raise MetricsFileError(f"{path}:{i + 1}: not a row of this log (an object with an integer step)")
        yield row


#: Wall-clock measurements and bookkeeping: they legitimately differ between runs.
NOT_COMPARED = frozenset({"step", "restart", "time", "train/step_time", "train/data_wait"})
#: The resume checks' results exist only in resumed segments: they describe the resume, not the run.
NOT_COMPARED_PREFIXES = ("resume/",)


def compared(key: str) -> bool:
    return key not in NOT_COMPARED and not key.startswith(NOT_COMPARED_PREFIXES)


def metrics_by_step(run_dir: Path, *, everything: bool = False) -> dict[int, dict[str, float]]:
    """step -> {metric: value} over every segment of a run (event lines skipped); only the compared
    metrics unless ``everything``."""
    return by_step(read_metrics(run_dir), everything=everything)


def by_step(lines: Iterable[dict[str, Any]], *, everything: bool = False) -> dict[int, dict[str, float]]:
    """`metrics_by_step` of a log's lines already read."""
    out: dict[int, dict[str, float]] = {}
    for line in lines:
        if "event" in line:
            continue
        out.setdefault(line["step"], {}).update({k: v for k, v in line.items() if everything or compared(k)})
    return out
