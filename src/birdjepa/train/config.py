"""The training recipe's options: optimizer, view augmentations, LeJEPA objective (no JAX here:
`birdjepa.config` imports it; their ranges are checked by `birdjepa.validation`)."""

from __future__ import annotations

import dataclasses
from typing import Literal


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
    noise_db: float = 0.0
    """Per-view added stationary noise with the view's own noise-floor spectrum, at uniform [0,
    noise_db] dB above that floor (0 = off): the recording's signal-to-noise ratio, which the
    encoder otherwise keeps as a feature both views share, differs between views."""
    pitch_bins: float = 2.0
    """Per-view frequency shift, uniform in ±pitch_bins mel bins (0 = off): one singer sings higher
    than another, so the exact pitch of a recording is not a feature to keep."""
    stretch: float = 0.1
    """Per-view time stretch by a factor uniform in [1 / (1 + s), 1 + s] (0 = off): tempo varies by
    singer too."""

    @property
    def active(self) -> bool:
        on = (self.gain_db, self.tilt_db, self.mix_prob, self.noise_db, self.pitch_bins, self.stretch)
        return any(x > 0 for x in on)


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    name: Literal["adamw", "muon"] = "adamw"
    """adamw, or muon (optax.contrib.muon; AdamW for non-matrix parameters)."""
    lr: float = 1e-3
    """Peak learning rate."""
    weight_decay: float = 0.05
    b1: float = 0.9
    b2: float = 0.999
    schedule: Literal["cosine", "wsd"] = "cosine"
    """cosine: linear warmup then cosine decay; wsd: warmup, stable, then linear decay."""
    warmup_steps: int = 10
    decay_fraction: float = 0.2
    """wsd only: the fraction of updates spent decaying at the end."""
    min_lr_ratio: float = 0.0
    """Final LR as a fraction of the peak."""
    clip_norm: float = 1.0
    """Global-norm gradient clipping (0 = off)."""
    grad_accum: int = 1
    """Micro-batches per optimizer update."""
    probe_lr_scale: float = 100.0
    """LR multiplier of the online probe head: a linear probe on a moving encoder needs a much faster
    LR than the encoder to converge within a short run (demo defaults, 600 steps: held-out accuracy
    0.33 at x100, 0.27 at x30)."""


DEFAULT_LAMBDA = 0.05
DEFAULT_NUM_DIRECTIONS = 256
DEFAULT_NUM_KNOTS = 17
DEFAULT_T_MAX = 3.0


@dataclasses.dataclass(frozen=True)
class LeJepaConfig:
    """LeJEPA loss settings (see `birdjepa.train.objectives`)."""

    lam: float = DEFAULT_LAMBDA
    """Weight λ of SIGReg in ``(1 - λ) * invariance + λ * SIGReg``."""
    num_directions: int = DEFAULT_NUM_DIRECTIONS
    """K random 1-D projections per step."""
    num_knots: int = DEFAULT_NUM_KNOTS
    """Trapezoid knots on [0, t_max]."""
    t_max: float = DEFAULT_T_MAX
    sigreg_per_view: bool = False
    """SIGReg of each view's B projections, averaged over views (as LeJEPA's reference code), instead
    of one test of all B*V pooled."""
    local_views: int = 0
    """Multi-crop: local views per sample, cut from the global views (0 = off). The invariance pulls
    every view to the centre of the global views."""
    local_frames: int = 128
    """Frames of a local view (a multiple of the patch size)."""
    span_weight: float = 0.0
    """Weight of the masked-span (JEPA) term added to the loss (0 = off; needs
    ``--model.predictor-depth`` > 0): hide time spans of each view's tokens and predict the encoder's
    tokens there from the rest."""
    span_tokens: int = 4
    """Length of a hidden span in time tokens (it must divide the token grid's time side)."""
    span_ratio: float = 0.5
    """Fraction of the spans hidden in each view."""
