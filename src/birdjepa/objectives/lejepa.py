"""LeJEPA (Balestriero & LeCun, 2025): invariance between views plus SIGReg on their projections.

Input: projections ``z`` of shape ``[B, V, P]`` (V views of each of B samples; the model flattens the views
into the batch to encode them and hands them back as ``[B, V, P]``).

*Invariance* (the JEPA prediction term, views predict their mean)::

    invariance = 1/(B V P) * sum_{b, v} || z[b, v] - mean_v' z[b, v'] ||²

i.e. the squared distance to the per-sample view centre, averaged over samples, views **and dimensions**
(``mean((z - z.mean(1))**2)``), so its scale does not depend on P.

*SIGReg*: the ``N = B*V`` projections should be distributed as N(0, I_P) (`birdjepa.objectives.sigreg`).

*Total*::

    loss = (1 - λ) * invariance + λ * SIGReg,     λ = 0.05 by default

λ = 0.05 is the paper's recommended default: SIGReg is O(1) at its optimum but O(N) when the embedding
collapses, so a small weight suffices to prevent collapse while letting the invariance term dominate what
the features encode; the paper reports performance is stable over a wide range of small λ.

Multi-crop (``local_views``) adds short views cut from the global ones, encoded apart; the
masked-span term (``span_weight``) adds `birdjepa.objectives.span`'s JEPA term.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from birdjepa.objectives.base import Model, Tensors, in_order
from birdjepa.objectives.mae import patch_errors
from birdjepa.objectives.options import (
    DEFAULT_LAMBDA,
    DEFAULT_NUM_DIRECTIONS,
    DEFAULT_NUM_KNOTS,
    DEFAULT_T_MAX,
    LeJepaConfig,
)
from birdjepa.objectives.sigreg import sigreg, sigreg_directions, sigreg_from_sums, sigreg_partial_sums
from birdjepa.objectives.span import span_errors, span_loss, span_mask

Array = jax.Array

_LOCAL_KEY, _SPAN_KEY = 3, 4  # folded into the step's key (2 is the augmentation's)


def invariance_loss(z: Array, n_global: int | None = None) -> Array:
    """``mean_{b, v, p} (z[b, v, p] - c[b, p])²`` for ``z [B, V, P]``, where the centre ``c`` is the
    mean of the first ``n_global`` views (default: all). With local views (multi-crop) only the
    global views make the centre, and every view is pulled to it."""
    if z.ndim != 3:
        raise ValueError(f"invariance expects z of shape [B, V, P], got {z.shape}")
    return jnp.mean(invariance_residuals(z, n_global))


def invariance_residuals(z: Array, n_global: int | None = None) -> Array:
    """``(z[b, v, p] - c[b, p])²``, what `invariance_loss` averages (per sample: it adds up over the
    parts of a batch)."""
    z = z.astype(jnp.float32)
    # Centre computed relative to view 0 (same value mathematically): exactly 0 when all views are equal.
    rel = z - z[:, :1]
    return jnp.square(rel - rel[:, :n_global].mean(axis=1, keepdims=True))


def lejepa_loss(
    z: Array,
    key: Array,
    *,
    lam: float = DEFAULT_LAMBDA,
    num_directions: int = DEFAULT_NUM_DIRECTIONS,
    num_knots: int = DEFAULT_NUM_KNOTS,
    t_max: float = DEFAULT_T_MAX,
    sigreg_per_view: bool = False,
    n_global: int | None = None,
) -> dict[str, Array]:
    """LeJEPA on projections ``z [B, V, P]`` -> ``{"loss", "invariance", "sigreg"}`` (scalars), with
    ``loss = (1 - lam) * invariance + lam * sigreg``; ``key`` draws the SIGReg directions; the first
    ``n_global`` views (default: all) make the invariance centre."""
    inv = invariance_loss(z, n_global)
    reg = sigreg(
        z, key, num_directions=num_directions, num_knots=num_knots, t_max=t_max, per_view=sigreg_per_view
    )
    return {"loss": (1.0 - lam) * inv + lam * reg, "invariance": inv, "sigreg": reg}


def local_crops(x: Array, key: Array, count: int, frames: int) -> Array:
    """``count`` local views per sample: windows of ``frames`` frames, each from a random one of the
    sample's views at a random start (``x`` ``[B, V, T, M]`` -> ``[B, count, frames, M]``)."""
    b, v, t, m = x.shape
    if not 0 < frames <= t:
        raise ValueError(f"local crops of {frames} frames from views of {t}")
    k_view, k_start = jax.random.split(key)
    source = jax.random.randint(k_view, (b, count), 0, v)
    start = jax.random.randint(k_start, (b, count), 0, t - frames + 1)

    def crop(sample: Array, view: Array, s: Array) -> Array:  # [V, T, M], scalars -> [frames, M]
        return jax.lax.dynamic_slice(sample[view], (s, 0), (frames, m))

    return jax.vmap(jax.vmap(crop, in_axes=(None, 0, 0)))(x, source, start)


