"""Per-parameter weight-update monitor: in-graph statistics (part A) and a host-side tracker (part B).

Part A, ``update_stats(grads, params_before, params_after)``, is a pure, jittable function the train step
calls with the raw (pre-clipping) gradients and the parameters before and after ``optax.apply_updates``.
For every parameter leaf it computes, in float32 (leaves of other float dtypes are upcast first):

* ``grad_norm``      ||g||_2
* ``grad_max_abs``   max |g|
* ``grad_mean_abs``  mean |g|
* ``param_norm``     ||w_before||_2
* ``update_norm``    ||w_after - w_before||_2, the change actually applied (after clipping, weight decay,
  masking and float rounding), not ``lr * g``: a parameter whose update is rounded away counts as frozen
* ``update_ratio``   update_norm / (param_norm + RATIO_EPS), RATIO_EPS = 1e-12. The eps only avoids 0/0
  for an all-zero parameter that does not move (ratio 0); a zero-initialised parameter that does move
  (biases, the probe head) gets a huge ratio (~||dw|| * 1e12) until it is away from zero.

each stacked into one ``[P]`` array whose entry ``i`` is parameter ``param_names(params)[i]`` (names sorted),
plus two int32 scalars: ``vanishing`` (parameters with grad_norm <= 1e-7) and ``exploding`` (grad_norm >=
1e2, or not finite: a NaN/inf gradient counts as exploding). Norms are plain float32 sums of squares (as in
``optax.global_norm``), so a leaf norm above ~1.8e19 overflows to inf, which also counts as exploding.
Only ``[P]`` vectors leave the device, never parameter copies.

Names are the '/'-joined pytree path of each leaf (dict keys, attribute names, sequence indices); for
the model's nested-dict tree they are exactly ``birdjepa.model.vit.named_params``'s names, e.g.
``encoder/block_0/attn/qkv/kernel`` (a ``{"params": {...}}`` wrapper is dropped, as there).

To compute the statistics only every ``monitor_interval`` optimizer updates, either compile two
variants of the step (``monitor`` a static argument; the plain variant skips ``update_stats`` entirely) or use
``maybe_update_stats(pred, ...)``, a ``jax.lax.cond`` whose skipped branch returns ``empty_stats``:
NaN vectors and counts of -1, which ``UpdateMonitor.observe`` refuses, so a placeholder is never
mistaken for a measurement.

Part B, ``UpdateMonitor``, turns the statistics of each check into scalar metrics (``monitor/...``) and
warnings, and tracks per-parameter "frozen" streaks across checks; its state is JSON-able for checkpoints.
With gradient accumulation (``optax.MultiSteps``) the parameters only change at the last micro-step of
each update, so checks fall on those micro-steps (`check_due`), or every parameter would look frozen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from birdjepa.reductions import one_pass

Array = jax.Array
PyTree = Any

RATIO_EPS = 1e-12
"""Added to ||w_before|| in the update ratio."""
VANISHING_GRAD_NORM = 1e-7
"""A parameter whose gradient L2 norm is <= this is reported as vanishing."""
EXPLODING_GRAD_NORM = 1e2
"""A parameter whose gradient L2 norm is >= this (or not finite) is reported as exploding."""

#: The per-parameter ``[P]`` float32 vectors ``update_stats`` returns.
VECTOR_STATS: tuple[str, ...] = (
    "grad_norm",
    "grad_max_abs",
    "grad_mean_abs",
    "param_norm",
    "update_norm",
    "update_ratio",
)
#: The int32 scalar counts ``update_stats`` returns.
COUNT_STATS: tuple[str, ...] = ("vanishing", "exploding")


def _key_name(key: Any) -> str:
    """One path element: dict key, attribute name or sequence index (the rule of
    ``birdjepa.rundir.checkpoint.norms``)."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def _named_leaves(tree: PyTree) -> dict[str, Any]:
    """``{name: leaf}`` over a params-shaped tree; drops a ``{"params": {...}}`` wrapper like
    ``birdjepa.model.vit.named_params``, so the names of both trees agree."""
    if isinstance(tree, Mapping) and set(tree) == {"params"} and isinstance(tree["params"], Mapping):
        tree = tree["params"]
    out: dict[str, Any] = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = "/".join(_key_name(k) for k in path)
        if name in out:  # e.g. a dict key that itself contains '/'
            raise ValueError(f"two parameters share the name {name!r}")
        out[name] = leaf
    if not out:
        raise ValueError("the parameter tree has no leaves")
    return out


