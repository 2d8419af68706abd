"""Training objectives and online-probe metrics: pure functions, arrays in, dict of scalars out.

All functions are deterministic given their inputs (the only randomness, SIGReg's directions, comes from an
explicit key), and work under ``jax.jit`` and ``jax.grad``.

LeJEPA (Balestriero & LeCun, 2025)
----------------------------------
Input: projections ``z`` of shape ``[B, V, P]`` (V views of each of B samples; the model flattens the views
into the batch to encode them and hands them back as ``[B, V, P]``).

*Invariance* (the JEPA prediction term, views predict their mean)::

    invariance = 1/(B V P) * sum_{b, v} || z[b, v] - mean_v' z[b, v'] ||²

i.e. the squared distance to the per-sample view centre, averaged over samples, views **and dimensions**
(``mean((z - z.mean(1))**2)``), so its scale does not depend on P.

*SIGReg* (Sketched Isotropic Gaussian Regularisation): the ``N = B*V`` embeddings ``Z [N, P]`` should be
distributed as N(0, I_P). Draw K = ``num_directions`` (default 256) directions ``a_k = g_k / ||g_k||`` with
``g_k ~ N(0, I_P)`` from the step key, project ``x[n, k] = <Z[n], a_k>`` and for each direction compute the
Epps–Pulley statistic against N(0, 1)::

    EP_k = N * ∫_R | φ_k(t) - exp(-t²/2) |² w(t) dt,    φ_k(t) = 1/N sum_n exp(i t x[n, k]),
    w(t) = exp(-t²/2)

    |φ_k(t) - e^{-t²/2}|² = (mean_n cos(t x) - e^{-t²/2})² + (mean_n sin(t x))²

The integrand is even in t, so the integral is computed as ``2 * ∫_0^{t_max}`` with the trapezoid rule on
``num_knots`` (default 17) equally spaced knots in ``[0, t_max]`` (default ``t_max = 3``: the weight is
``w(3) = e^{-9/2} ≈ 0.011`` there and the tail beyond 3 holds ~0.3% of its mass). ``SIGReg = mean_k EP_k``.
For N i.i.d. N(0, I) embeddings ``E[EP_k] = ∫ (1 - e^{-t²}) e^{-t²/2} dt = √(2π) - √(2π/3) ≈ 1.06``
whatever N, while any fixed departure from N(0, 1) grows linearly in N (the factor N makes EP a test
statistic). All N = B*V embeddings are pooled into one sample, so SIGReg tests the marginal of all views
together (an alternative, not implemented, is the mean over views of SIGReg with N = B each).

*Total*::

    loss = (1 - λ) * invariance + λ * SIGReg,     λ = 0.05 by default

λ = 0.05 is the paper's recommended default: SIGReg is O(1) at its optimum but O(N) when the embedding
collapses, so a small weight suffices to prevent collapse while letting the invariance term dominate what
the features encode; the paper reports performance is stable over a wide range of small λ.

*Masked spans* (optional, ``span_weight > 0``, off by default): ``span_mask`` hides
``round(span_ratio * spans)`` time spans of ``span_tokens`` tokens in each view; the encoder sees a copy
of the view with a learned mask token there, a predictor maps its tokens to the encoder's tokens of the
whole view, and ``span_loss`` is their squared error at the hidden tokens (targets standardised per
token, without gradient: the JEPA term)::

    loss = (1 - λ) * invariance + λ * SIGReg + span_weight * span

It costs a second encoder pass per step. On the demo set it did not beat the defaults clearly
(``docs/issues/002-pretraining-learns``, H7).

Supervised and probe metrics
----------------------------
Labels are integer class ids; a label ``< 0`` (the loader writes ``-1``) means *missing* and the sample is
ignored. Cross-entropy and accuracy are means over labelled samples; with no labelled sample both are 0
(and the gradient is 0). Logits may be ``[B, C]`` with labels ``[B]``, or ``[B, V, C]`` (one prediction per
view) with labels ``[B]`` (broadcast over views) or ``[B, V]``. A label ``>= C`` is a caller bug; it is not
checked inside jit (it contributes ``logsumexp(logits)`` to the CE and counts as wrong).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from birdjepa.config import (
    DEFAULT_LAMBDA,
    DEFAULT_NUM_DIRECTIONS,
    DEFAULT_NUM_KNOTS,
    DEFAULT_T_MAX,
)

Array = jax.Array


def invariance_loss(z: Array, n_global: int | None = None) -> Array:
    """``mean_{b, v, p} (z[b, v, p] - c[b, p])²`` for ``z [B, V, P]``, where the centre ``c`` is the
    mean of the first ``n_global`` views (default: all). With local views (multi-crop) only the
    global views make the centre, and every view is pulled to it."""
    if z.ndim != 3:
        raise ValueError(f"invariance expects z of shape [B, V, P], got {z.shape}")
    return jnp.mean(invariance_residuals(z, n_global))


def invariance_residuals(z: Array, n_global: int | None = None) -> Array:
    """``(z[b, v, p] - c[b, p])²``, what `invariance_loss` averages (per sample: it adds up over the
    parts of a batch)."""
    z = z.astype(jnp.float32)
    # Centre computed relative to view 0 (same value mathematically): exactly 0 when all views are equal.
    rel = z - z[:, :1]
    return jnp.square(rel - rel[:, :n_global].mean(axis=1, keepdims=True))


def sigreg_directions(key: Array, dim: int, num_directions: int = DEFAULT_NUM_DIRECTIONS) -> Array:
    """``[dim, num_directions]`` unit-norm columns, ``normal(key)`` normalised per column."""
    g = jax.random.normal(key, (dim, num_directions), jnp.float32)
    return g / jnp.linalg.norm(g, axis=0, keepdims=True)


def epps_pulley_knots(
    num_knots: int = DEFAULT_NUM_KNOTS, t_max: float = DEFAULT_T_MAX
) -> tuple[Array, Array]:
    """Knots ``t`` on ``[0, t_max]`` and trapezoid weights for ``∫_{-t_max}^{t_max}`` of an even function
    (i.e. twice the ``[0, t_max]`` trapezoid weights)."""
    if num_knots < 2:
        raise ValueError(f"num_knots={num_knots} must be >= 2")
    t = jnp.linspace(0.0, t_max, num_knots, dtype=jnp.float32)
    dt = t_max / (num_knots - 1)
    w = jnp.full((num_knots,), dt, jnp.float32).at[0].set(dt / 2).at[-1].set(dt / 2)
    return t, 2.0 * w


def epps_pulley_integrand(x: Array, t: Array) -> Array:
    """``|φ_emp(t) - e^{-t²/2}|² e^{-t²/2}`` for samples ``x [N, K]`` at knots ``t [J]`` -> ``[K, J]``."""
    x = x.astype(jnp.float32)
    tx = x[:, :, None] * t[None, None, :]  # [N, K, J]
    return ecf_integrand(jnp.cos(tx).mean(axis=0), jnp.sin(tx).mean(axis=0), t)


def ecf_integrand(re: Array, im: Array, t: Array) -> Array:
    """``|φ(t) - e^{-t²/2}|² e^{-t²/2}`` of an empirical characteristic function ``φ = re + i im``
    (``[K, J]``, at knots ``t [J]``)."""
    gauss = jnp.exp(-0.5 * jnp.square(t))
    err = jnp.square(re - gauss) + jnp.square(im)
    return err * gauss


def ecf_sums(x: Array, t: Array) -> Array:
    """``[2, K, J]``: the sums over the samples of ``cos(t x)`` and ``sin(t x)`` for ``x [N, K]``: the
    empirical characteristic function before its division by N, a statistic of a batch that adds up
    over the parts it is cut into (`birdjepa.train.virtual_shards`)."""
    tx = x.astype(jnp.float32)[:, :, None] * t[None, None, :]
    return jnp.stack([jnp.cos(tx).sum(axis=0), jnp.sin(tx).sum(axis=0)])


def sigreg_directions_and_knots(
    key: Array, dim: int, num_directions: int, num_knots: int, t_max: float
) -> tuple[Array, Array, Array]:
    """SIGReg's directions ``[dim, K]``, knots ``[J]`` and weights ``[J]``."""
    return (sigreg_directions(key, dim, num_directions), *epps_pulley_knots(num_knots, t_max))


