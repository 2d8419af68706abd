"""Pictures of a run around its resumes (matplotlib ``Figure`` objects: no pyplot, no display, so they
render headless and in notebooks alike)."""

from __future__ import annotations

import math

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from birdjepa.analysis.load import RunLog
from birdjepa.analysis.windows import Jump, ema, iid_reference, rolling_quantiles

#: The IID grid's default panels: the normalised statistics (1 = IID's 95th percentile) and the
#: window's distinct samples against their expectation.
IID_GRID = (
    "dataloader/bucket_chi2/div/vs_iid95",
    "dataloader/bucket_chi2/hash/vs_iid95",
    "dataloader/bucket_lag1/div/vs_iid95",
    "dataloader/bucket_lag1/hash/vs_iid95",
    "dataloader/shard_chi2/vs_iid95",
    "dataloader/shard_lag1/vs_iid95",
    "dataloader/overlap_prev",
    "dataloader/hash_overlap_prev/vs_iid95",
    "dataloader/window_unique",
)
_OTHER_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.0}


def _mark_resumes(ax: Axes, log: RunLog, lo: float = -math.inf, hi: float = math.inf) -> None:
    for r in log.resumes:
        if lo <= r.step <= hi:
            ax.axvline(r.step - 0.5, color="tab:red", linewidth=1.0, alpha=0.7)


def _reference(ax: Axes, log: RunLog, metric: str, keep: np.ndarray | None = None) -> None:
    ref = iid_reference(log, metric)
    if ref is None:
        return
    label, value = ref
    if isinstance(value, np.ndarray):
        steps, values = (log.steps, value) if keep is None else (log.steps[keep], value[keep])
        ax.plot(steps, values, color="tab:green", linewidth=1.0, label=label)
    else:
        ax.axhline(value, color="tab:green", linewidth=1.0, label=label)


class _Bands:
    """A metric's EMA and trailing 10-90 % band over the whole timeline, computed once per figure."""

    def __init__(self, log: RunLog, metric: str, halflife: float, band: int) -> None:
        self.log, self.values, self.halflife, self.band = log, log.metrics[metric], halflife, band
        self.q = rolling_quantiles(self.values, band)
        self.ema = ema(self.values, halflife)

    def draw(self, ax: Axes, keep: np.ndarray) -> None:
        """The logged values with their EMA and band, over the timeline entries in ``keep``."""
        steps = self.log.steps
        ax.fill_between(steps[keep], self.q[0][keep], self.q[1][keep], color="tab:blue", alpha=0.15,
                        linewidth=0, label=f"10-90 % of last {self.band}")  # fmt: skip
        logged = keep & ~np.isnan(self.values)
        ax.plot(steps[logged], self.values[logged], ".", color="tab:blue", markersize=3, label=self.log.name)
        ax.plot(steps[keep], self.ema[keep], color="tab:orange", linewidth=1.2,
                label=f"EMA (half-life {self.halflife:g})")  # fmt: skip


def _other(ax: Axes, other: RunLog | None, metric: str, lo: float, hi: float) -> None:
    if other is None or metric not in other.metrics:
        return
    steps, values = other.series(metric)
    keep = (steps >= lo) & (steps <= hi)
    ax.plot(steps[keep], values[keep], label=other.name, **_OTHER_STYLE)