def param_names(params: PyTree) -> list[str]:
    """Parameter names in the order of the ``[P]`` vectors of ``update_stats`` (sorted)."""
    return sorted(_named_leaves(params))


def leaf_names(params: PyTree) -> list[str]:
    """Parameter names in `jax.tree.leaves` order."""
    return list(_named_leaves(params))


def _leaf_stats(g: Array, before: Array, after: Array) -> dict[str, Array]:
    g = g.astype(jnp.float32)
    before = before.astype(jnp.float32)
    after = after.astype(jnp.float32)
    if g.size == 0:  # max/mean of an empty array are undefined; an empty leaf never moves
        zero = jnp.zeros((), jnp.float32)
        return {k: zero for k in VECTOR_STATS}
    abs_g, add = jnp.abs(g).reshape(-1), jax.lax.add
    # One pass over the leaf for all five reductions: the step compiles (and a resumed run loads) one
    # loop per parameter instead of five (`birdjepa.reductions`).
    squares, max_abs, total_abs, before_squares, update_squares = one_pass([
        (jnp.square(g).reshape(-1), 0.0, add), (abs_g, -jnp.inf, jax.lax.max), (abs_g, 0.0, add),
        (jnp.square(before).reshape(-1), 0.0, add), (jnp.square(after - before).reshape(-1), 0.0, add),
    ])  # fmt: skip
    param_norm, update_norm = jnp.sqrt(before_squares), jnp.sqrt(update_squares)
    return {
        "grad_norm": jnp.sqrt(squares),
        "grad_max_abs": max_abs,
        "grad_mean_abs": total_abs / g.size,
        "param_norm": param_norm,
        "update_norm": update_norm,
        "update_ratio": update_norm / (param_norm + RATIO_EPS),
    }


def update_stats(
    grads: PyTree,
    params_before: PyTree,
    params_after: PyTree,
    *,
    vanishing: float = VANISHING_GRAD_NORM,
    exploding: float = EXPLODING_GRAD_NORM,
) -> dict[str, Array]:
    """Per-parameter statistics of one step (see the module docstring); jittable, pure.

    Returns ``{name: [P] float32}`` for each of ``VECTOR_STATS`` (entry ``i`` is ``param_names(...)[i]``)
    and ``{"vanishing": int32, "exploding": int32}`` counts. The three trees must have the same names and
    leaf shapes (checked at trace time: shapes are static, and a silent broadcast would be wrong).
    """
    g_leaves = _named_leaves(grads)
    b_leaves = _named_leaves(params_before)
    a_leaves = _named_leaves(params_after)
    names = sorted(b_leaves)
    for label, leaves in (("grads", g_leaves), ("params_after", a_leaves)):
        if sorted(leaves) != names:
            raise ValueError(
                f"{label} and params_before have different parameters: {sorted(set(leaves) ^ set(names))[:5]}"
            )
    per_leaf = []
    for n in names:
        shapes = {jnp.shape(g_leaves[n]), jnp.shape(b_leaves[n]), jnp.shape(a_leaves[n])}
        if len(shapes) != 1:
            raise ValueError(f"parameter {n!r}: grads/before/after shapes differ: {sorted(shapes)}")
        per_leaf.append(_leaf_stats(g_leaves[n], b_leaves[n], a_leaves[n]))
    out = {k: jnp.stack([s[k] for s in per_leaf]) for k in VECTOR_STATS}
    gn = out["grad_norm"]
    out["vanishing"] = jnp.sum(gn <= vanishing, dtype=jnp.int32)
    # `not <` rather than `>=`: a NaN gradient norm is counted as exploding instead of as nothing.
    out["exploding"] = jnp.sum(~(gn < exploding), dtype=jnp.int32)
    return out


def empty_stats(params: PyTree) -> dict[str, Array]:
    """Placeholder with ``update_stats``'s structure for steps that skip the check: NaN vectors and
    counts of -1 (``UpdateMonitor.observe`` rejects it)."""
    p = len(_named_leaves(params))
    out = {k: jnp.full((p,), jnp.nan, jnp.float32) for k in VECTOR_STATS}
    out.update({k: jnp.array(-1, jnp.int32) for k in COUNT_STATS})
    return out


