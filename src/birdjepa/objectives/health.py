"""What every objective's step also computes: the online linear probe (its loss trains the probe head
only: it sees ``stop_gradient(embedding)``) and the collapse diagnostic (the effective rank of the
batch's embeddings and projections, `birdjepa.diagnostics.collapse`). The same five methods as an
objective (`birdjepa.objectives.base`), so the virtual-shard step treats both alike."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from birdjepa.diagnostics.collapse import effective_rank
from birdjepa.objectives.base import Tensors, in_order
from birdjepa.objectives.supervised import masked_ce_sums, probe_metrics

Array = jax.Array


def terms(out: Tensors, batch: dict[str, Array]) -> Tensors:
    """``probe_ce`` (added to the loss), ``probe_acc``, ``probe_n_labelled`` and the ranks."""
    return {**probe_metrics(out["probe_logits"], batch["label"]), **ranks(out)}


def ranks(out: Tensors) -> Tensors:
    """``embedding_rank``, and ``projection_rank`` where the objective has a projection."""
    found = {"embedding_rank": effective_rank(out["embedding"])}
    if "projection" in out:
        found["projection_rank"] = effective_rank(out["projection"])
    return found


def statistics(out: Tensors, batch: dict[str, Array]) -> Tensors:
    return {"probe_n_labelled": masked_ce_sums(out["probe_logits"], batch["label"])[2]}


def parts(out: Tensors, batch: dict[str, Array], totals: Tensors) -> Tensors:
    """The probe's parts, and the shard's embeddings and projections (the ranks are the batch's)."""
    ce, correct, n = masked_ce_sums(out["probe_logits"], batch["label"])
    d = jnp.maximum(totals["probe_n_labelled"], 1.0)
    whole = {k: out[k] for k in ("embedding", "projection") if k in out}
    return {"probe_ce": ce / d, "probe_acc": correct / d, "probe_n_labelled": n, **whole}


def combine(parts: Tensors) -> Tensors:
    probe = {k: in_order(parts[k]) for k in ("probe_ce", "probe_acc", "probe_n_labelled")}
    return {**probe, **ranks(parts)}