def sigreg_partial_sums(
    z: Array, key: Array, *, num_directions: int, num_knots: int, t_max: float, per_view: bool
) -> Array:
    """`ecf_sums` of a part of a batch's projections ``z [b, V, P]`` on SIGReg's directions: ``[2, K,
    J]`` pooled over views, ``[V, 2, K, J]`` per view. Summed over every part of the batch, they give
    `sigreg_from_sums` the batch's SIGReg."""
    a, t, _ = sigreg_directions_and_knots(key, z.shape[-1], num_directions, num_knots, t_max)
    if per_view:
        return jax.vmap(lambda zv: ecf_sums(zv @ a, t))(jnp.swapaxes(z.astype(jnp.float32), 0, 1))
    return ecf_sums(z.reshape(-1, z.shape[-1]).astype(jnp.float32) @ a, t)


def sigreg_from_sums(sums: Array, n: int, *, num_knots: int, t_max: float) -> Array:
    """SIGReg from the batch's `sigreg_partial_sums` (``n``: samples per statistic, B*V pooled, B per
    view): the same statistic as `sigreg` computes from the whole batch at once."""
    t, w = epps_pulley_knots(num_knots, t_max)

    def mean_ep(s: Array) -> Array:
        return (n * (ecf_integrand(s[0] / n, s[1] / n, t) @ w)).mean()

    return jax.vmap(mean_ep)(sums).mean() if sums.ndim == 4 else mean_ep(sums)


