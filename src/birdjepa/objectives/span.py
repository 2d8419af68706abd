"""The masked-span (JEPA) term LeJEPA can add (``--objective.lejepa.span-weight``).

Off by default (``span_weight`` 0). ``span_mask`` hides
``round(span_ratio * spans)`` time spans of ``span_tokens`` tokens in each view; the encoder sees a copy
of the view with a learned mask token there, a predictor maps its tokens to the encoder's tokens of the
whole view, and ``span_loss`` is their squared error at the hidden tokens (targets standardised per
token, without gradient: the JEPA term)::

    loss = (1 - λ) * invariance + λ * SIGReg + span_weight * span

It costs a second encoder pass per step. On the demo set it did not beat the defaults clearly
(``docs/issues/002-pretraining-learns``, H7).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def span_mask(key: Array, lead: tuple[int, ...], grid: tuple[int, int], span: int, ratio: float) -> Array:
    """``[*lead, N]`` booleans (True = hidden) over a time-major token grid ``(n_time, n_freq)``: the
    time side cut into spans of ``span`` tokens, ``round(ratio * spans)`` of them (at least one; the
    options refuse a ratio that rounds to none) hidden in each sample, every mel patch of a hidden time
    step with it."""
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