def maybe_update_stats(
    pred: Array | bool,
    grads: PyTree,
    params_before: PyTree,
    params_after: PyTree,
    **thresholds: float,
) -> dict[str, Array]:
    """``update_stats(...)`` when ``pred`` else ``empty_stats(params_before)``, under ``jax.lax.cond`` so
    one compiled step serves both cases and only the taken branch runs."""
    return jax.lax.cond(
        pred,
        lambda: update_stats(grads, params_before, params_after, **thresholds),
        lambda: empty_stats(params_before),
    )


def check_due(step: int, interval: int, grad_accum: int = 1) -> bool:
    """Whether micro-step ``step`` (0-based, counting only those not skipped as non-finite, which leave
    the accumulation where it was) is a check: the last micro-step of every ``interval``-th optimizer
    update (0 = never). Counting updates, not micro-steps, makes every accumulation valid and puts each
    check where the parameters change."""
    if interval <= 0:
        return False
    return (step + 1) % (interval * grad_accum) == 0


def _summary(prefix: str, values: np.ndarray) -> dict[str, float]:
    v = values.astype(np.float64)
    return {
        f"{prefix}/median": float(np.percentile(v, 50)),
        f"{prefix}/p95": float(np.percentile(v, 95)),
        f"{prefix}/min": float(np.min(v)),
        f"{prefix}/max": float(np.max(v)),
    }


