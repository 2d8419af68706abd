"""The objectives' options, their checks and the registry (no JAX here: `birdjepa.config` and
`birdjepa.validation` import it).

An objective is registered by one entry of `REGISTRY`: its name (``--objective.kind``), its options
(the group ``--objective.<name>.*``, a field of `ObjectiveConfig`) and the class that computes it
(``"module:Class"``, imported only when a step is built). `docs/extending.md` walks through adding one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, ClassVar, Literal

from birdjepa.model.config import DecoderConfig, ModelConfig

PretrainConfig = Any
"""`birdjepa.config.PretrainConfig`, which imports this module (a floor below it)."""

Problem = tuple[str, Any, str]
"""(option under the objective's group, its value, what is allowed)."""


class Options:
    """What every objective's options provide besides their fields (each a no-op by default)."""

    RANGES: ClassVar[tuple[tuple[tuple[str, ...], str], ...]] = ()
    """(fields, rule): rule one of ">=0", ">=1", ">=2", ">0", "[0,1]", "(0,1)" (`birdjepa.validation`)."""
    NEEDS_LABELS: ClassVar[bool] = False
    """Whether the objective trains on the labels (train shards without any are then refused)."""
    IDLE_PARAMS: ClassVar[tuple[str, ...]] = ()
    """Name prefixes of parameters the model builds that no loss of this objective reads: their zero
    gradients are no vanishing gradients, and the update monitor does not report them."""

    def problems(self, cfg: PretrainConfig) -> Iterator[Problem]:
        """Options of this group that cannot work with the rest of ``cfg`` (the chosen objective only)."""
        return iter(())

    def unused(self, cfg: PretrainConfig) -> Iterator[Problem]:
        """Options given a value other than their default that this objective would never read with
        the rest of ``cfg`` (here the option is its whole path, ``model.predictor_depth``): a run trained
        without them, config.json recording them as given. The predictor by default: only LeJEPA's span
        term reads it."""
        depth = cfg.model.predictor_depth
        if depth:
            yield "model.predictor_depth", depth, f"the {cfg.objective.kind} objective has no span term"

    def model(self, model_cfg: ModelConfig) -> ModelConfig:
        """The model this objective trains, from the configured one (with the data's class count)."""
        return model_cfg

    def decoder(self, model_cfg: ModelConfig) -> DecoderConfig | None:
        """The decoder the model builds for this objective (None: none)."""
        return None


DEFAULT_LAMBDA = 0.05
DEFAULT_NUM_DIRECTIONS = 256
DEFAULT_NUM_KNOTS = 17
DEFAULT_T_MAX = 3.0
#: SIGReg's largest frequency: its integrand's weight exp(-t^2/2) is 2e-22 there, so a larger one only
#: spreads the knots (17 of them over [0, 100] scored a collapsed embedding 1e-6; the run exited 0).
T_MAX = 10.0


@dataclasses.dataclass(frozen=True)
class LeJepaConfig(Options):
    """LeJEPA loss settings (see `birdjepa.objectives.lejepa`)."""

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
    tokens there from the rest (`birdjepa.objectives.span`)."""
    span_tokens: int = 4
    """Length of a hidden span in time tokens (it must divide the token grid's time side)."""
    span_ratio: float = 0.5
    """Fraction of the spans hidden in each view."""
    patch_weight: float = 0.0
    """Weight of the patch term added to the loss (0 = off): each of the encoder's final tokens, through
    a per-token linear read-out, reconstructs its own input patch (standardised over its values), so
    the tokens keep what their patch holds (`birdjepa.objectives.lejepa`)."""

    RANGES: ClassVar = (
        (("num_directions", "span_tokens", "local_frames"), ">=1"),
        (("local_views",), ">=0"),
        (("num_knots",), ">=2"),
        (("t_max",), ">0"),
        (("span_weight", "patch_weight"), ">=0"),
        (("lam",), "[0,1]"),
        (("span_ratio",), "(0,1)"),
    )

    def problems(self, cfg: PretrainConfig) -> Iterator[Problem]:
        m = cfg.model
        if self.t_max > T_MAX:  # its knots spread out until a collapsed embedding scores 0 (at 1e6)
            yield "t_max", self.t_max, f"must be at most {T_MAX:g}: SIGReg's weight exp(-t^2/2) is ~0 past it"
        if cfg.data.n_views < 2:
            yield "n_views", cfg.data.n_views, "the lejepa objective compares views: need >= 2"
        if self.span_weight and not m.predictor_depth:
            yield "span_weight", self.span_weight, "needs a predictor: set --model.predictor-depth >= 1"
        time_tokens = m.n_frames // m.patch
        if self.span_weight and time_tokens % self.span_tokens:
            yield "span_tokens", self.span_tokens, f"must divide the {time_tokens} time tokens"
        elif self.span_weight:  # the predictor works from the spans left: all hidden, it has nothing
            spans = time_tokens // self.span_tokens
            # None hidden was one hidden, without a word: 0.01, 0.05 and 0.1 of 8 spans trained one recipe.
            if not 1 <= round(self.span_ratio * spans) < spans:
                what = (f"must hide some but not all of the {spans} spans of {self.span_tokens} time tokens "
                        f"(round(ratio * {spans}) of them: 1 at {1 / spans:g})")  # fmt: skip
                yield "span_ratio", self.span_ratio, what
        if self.local_views and (self.local_frames % m.patch or self.local_frames > m.n_frames):
            allowed = f"must be a multiple of --model.patch ({m.patch}) and at most {m.n_frames} frames"
            yield "local_frames", self.local_frames, allowed

    def unused(self, cfg: PretrainConfig) -> Iterator[Problem]:
        default, where = LeJepaConfig(), "objective.lejepa"
        if not self.span_weight:
            off = "without --objective.lejepa.span-weight (0: no span term)"
            if depth := cfg.model.predictor_depth:
                yield "model.predictor_depth", depth, f"the predictor is read only by the span term: {off}"
            for name in ("span_tokens", "span_ratio"):
                if getattr(self, name) != getattr(default, name):
                    yield f"{where}.{name}", getattr(self, name), f"is the span term's: {off}"
        if not self.local_views and self.local_frames != default.local_frames:
            why = "is the local views': --objective.lejepa.local-views is 0"
            yield f"{where}.local_frames", self.local_frames, why

    def decoder(self, model_cfg: ModelConfig) -> DecoderConfig | None:
        # The patch term's read-out: a decoder without blocks maps each token to its own patch's values.
        m = model_cfg.resolved()
        return DecoderConfig(dim=m.dim, depth=0, heads=m.heads) if self.patch_weight else None


@dataclasses.dataclass(frozen=True)
class MaeConfig(Options):
    """Masked autoencoder settings (see `birdjepa.objectives.mae`)."""

    mask_ratio: float = 0.75
    """Fraction of each view's patches hidden from the encoder (He et al.'s and Audio-MAE's 0.75)."""
    masking: Literal["random", "time", "freq", "block"] = "random"
    """Which patches are hidden together: random (each patch on its own), time (spans of
    ``block_time`` time steps, every band), freq (bands of ``block_freq`` patch rows, every time step)
    or block (``block_time`` x ``block_freq`` rectangles)."""
    block_time: int = 2
    """Time side of a masked block, in patches (time and block masking)."""
    block_freq: int = 2
    """Frequency side of a masked block, in patches (freq and block masking; needs
    ``--model.patch-freq`` smaller than the mel bins)."""
    norm_pix: bool = True
    """Targets: each patch standardised over its own values (He et al.: better features), else the
    patches as the encoder receives them."""
    decoder_dim: int | None = None
    """Width of the decoder's tokens (None: the encoder's)."""
    decoder_depth: int = 2
    """Transformer blocks of the decoder (a light one: the encoder does the work)."""
    decoder_heads: int | None = None
    """Attention heads of the decoder (None: the encoder's)."""

    IDLE_PARAMS: ClassVar = ("projector/",)  # built (one layer, `model`), read by no loss
    RANGES: ClassVar = (
        (("block_time", "block_freq", "decoder_dim", "decoder_depth", "decoder_heads"), ">=1"),
        (("mask_ratio",), "(0,1)"),
    )

    def problems(self, cfg: PretrainConfig) -> Iterator[Problem]:
        m = cfg.model.resolved()
        n_time, n_freq = m.grid
        if self.masking in ("time", "block") and n_time % self.block_time:
            yield "block_time", self.block_time, f"must divide the {n_time} time patches"
        if self.masking in ("freq", "block") and (n_freq == 1 or n_freq % self.block_freq):
            allowed = f"must divide the {n_freq} frequency patches (set --model.patch-freq to cut bands)"
            yield "block_freq", self.block_freq, allowed
        hidden = round(self.mask_ratio * m.n_patches)
        if not 0 < hidden < m.n_patches:
            yield "mask_ratio", self.mask_ratio, f"must hide some but not all of the {m.n_patches} patches"
        decoder = self.decoder(m)
        if decoder.dim % decoder.heads:
            yield "decoder_heads", decoder.heads, f"must divide the decoder's width ({decoder.dim})"
        elif m.rope and (decoder.dim // decoder.heads) % 4:  # the encoder's is checked; this one was not
            width = decoder.dim // decoder.heads
            yield (
                "decoder_heads",
                decoder.heads,
                f"--model.rope needs a decoder head width that 4 divides (it is {width})",
            )
        if (
            m.swiglu and decoder.depth and 2 * m.mlp_ratio * decoder.dim // 3 < 1
        ):  # a ZeroDivisionError at init
            why = "--model.swiglu needs 2/3 of --model.mlp-ratio x the decoder's width to be >= 1"
            yield "decoder_dim", decoder.dim, why

    def unused(self, cfg: PretrainConfig) -> Iterator[Problem]:
        yield from super().unused(cfg)
        default, m = MaeConfig(), cfg.model
        reads = {"block_time": ("time", "block"), "block_freq": ("freq", "block")}
        for name, maskings in reads.items():
            if getattr(self, name) != getattr(default, name) and self.masking not in maskings:
                why = f"is read by --objective.mae.masking {' or '.join(maskings)}, not {self.masking}"
                yield f"objective.mae.{name}", getattr(self, name), why
        if m.proj_dim is not None:  # the projector is built (one layer), and no loss reads it
            yield "model.proj_dim", m.proj_dim, "no loss of the mae objective reads the projector"

    def model(self, model_cfg: ModelConfig) -> ModelConfig:
        # No loss reads the projector: one linear layer (the model always has one) is all it costs.
        return dataclasses.replace(model_cfg, proj_layers=0)

    def decoder(self, model_cfg: ModelConfig) -> DecoderConfig:
        m = model_cfg.resolved()
        dim = self.decoder_dim or m.dim
        return DecoderConfig(dim=dim, depth=self.decoder_depth, heads=self.decoder_heads or m.heads)


@dataclasses.dataclass(frozen=True)
class SupervisedConfig(Options):
    """Cross-entropy on the labels (see `birdjepa.objectives.supervised`): no options of its own."""

    NEEDS_LABELS: ClassVar[bool] = True

    def model(self, model_cfg: ModelConfig) -> ModelConfig:
        # The projector becomes the classifier.
        return dataclasses.replace(model_cfg, proj_dim=model_cfg.n_classes, proj_layers=0)


@dataclasses.dataclass(frozen=True)
class Registration:
    options: type[Options]
    implementation: str
    """``"module:Class"``: the `birdjepa.objectives.base.Objective` that computes it."""


REGISTRY: dict[str, Registration] = {
    "lejepa": Registration(LeJepaConfig, "birdjepa.objectives.lejepa:LeJepa"),
    "mae": Registration(MaeConfig, "birdjepa.objectives.mae:Mae"),
    "supervised": Registration(SupervisedConfig, "birdjepa.objectives.supervised:Supervised"),
}


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
    kind: Literal["lejepa", "mae", "supervised"] = "lejepa"
    """lejepa: invariance + SIGReg on projections; mae: reconstruct masked patches from visible ones;
    supervised: cross-entropy on labels."""
    lejepa: LeJepaConfig = LeJepaConfig()
    """Invariance + SIGReg (λ = 0.05, the paper's)."""
    mae: MaeConfig = MaeConfig()
    """Masked autoencoder (ratio 0.75, a 2-block decoder)."""
    supervised: SupervisedConfig = SupervisedConfig()

    @property
    def options(self) -> Options:
        """The chosen objective's options."""
        return getattr(self, self.kind)
