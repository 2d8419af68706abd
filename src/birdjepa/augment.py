"""View augmentations of the recording channel, applied to log-mel views inside the jitted step.

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
  another bird or a noise source behind the recording.

The loader's crop and time/frequency masks act on each view before this. The features arrive as
``(log(power) - mean) / std`` (``birdjepa.data.Features``): gains are in dB of power, turned into the
same units. Randomness comes from the step's key only, so a resumed step draws the same views.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

Array = jax.Array
_DB = math.log(10.0) / 10.0  # natural-log units per dB of power


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    gain_db: float = 0.0
    """Per-view gain, uniform in ±gain_db dB (0 = off)."""
    tilt_db: float = 0.0
    """Per-view spectral tilt: from -t to +t dB across the mel bands, t uniform in ±tilt_db (0 = off)."""
    mix_prob: float = 0.0
    """Probability that a view gets another recording of the batch mixed in behind it (0 = off)."""
    mix_db: tuple[float, float] = (-20.0, -5.0)
    """Level of the mixed-in recording relative to the view, uniform in this range (dB)."""

    def __post_init__(self) -> None:
        if self.gain_db < 0 or self.tilt_db < 0 or not 0.0 <= self.mix_prob <= 1.0:
            raise ValueError(
                f"need gain_db >= 0, tilt_db >= 0 and mix_prob in [0, 1], got {self.gain_db}, "
                f"{self.tilt_db}, {self.mix_prob}"
            )
        if len(self.mix_db) != 2 or self.mix_db[0] > self.mix_db[1]:
            raise ValueError(f"mix_db must be (low, high) with low <= high, got {self.mix_db}")

    @property
    def active(self) -> bool:
        return self.gain_db > 0 or self.tilt_db > 0 or self.mix_prob > 0


def augment_views(x: Array, key: Array, cfg: AugmentConfig, *, mean: float, std: float) -> Array:
    """``x`` ``[B, V, T, M]`` normalised log-mel views -> the same, each view's channel redrawn."""
    if not cfg.active:
        return x
    if x.ndim != 4:
        raise ValueError(f"augment_views expects [B, V, T, M] views, got shape {x.shape}")
    b, v, _, m = x.shape
    k_gain, k_tilt, k_mix, k_level, _ = jax.random.split(key, 5)
    log_power = x.astype(jnp.float32) * std + mean
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