class UpdateMonitor:
    """Host-side tracker of ``update_stats`` results across checks.

    ``names`` is ``param_names(params)`` (sorted, unique: the order of the stats vectors). A parameter is
    *frozen* once its update ratio has been <= ``frozen_ratio`` for ``patience`` consecutive checks; its
    streak resets (and it is no longer frozen) as soon as a check shows a larger ratio. ``top_k`` smallest
    ratios are logged by name. ``vanishing``/``exploding`` are the gradient-norm thresholds (the same
    defaults as ``update_stats``); ``max_listed`` caps the names quoted in one warning. Parameters named
    with a prefix in ``idle`` (the objective's `IDLE_PARAMS`: read by no loss) are never reported
    vanishing or frozen, nor summarised or listed among the smallest ratios: MAE's projector warned so
    every check, a warning users learn to skip.

    All comparisons are done in float32 on the float32 stats, as the graph does them; summaries in float64.
    """

    STATE_VERSION = 1

    def __init__(
        self,
        names: Sequence[str],
        patience: int = 3,
        frozen_ratio: float = 1e-12,
        top_k: int = 5,
        *,
        vanishing: float = VANISHING_GRAD_NORM,
        exploding: float = EXPLODING_GRAD_NORM,
        max_listed: int = 10,
        idle: tuple[str, ...] = (),
    ) -> None:
        names = list(names)
        if not names or names != sorted(set(names)):
            raise ValueError("names must be non-empty, unique and sorted (use param_names(params))")
        if patience < 1 or top_k < 0 or max_listed < 1:
            raise ValueError(
                f"need patience >= 1, top_k >= 0, max_listed >= 1; got {patience}, {top_k}, {max_listed}"
            )
        self.names = names
        self.patience = patience
        self.frozen_ratio = frozen_ratio
        self.top_k = top_k
        self.vanishing = vanishing
        self.exploding = exploding
        self.max_listed = max_listed
        self.watched = (
            np.array([not n.startswith(idle) for n in names]) if idle else np.ones(len(names), bool)
        )
        self._streak = np.zeros(len(names), np.int64)
        self._frozen = np.zeros(len(names), bool)
        self._last_step: int | None = None

    @property
    def frozen(self) -> list[str]:
        """Names of the parameters frozen now."""
        return [n for n, f in zip(self.names, self._frozen, strict=True) if f]

    def _vector(self, stats: Mapping[str, Any], key: str) -> np.ndarray:
        v = np.asarray(stats[key], np.float32)
        if v.shape != (len(self.names),):
            raise ValueError(f"stats[{key!r}] has shape {v.shape}; expected ({len(self.names)},)")
        return v

    def _listing(self, idx: np.ndarray, values: np.ndarray | None = None) -> str:
        shown = [
            self.names[i] if values is None else f"{self.names[i]} ({float(values[i]):.3g})"
            for i in idx[: self.max_listed]
        ]
        more = f" (+{len(idx) - self.max_listed} more)" if len(idx) > self.max_listed else ""
        return ", ".join(shown) + more

    def observe(self, step: int, stats: Mapping[str, Any]) -> tuple[dict[str, float], list[str]]:
        """Take one check's stats (``update_stats`` output, device or numpy arrays) for ``step``; return
        ``(metrics, warnings)``. Metrics are floats keyed ``monitor/...``; warnings are empty when healthy."""
        if any(int(np.asarray(stats[k])) < 0 for k in COUNT_STATS if k in stats):
            raise ValueError(f"step {step}: stats are the empty_stats placeholder of a skipped check")
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"step {step} observed after step {self._last_step}: steps must increase")
        ratio = self._vector(stats, "update_ratio")
        gnorm = self._vector(stats, "grad_norm")

        low = (ratio <= np.float32(self.frozen_ratio)) & self.watched
        self._streak = np.where(low, self._streak + 1, 0)
        frozen = self._streak >= self.patience
        newly = np.flatnonzero(frozen & ~self._frozen)
        self._frozen = frozen
        self._last_step = step
        vanishing = np.flatnonzero((gnorm <= np.float32(self.vanishing)) & self.watched)
        exploding = np.flatnonzero(~(gnorm < np.float32(self.exploding)))  # NaN counts as exploding

        # Summaries and the smallest ratios over the parameters a loss reads: an idle one's ratio of 0
        # was every check's minimum and first smallest (MAE's projector), hiding the ratios to watch.
        watched = np.flatnonzero(self.watched)
        metrics = _summary("monitor/update_ratio", ratio[watched])
        metrics.update(_summary("monitor/grad_norm", gnorm[watched]))
        metrics["monitor/grad_max_abs/max"] = float(np.max(self._vector(stats, "grad_max_abs")))
        metrics["monitor/vanishing"] = float(len(vanishing))
        metrics["monitor/exploding"] = float(len(exploding))
        metrics["monitor/frozen"] = float(np.sum(frozen))
        # Stable sort: equal ratios are listed in name order, so the keys are deterministic.
        for i in watched[np.argsort(ratio[watched], kind="stable")][: self.top_k]:
            metrics[f"monitor/smallest_ratio/{self.names[i]}"] = float(ratio[i])

        warnings = []
        if len(newly):
            warnings.append(
                f"step {step}: {len(newly)} parameter(s) newly frozen (update ratio <= {self.frozen_ratio:g} "
                f"for {self.patience} consecutive checks): {self._listing(newly)}"
            )
        if len(exploding):
            worst = exploding[np.argsort(-np.nan_to_num(gnorm[exploding], nan=np.inf), kind="stable")]
            warnings.append(
                f"step {step}: exploding gradients (L2 norm >= {self.exploding:g} or not finite) in "
                f"{len(exploding)} parameter(s): {self._listing(worst, gnorm)}"
            )
        if len(vanishing):
            worst = vanishing[np.argsort(gnorm[vanishing], kind="stable")]
            warnings.append(
                f"step {step}: vanishing gradients (L2 norm <= {self.vanishing:g}) in "
                f"{len(vanishing)} parameter(s): {self._listing(worst, gnorm)}"
            )
        return metrics, warnings

    def state(self) -> dict[str, Any]:
        """JSON-able state: the per-parameter streaks (nonzero only), the frozen set and the last step."""
        return {
            "version": self.STATE_VERSION,
            "names": list(self.names),
            "streak": {n: int(s) for n, s in zip(self.names, self._streak, strict=True) if s},
            "frozen": self.frozen,
            "last_step": self._last_step,
        }

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Restore ``state()``; the parameter names must be the same (a resumed run has the same model)."""
        if state.get("version") != self.STATE_VERSION:
            raise ValueError(f"unsupported monitor state version {state.get('version')!r}")
        if list(state["names"]) != self.names:
            diff = sorted(set(state["names"]) ^ set(self.names))[:5]
            raise ValueError(f"monitor state is for different parameters (e.g. {diff})")
        index = {n: i for i, n in enumerate(self.names)}
        streak = np.zeros(len(self.names), np.int64)
        for n, s in state["streak"].items():
            streak[index[n]] = int(s)
        frozen = np.zeros(len(self.names), bool)
        frozen[[index[n] for n in state["frozen"]]] = True
        self._streak, self._frozen = streak, frozen
        last = state["last_step"]
        self._last_step = None if last is None else int(last)
