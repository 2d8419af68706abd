"""ViT encoder over log-mel spectrograms, the LeJEPA projector and the online linear probe (flax.linen).

Input: log-mel spectrograms float32 ``[B, T, M]`` (time-major; the default input is T=512 frames x M=128 mel
bins), or ``[B, V, T, M]`` for V views per sample. ``input_norm`` first normalises each spectrogram
(default ``floor``: each mel bin's noise floor subtracted, then standardised, so level, microphone
colour and stationary background do not reach the encoder). It is cut into non-overlapping patches
of ``patch`` frames by ``patch_freq`` mel bins (default 16 frames x all 128 bins: one token per 160 ms,
32 tokens, ordered time-major: patch index ``i_t * (M // patch_freq) + i_m``), each flattened patch is
embedded by one linear layer, a **learned** position embedding (one vector per patch, shape
``[1, n_patches, dim]``, init N(0, 0.02²)) is added, and ``depth`` pre-LN transformer blocks follow::

    x = x + drop_path(dropout(attn(LN(x))))        # multi-head self-attention, no attention dropout
    x = x + drop_path(dropout(mlp(LN(x))))         # Dense(mlp_ratio*dim) -> GELU -> Dense(dim)

then a final LayerNorm; ``embedding`` is the mean over patch tokens (after that LayerNorm). Learned position
embeddings were chosen over fixed 2-D sin-cos because the input grid is fixed (T and M never change within a
run) and they are what the AudioMAE/BirdMAE line of spectrogram ViTs use; the input size is checked at call
time, so a wrong T or M fails loudly instead of silently misaligning positions. A shorter T (a local
crop, a multiple of ``patch``) takes the first positions. Frame tokens over square patches: on the
demo set, whose species differ in temporal pattern, square patches left even a supervised run at
chance (``docs/issues/002-pretraining-learns``).

Multi-view input: ``BirdJepa.__call__`` accepts ``[B, V, T, M]`` and flattens the views into the batch
(``[B*V, T, M]``, view index fastest) before the encoder, then reshapes every output back to ``[B, V, ...]``.
So views are encoded independently (own dropout masks, no cross-view attention); the objectives receive
``projection`` as ``[B, V, P]``. ``encode_views`` is the same thing as a function of (params, apply_fn).

Randomness: only dropout and drop-path are random, and only when ``deterministic=False``; they draw from the
flax RNG stream ``"dropout"`` (``apply(..., rngs={"dropout": key})``). With ``deterministic=True`` no RNG is
needed and a passed key is ignored. Drop-path rates grow linearly over depth, from 0 at block 0 to
``drop_path`` at the last block (the DeiT/BEiT rule).

Recomputed blocks (``remat``): the encoder's blocks run in one ``lax.scan``, the predictor's and the
decoder's each in another, each block recomputed in the backward pass (`RecomputedBlocks`, through
`run_blocks`), from the same per-block parameters: a step keeps each block's input, not its
activations. The same function to float32's last bits, not the same bits.

Parameter names (stable, with ``remat`` too; the monitor reports stats by these '/'-joined paths)::

    encoder/patch_embed/{kernel,bias}        encoder/pos_embed
    encoder/block_{i}/norm1/{scale,bias}     encoder/block_{i}/attn/qkv/{kernel,bias}
    encoder/block_{i}/attn/proj/{kernel,bias}
    encoder/block_{i}/norm2/{scale,bias}     encoder/block_{i}/mlp/fc1/...  encoder/block_{i}/mlp/fc2/...
    encoder/norm/{scale,bias}
    projector/dense_{j}/...  projector/norm_{j}/...  projector/out/...
    probe/head/{kernel,bias}
    encoder/mask_token  predictor/block_{i}/...  predictor/norm/...  predictor/out/...  (predictor_depth > 0)
    decoder/embed/...  decoder/mask_token  decoder/pos_embed  decoder/block_{i}/...  decoder/out/...  (MAE)

``param_groups`` splits a params tree into the "encoder", "projector" and "probe" groups (and
"predictor", when there is one).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from birdjepa.model.config import GROUPS, OPTIONAL_GROUPS, DecoderConfig, ModelConfig
from birdjepa.model.noise_floor import noise_floor

Array = jax.Array
PyTree = Any


def patchify(x: Array, patch: int, q: int) -> Array:
    """``[B, T, M]`` -> ``[B, (T/p)*(M/q), p*q]`` (``p = patch`` frames by ``q`` mel bins):
    non-overlapping patches, time-major patch order; inside a patch the values are ordered (frame, mel)."""
    b, t, m = x.shape
    x = x.reshape(b, t // patch, patch, m // q, q)
    x = x.transpose(0, 1, 3, 2, 4)
    return x.reshape(b, (t // patch) * (m // q), patch * q)


def normalised_input(cfg: ModelConfig, x: Array) -> Array:
    """``x [B, T, M]`` as the encoder receives it: float32, normalised as ``cfg.input_norm`` says (also
    the benchmark's ``raw:input`` baseline)."""
    x = x.astype(jnp.float32)
    if cfg.input_norm == "floor":  # log domain: a channel's gain per bin is an offset per bin
        x = x - noise_floor(x)
    if cfg.input_norm in ("clip", "floor"):
        mean = x.mean(axis=(1, 2), keepdims=True)
        x = (x - mean) / jnp.sqrt(jnp.square(x - mean).mean(axis=(1, 2), keepdims=True) + 1e-6)
    return x


def input_patches(cfg: ModelConfig, x: Array) -> Array:
    """What the encoder embeds: `normalised_input` cut into patches ``[B, N, patch * patch_mels]``
    (`patchify`; also the MAE objective's targets)."""
    return patchify(normalised_input(cfg, x), cfg.patch, cfg.patch_mels)


def compute_dtype(cfg: ModelConfig) -> Any:
    """The dtype the model computes in (``cfg.dtype``); parameters are float32 either way."""
    return jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32


class DropPath(nn.Module):
    """Stochastic depth: zero a residual branch per sample with probability ``rate``, scale by 1/(1-rate)
    (an array in scanned blocks: each block's own rate)."""

    rate: float | Array

    @nn.compact
    def __call__(self, x: Array, deterministic: bool) -> Array:
        if deterministic or (not isinstance(self.rate, jax.Array) and self.rate == 0.0):
            return x
        keep = 1.0 - self.rate
        mask = jax.random.bernoulli(self.make_rng("dropout"), keep, (x.shape[0],) + (1,) * (x.ndim - 1))
        # In x's dtype: a scanned block's float32 rate made bfloat16 activations float32, and the scan's
        # carry then changed type (a traceback). A Python float's weak type gave the same division.
        return jnp.where(mask, x / jnp.asarray(keep, x.dtype), jnp.zeros_like(x))


def rope_angles(positions: Array, head_dim: int) -> Array:
    """``[.., N, head_dim / 2]`` rotation angles of tokens at ``positions [.., N, 2]`` (time, frequency
    index): the first half of the pairs turns with time, the second with frequency, each at the
    frequencies ``10000^(-i / (head_dim / 4))``."""
    quarter = head_dim // 4
    freqs = 10000.0 ** (-jnp.arange(quarter, dtype=jnp.float32) / quarter)
    return jnp.concatenate([positions[..., :1] * freqs, positions[..., 1:] * freqs], axis=-1)


def rotate(x: Array, angles: Array) -> Array:
    """``x [B, N, H, Dh]`` with channel pairs ``(c, c + Dh/2)`` turned by ``angles [B, N, Dh/2]``."""
    cos, sin = jnp.cos(angles)[:, :, None].astype(x.dtype), jnp.sin(angles)[:, :, None].astype(x.dtype)
    a, b = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)


