"""The model's options and presets (no JAX here: `birdjepa.config` imports it; their ranges are
checked by `birdjepa.validation`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

PRESETS: dict[str, dict[str, int]] = {
    # tiny: for tests and CPU smoke runs.
    "tiny": {"dim": 64, "depth": 2, "heads": 2, "mlp_ratio": 4, "proj_hidden": 128, "proj_dim": 32},
    "small": {"dim": 384, "depth": 12, "heads": 6, "mlp_ratio": 4, "proj_hidden": 2048, "proj_dim": 128},
    "base": {"dim": 768, "depth": 12, "heads": 12, "mlp_ratio": 4, "proj_hidden": 2048, "proj_dim": 128},
}


GROUPS: tuple[str, ...] = ("encoder", "projector", "probe")
OPTIONAL_GROUPS: tuple[str, ...] = ("predictor", "decoder")  # predictor_depth > 0; an objective's decoder


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """A decoder of patch values from the encoder's visible tokens (the MAE objective's; its options
    are the objective's, `birdjepa.objectives.options.MaeConfig`). Depth 0 is a read-out of each
    token's own patch, with every patch visible (LeJEPA's patch term)."""

    dim: int
    depth: int
    heads: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Model hyper-parameters. Fields left at ``None`` take the named ``preset``'s value (see ``PRESETS``
    and ``resolved``); any field given explicitly overrides the preset.

    ``ModelConfig()`` is the tiny preset; ``ModelConfig(preset="small", depth=6)`` is small with 6 blocks.
    """

    preset: str = "tiny"
    """tiny, small or base: the values of every option left unset (`PRESETS`)."""
    dim: int | None = None
    """Token width D."""
    depth: int | None = None
    """Number of transformer blocks."""
    heads: int | None = None
    """Attention heads; must divide ``dim``."""
    mlp_ratio: int | None = None
    """MLP hidden width = mlp_ratio * dim."""
    patch: int = 16
    """Patch length in time frames; must divide T."""
    patch_freq: int | None = None
    """Patch height in mel bins; None: all ``n_mels``, one token per ``patch`` frames that sees the
    whole spectrum (a song is a sequence of spectra; 16 gives the square patches of image ViTs)."""
    n_frames: int = 512
    """T, the number of spectrogram frames the position embedding is built for."""
    n_mels: int = 128
    """M, the number of mel bins."""
    dropout: float = 0.0
    """Dropout rate after the attention output projection and after the MLP."""
    drop_path: float = 0.0
    """Stochastic-depth rate of the last block (linear from 0 at block 0)."""
    proj_hidden: int | None = None
    """Hidden width of the projector MLP."""
    proj_dim: int | None = None
    """Output width P of the projector (the space LeJEPA's losses act on)."""
    proj_layers: int = 2
    """Number of hidden (Dense -> norm -> GELU) layers of the projector before its output Dense."""
    proj_norm: Literal["layer", "batch"] = "layer"
    """Norm of the projector's hidden layers: layer (per sample) or batch (per feature over the batch,
    from the batch's own statistics: the projector only serves the training loss, so no running
    averages are kept)."""
    n_classes: int = 10
    """Classes of the online linear probe (the trainer sets it from the dataset vocabulary)."""
    input_norm: Literal["none", "clip", "floor"] = "floor"
    """Per-spectrogram normalisation before patching. clip: standardise by its own mean and std
    (level-invariant); floor: subtract each mel bin's noise floor (see ``noise_floor``), then
    standardise (removes level, microphone response and stationary noise colour)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype of the encoder, projector and predictor (matmuls, attention, activations).
    Parameters, gradients and the optimizer state stay float32 (master weights), and the model's
    outputs are cast to float32 before any loss, so bfloat16 changes the arithmetic, not the state.
    It is for accelerators: on every CPU measured, one with a bfloat16 matrix unit (AMX) among them,
    the small and base steps are 1.1-1.6x as long in bfloat16 (docs/benchmarks.md, bench_step.py)."""
    ln_epsilon: float = 1e-6
    """Epsilon of every LayerNorm (flax's default; PyTorch's is 1e-5: set it to match a reference)."""
    predictor_depth: int = 0
    """Transformer blocks of the masked-span predictor (0 = no predictor): from the tokens of a view
    whose time spans were replaced by a learned mask token, it predicts the encoder's tokens of the
    whole view at those spans (the JEPA term, see ``objectives.span_loss``)."""

    rope: bool = False
    """2-D rotary position embeddings in every attention, in place of the learned position embedding:
    half of each head's channels rotate with the patch's time index, half with its frequency index
    (the axial form of Heo et al. 2024; the head width must be a multiple of 4)."""
    qk_norm: bool = False
    """LayerNorm of each head's queries and keys before attention (bounds the attention logits;
    Dehghani et al. 2023, ViT-22B)."""
    swiglu: bool = False
    """SwiGLU MLP, ``(silu(x W_gate) * x W_fc1) W_fc2``, hidden width 2/3 of ``mlp_ratio * dim`` (the
    parameter count of the GELU MLP; Shazeer 2020)."""
    layer_scale: float = 0.0
    """LayerScale: a learned per-channel scale on each residual branch, initialised to this value
    (0 = off; Touvron et al. 2021 use 1e-5 to 0.1)."""
    registers: int = 0
    """Learned register tokens appended to the patch tokens (Darcet et al. 2024): attention may park
    global information there. They leave the embedding and the returned tokens."""
    remat: bool = False
    """The transformer blocks in ``lax.scan``s (the encoder's, the predictor's and an objective's
    decoder's, each in its own), each recomputed in the backward pass instead of keeping its
    activations (gradient checkpointing): a step holds each block's input and one block's
    activations, not every block's, for one more forward pass of the blocks. The same parameters
    (the scan stacks them for the step); the step's last bits differ, and `birdjepa trace` records
    the blocks' input and output, not the modules inside them. Recomputing unrolled blocks saves
    nothing on XLA: the scan keeps the memory apart (``docs/issues/007-step-limit``)."""

    def resolved(self) -> ModelConfig:
        """This config with the preset's value in every field left at None (what the model is built from)."""
        filled = {k: v for k, v in PRESETS[self.preset].items() if getattr(self, k) is None}
        return dataclasses.replace(self, **filled) if filled else self

    @property
    def grid(self) -> tuple[int, int]:
        """Patch grid (time, mel)."""
        return self.n_frames // self.patch, self.n_mels // self.patch_mels

    @property
    def patch_mels(self) -> int:
        return self.n_mels if self.patch_freq is None else self.patch_freq

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The named preset ("tiny", "small", "base"), with optional field overrides, resolved."""
    return ModelConfig(preset=name, **overrides).resolved()
