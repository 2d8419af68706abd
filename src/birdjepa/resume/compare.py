"""Compare the logged metrics of two runs step by step (each may span several resumed segments).

`birdjepa compare RUN_A RUN_B [--metrics ...]` and `birdjepa verify-resume` both use `compare_runs` and
`print_table`: one definition of "the same run".
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterable
from pathlib import Path

import tyro

from birdjepa import exit_codes
from birdjepa.rundir import layout
from birdjepa.rundir.metrics_log import (
    MetricsFileError,
    by_step,
    close_names,
    compared,
    metrics_by_step,
    read_metrics,
)
from birdjepa.train import revisions

Logged = dict[int, dict[str, float]]
"""A run's log by step (`metrics_by_step`)."""


@dataclasses.dataclass
class MetricDiff:
    name: str
    max_abs: float
    max_rel: float
    first_step: int | None
    first_values: tuple[float | None, float | None] | None
    steps: int


def compare_runs(a: Path, b: Path, metrics: Iterable[str] | None = None) -> list[MetricDiff]:
    """Per metric: max abs/rel difference over the steps both runs logged, and the first differing
    step with both values. A step or metric logged by only one run counts as a difference."""
    return compare_logged(metrics_by_step(a), metrics_by_step(b), metrics)


def _nan(v: object) -> bool:
    return isinstance(v, float) and math.isnan(v)


def compare_logged(ma: Logged, mb: Logged, metrics: Iterable[str] | None = None) -> list[MetricDiff]:
    """`compare_runs` of two runs' logs already read (`metrics_by_step`)."""
    names = sorted(
        set(metrics) if metrics is not None else {k for d in (*ma.values(), *mb.values()) for k in d}
    )
    out = []
    for name in names:
        logged_at = sorted(s for s in set(ma) | set(mb) if name in ma.get(s, {}) or name in mb.get(s, {}))
        diff = MetricDiff(name, 0.0, 0.0, None, None, len(logged_at))
        for s in logged_at:
            va, vb = ma.get(s, {}).get(name), mb.get(s, {}).get(name)
            if va == vb or (_nan(va) and _nan(vb)):
                continue
            # A NaN against a number (a log written by plain json.dumps) was max(0.0, nan) = 0.0: equal.
            if va is None or vb is None or isinstance(va, str) or isinstance(vb, str) or _nan(va) or _nan(vb):
                d, r = float("inf"), float("inf")
            else:
                d = abs(va - vb)
                r = d / max(abs(va), abs(vb), 1e-30)
            diff.max_abs, diff.max_rel = max(diff.max_abs, d), max(diff.max_rel, r)
            if diff.first_step is None:
                diff.first_step, diff.first_values = s, (va, vb)
        out.append(diff)
    return out


def compare_with_coverage(
    a: Path, b: Path, metrics: Iterable[str] | None = None, logs: tuple[Logged, Logged] | None = None
) -> tuple[list[MetricDiff], list[str]]:
    """`compare_runs`, and the lines naming the steps only one run logged (a run stopped early, or
    extended past the other) with the largest difference over the steps both logged (none where both
    logged the same steps); each log read once (``logs``: the two read already, `metrics_by_step`)."""
    ma, mb = logs if logs is not None else (metrics_by_step(a), metrics_by_step(b))
    wanted = set(metrics) if metrics is not None else None
    # A step logged with no compared metric (a resumed segment's first row under --log-every N holds its
    # resume/* checks alone) is no step logged: "steps only B logged: 4, 7", then exit 0.
    sa, sb = (
        {s for s, m in run.items() if (m.keys() if wanted is None else wanted & m.keys())} for run in (ma, mb)
    )
    diffs = compare_logged(ma, mb, metrics)
    if sa == sb:
        return diffs, []
    lines = [f"steps only {run} logged: {step_ranges(only)} ({len(only)})"
             for run, only in ((a, sa - sb), (b, sb - sa)) if only]  # fmt: skip
    both = sa & sb
    ca, cb = ({s: m for s, m in run.items() if s in both} for run in (ma, mb))
    common = max((d.max_abs for d in compare_logged(ca, cb, metrics)), default=0.0)
    return diffs, [*lines, f"over the {len(both)} steps both logged: max_abs_diff={common}"]


def print_table(diffs: list[MetricDiff]) -> float:
    """Prints one row per metric (max abs and rel difference, first differing step with both values);
    returns the largest abs difference (inf when there is nothing to compare)."""
    width = max([len(d.name) for d in diffs] + [6])
    print(f"{'metric':<{width}}  {'steps':>5}  {'max_abs_diff':>12}  {'max_rel_diff':>12}  first difference")
    for d in diffs:
        first = "-" if d.first_step is None else f"step {d.first_step}: {d.first_values}"
        print(f"{d.name:<{width}}  {d.steps:>5}  {d.max_abs:>12.6g}  {d.max_rel:>12.6g}  {first}")
    return max((d.max_abs for d in diffs), default=float("inf"))


