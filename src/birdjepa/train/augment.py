"""View augmentations, applied to log-mel views inside the jitted step.

Two crops of one recording share everything about how it was recorded: its level, the microphone's
frequency response, the background. An invariance objective is then satisfied by encoding those, and
they are easier to encode than the song (measured on the demo set: in the encoder of a LeJEPA run
without these augmentations, the recording's loudness explained 36 % of the embedding variance and
the species 10 %; see ``docs/issues/002-pretraining-learns``). Drawn independently for every view,
they make the channel differ between views so only the song is shared:

* **gain**: the whole view louder or quieter, uniform in ``±gain_db``;
* **tilt**: a spectral slope, linear in the mel index, from ``-tilt_db`` to ``+tilt_db`` across the
  band (microphone and distance colour the spectrum);
* **background**: with probability ``mix_prob``, another recording of the batch (its view of the same
  index, rolled by one sample) is added in the power domain at ``mix_db`` (uniform) below it, as
  another bird or a noise source behind the recording;
* **warp** (on by default): a shift of ``±pitch_bins`` mel bins and a time stretch of up to
  ``1 + stretch``. Two individuals of a species do not sing at the same pitch and tempo; without the
  warp the encoder may keep both exactly (on the demo set it lifted the frozen linear probe from
  0.55 to 0.59 at 600 steps).

The channel augmentations (gain, tilt, background) are off by default: the encoder's input
normalisation (``ModelConfig.input_norm = "floor"``) already removes level, microphone colour and
stationary noise, and with it they did not help. The loader's crop and time/frequency masks act on
each view before this. The features arrive as ``(log(power) - mean) / std``
(``birdjepa.data.Features``): gains are in dB of power, turned into the same units. Randomness comes
from the step's key only, so a resumed step draws the same views.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from birdjepa.config import AugmentConfig
from birdjepa.model.noise_floor import noise_floor

Array = jax.Array
_DB = math.log(10.0) / 10.0  # natural-log units per dB of power
_NOISE_KEY = 7


def augment_views(x: Array, key: Array, cfg: AugmentConfig, *, mean: float, std: float) -> Array:
    """``x`` ``[B, V, T, M]`` normalised log-mel views -> the same, each view's channel redrawn."""
    if not cfg.active:
        return x
    if x.ndim != 4:
        raise ValueError(f"augment_views expects [B, V, T, M] views, got shape {x.shape}")
    b, v, t, m = x.shape
    k_gain, k_tilt, k_mix, k_level, k_pitch, k_stretch = jax.random.split(key, 6)
    log_power = x.astype(jnp.float32) * std + mean
    if cfg.pitch_bins > 0 or cfg.stretch > 0:
        shift = jax.random.uniform(k_pitch, (b, v), minval=-cfg.pitch_bins, maxval=cfg.pitch_bins)
        log_stretch = jax.random.uniform(
            k_stretch, (b, v), minval=-math.log1p(cfg.stretch), maxval=math.log1p(cfg.stretch)
        )
        log_power = _warp(log_power, shift, jnp.exp(log_stretch), reach=cfg.pitch_bins)
    if cfg.noise_db > 0:  # its own key: adding it leaves the other draws as they were
        floor = noise_floor(log_power.reshape(b * v, t, m)).reshape(b, v, 1, m)
        above = jax.random.uniform(jax.random.fold_in(key, _NOISE_KEY), (b, v, 1, 1), maxval=cfg.noise_db)
        log_power = jnp.logaddexp(log_power, floor + above * _DB)
    offset = jnp.zeros((b, v, 1, m), jnp.float32)
    if cfg.gain_db > 0:
        offset += jax.random.uniform(k_gain, (b, v, 1, 1), minval=-cfg.gain_db, maxval=cfg.gain_db)
    if cfg.tilt_db > 0:
        slope = jax.random.uniform(k_tilt, (b, v, 1, 1), minval=-cfg.tilt_db, maxval=cfg.tilt_db)
        offset += slope * jnp.linspace(-1.0, 1.0, m, dtype=jnp.float32)
    log_power = log_power + offset * _DB
    if cfg.mix_prob > 0:
        other = jnp.roll(log_power, 1, axis=0)
        level = jax.random.uniform(k_level, (b, v, 1, 1), minval=cfg.mix_db[0], maxval=cfg.mix_db[1])
        mixed = jnp.logaddexp(log_power, other + level * _DB)
        log_power = jnp.where(jax.random.bernoulli(k_mix, cfg.mix_prob, (b, v, 1, 1)), mixed, log_power)
    return ((log_power - mean) / std).astype(x.dtype)