def epps_pulley(x: Array, num_knots: int = DEFAULT_NUM_KNOTS, t_max: float = DEFAULT_T_MAX) -> Array:
    """Epps–Pulley statistic against N(0, 1) of each column of ``x [N, K]`` -> ``[K]``:
    ``N * ∫ |φ_emp(t) - e^{-t²/2}|² e^{-t²/2} dt`` (trapezoid on ``[0, t_max]``, doubled)."""
    if x.ndim != 2:
        raise ValueError(f"epps_pulley expects samples of shape [N, K], got {x.shape}")
    t, w = epps_pulley_knots(num_knots, t_max)
    return x.shape[0] * (epps_pulley_integrand(x, t) @ w)


def sigreg(
    z: Array,
    key: Array,
    *,
    num_directions: int = DEFAULT_NUM_DIRECTIONS,
    num_knots: int = DEFAULT_NUM_KNOTS,
    t_max: float = DEFAULT_T_MAX,
    per_view: bool = False,
) -> Array:
    """SIGReg of embeddings ``z`` (``[N, P]``, or ``[B, V, P]`` pooled to ``[B*V, P]``): the mean over
    ``num_directions`` random unit directions (from ``key``) of the Epps–Pulley statistic of the
    projections. ``per_view`` (``[B, V, P]`` only): the statistic of each view's ``B`` projections on
    the same directions, averaged over views."""
    a = sigreg_directions(key, z.shape[-1], num_directions)
    if per_view:
        if z.ndim != 3:
            raise ValueError(f"per-view SIGReg needs z of shape [B, V, P], got {z.shape}")
        views = jnp.swapaxes(z.astype(jnp.float32), 0, 1)  # [V, B, P]
        return jax.vmap(lambda zv: epps_pulley(zv @ a, num_knots, t_max).mean())(views).mean()
    z = z.reshape(-1, z.shape[-1]).astype(jnp.float32)
    return epps_pulley(z @ a, num_knots, t_max).mean()


def lejepa_loss(
    z: Array,
    key: Array,
    *,
    lam: float = DEFAULT_LAMBDA,
    num_directions: int = DEFAULT_NUM_DIRECTIONS,
    num_knots: int = DEFAULT_NUM_KNOTS,
    t_max: float = DEFAULT_T_MAX,
    sigreg_per_view: bool = False,
    n_global: int | None = None,
) -> dict[str, Array]:
    """LeJEPA on projections ``z [B, V, P]`` -> ``{"loss", "invariance", "sigreg"}`` (scalars), with
    ``loss = (1 - lam) * invariance + lam * sigreg``; ``key`` draws the SIGReg directions; the first
    ``n_global`` views (default: all) make the invariance centre."""
    inv = invariance_loss(z, n_global)
    reg = sigreg(
        z, key, num_directions=num_directions, num_knots=num_knots, t_max=t_max, per_view=sigreg_per_view
    )
    return {"loss": (1.0 - lam) * inv + lam * reg, "invariance": inv, "sigreg": reg}


