"""The supervised objective (the reference ceiling) and the masked cross-entropy every probe uses.

Labels are integer class ids; a label ``< 0`` (the loader writes ``-1``) means *missing* and the sample is
ignored. Cross-entropy and accuracy are means over labelled samples; with no labelled sample both are 0
(and the gradient is 0). Logits may be ``[B, C]`` with labels ``[B]``, or ``[B, V, C]`` (one prediction per
view) with labels ``[B]`` (broadcast over views) or ``[B, V]``. A label ``>= C`` is a caller bug; it is not
checked inside jit (it contributes ``logsumexp(logits)`` to the CE and counts as wrong).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from birdjepa.objectives.base import Model, Tensors, in_order

Array = jax.Array


def _masked_ce_acc(logits: Array, labels: Array) -> tuple[Array, Array, Array]:
    """Mean CE, mean accuracy over samples with ``label >= 0``, and their count (float)."""
    ce_sum, correct, n = masked_ce_sums(logits, labels)
    denom = jnp.maximum(n, 1.0)
    return ce_sum / denom, correct / denom, n


def masked_ce_sums(logits: Array, labels: Array) -> tuple[Array, Array, Array]:
    """Summed CE, the number correct and the number of samples with ``label >= 0`` (floats): what
    `_masked_ce_acc` divides, and what adds up over the parts of a batch."""
    labels = jnp.asarray(labels)
    if logits.ndim == labels.ndim + 2:  # [B, V, C] logits with [B] labels: one label for all views
        labels = jnp.broadcast_to(labels[:, None], logits.shape[:-1])
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels of shape {labels.shape} do not match logits of shape {logits.shape}")
    logits = logits.astype(jnp.float32)
    mask = labels >= 0
    safe = jnp.where(mask, labels, 0).astype(jnp.int32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    correct = jnp.argmax(logits, axis=-1) == labels
    n = mask.sum().astype(jnp.float32)
    ce_sum = jnp.where(mask, nll, 0.0).sum()
    return ce_sum, jnp.where(mask, correct, False).sum().astype(jnp.float32), n


def supervised_loss(logits: Array, labels: Array) -> dict[str, Array]:
    """Cross-entropy of a classification head -> ``{"loss", "ce", "acc", "n_labelled"}``
    (``loss == ce``; labels < 0 ignored; 0 when no sample is labelled)."""
    ce, acc, n = _masked_ce_acc(logits, labels)
    return {"loss": ce, "ce": ce, "acc": acc, "n_labelled": n}


def probe_metrics(logits: Array, labels: Array) -> dict[str, Array]:
    """Online linear-probe metrics -> ``{"probe_ce", "probe_acc", "probe_n_labelled"}`` (labels < 0 ignored).
    ``probe_ce`` is also the probe's training loss (the model stops its gradient at the embedding)."""
    ce, acc, n = _masked_ce_acc(logits, labels)
    return {"probe_ce": ce, "probe_acc": acc, "probe_n_labelled": n}


class Supervised:
    """`birdjepa.objectives.base.Objective`: cross-entropy of the projector (a classifier here,
    `birdjepa.objectives.options.SupervisedConfig`) on every view's label."""

    def __init__(self, options: Any, model_cfg: Any) -> None:
        pass

    def forward(self, model: Model, views: Array, batch: dict[str, Array]) -> Tensors:
        out = model.apply("global", views, model.dropout)
        return {k: out[k] for k in ("embedding", "projection", "probe_logits")}

    def terms(self, out: Tensors, batch: dict[str, Array]) -> Tensors:
        return supervised_loss(out["projection"], batch["label"])

    def statistics(self, out: Tensors, batch: dict[str, Array]) -> Tensors:
        return {"n_labelled": masked_ce_sums(out["projection"], batch["label"])[2]}

    def totals(self, sums: Tensors) -> Tensors:
        return sums

    def parts(self, out: Tensors, batch: dict[str, Array], totals: Tensors, batch_size: int) -> Tensors:
        ce, correct, n = masked_ce_sums(out["projection"], batch["label"])
        d = jnp.maximum(totals["n_labelled"], 1.0)
        return {"loss": ce / d, "ce": ce / d, "acc": correct / d, "n_labelled": n}

    def combine(self, parts: Tensors, totals: Tensors) -> Tensors:
        added = {k: in_order(parts[k]) for k in ("ce", "acc", "n_labelled")}
        return {"loss": added["ce"], **added}
