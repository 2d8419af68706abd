"""Each mel bin's noise floor, which ``--model.input-norm floor`` subtracts before the encoder sees a
spectrogram (`birdjepa.model.vit.normalised_input`) and the augmentation's noise is added above
(`birdjepa.train.augment`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

NOISE_FLOOR_WINDOW = 16  # frames (160 ms): longer than a note, shorter than a song's pauses


def noise_floor(x: Array, window: int = NOISE_FLOOR_WINDOW) -> Array:
    """Each mel bin's noise floor in ``x [B, T, M]`` (log domain) -> ``[B, 1, M]``: the 20th percentile
    over time of its means over windows of ``window`` frames (fewer when they do not divide T). A
    bird sings in bursts, so the quiet windows show the background; a quantile over all T frames
    costs 20x more (a sort of T per bin)."""
    b, t, m = x.shape
    window = math.gcd(window, t)
    with jax.named_scope("noise_floor"):  # a name in XLA's metadata only (birdjepa.perf.profile)
        means = x.reshape(b, t // window, window, m).mean(axis=2)
        return low_quantile(jnp.swapaxes(means, 1, 2), 0.2)[:, None, :]


def low_quantile(a: Array, q: float) -> Array:
    """``jnp.quantile(a, q, axis=-1)`` of a float32 ``a`` (linear interpolation), its bits, from the two
    order statistics around ``q`` that `jax.lax.top_k` finds: the quantile sorts every row, and on a
    CPU XLA's sort calls its comparator for each comparison where its top_k runs a routine of its own
    (the tiny step's floor, a sort of 32 window means a bin, took 8.5 ms; the step with top_k takes
    0.84-0.92x the time: ``docs/issues/007-step-limit/tiny_step.py``). top_k finds the ``ceil(q (n -
    1)) + 1`` smallest, so a low ``q`` costs least. As the quantile, a row with a NaN gives NaN. One
    difference: top_k orders -0 below +0 where the sort takes them as equal and keeps the row's order,
    so in a row holding both a zero may come back with the other sign (a window mean is -0 only if all
    its frames are, and no feature is: ``x - x`` is +0)."""
    n = a.shape[-1]
    pos = np.float32(q) * np.float32(n - 1)  # float32, as the quantile computes its position and weights
    lo, hi = int(np.floor(pos)), int(np.ceil(pos))
    high_weight = pos - np.floor(pos)
    smallest = -jax.lax.top_k(-a, hi + 1)[0]  # the hi + 1 smallest of each row, ascending
    value = smallest[..., lo] * (np.float32(1) - high_weight) + smallest[..., hi] * high_weight
    return jnp.where(jnp.isnan(a).any(axis=-1), jnp.nan, value)
