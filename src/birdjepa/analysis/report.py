"""`birdjepa analyze`: figures and a markdown table of what each resume did to each metric."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path

import tyro

from birdjepa import exit_codes
from birdjepa.analysis import figures
from birdjepa.analysis.load import DEFAULT_GAP_S, RunLog, load_run
from birdjepa.analysis.windows import Jump, jumps, max_abs_diff, windows_at
from birdjepa.outputs import unwritable
from birdjepa.rundir import layout
from birdjepa.rundir.metrics_log import MetricsFileError, close_names

#: Plotted when --metrics is not given (those the run logged).
DEFAULT_METRICS = (
    "train/loss",
    "train/sigreg",
    "train/invariance",
    "train/probe_ce",
    "train/grad_norm",
    "train/param_norm",
    "dataloader/bucket_lag1/div",
    "dataloader/window_unique",
)


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return f"{x:.4g}"


def summary_markdown(log: RunLog, found: list[Jump], width: int, other: RunLog | None,
                     whole_run: dict[str, float] | None) -> str:  # fmt: skip
    """The report: the resumes and how they were found, then one row per resume and metric."""
    lines = [f"# Resume analysis: {log.name}", ""]
    lines.append(f"{len(log.steps)} logged steps ({log.steps[0]}..{log.steps[-1]}), {len(log.resumes)} "
                 f"resume(s); windows of {width} steps.")  # fmt: skip
    for r in log.resumes:
        gap = "" if math.isnan(r.gap_s) else f", {r.gap_s:.1f} s after the previous line"
        if r.gap_s < 0:  # "-3595.4 s after": a segment on a node whose clock was behind
            gap = f", {-r.gap_s:.1f} s before the previous line by its clock"
        before, after = windows_at(log, r.step, width)
        where = " and ".join(w for w, cut in (("start", before < width), ("end", after < width)) if cut)
        if where:  # its z is against drift over windows as short as its own: said, as the table is not
            gap += (f"; windows cut by the run's {where}: {before} step{'s' * (before != 1)} before, {after} "
                    "after (its drift from windows of the same lengths)")  # fmt: skip
        lines.append(f"- step {r.step}: {r.reason}{gap}")
    if log.non_finite:  # a NaN is left out of the means below as if not logged: said, not averaged away
        said = "; ".join(f"{k} at step{'s' * (len(v) > 1)} {', '.join(map(str, v[:10]))}"
                         f"{', ...' * (len(v) > 10)}" for k, v in sorted(log.non_finite.items()))  # fmt: skip
        lines.append(
            f"Logged not finite: {said} (a NaN is left out of its window's mean, an inf makes it inf)."
        )
    lines += [
        "",
        f"jump = mean over [r, r+{width}) − mean over [r−{width}, r); z = (jump − mean drift) / sd drift, "
        f"where drift is the same statistic at every step of {(other or log).name} whose ±{width} windows "
        "hold no resume.",
        "",
    ]
    head = "| resume step | metric | pre | post | jump | z | drift sd | n drift |"
    rule = "|---:|---|---:|---:|---:|---:|---:|---:|"
    if other is not None:
        head += f" jump of {other.name} at r | max abs diff vs {other.name} (window) |"
        rule += "---:|---:|"
    lines += [head, rule]
    for j in found:
        row = (f"| {j.resume_step} | {j.metric} | {_fmt(j.pre)} | {_fmt(j.post)} | {_fmt(j.jump)} | "
               f"{_fmt(j.z)} | {_fmt(j.drift_sd)} | {j.n_drift} |")  # fmt: skip
        if other is not None:
            row += f" {_fmt(j.other_jump)} | {_fmt(j.other_max_abs)} |"
        lines.append(row)
    if other is not None and whole_run is not None:
        worst = max(whole_run.values(), default=math.inf)
        differing = sorted(((v, k) for k, v in whole_run.items() if v != 0.0), reverse=True)
        lines += ["", f"Whole run against {other.name}, every compared metric ({len(whole_run)}): "
                  f"max_abs_diff={worst!r}"]  # fmt: skip
        if differing:  # inf: logged at a step by one run only (e.g. a monitor metric logged when it flags)
            shown = ", ".join(f"{k} {_fmt(v)}" for v, k in differing[:12])
            lines.append(f"{len(differing)} differ; the largest: {shown}")
        train = [v for k, v in whole_run.items() if k.startswith("train/")]
        if train:
            lines.append(f"train/ metrics only ({len(train)}): max_abs_diff={max(train)!r}")
    return "\n".join(lines) + "\n"


def _slug(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", metric).strip("_")


@dataclasses.dataclass(frozen=True)
class Analysis:
    summary: Path
    figures: list[Path]
    jumps: list[Jump]
    max_abs_diff: float | None
    """Over every compared metric against the other run (None without one)."""


def analyze(
    run: Path,
    *,
    other: Path | None = None,
    metrics: tuple[str, ...] | None = None,
    window: int = 20,
    out: Path | None = None,
    gap_s: float = DEFAULT_GAP_S,
) -> Analysis:
    """Writes ``summary.md``, ``overview.png``, ``window-<metric>.png`` per metric and, when the run has
    loader diagnostics, ``iid_grid.png`` into ``out`` (default ``RUN/analysis``)."""
    if window < 1:
        raise ValueError(f"--window must be >= 1, got {window}")
    log = load_run(run, gap_s=gap_s)
    ref = load_run(other, gap_s=gap_s) if other is not None else None
    if metrics is None:
        chosen = [m for m in DEFAULT_METRICS if m in log.metrics] or sorted(log.metrics)[:8]
    else:
        missing = [m for m in metrics if m not in log.metrics]
        if missing:  # exit 1 with all its ~80 names, where compare's typo is one line and exit 2
            first = ", ".join(sorted(log.metrics)[:5])
            hint = close_names(missing[0], log.metrics) or f"it logged {first}, ..."
            raise MetricsFileError(f"--metrics {' '.join(missing)}: {run} did not log it ({len(log.metrics)} "
                                   f"metrics); {hint}")  # fmt: skip
        chosen = list(metrics)
    if out is not None:
        where = Path(out)
    elif run.is_dir() or run.name == layout.METRICS_FILE:
        where = layout.analysis_dir(run if run.is_dir() else run.parent)
    else:  # any other log file (an export, a copied X.jsonl): two in one folder wrote over each other's
        where = run.parent / f"{run.stem}-analysis"
    why = unwritable(where, folder=True)  # a read-only run (an archive, another user's): a traceback
    if why is not None:
        raise OutputError(why if out is not None else f"{why}; give --out FOLDER")
    out = where
    out.mkdir(parents=True, exist_ok=True)
    # An earlier analysis's files there, this one's names: its summary and figures of other metrics stood
    # beside this one's (another run's, with another --out given twice). Only the files it listed as its
    # own: every window-*.png removed a user's figure of that name. The summary goes last: a folder with
    # one holds one whole analysis.
    listed = out / WRITTEN
    names = listed.read_text().splitlines() if listed.is_file() else []
    for name in {"summary.md", "overview.png", "iid_grid.png", *names}:
        if name and (out / name).parent == out:  # a name, not a path elsewhere
            (out / name).unlink(missing_ok=True)

    found = jumps(log, chosen, window, ref)
    whole = max_abs_diff(log, ref) if ref is not None else None
    written = []
    fig = figures.overview(log, chosen, other=ref)
    fig.savefig(path := out / "overview.png", dpi=100)
    written.append(path)
    for metric in chosen:
        fig = figures.resume_windows(log, metric, window, other=ref, found=found)
        fig.savefig(path := out / f"window-{_slug(metric)}.png", dpi=100)
        written.append(path)
    if any(m in log.metrics for m in figures.IID_GRID):
        figures.iid_grid(log).savefig(path := out / "iid_grid.png", dpi=100)
        written.append(path)
    listed.write_text("".join(f"{p.name}\n" for p in written))
    summary = out / "summary.md"
    summary.write_text(summary_markdown(log, found, window, ref, whole))
    worst = max(whole.values(), default=math.inf) if whole is not None else None
    return Analysis(summary, written, found, worst)


WRITTEN = ".analysis-files"
"""The figures an analysis wrote into its folder, one name a line: the next one there removes those."""


class OutputError(OSError):
    """Where the figures go cannot be written."""


def cli(
    run: tyro.conf.Positional[Path],
    other: Path | None = None,
    metrics: tuple[str, ...] | None = None,
    window: int = 20,
    out: Path | None = None,
    gap_s: float = DEFAULT_GAP_S,
) -> None:
    """Find a run's resumes (RUN: a run directory, its metrics.jsonl, or a CSV/wandb export with a step
    column) and write PNG figures of each metric around them plus a markdown table of every jump and
    its z-score against normal drift; --other overlays a reference run (e.g. the uninterrupted one)
    and adds the max abs difference to it. --gap-s: in logs without resume events, a pause longer than
    this many seconds counts as a resume."""
    # An empty --metrics was a matplotlib traceback; a --gap-s below 0 found a resume at every line, NaN none.
    for bad, said in ((window < 1, f"--window {window}: must be at least 1"),
                      (metrics == (), "--metrics: give at least one, or leave it out for the main ones"),
                      (not gap_s >= 0, f"--gap-s {gap_s}: must be a number >= 0")):  # fmt: skip
        if bad:
            print(f"error: {said}", file=sys.stderr, flush=True)
            raise SystemExit(exit_codes.USAGE)
    try:
        result = analyze(run, other=other, metrics=metrics, window=window, out=out, gap_s=gap_s)
    except OutputError as e:  # an --out given: exit 2, as every command's; the run's own folder: 74, as
        print(f"error: {e}", file=sys.stderr, flush=True)  # evaluate's into a read-only run
        raise SystemExit(exit_codes.USAGE if out is not None else exit_codes.IOERR) from None
    except (MetricsFileError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(exit_codes.USAGE) from None
    print(result.summary.read_text())
    for path in [*result.figures, result.summary]:
        print(f"wrote {path}")