def token_angles(cfg: ModelConfig, index: Array, registers: int = 0) -> Array:
    """The rotary angles of patch tokens ``index [B, N]`` (time-major patch indices), then of
    ``registers`` tokens that turn by nothing."""
    n_freq = cfg.grid[1]
    positions = jnp.stack([index // n_freq, index % n_freq], axis=-1).astype(jnp.float32)
    positions = jnp.pad(positions, ((0, 0), (0, registers), (0, 0)))
    return rope_angles(positions, cfg.dim // cfg.heads)


class Attention(nn.Module):
    """Multi-head self-attention: one fused ``qkv`` Dense, scaled dot-product attention, ``proj`` Dense
    (with ``qk_norm``: a LayerNorm of each head's queries and keys; with ``angles``: rotary embeddings)."""

    dim: int
    heads: int
    dtype: Any = jnp.float32
    qk_norm: bool = False
    ln_epsilon: float = 1e-6

    @nn.compact
    def __call__(self, x: Array, angles: Array | None = None) -> Array:
        b, n, _ = x.shape
        head_dim = self.dim // self.heads
        dense = dict(
            kernel_init=nn.initializers.xavier_uniform(), bias_init=nn.initializers.zeros, dtype=self.dtype
        )
        qkv = nn.Dense(3 * self.dim, name="qkv", **dense)(x).reshape(b, n, 3, self.heads, head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if self.qk_norm:
            q = nn.LayerNorm(self.ln_epsilon, name="q_norm", dtype=self.dtype)(q)
            k = nn.LayerNorm(self.ln_epsilon, name="k_norm", dtype=self.dtype)(k)
        if angles is not None:
            q, k = rotate(q, angles), rotate(k, angles)
        out = jax.nn.dot_product_attention(q, k, v)  # [B, N, H, Dh], scale 1/sqrt(Dh)
        return nn.Dense(self.dim, name="proj", **dense)(out.reshape(b, n, self.dim))


class Mlp(nn.Module):
    """``fc1 -> GELU -> fc2``; ``swiglu``: ``(silu(gate(x)) * fc1(x)) -> fc2`` at 2/3 of the hidden width."""

    hidden: int
    dim: int
    dtype: Any = jnp.float32
    swiglu: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        dense = dict(
            kernel_init=nn.initializers.xavier_uniform(), bias_init=nn.initializers.zeros, dtype=self.dtype
        )
        if self.swiglu:
            hidden = 2 * self.hidden // 3
            x = nn.silu(nn.Dense(hidden, name="gate", **dense)(x)) * nn.Dense(hidden, name="fc1", **dense)(x)
        else:
            x = nn.gelu(nn.Dense(self.hidden, name="fc1", **dense)(x))
        return nn.Dense(self.dim, name="fc2", **dense)(x)


class LayerScale(nn.Module):
    """A learned per-channel scale, initialised to ``init`` (Touvron et al. 2021)."""

    init: float

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = self.param("scale", nn.initializers.constant(self.init), (x.shape[-1],))
        return x * scale.astype(x.dtype)


class Block(nn.Module):
    """Pre-LN transformer block."""

    cfg: ModelConfig
    drop_path: float | Array

    @nn.compact
    def __call__(self, x: Array, deterministic: bool, angles: Array | None = None) -> Array:
        """``angles``: the tokens' rotary angles (`rope_angles`; with ``rope``)."""
        cfg = self.cfg.resolved()
        dt = compute_dtype(cfg)
        drop = DropPath(self.drop_path)
        h = Attention(cfg.dim, cfg.heads, dt, cfg.qk_norm, cfg.ln_epsilon, name="attn")(
            nn.LayerNorm(cfg.ln_epsilon, name="norm1", dtype=dt)(x), angles
        )
        if cfg.layer_scale:
            h = LayerScale(cfg.layer_scale, name="scale1")(h)
        x = x + drop(nn.Dropout(cfg.dropout)(h, deterministic=deterministic), deterministic)
        h = Mlp(cfg.mlp_ratio * cfg.dim, cfg.dim, dt, cfg.swiglu, name="mlp")(
            nn.LayerNorm(cfg.ln_epsilon, name="norm2", dtype=dt)(x)
        )
        if cfg.layer_scale:
            h = LayerScale(cfg.layer_scale, name="scale2")(h)
        return x + drop(nn.Dropout(cfg.dropout)(h, deterministic=deterministic), deterministic)


def drop_path_rates(cfg: ModelConfig) -> list[float]:
    """Each encoder block's drop-path rate: linear from 0 at block 0 to ``drop_path`` at the last."""
    return [cfg.drop_path * i / max(cfg.depth - 1, 1) for i in range(cfg.depth)]


class RecomputedBlocks(nn.Module):
    """``remat``: transformer blocks in one ``lax.scan``, each recomputed in the backward pass
    (``jax.checkpoint``), from ``blocks``, the parameters of ``block_0 ... block_{n-1}`` as their module
    holds them (stacked here, for the step: the checkpoint's layout is the unrolled one), block ``i``
    with drop-path rate ``rates[i]``. Each block draws its dropout from a key of its own, split from
    this module's."""

    cfg: ModelConfig
    deterministic: bool
    blocks: tuple[Any, ...]
    rates: tuple[float, ...]
    #: `birdjepa.train.calls` records this module's input and output, not the calls inside it: those
    #: would be kept for every block, which is what the scan is there to avoid.
    record_inside: ClassVar[bool] = False

    @nn.compact
    def __call__(self, x: Array, angles: Array | None) -> Array:
        cfg, depth = self.cfg, len(self.blocks)
        rates = jnp.asarray(self.rates, jnp.float32)
        stochastic = not self.deterministic and (cfg.dropout or cfg.drop_path)
        keys = jax.random.split(self.make_rng("dropout"), depth) if stochastic else jnp.zeros(depth)

        @jax.checkpoint
        def block(x: Array, params: Any, rate: Array, key: Array) -> Array:
            rngs = {"dropout": key} if stochastic else {}
            module = Block(cfg, rate if cfg.drop_path else 0.0)
            return module.apply({"params": params}, x, self.deterministic, angles, rngs=rngs)

        stacked = jax.tree.map(lambda *a: jnp.stack(a), *self.blocks)
        x, _ = jax.lax.scan(lambda x, xs: (block(x, *xs), None), x, (stacked, rates, keys))
        return x


def run_blocks(
    parent: nn.Module,
    cfg: ModelConfig,
    x: Array,
    deterministic: bool,
    angles: Array | None,
    rates: Sequence[float],
) -> Array:
    """``parent``'s transformer blocks ``block_0 ... block_{n-1}`` (block ``i`` at drop-path rate
    ``rates[i]``) over ``x``, called from inside its ``nn.compact`` method: one after another, or with
    ``cfg.remat`` in `RecomputedBlocks` from the same parameters (initialised unrolled, so the two
    share their names)."""
    if cfg.remat and not parent.is_initializing():
        params = tuple(parent.variables["params"][f"block_{i}"] for i in range(len(rates)))
        return RecomputedBlocks(cfg, deterministic, params, tuple(rates), name="blocks")(x, angles)
    for i, rate in enumerate(rates):
        x = Block(cfg, rate, name=f"block_{i}")(x, deterministic, angles)
    return x


class Encoder(nn.Module):
    """ViT over ``[B, T, M]`` spectrograms -> ``(embedding [B, D], tokens [B, N, D])``."""

    cfg: ModelConfig

    @nn.compact
    def __call__(
        self, x: Array, *, deterministic: bool, mask: Array | None = None, keep: Array | None = None
    ) -> tuple[Array, Array]:
        """``mask [B, N]`` (True = hidden): those patch tokens are replaced by the learned mask token
        before the position embedding (the masked-span predictor's context). ``keep [B, K]`` (patch
        indices): only those tokens, with their positions, enter the blocks (MAE's visible patches;
        the embedding is their mean)."""
        cfg = self.cfg.resolved()
        t = x.shape[1] if x.ndim == 3 else -1
        if x.ndim != 3 or x.shape[2] != cfg.n_mels or not 0 < t <= cfg.n_frames or t % cfg.patch:
            raise ValueError(
                f"encoder expects [B, T, M={cfg.n_mels}] spectrograms with T={cfg.n_frames} (or a shorter "
                f"local crop, a multiple of patch={cfg.patch}), got shape {x.shape}"
            )
        dt = compute_dtype(cfg)
        tokens = nn.Dense(
            cfg.dim,
            name="patch_embed",
            kernel_init=nn.initializers.xavier_uniform(),
            bias_init=nn.initializers.zeros,
            dtype=dt,
        )(input_patches(cfg, x))
        if cfg.predictor_depth:
            mask_token = self.param("mask_token", nn.initializers.normal(0.02), (cfg.dim,))
            if mask is not None:
                tokens = jnp.where(mask[..., None], mask_token, tokens)
        # Patches are time-major: a crop of T frames takes the positions of the first T / patch rows.
        index = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape[:2])
        if not cfg.rope:
            pos = self.param("pos_embed", nn.initializers.normal(0.02), (1, cfg.n_patches, cfg.dim))
            tokens = tokens + pos[:, : tokens.shape[1]].astype(dt)
        if keep is not None:
            tokens, index = jnp.take_along_axis(tokens, keep[..., None], axis=1), keep
        n = tokens.shape[1]
        if cfg.registers:
            registers = self.param("registers", nn.initializers.normal(0.02), (cfg.registers, cfg.dim))
            tokens = jnp.concatenate(
                [tokens, jnp.broadcast_to(registers.astype(tokens.dtype), (len(tokens), *registers.shape))], 1
            )
        angles = token_angles(cfg, index, cfg.registers) if cfg.rope else None
        tokens = run_blocks(self, cfg, tokens, deterministic, angles, drop_path_rates(cfg))
        tokens = nn.LayerNorm(cfg.ln_epsilon, name="norm", dtype=dt)(tokens)[:, :n]  # registers leave
        return tokens.mean(axis=1), tokens


class BatchStandardize(nn.Module):
    """BatchNorm from the batch's own statistics (no running averages): each feature centred and scaled
    over the batch axis, then a learned scale and bias. Under a batch-sharded ``jit`` the statistics are
    of the global batch."""

    epsilon: float = 1e-5

    @nn.compact
    def __call__(self, x: Array) -> Array:
        mean = x.mean(axis=0, keepdims=True)
        var = jnp.square(x - mean).mean(axis=0, keepdims=True)
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        bias = self.param("bias", nn.initializers.zeros, (x.shape[-1],))
        return (x - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias


class Projector(nn.Module):
    """MLP ``dim -> hidden -> ... -> out_dim``: ``layers`` x (Dense -> norm -> GELU), then Dense."""

    hidden: int
    out_dim: int
    layers: int = 2
    norm: Literal["layer", "batch"] = "layer"
    dtype: Any = jnp.float32
    ln_epsilon: float = 1e-6

    @nn.compact
    def __call__(self, x: Array) -> Array:
        for j in range(self.layers):
            x = nn.Dense(self.hidden, name=f"dense_{j}", dtype=self.dtype)(x)
            if self.norm == "batch":  # its statistics in float32 whatever the compute dtype
                x = BatchStandardize(name=f"norm_{j}")(x.astype(jnp.float32)).astype(self.dtype)
            else:
                x = nn.LayerNorm(self.ln_epsilon, name=f"norm_{j}", dtype=self.dtype)(x)
            x = nn.gelu(x)
        return nn.Dense(self.out_dim, name="out", dtype=self.dtype)(x)


class Predictor(nn.Module):
    """Context tokens ``[B, N, D]`` -> predicted tokens ``[B, N, D]``: ``predictor_depth`` transformer
    blocks of the encoder's width, a LayerNorm and a linear read-out."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens: Array) -> Array:
        cfg = self.cfg
        dt = compute_dtype(cfg)
        every = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape[:2])
        angles = token_angles(cfg, every) if cfg.rope else None
        tokens = run_blocks(self, cfg, tokens, True, angles, [0.0] * cfg.predictor_depth)
        return nn.Dense(cfg.dim, name="out", dtype=dt)(
            nn.LayerNorm(cfg.ln_epsilon, name="norm", dtype=dt)(tokens)
        )


class Decoder(nn.Module):
    """Visible tokens ``[B, K, D]`` at patch indices ``keep [B, K]`` -> every patch's values ``[B, N,
    patch * patch_mels]``: a linear map to the decoder's width, a learned mask token at the hidden
    patches, a learned position embedding, ``depth`` transformer blocks (no dropout), a LayerNorm and
    a linear read-out (He et al.'s MAE decoder). At depth 0 every patch must be visible: a linear map
    of each token (already normed by the encoder) gives its own patch's values, and nothing else."""

    cfg: ModelConfig
    decoder: DecoderConfig

    @nn.compact
    def __call__(self, visible: Array, keep: Array) -> Array:
        cfg, dec = self.cfg, self.decoder
        dt = compute_dtype(cfg)
        if dec.depth == 0:
            if keep.shape[-1] != cfg.n_patches:
                raise ValueError(f"a read-out (decoder depth 0) needs all {cfg.n_patches} patches visible")
            return nn.Dense(cfg.patch * cfg.patch_mels, name="out", dtype=dt)(visible)
        x = nn.Dense(dec.dim, name="embed", dtype=dt)(visible)
        mask_token = self.param("mask_token", nn.initializers.normal(0.02), (dec.dim,))
        full = jnp.broadcast_to(mask_token.astype(x.dtype), (x.shape[0], cfg.n_patches, dec.dim))
        full = full.at[jnp.arange(x.shape[0])[:, None], keep].set(x)  # indices are distinct: no sums
        if not cfg.rope:  # with rope the blocks below turn the tokens by their positions instead
            full = full + self.param("pos_embed", nn.initializers.normal(0.02), (1, cfg.n_patches, dec.dim))
        narrow = dataclasses.replace(cfg, dim=dec.dim, heads=dec.heads, dropout=0.0, drop_path=0.0)
        every = jnp.broadcast_to(jnp.arange(cfg.n_patches), full.shape[:2])
        angles = token_angles(narrow, every) if cfg.rope else None
        full = run_blocks(self, narrow, full, True, angles, [0.0] * dec.depth)
        full = nn.LayerNorm(cfg.ln_epsilon, name="norm", dtype=dt)(full)
        return nn.Dense(cfg.patch * cfg.patch_mels, name="out", dtype=dt)(full)


class OnlineProbe(nn.Module):
    """The online probe: a linear classification head ``embedding -> n_classes`` trained beside the encoder
    on its stop-gradient embedding (zero-initialised: uniform logits at start)."""

    n_classes: int

    @nn.compact
    def __call__(self, x: Array) -> Array:
        return nn.Dense(self.n_classes, name="head", kernel_init=nn.initializers.zeros)(x)


class BirdJepa(nn.Module):
    """Encoder + projector + online probe.

    ``__call__(spectrogram, *, deterministic)`` with ``spectrogram`` ``[B, T, M]`` or ``[B, V, T, M]``
    returns ``{"embedding": [.., D], "tokens": [.., N, D], "projection": [.., P], "probe_logits": [.., C]}``
    where ``..`` is ``B`` or ``B, V``. The probe sees ``stop_gradient(embedding)``: its loss trains the probe
    only, never the encoder.
    """

    cfg: ModelConfig
    decoder: DecoderConfig | None = None
    """The objective's decoder (`Decoder`; None: none)."""

    @nn.compact
    def __call__(
        self,
        spectrogram: Array,
        *,
        deterministic: bool,
        mask: Array | None = None,
        keep: Array | None = None,
        readout: bool = False,
    ) -> dict[str, Array]:
        """``mask`` (``[.., N]``, True = hidden; needs ``predictor_depth > 0``) adds ``"prediction"``
        ``[.., N, D]``: the predictor's tokens from the masked view's. ``keep`` (``[.., K]`` patch
        indices; needs a decoder) encodes those patches only and adds ``"reconstruction"`` ``[.., N,
        P]``, the decoder's values of every patch, and ``"patches"``, the patches the encoder was
        given (`input_patches`). ``readout`` (needs a decoder of depth 0) adds the same with every
        patch encoded: each token's read-out of its own patch (LeJEPA's patch term)."""
        lead = spectrogram.shape[:-2]
        if len(lead) not in (1, 2):
            raise ValueError(
                f"expected [B, T, M] or [B, V, T, M] spectrograms, got shape {spectrogram.shape}"
            )
        x = spectrogram.reshape((-1,) + spectrogram.shape[-2:])
        cfg = self.cfg.resolved()
        if mask is not None and not cfg.predictor_depth:  # else the mask would be ignored silently
            raise ValueError("a mask needs a predictor (predictor_depth >= 1)")
        if keep is not None and self.decoder is None:
            raise ValueError("visible patches (keep) need a decoder")
        if readout and (self.decoder is None or self.decoder.depth):
            raise ValueError("a read-out needs a decoder of depth 0")
        flat_mask = None if mask is None else mask.reshape(-1, mask.shape[-1])
        flat_keep = None if keep is None else keep.reshape(-1, keep.shape[-1])
        embedding, tokens = Encoder(cfg, name="encoder")(
            x, deterministic=deterministic, mask=flat_mask, keep=flat_keep
        )
        dt = compute_dtype(cfg)
        projector = Projector(
            cfg.proj_hidden,
            cfg.proj_dim,
            cfg.proj_layers,
            cfg.proj_norm,
            dt,
            cfg.ln_epsilon,
            name="projector",
        )
        projection = projector(embedding)
        out = {"embedding": embedding, "tokens": tokens, "projection": projection}
        if cfg.predictor_depth and (mask is not None or self.is_initializing()):
            out["prediction"] = Predictor(cfg, name="predictor")(tokens)
        if self.decoder is not None and (keep is not None or readout or self.is_initializing()):
            every = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape[:2])  # at init: no mask
            where = every if flat_keep is None else flat_keep
            out["reconstruction"] = Decoder(cfg, self.decoder, name="decoder")(tokens, where)
            if flat_keep is not None or readout:
                out["patches"] = input_patches(cfg, x)
        # Every loss and the probe see float32, whatever the compute dtype.
        out = {k: v.astype(jnp.float32) for k, v in out.items()}
        # Named "probe" in every checkpoint's parameter tree.
        out["probe_logits"] = OnlineProbe(cfg.n_classes, name="probe")(
            jax.lax.stop_gradient(out["embedding"])
        )
        return {k: v.reshape(lead + v.shape[1:]) for k, v in out.items()}


@functools.partial(jax.jit, static_argnums=(0, 2))
def init_params(cfg: ModelConfig, key: Array, decoder: DecoderConfig | None = None) -> PyTree:
    """Initial params ``{"params": {"encoder": ..., "projector": ..., "probe": ...}}`` from ``key``
    (and ``"decoder"`` with one; traced with a batch of one zero spectrogram; no dropout key needed;
    jitted: one compile instead of dispatching every init op eagerly). Flax draws each module's
    parameters from its own path, so a decoder leaves the others' as they were."""
    x = jnp.zeros((1, cfg.n_frames, cfg.n_mels), jnp.float32)
    return BirdJepa(cfg, decoder).init({"params": key}, x, deterministic=True)


def encode_views(
    params: PyTree,
    apply_fn: Callable[..., dict[str, Array]],
    x: Array,
    *,
    deterministic: bool,
    dropout_key: Array | None = None,
) -> dict[str, Array]:
    """Encode ``[B, V, T, M]`` views: flatten to ``[B*V, T, M]``, apply, reshape outputs to ``[B, V, ...]``.

    ``apply_fn`` is ``BirdJepa(cfg).apply``; ``dropout_key`` is required when ``deterministic=False`` and the
    model has dropout or drop-path.
    """
    if x.ndim != 4:
        raise ValueError(f"encode_views expects [B, V, T, M], got shape {x.shape}")
    b, v = x.shape[:2]
    rngs = {} if dropout_key is None else {"dropout": dropout_key}
    out = apply_fn(params, x.reshape((b * v,) + x.shape[2:]), deterministic=deterministic, rngs=rngs)
    return {k: a.reshape((b, v) + a.shape[1:]) for k, a in out.items()}


def encoder_apply(cfg: ModelConfig, *, tokens: bool = False) -> Callable[[Any, jax.Array], Any]:
    """``(params, spectrogram) -> embedding``: the encoder alone of a `BirdJepa` params tree
    (``{"encoder": ..., "projector": ..., "probe": ...}``), deterministic (no dropout); with ``tokens``,
    the patch tokens ``[B, N, D]`` instead (the registers left out). Two programs, not one with both
    outputs: with the harness's XLA flags, a program that also returns the tokens fuses their mean
    otherwise, and the embedding's last bits move."""
    encoder = Encoder(cfg.resolved())

    def apply(params: Any, x: jax.Array) -> jax.Array:
        return encoder.apply({"params": params["encoder"]}, x, deterministic=True)[1 if tokens else 0]

    return apply


def _unwrap(params: PyTree) -> Mapping[str, PyTree]:
    """Accept ``{"params": {...}}`` (what ``init`` returns) or the inner dict."""
    if isinstance(params, Mapping) and set(params) == {"params"}:
        return params["params"]
    return params


def param_groups(params: PyTree) -> dict[str, PyTree]:
    """Split params into ``{"encoder": ..., "projector": ..., "probe": ...}`` (each a sub-tree).
    Raises if the tree has any other top-level entry, so every parameter belongs to exactly one group."""
    inner = _unwrap(params)
    extra = set(inner) - set(GROUPS) - set(OPTIONAL_GROUPS)
    missing = set(GROUPS) - set(inner)
    if extra or missing:
        raise ValueError(
            f"param tree top level {sorted(inner)}: unexpected {sorted(extra)}, missing {sorted(missing)}"
        )
    return {g: inner[g] for g in GROUPS + OPTIONAL_GROUPS if g in inner}


def named_params(params: PyTree) -> dict[str, Array]:
    """Flat ``{"encoder/block_0/attn/qkv/kernel": array, ...}`` in a stable (sorted-key) order."""
    flat = jax.tree_util.tree_flatten_with_path(_unwrap(params))[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): leaf for path, leaf in flat}


def param_count(params: PyTree) -> int:
    return int(sum(math.prod(a.shape) for a in jax.tree_util.tree_leaves(params)))
