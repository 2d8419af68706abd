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
import difflib
import json
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any, Protocol

from birdjepa.rundir.layout import METRICS_FILE

TORN_SUFFIX = ".torn"


class Later(Protocol):
    """Values of a row still being computed (`birdjepa.train.param_norms.Norms`)."""

    def result(self) -> Mapping[str, float]: ...


class MetricsFileError(ValueError):
    """A line of a metrics file that is not JSON and not a torn last line."""


#: How `plain` writes a float JSON has no literal for.
NON_FINITE = ("nan", "inf", "-inf")


def plain(value: Any) -> Any:
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
        line.update({k: plain(v) for k, v in metrics.items()})
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
        line.update({k: plain(v) for k, v in fields.items()})
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
    cut, tail = _last_line(path)
    if _parses(tail):
        if tail.endswith(b"\n"):
            return None
        with path.open("ab") as f:  # a whole record that lost only its newline
            f.write(b"\n")
        return None
    torn = path.with_name(path.name + TORN_SUFFIX)
    with torn.open("ab") as f:
        f.write(tail if tail.endswith(b"\n") else tail + b"\n")
    with path.open("r+b") as f:
        f.truncate(cut)
    with path.open("rb") as f:  # the line's number, counted in blocks (a long run's log is hundreds of MB)
        line = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b"")) + 1
    print(f"WARNING {path}:{line}: a torn last line ({len(tail)} bytes, a writer killed mid-append) was "
          f"moved to {torn}", flush=True)  # fmt: skip
    return {"line": line, "bytes": len(tail), "moved_to": str(torn)}


def _last_line(path: Path) -> tuple[int, bytes]:
    """Where the file's last line starts, and its bytes: read back from the end, each block once (a long
    run's log is hundreds of MB; a tail of NULs a crash left, as long)."""
    block = 1 << 16
    with path.open("rb") as f:
        end = f.seek(0, 2)
        pos, content_end, found = end, None, 0  # content_end: past the last byte that is no newline
        while pos > 0 and not found:
            start = max(0, pos - block)
            f.seek(start)
            data = f.read(pos - start)
            if content_end is None and data.rstrip(b"\n"):
                content_end = start + len(data.rstrip(b"\n"))
            if content_end is not None:
                nl = data.rfind(b"\n", 0, content_end - start)
                found = start + nl + 1 if nl >= 0 else 0
            pos = start
        f.seek(found)
        return found, f.read(end - found)


def read_metrics(run_dir: Path) -> Iterator[dict[str, Any]]:
    """Every line of a run's metrics file, in order (events included); see `read_metrics_file`."""
    return read_metrics_file(Path(run_dir) / METRICS_FILE)


def read_metrics_file(path: Path) -> Iterator[dict[str, Any]]:
    """Every line of a metrics file, in order. A torn last line (a live writer mid-append, or one that
    was killed) is skipped with a warning; any other line that does not parse raises `MetricsFileError`
    naming the file and the line."""
    for i, row, why, detail in parsed_lines(path):
        if why == TORN:
            print(
                f"WARNING {path}:{i}: a torn last line is ignored (a writer mid-append or killed)", flush=True
            )
            return
        if why:  # a KeyError's or TypeError's traceback, further on
            raise MetricsFileError(f"{path}:{i}: {why}{f' ({detail})' if detail else ''}")
        yield row


#: Why `parsed_lines` finds a line no row of the log.
NOT_JSON, NOT_A_ROW, TORN = (
    "not a JSON line",
    "not a row of this log (an object with an integer step)",
    "torn",
)


def parsed_lines(path: Path) -> Iterator[tuple[int, dict[str, Any], str, str]]:
    """Each non-empty line of a metrics file, streamed (a long run's is hundreds of MB): its number, its
    row, and "" or why it is none: `NOT_JSON` (with the parser's reason, ``detail``), `NOT_A_ROW`, or
    `TORN`, a last line that does not parse (a writer mid-append, or killed). The one reading of a line
    that the readers (`read_metrics_file`) and the resume (`birdjepa.rundir.log_at_resume`) share."""
    pending: tuple[int, dict[str, Any], str, str] | None = None  # a line that does not parse: torn if last
    with Path(path).open("rb") as f:
        # The file as it was at the open: a live run's log read to its end read on into a line appended
        # meanwhile, its first half a line that "does not parse" before its second.
        left = os.fstat(f.fileno()).st_size
        for i, line in enumerate(f, start=1):
            if left <= 0:
                break
            line, left = line[:left], left - len(line)
            if not line.strip():
                continue
            if pending is not None:
                yield pending
                pending = None
            try:
                row = json.loads(line)
            except ValueError as e:
                pending = (i, {}, NOT_JSON, str(e))
                continue
            step = row.get("step") if isinstance(row, dict) else None
            if not isinstance(step, int) or isinstance(step, bool):
                yield i, {}, NOT_A_ROW, ""
            else:
                yield i, row, "", ""
    if pending is not None:
        yield pending[0], {}, TORN, ""


#: Wall-clock measurements and bookkeeping: they legitimately differ between runs.
NOT_COMPARED = frozenset({"step", "restart", "time", "train/step_time", "train/data_wait"})
#: The resume checks' results exist only in resumed segments: they describe the resume, not the run.
NOT_COMPARED_PREFIXES = ("resume/",)
#: References the monitor computes from the batch size and the data set's size alone, not measurements
#: of the run: a run resumed across a birdjepa whose formula changed (overlap_prev's, made exact) differed
#: from its straight twin there only.
NOT_COMPARED_SUFFIXES = ("_iid_expected",)


def compared(key: str) -> bool:
    return (key not in NOT_COMPARED and not key.startswith(NOT_COMPARED_PREFIXES)
            and not key.endswith(NOT_COMPARED_SUFFIXES))  # fmt: skip


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


def close_names(name: str, logged: Iterable[str]) -> str | None:
    """``did you mean A, B?`` for a metric name a log lacks (a typo), from the names it holds; None where
    none is close (compare listed the first 8 names in order, all dataloader/*, never train/loss)."""
    near = difflib.get_close_matches(name, sorted(logged), n=3)
    return f"did you mean {', '.join(near)}?" if near else None
