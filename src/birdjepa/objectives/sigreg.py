"""SIGReg (Sketched Isotropic Gaussian Regularisation, LeJEPA's, Balestriero & LeCun 2025): pure
functions, deterministic given their inputs (the only randomness, the directions, comes from a key).

The ``N = B*V`` embeddings ``Z [N, P]`` should be distributed as N(0, I_P). Draw K = ``num_directions``
(default 256) directions ``a_k = g_k / ||g_k||`` with ``g_k ~ N(0, I_P)`` from the step key, project
``x[n, k] = <Z[n], a_k>`` and for each direction compute the Epps–Pulley statistic against N(0, 1)::

    EP_k = N * ∫_R | φ_k(t) - exp(-t²/2) |² w(t) dt,    φ_k(t) = 1/N sum_n exp(i t x[n, k]),
    w(t) = exp(-t²/2)

    |φ_k(t) - e^{-t²/2}|² = (mean_n cos(t x) - e^{-t²/2})² + (mean_n sin(t x))²

The integrand is even in t, so the integral is computed as ``2 * ∫_0^{t_max}`` with the trapezoid rule on
``num_knots`` (default 17) equally spaced knots in ``[0, t_max]`` (default ``t_max = 3``: the weight is
``w(3) = e^{-9/2} ≈ 0.011`` there and the tail beyond 3 holds ~0.3% of its mass). ``SIGReg = mean_k EP_k``.
For N i.i.d. N(0, I) embeddings ``E[EP_k] = ∫ (1 - e^{-t²}) e^{-t²/2} dt = √(2π) - √(2π/3) ≈ 1.06``
whatever N, while any fixed departure from N(0, 1) grows linearly in N (the factor N makes EP a test
statistic). All N = B*V embeddings are pooled into one sample, so SIGReg tests the marginal of all views
together (``sigreg_per_view``: the mean over views of SIGReg with N = B each, as LeJEPA's code).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from birdjepa.objectives.options import DEFAULT_NUM_DIRECTIONS, DEFAULT_NUM_KNOTS, DEFAULT_T_MAX

Array = jax.Array


def named_sigreg(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` with every operation it adds to a step named ``sigreg`` in XLA's metadata: the step's
    profile attributes their time (`birdjepa.perf.profile`). A name only: the arithmetic is unchanged."""

    @functools.wraps(f)
    def scoped(*args: Any, **kwargs: Any) -> Any:
        with jax.named_scope("sigreg"):
            return f(*args, **kwargs)

    return scoped


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


@named_sigreg
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


@named_sigreg
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


@named_sigreg
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
