"""What happens to a metric across a resume, measured against how much it moves anyway.

For a resume at step ``r`` and a width ``W``: ``pre`` is the mean over steps ``[r - W, r)``, ``post`` the
mean over ``[r, r + W)``, and the jump is ``post - pre``. The same statistic taken at every other step
``t`` whose windows ``[t - W, t + W)`` hold no resume is the metric's normal drift (training moves every
metric; a loss falling by 0.1 per 20 steps is not a jump). The z-score is the jump against that drift:
``(jump - mean(drift)) / std(drift)``; a resume that is a non-event scores like any other step. A resume
within ``W`` steps of the run's first or last step has a window cut short there (``before`` or ``after``
steps instead of ``W``): its drift is measured over windows of those same lengths, as a cut window's jump
spans fewer steps and averages fewer values than a full one's. Given a reference run (``other``, e.g.
the uninterrupted one), the drift is measured on it instead: it shows the metric's normal movement
untouched by resumes, and a run resumed every few steps has no quiet windows of its own.

Bands for the pictures: an EMA (``halflife`` steps) and trailing rolling quantiles (the last ``width``
logged values; trailing so a band never knows about the step after it).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from birdjepa.analysis.load import RunLog
from birdjepa.rundir.metrics_log import compared


def ema(values: np.ndarray, halflife: float) -> np.ndarray:
    """Exponential moving average over the logged values (nan entries are skipped: they keep the
    previous average, and stay nan before the first value)."""
    alpha = 1.0 - 0.5 ** (1.0 / halflife)
    out = np.full(len(values), np.nan)
    avg = math.nan
    with np.errstate(invalid="ignore", over="ignore"):  # a diverged step's inf: nan next, then it restarts
        for i, v in enumerate(values):
            if not math.isnan(v):
                avg = v if math.isnan(avg) else avg + alpha * (v - avg)
            out[i] = avg
    return out


def rolling_quantiles(values: np.ndarray, width: int, qs: tuple[float, ...] = (0.1, 0.9)) -> np.ndarray:
    """[len(qs), n]: quantiles of the last ``width`` entries up to and including each one (nan ignored;
    shorter windows at the start)."""
    n = len(values)
    padded = np.concatenate([np.full(width - 1, np.nan), values])
    windows = np.lib.stride_tricks.sliding_window_view(padded, width)
    out = np.full((len(qs), n), np.nan)
    has = ~np.all(np.isnan(windows), axis=1)
    if has.any():
        with np.errstate(invalid="ignore"):  # interpolating towards a diverged step's inf
            out[:, has] = np.nanquantile(windows[has], qs, axis=1)
    return out


def _window_means(
    steps: np.ndarray, values: np.ndarray, at: np.ndarray, before: int | np.ndarray, after: int | np.ndarray
) -> tuple[np.ndarray, ...]:
    """Means over ``[at - before, at)`` and ``[at, at + after)`` of the logged (non-nan) values, and the
    number of values in each. Each window summed on its own: prefix sums carried one ``inf`` (a diverged
    step) into every later window as nan, and one huge value swamped every later sum to 0."""
    logged = ~np.isnan(values)
    lo, mid, hi = (np.searchsorted(steps, x) for x in (at - before, at, at + after))
    out = np.full((4, len(at)), np.nan)
    with np.errstate(invalid="ignore", over="ignore"):
        for i, (a, m, b) in enumerate(zip(lo, mid, hi, strict=True)):
            left, right = values[a:m][logged[a:m]], values[m:b][logged[m:b]]
            out[:, i] = (left.mean() if len(left) else np.nan, right.mean() if len(right) else np.nan,
                         len(left), len(right))  # fmt: skip
    pre, post, n_pre, n_post = out
    return pre, post, n_pre.astype(np.int64), n_post.astype(np.int64)


def windows_at(log: RunLog, step: int, width: int) -> tuple[int, int]:
    """(before, after): the lengths in steps of the windows at ``step``, ``width`` each unless the run's
    first or last step cuts them short (0 for a resume that logged no step after it)."""
    return max(0, min(width, step - int(log.steps[0]))), max(0, min(width, int(log.steps[-1]) + 1 - step))


def normal_drift(log: RunLog, metric: str, before: int, after: int | None = None) -> np.ndarray:
    """``post - pre`` over windows of ``before`` and ``after`` steps (``after`` = ``before`` unless given)
    at every logged step whose two windows lie inside the run, hold no resume, and have at least one value
    each, finite (a window over a diverged step's inf is no drift to compare with)."""
    after = before if after is None else after
    steps, values = log.steps, log.metrics[metric]
    t = steps[(steps - before >= steps[0]) & (steps + after - 1 <= steps[-1])]
    for r in log.resumes:
        t = t[~((t - before < r.step) & (r.step < t + after))]
    pre, post, n_pre, n_post = _window_means(steps, values, t, before, after)
    with np.errstate(invalid="ignore"):
        drift = post - pre
    return drift[(n_pre > 0) & (n_post > 0) & np.isfinite(drift)]


@dataclasses.dataclass(frozen=True)
class Jump:
    metric: str
    resume_step: int
    pre: float
    post: float
    jump: float
    z: float
    """Against the normal drift; nan when there is none to compare with."""
    drift_sd: float
    n_drift: int
    drift_run: str
    """The run the drift was measured on."""
    other_jump: float | None
    """The same statistic on the other run at the same step (what the step would have shown there)."""
    other_max_abs: float | None
    """Largest |this run - other run| over the window's steps (None without another run)."""
    before: int
    """Steps in the pre window: ``W``, or fewer where the run's first step cuts it (see `windows_at`)."""
    after: int
    """Steps in the post window: ``W``, or fewer where the run's last step cuts it."""


def _z(jump: float, drift: np.ndarray) -> tuple[float, float]:
    if len(drift) < 2 or math.isnan(jump):
        return math.nan, math.nan
    mean, sd = float(np.mean(drift)), float(np.std(drift, ddof=1))
    if sd == 0.0:  # a metric that never moves (e.g. the batch size): any change is infinitely unusual
        return (0.0 if jump == mean else math.copysign(math.inf, jump - mean)), sd
    return (jump - mean) / sd, sd


def window_diff(log: RunLog, other: RunLog, metric: str, lo: int, hi: int) -> float:
    """max |log - other| over the steps in ``[lo, hi)`` that either run logged the metric at; inf where
    only one of them did (a missing value is a difference)."""
    empty = (np.array([], np.int64), np.array([]))
    (sa, va), (sb, vb) = (r.series(metric) if metric in r.metrics else empty for r in (log, other))
    ka, kb = (sa >= lo) & (sa < hi), (sb >= lo) & (sb < hi)
    if not np.array_equal(sa[ka], sb[kb]):
        return math.inf
    va, vb = va[ka], vb[kb]
    with np.errstate(invalid="ignore"):  # equal infinities differ by 0, not nan
        diff = np.where(va == vb, 0.0, np.abs(va - vb))
    return float(diff.max(initial=0.0))


def jumps(log: RunLog, metrics: list[str], width: int, other: RunLog | None = None) -> list[Jump]:
    """One ``Jump`` per resume and metric, in resume then metric order."""
    reference = other if other is not None else log
    at = np.array([r.step for r in log.resumes], np.int64)
    spans = [windows_at(log, r.step, width) for r in log.resumes]
    before, after = (np.array([s[k] for s in spans], np.int64) for k in (0, 1))
    out = []
    for metric in metrics:
        drifts: dict[tuple[int, int], np.ndarray] = {}  # one per window lengths (most are (W, W))
        pre, post, _, _ = _window_means(log.steps, log.metrics[metric], at, before, after)
        other_jumps: list[float | None] = [None] * len(at)
        if other is not None and metric in other.metrics:
            o_pre, o_post, _, _ = _window_means(other.steps, other.metrics[metric], at, before, after)
            other_jumps = [float(x) for x in o_post - o_pre]
        for i, r in enumerate(log.resumes):
            if spans[i] not in drifts:
                drifts[spans[i]] = (normal_drift(reference, metric, *spans[i]) if metric in reference.metrics
                                    else np.array([]))  # fmt: skip
            drift = drifts[spans[i]]
            jump = float(post[i] - pre[i])
            z, sd = _z(jump, drift)
            diff = None if other is None else window_diff(log, other, metric, r.step - width, r.step + width)
            values = (
                float(pre[i]),
                float(post[i]),
                jump,
                z,
                sd,
                len(drift),
                reference.name,
                other_jumps[i],
                diff,
                *spans[i],
            )
            out.append(Jump(metric, r.step, *values))
    out.sort(key=lambda j: (j.resume_step, metrics.index(j.metric)))
    return out


def max_abs_diff(log: RunLog, other: RunLog, metrics: list[str] | None = None) -> dict[str, float]:
    """Per compared metric (``birdjepa.resume.compare``'s rule: no wall-clock or resume-check keys), the
    largest |log - other| over the whole run."""
    names = metrics or sorted(k for k in set(log.metrics) | set(other.metrics) if compared(k))
    lo = int(min(log.steps[0], other.steps[0]))
    hi = int(max(log.steps[-1], other.steps[-1])) + 1
    return {m: window_diff(log, other, m, lo, hi) for m in names}


def iid_reference(log: RunLog, metric: str) -> tuple[str, float | np.ndarray] | None:
    """The value an IID sample stream would give for a ``dataloader/...`` metric (see
    ``birdjepa.diagnostics.iid``): 1 for the ``/vs_iid95`` ratios (IID's 95th percentile), the logged
    expectation where there is one, 0 for lag-1 correlations, 255 (the degrees of freedom) for the
    256-bucket chi-squared. None where there is no simple reference."""
    if not metric.startswith("dataloader/"):
        return None
    if metric.endswith("/vs_iid95"):
        return "IID p95", 1.0
    if (expected := f"{metric}_iid_expected") in log.metrics:
        return "IID expectation", log.metrics[expected]
    if "lag1" in metric:
        return "IID mean", 0.0
    if metric.startswith("dataloader/bucket_chi2/"):
        return "IID mean (255 dof)", 255.0
    return None