def resume_windows(
    log: RunLog,
    metric: str,
    width: int,
    *,
    other: RunLog | None = None,
    found: list[Jump] | None = None,
    halflife: float = 5.0,
    band: int = 20,
    columns: int = 4,
) -> Figure:
    """One panel per resume: ``metric`` over steps ``[r - W, r + W)`` with its EMA and band, the IID
    reference (``dataloader/...``), the other run dashed, and the jump's z-score in the title."""
    n = max(len(log.resumes), 1)
    cols = min(n, columns)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(4.2 * cols, 3.0 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    by_step = {j.resume_step: j for j in found or [] if j.metric == metric}
    if not log.resumes:
        axes[0].text(0.5, 0.5, f"{log.name}: no resumes", ha="center", va="center")
    bands = _Bands(log, metric, halflife, band)
    for ax, r in zip(axes, log.resumes, strict=False):
        lo, hi = r.step - width, r.step + width - 1
        keep = (log.steps >= lo) & (log.steps <= hi)
        bands.draw(ax, keep)
        _other(ax, other, metric, lo, hi)
        _reference(ax, log, metric, keep)
        _mark_resumes(ax, log, lo, hi)
        j = by_step.get(r.step)
        title = f"resume at step {r.step}"
        if j is not None:
            title += f"\njump {j.jump:+.4g}, z {j.z:+.2f}"
            if j.other_max_abs is not None:
                title += f", max |Δ| {j.other_max_abs:.3g}"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
    for ax in axes[n:]:  # the grid's unused cells (n is 1 with no resumes: the note's panel)
        ax.set_visible(False)
    axes[0].set_ylabel(metric)
    if axes[0].get_legend_handles_labels()[0]:  # a run with no resume yet has nothing labelled
        axes[0].legend(fontsize=7, loc="best")
    fig.suptitle(f"{log.name}\n{metric} around each resume (±{width} steps)", fontsize=10)
    return fig


def overview(log: RunLog, metrics: list[str], *, other: RunLog | None = None, halflife: float = 5.0,
             band: int = 20) -> Figure:  # fmt: skip
    """The whole run, one panel per metric, resumes as red lines."""
    fig = Figure(figsize=(10, 2.2 * len(metrics)), layout="constrained")
    axes = fig.subplots(len(metrics), 1, squeeze=False, sharex=True).ravel()
    everything = np.ones(len(log.steps), bool)
    for ax, metric in zip(axes, metrics, strict=True):
        _Bands(log, metric, halflife, band).draw(ax, everything)
        _other(ax, other, metric, -math.inf, math.inf)
        _reference(ax, log, metric)
        _mark_resumes(ax, log)
        ax.set_ylabel(metric, fontsize=8)
    axes[0].legend(fontsize=7, loc="best")
    named = set(axes[0].get_legend_handles_labels()[1])
    for ax in axes[1:]:  # a line the first panel has not (a loader panel's IID reference) was never named
        new = [
            (h, label) for h, label in zip(*ax.get_legend_handles_labels(), strict=True) if label not in named
        ]
        if new:
            ax.legend(*zip(*new, strict=True), fontsize=7, loc="best")
    axes[-1].set_xlabel("step")
    fig.suptitle(f"{log.name}: {len(log.resumes)} resume(s) (red lines)", fontsize=10)
    return fig


def iid_grid(log: RunLog, metrics: tuple[str, ...] = IID_GRID, *, halflife: float = 5.0, band: int = 20,
             columns: int = 3) -> Figure:  # fmt: skip
    """The loader's IID diagnostics, one panel each, with IID's reference and the resumes."""
    present = [m for m in metrics if m in log.metrics]
    if not metrics:  # every panel unticked in the notebook: "none of the IID metrics [] were logged"
        raise ValueError("no IID metric chosen: choose a panel")
    if not present:
        raise ValueError(f"{log.name}: none of the IID metrics {list(metrics)} were logged")
    rows = math.ceil(len(present) / columns)
    fig = Figure(figsize=(4.2 * columns, 2.6 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    everything = np.ones(len(log.steps), bool)
    for ax, metric in zip(axes, present, strict=False):
        _Bands(log, metric, halflife, band).draw(ax, everything)
        _reference(ax, log, metric)
        _mark_resumes(ax, log)
        ax.set_title(metric.removeprefix("dataloader/"), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.legend(fontsize=6, loc="best")
    for ax in axes[len(present) :]:
        ax.set_visible(False)
    fig.suptitle(f"{log.name}: loader IID diagnostics (green: IID reference; red: resumes)", fontsize=10)
    return fig