def span_mask(key: Array, lead: tuple[int, ...], grid: tuple[int, int], span: int, ratio: float) -> Array:
    """``[*lead, N]`` booleans (True = hidden) over a time-major token grid ``(n_time, n_freq)``: the
    time side cut into spans of ``span`` tokens, ``round(ratio * spans)`` of them (at least one)
    hidden in each sample, every mel patch of a hidden time step with it."""
    n_time, n_freq = grid
    if n_time % span:
        raise ValueError(f"span of {span} tokens does not divide the {n_time} time tokens")
    spans = n_time // span
    hidden = max(1, round(ratio * spans))
    rank = jnp.argsort(jnp.argsort(jax.random.uniform(key, (*lead, spans)), axis=-1), axis=-1)
    per_span = rank < hidden
    return jnp.repeat(per_span, span * n_freq, axis=-1)


def span_loss(prediction: Array, target: Array, mask: Array) -> Array:
    """Mean squared error of ``prediction`` against the standardised ``target`` (both ``[.., N, D]``;
    each target token scaled to zero mean and unit variance over D, so shrinking the encoder's tokens
    cannot shrink the error) over the hidden tokens of ``mask [.., N]`` only."""
    return jnp.sum(span_errors(prediction, target) * mask) / jnp.maximum(jnp.sum(mask), 1)


def span_errors(prediction: Array, target: Array) -> Array:
    """``[.., N]``: each token's squared error against its standardised target (see `span_loss`)."""
    target = target.astype(jnp.float32)
    target = (target - target.mean(axis=-1, keepdims=True)) / jnp.sqrt(
        target.var(axis=-1, keepdims=True) + 1e-6
    )
    return jnp.square(prediction.astype(jnp.float32) - target).mean(axis=-1)


def _masked_ce_acc(logits: Array, labels: Array) -> tuple[Array, Array, Array]:
    """Mean CE, mean accuracy over samples with ``label >= 0``, and their count (float)."""
    ce_sum, correct, n = masked_ce_sums(logits, labels)
    denom = jnp.maximum(n, 1.0)
    return ce_sum / denom, correct / denom, n


def masked_ce_sums(logits: Array, labels: Array) -> tuple[Array, Array, Array]:
    """Summed CE, the number correct and the number of samples with ``label >= 0`` (floats): what
    `_masked_ce_acc` divides, and what adds up over the parts of a batch."""
    labels = jnp.asarray(labels)
    if logits.ndim == labels.ndim + 2:  # [B, V, C] logits with [B] labels: one label for all views
        labels = jnp.broadcast_to(labels[:, None], logits.shape[:-1])
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels of shape {labels.shape} do not match logits of shape {logits.shape}")
    logits = logits.astype(jnp.float32)
    mask = labels >= 0
    safe = jnp.where(mask, labels, 0).astype(jnp.int32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    correct = jnp.argmax(logits, axis=-1) == labels
    n = mask.sum().astype(jnp.float32)
    ce_sum = jnp.where(mask, nll, 0.0).sum()
    return ce_sum, jnp.where(mask, correct, False).sum().astype(jnp.float32), n


def supervised_loss(logits: Array, labels: Array) -> dict[str, Array]:
    """Cross-entropy of a classification head -> ``{"loss", "ce", "acc", "n_labelled"}``
    (``loss == ce``; labels < 0 ignored; 0 when no sample is labelled)."""
    ce, acc, n = _masked_ce_acc(logits, labels)
    return {"loss": ce, "ce": ce, "acc": acc, "n_labelled": n}


def probe_metrics(logits: Array, labels: Array) -> dict[str, Array]:
    """Online linear-probe metrics -> ``{"probe_ce", "probe_acc", "probe_n_labelled"}`` (labels < 0 ignored).
    ``probe_ce`` is also the probe's training loss (the model stops its gradient at the embedding)."""
    ce, acc, n = _masked_ce_acc(logits, labels)
    return {"probe_ce": ce, "probe_acc": acc, "probe_n_labelled": n}
