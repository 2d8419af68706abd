"""Masked autoencoder (He et al. 2022; on spectrograms Audio-MAE and Bird-MAE): the encoder sees a
quarter of each view's patches, a light decoder predicts the values of the rest.

For each view, `patch_masks` hides ``round(mask_ratio * N)`` of its N patches (the same count in
every view, so every shape is static): patches one by one (``random``), or together in time spans,
frequency bands or time-frequency blocks, as Bird-MAE and Audio-MAE compare. The draw comes from the
step's key (``fold_in(key, 5)``), so a resumed step hides what it hid before. The encoder embeds the
visible patches only, with their position embeddings (`birdjepa.model.vit.Encoder`'s ``keep``): at
ratio 0.75 its blocks cost a quarter of a full pass. The decoder (`birdjepa.model.vit.Decoder`) puts a
mask token at every hidden patch and predicts every patch's values; the loss is the mean squared
error over the hidden patches only::

    loss = 1 / (B V H P) * sum over views, hidden patches h and values p of (pred[h, p] - target[h, p])²

with H hidden patches of P values each. The targets are the patches the encoder is given (after the
input normalisation), each standardised over its own values with ``norm_pix`` (the default; He et
al. found it gives better features). The online probe reads the mean of the visible tokens (the
embedding a masked pass gives); the periodic evaluation embeds whole views, as for every objective.

Every term is a mean over a static count, so with virtual shards a shard's part is its sum over the
batch's count: no statistics, no second pass of anything.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from birdjepa.objectives.base import Model, Tensors, in_order
from birdjepa.objectives.options import MaeConfig

Array = jax.Array

_MASK_KEY = 5  # folded into the step's key (2, 3, 4: augmentation, local crops, span masks)


def block_shape(options: MaeConfig, grid: tuple[int, int]) -> tuple[int, int]:
    """(time, frequency) patches of a block hidden together."""
    n_time, n_freq = grid
    return {
        "random": (1, 1),
        "time": (options.block_time, n_freq),
        "freq": (n_time, options.block_freq),
        "block": (options.block_time, options.block_freq),
    }[options.masking]


def patch_masks(
    key: Array, lead: tuple[int, ...], grid: tuple[int, int], block: tuple[int, int], hidden: int
) -> tuple[Array, Array]:
    """``(keep [*lead, N - hidden], mask [*lead, N])``: the visible patch indices (ascending) and the
    hidden patches (True) of a time-major patch grid ``(n_time, n_freq)``, ``hidden`` of them in each
    sample. Whole blocks of ``block`` patches are hidden in a random order of blocks; the patches of
    the last block reached, where ``hidden`` is no multiple of a block, in a random order."""
    n_time, n_freq = grid
    bt, bf = block
    block_key, patch_key = jax.random.split(key)
    scores = jax.random.uniform(block_key, (*lead, (n_time // bt) * (n_freq // bf)))
    block_rank = jnp.argsort(jnp.argsort(scores, axis=-1), axis=-1).astype(jnp.float32)
    block_rank = block_rank.reshape(*lead, n_time // bt, 1, n_freq // bf, 1)
    per_patch = jnp.broadcast_to(block_rank, (*lead, n_time // bt, bt, n_freq // bf, bf))
    per_patch = per_patch.reshape(*lead, n_time * n_freq)
    # The block's place first, then the patch's within it (a uniform draw in [0, 1) breaks no order).
    order = jnp.argsort(per_patch + jax.random.uniform(patch_key, per_patch.shape), axis=-1)
    n = n_time * n_freq
    keep = jnp.sort(order[..., : n - hidden], axis=-1)
    mask = jnp.argsort(order, axis=-1) >= n - hidden
    return keep.astype(jnp.int32), mask


def patch_errors(reconstruction: Array, patches: Array, norm_pix: bool) -> Array:
    """``[.., N]``: each patch's mean squared error against its target (standardised over its own
    values with ``norm_pix``)."""
    target = jax.lax.stop_gradient(patches.astype(jnp.float32))
    if norm_pix:
        mean = target.mean(axis=-1, keepdims=True)
        target = (target - mean) / jnp.sqrt(target.var(axis=-1, keepdims=True) + 1e-6)
    return jnp.square(reconstruction.astype(jnp.float32) - target).mean(axis=-1)


class Mae:
    """`birdjepa.objectives.base.Objective`: masked patch reconstruction of every view."""

    def __init__(self, options: MaeConfig, model_cfg: Any) -> None:
        self.o, self.grid = options, model_cfg.grid
        n = model_cfg.n_patches
        self.hidden = round(options.mask_ratio * n)
        self.block = block_shape(options, self.grid)

    def forward(self, model: Model, views: Array, batch: dict[str, Array]) -> Tensors:
        mask_key = model.draw("mask", _MASK_KEY)
        keep, mask = patch_masks(mask_key, views.shape[:2], self.grid, self.block, self.hidden)
        model.note("draws/patch_mask", mask)
        out = model.apply("global", views, model.dropout, keep=keep)
        tensors = {k: out[k] for k in ("embedding", "probe_logits", "reconstruction", "patches")}
        return {**tensors, "mask": mask}

    def _sum(self, out: Tensors) -> Array:
        errors = patch_errors(out["reconstruction"], out["patches"], self.o.norm_pix)
        return jnp.sum(jnp.where(out["mask"], errors, 0.0))

    def terms(self, out: Tensors, batch: dict[str, Array]) -> Tensors:
        b, v = out["mask"].shape[:2]
        mse = self._sum(out) / (b * v * self.hidden)
        return {"loss": mse, "mse": mse}

    def statistics(self, out: Tensors, batch: dict[str, Array]) -> Tensors:
        return {}

    def totals(self, sums: Tensors) -> Tensors:
        return {}

    def parts(self, out: Tensors, batch: dict[str, Array], totals: Tensors, batch_size: int) -> Tensors:
        mse = self._sum(out) / (batch_size * out["mask"].shape[1] * self.hidden)
        return {"loss": mse, "mse": mse}

    def combine(self, parts: Tensors, totals: Tensors) -> Tensors:
        mse = in_order(parts["mse"])
        return {"loss": mse, "mse": mse}