def step_ranges(steps: Iterable[int]) -> str:
    """``0-3, 7, 9-10``: sorted steps, runs of consecutive ones as one range."""
    out: list[list[int]] = []
    for s in sorted(steps):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def read_run(run: Path) -> tuple[Logged, dict[str, int]]:
    """A run's log by step (`metrics_by_step`), read once, and the metrics a revision of the step its
    resume crossed redefines in it (names or prefixes, `revisions.redefined`), each with the step it was
    crossed at: its values before and after mean other things, and another run's are either."""
    redefined: dict[str, int] = {}

    def rows() -> Iterable[dict]:
        for line in read_metrics(run):
            if line.get("event") == "step_revised":
                names = revisions.redefined_at(line)
                redefined.update({m: redefined.get(m, line["step"]) for m in names})
            yield line

    return by_step(rows()), redefined


def not_a_run(run: Path) -> str | None:
    """Why ``run`` is no run folder to compare (None: it is one): the argument that is wrong, rather
    than the file in it that could not be opened."""
    if not run.exists():
        return layout.no_run_at(run)
    if not run.is_dir():
        return f"{run}: not a run folder (a file)"
    if not layout.metrics_file(run).is_file():
        return f"{run}: not a run folder (no {layout.METRICS_FILE} in it)"
    return None


def cli(
    run_a: tyro.conf.Positional[Path],
    run_b: tyro.conf.Positional[Path],
    metrics: tuple[str, ...] | None = None,
) -> None:
    """Align two runs' logged metrics by step (all segments) and print per metric the max abs and rel
    difference and the first differing step; exit 1 if any selected metric differs."""
    if metrics == ():  # compared nothing: max_abs_diff=inf, exit 1, a run "different" from itself
        print("error: --metrics: give at least one, or leave it out for every metric", file=sys.stderr)
        raise SystemExit(exit_codes.USAGE)
    for run in (run_a, run_b):
        why = not_a_run(run)
        if why is not None:
            print(f"error: {why}", file=sys.stderr, flush=True)
            raise SystemExit(exit_codes.USAGE)
    try:
        (la, ra), (lb, rb) = read_run(run_a), read_run(run_b)  # read once, for every check below
        logs = la, lb
        if not any(logs):  # an empty table, exit 1, unexplained
            print(f"error: neither {run_a} nor {run_b} logged a step", file=sys.stderr, flush=True)
            raise SystemExit(exit_codes.USAGE)
        redefined = sorted({*ra, *rb})
        if metrics is None and redefined:  # a run resumed across a redefinition differed from both twins
            metrics = tuple(sorted({k for log in logs for m in log.values() for k in m
                                    if not revisions.is_redefined(k, redefined)}))  # fmt: skip
            crossed = "; ".join(f"{run} at step {min(r.values())}" for run, r in ((run_a, ra), (run_b, rb))
                                if r)  # fmt: skip
            print(f"not compared: {', '.join(m + '*' if m.endswith('/') else m for m in redefined)}, which a "
                  f"revision of the step crossed by a resume redefines ({crossed}; `birdjepa analyze` says "
                  "which)")  # fmt: skip
        diffs, coverage = compare_with_coverage(run_a, run_b, metrics, logs)
        unlogged = [d.name for d in diffs if d.steps == 0]  # a typo compared equal: max_abs_diff=0.0
        if uncompared := [m for m in unlogged if not compared(m)]:  # "neither run logged it" where both did
            print(f"error: --metrics {' '.join(uncompared)}: not compared (wall-clock time or bookkeeping, "
                  "which differ between any two runs, or the monitor's references, computed from the batch "
                  "size and the data set's size alone)", file=sys.stderr, flush=True)  # fmt: skip
            raise SystemExit(exit_codes.USAGE)
        if unlogged:
            logged = sorted({k for log in logs for m in log.values() for k in m})
            more = f", ... ({len(logged)})" if len(logged) > 8 else ""
            hint = close_names(unlogged[0], logged) or f"they log {', '.join(logged[:8])}{more}"
            print(f"error: --metrics {' '.join(unlogged)}: neither run logged it; {hint}", file=sys.stderr,
                  flush=True)  # fmt: skip
            raise SystemExit(exit_codes.USAGE)
        worst = print_table(diffs)
        for line in coverage:
            print(line)
    except (MetricsFileError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(exit_codes.USAGE) from None
    print(f"max_abs_diff={worst}")
    if worst != 0.0:
        raise SystemExit(exit_codes.FAILED)