class LeJepa:
    """`birdjepa.objectives.base.Objective`: LeJEPA on the projections of every view."""

    def __init__(self, options: LeJepaConfig, model_cfg: Any) -> None:
        self.o, self.grid = options, model_cfg.grid

    def forward(self, model: Model, views: Array, batch: dict[str, Array]) -> Tensors:
        o = self.o
        # With the patch term, the global views' tokens are also read back to their own patches.
        out = model.apply("global", views, model.dropout, readout=bool(o.patch_weight))
        z = out["projection"]
        if o.local_views:  # multi-crop: short views cut from the global ones, encoded apart
            local_key = model.draw("local", _LOCAL_KEY)
            local = local_crops(views, local_key, o.local_views, o.local_frames)
            model.note("draws/local_views", local)
            local_out = model.apply("local", local, jax.random.fold_in(local_key, 1))
            z = jnp.concatenate([z, local_out["projection"]], axis=1)
        if model.recording:
            model.note("keys/sigreg", jax.random.key_data(model.shared_key))
            model.note(
                "draws/sigreg_directions", sigreg_directions(model.shared_key, z.shape[-1], o.num_directions)
            )
        keep = ("embedding", "projection", "probe_logits")
        tensors = {**{k: out[k] for k in keep}, "z": z, "sigreg_key": model.shared_key}
        if o.span_weight:  # JEPA: a masked copy of the views predicts their tokens at the hidden spans
            span_key = model.draw("span", _SPAN_KEY)
            mask = span_mask(span_key, views.shape[:2], self.grid, o.span_tokens, o.span_ratio)
            model.note("draws/span_mask", mask)
            masked = model.apply("masked", views, jax.random.fold_in(span_key, 1), mask=mask)
            target = jax.lax.stop_gradient(out["tokens"])
            tensors.update(prediction=masked["prediction"], target=target, mask=mask)
        if o.patch_weight:
            tensors.update(reconstruction=out["reconstruction"], patches=out["patches"])
        return tensors

    def terms(self, out: Tensors, batch: dict[str, Array]) -> Tensors:
        o = self.o
        n_global = out["embedding"].shape[1]  # the global views: the local ones follow them in z
        obj = lejepa_loss(
            out["z"], out["sigreg_key"], lam=o.lam, num_directions=o.num_directions, num_knots=o.num_knots,
            t_max=o.t_max, sigreg_per_view=o.sigreg_per_view, n_global=n_global,
        )  # fmt: skip
        if o.span_weight:
            span = span_loss(out["prediction"], out["target"], out["mask"])
            obj = {**obj, "loss": obj["loss"] + o.span_weight * span, "span": span}
        if o.patch_weight:
            patch = jnp.mean(patch_errors(out["reconstruction"], out["patches"], norm_pix=True))
            obj = {**obj, "loss": obj["loss"] + o.patch_weight * patch, "patch": patch}
        return obj

    def _sums(self, out: Tensors) -> Array:
        o = self.o
        return sigreg_partial_sums(
            out["z"], out["sigreg_key"], num_directions=o.num_directions, num_knots=o.num_knots,
            t_max=o.t_max, per_view=o.sigreg_per_view,
        )  # fmt: skip

    def statistics(self, out: Tensors, batch: dict[str, Array]) -> Tensors:
        z = out["z"]
        samples = z.shape[0] if self.o.sigreg_per_view else z.shape[0] * z.shape[1]
        stats = {"ecf": self._sums(out), "ecf_samples": jnp.float32(samples)}
        if self.o.span_weight:
            stats["span_count"] = jnp.sum(out["mask"]).astype(jnp.float32)
        return stats

    def totals(self, sums: Tensors) -> Tensors:
        """SIGReg of the batch and its gradient with respect to the batch's sums."""
        o, sums = self.o, dict(sums)
        n = sums.pop("ecf_samples")
        reg = lambda s: sigreg_from_sums(s, n, num_knots=o.num_knots, t_max=o.t_max)  # noqa: E731
        sums["sigreg"], sums["sigreg_grad"] = jax.value_and_grad(reg)(sums.pop("ecf"))
        return sums

    def parts(self, out: Tensors, batch: dict[str, Array], totals: Tensors, batch_size: int) -> Tensors:
        o, z = self.o, out["z"]
        n_global = out["embedding"].shape[1]
        inv = jnp.sum(invariance_residuals(z, n_global)) / (batch_size * z.shape[1] * z.shape[2])
        surrogate = jnp.sum(totals["sigreg_grad"] * self._sums(out))  # its gradient: the shard's share
        parts = {"loss": (1.0 - o.lam) * inv + o.lam * surrogate, "invariance": inv}
        if o.span_weight:
            count = jnp.maximum(totals["span_count"], 1.0)
            span = jnp.sum(span_errors(out["prediction"], out["target"]) * out["mask"]) / count
            parts = {**parts, "loss": parts["loss"] + o.span_weight * span, "span": span}
        if o.patch_weight:
            errors = patch_errors(out["reconstruction"], out["patches"], norm_pix=True)
            patch = jnp.sum(errors) / (batch_size * errors.shape[1] * errors.shape[2])
            parts = {**parts, "loss": parts["loss"] + o.patch_weight * patch, "patch": patch}
        return parts

    def combine(self, parts: Tensors, totals: Tensors) -> Tensors:
        o = self.o
        inv, reg = in_order(parts["invariance"]), totals["sigreg"]
        obj = {"loss": (1.0 - o.lam) * inv + o.lam * reg, "invariance": inv, "sigreg": reg}
        if o.span_weight:
            span = in_order(parts["span"])
            obj = {**obj, "loss": obj["loss"] + o.span_weight * span, "span": span}
        if o.patch_weight:
            patch = in_order(parts["patch"])
            obj = {**obj, "loss": obj["loss"] + o.patch_weight * patch, "patch": patch}
        return obj