def _interp(x: Array, pos: Array) -> Array:
    """``x`` sampled at fractional positions ``pos`` along its first axis (linear, clamped at the edges).
    Each index is in range by construction, so the gathers skip XLA's bounds checks."""
    n = x.shape[0]
    pos = jnp.clip(pos, 0.0, n - 1.0)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, n - 1)
    w = pos - lo
    a, c = x.at[lo].get(mode="promise_in_bounds"), x.at[hi].get(mode="promise_in_bounds")
    return a + (c - a) * w.reshape(-1, *([1] * (x.ndim - 1)))


def _shift_bins(x: Array, s: Array, reach: float) -> Array:
    """``x [T, M]`` sampled at mel positions ``k - s`` (linear, clamped at the edges), for ``|s| <=
    reach``: the values two gathers along the mel axis gave, without a gather. Each index lies within
    ``ceil(reach)`` bins of its own (its upper neighbour one more), so each value is one of the
    ``2 ceil(reach) + 2`` copies of ``x`` shifted by as many bins, picked by a select. XLA's CPU gather
    reads one element at a time, here strided along the mel axis: with it the warp took 30-35 % of the
    tiny step's time, with the selects 13-15 % (``docs/issues/007-step-limit/tiny_step.py``). The copies
    grow with the reach: alone, the warp takes 2-4 ms at ``--augment.pitch-bins 2`` (the default),
    4-6 ms at 12 and 7-9 ms at 24, the gathers 4.6-4.8 ms at any. A bin beyond the reach stays NaN,
    which the guard reports."""
    m = x.shape[-1]
    pos = jnp.clip(jnp.arange(m, dtype=jnp.float32) - s, 0.0, m - 1.0)
    lo = jnp.floor(pos).astype(jnp.int32)
    w = pos - lo
    r = math.ceil(reach)  # k - s rounded to float32 cannot cross k +- r: lo - k in [-r, r], clamped too
    bin_ = jnp.arange(m, dtype=jnp.int32)
    edges = (jnp.repeat(x[:, :1], r, axis=1), x, jnp.repeat(x[:, -1:], r + 1, axis=1))
    padded = jnp.concatenate(edges, axis=1)  # bin k + d of x at column r + k + d, the edges held
    shifted = [jax.lax.slice_in_dim(padded, r + d, r + d + m, axis=1) for d in range(-r, r + 2)]
    a = c = jnp.full_like(x, jnp.nan)
    for d in range(-r, r + 1):  # the upper neighbour: the next copy (at the top bin, the edge held)
        at = lo - bin_ == d
        a, c = jnp.where(at, shifted[d + r], a), jnp.where(at, shifted[d + r + 1], c)
    return a + (c - a) * w


def _warp(x: Array, shift: Array, stretch: Array, *, reach: float) -> Array:
    """Each ``[T, M]`` view of ``x [B, V, T, M]`` shifted by ``shift`` mel bins (positive: higher,
    ``|shift| <= reach``) and stretched in time by ``stretch`` (> 1: slower), both about its start."""
    t = x.shape[2]

    def one(view: Array, s: Array, r: Array) -> Array:
        return _interp(_shift_bins(view, s, reach), jnp.arange(t, dtype=jnp.float32) / r)

    return jax.vmap(jax.vmap(one))(x, shift, stretch)
