"""What an objective provides, and what the step gives it.

An objective (`Objective`) is one class, registered by name in `birdjepa.objectives.options`. The step
(`birdjepa.train.step.make_loss_fn`) calls its ``forward`` with a `Model`: the model's calls, and the
step's random keys. Recording (`birdjepa trace`) and the divergence plants live in that `Model`, around
the objective, so an objective never sees them. ``forward`` returns every tensor its loss needs; then
one of two ways computes the loss:

* the default step: ``terms`` of the whole batch;
* ``--train.virtual-shards`` (`birdjepa.train.virtual_shards`): the batch is cut into shards, each
  forwarded on its own. A first pass takes each shard's ``statistics`` (sums that add up over the
  shards: counts, SIGReg's characteristic function); ``totals`` turns their sum into what every shard
  needs to know of the batch; a second pass takes each shard's ``parts``, whose sum over the shards
  is the batch's loss (and its gradient the batch's gradient); ``combine`` gives the batch's terms
  from the shards' parts, stacked in shard order (add them with `in_order`).

An objective whose terms are means over samples writes its parts as each shard's sum divided by the
batch's count, and has no statistics. Every term the step logs is ``train/<name>`` (``loss`` is the
objective's total).
"""

from __future__ import annotations

from typing import Any, Protocol

import jax

Array = jax.Array
Tensors = dict[str, Any]


class Model(Protocol):
    """The model and the step's randomness, as an objective's ``forward`` sees them."""

    model_cfg: Any
    """The resolved `birdjepa.model.config.ModelConfig`."""
    key: Array
    """The key of this forward's per-sample draws (a shard's own with virtual shards)."""
    shared_key: Array
    """The step's key for draws every shard shares (SIGReg's directions)."""
    dropout: Array
    """The dropout key of the main (``global``) call."""
    recording: bool
    """Whether the step is traced: draws worth recording that cost something are made only then."""

    def apply(self, call: str, x: Array, dropout: Array, **kw: Any) -> dict[str, Array]:
        """`birdjepa.model.vit.BirdJepa` on ``x`` (``kw``: its ``mask`` or ``keep``), dropout from
        ``dropout``; ``call`` names it in a trace (global, local, masked)."""
        ...

    def draw(self, name: str, constant: int) -> Array:
        """``fold_in(key, constant)``: a sub-key of its own (recorded as ``keys/<name>``); a constant
        is never reused, so adding a draw shifts no other."""
        ...

    def note(self, name: str, value: Array) -> None:
        """Record ``value`` under ``name`` (``draws/...``, ``keys/...``; nothing unless tracing)."""
        ...


class Objective(Protocol):
    """A pretraining objective: built from its options and the model's config."""

    def __init__(self, options: Any, model_cfg: Any) -> None: ...

    def forward(self, model: Model, views: Array, batch: dict[str, Array]) -> Tensors:
        """Every tensor the loss needs, from the augmented ``views [B, V, T, M]`` and the batch. It
        holds ``embedding`` and ``probe_logits`` (the online probe's and the collapse diagnostic's)
        and, where the objective has one, ``projection``."""
        ...

    def terms(self, out: Tensors, batch: dict[str, Array]) -> Tensors:
        """The whole batch's terms: ``loss`` and what is logged beside it."""
        ...

    def statistics(self, out: Tensors, batch: dict[str, Array]) -> Tensors:
        """A shard's sums of what the batch's terms need (virtual shards' first pass)."""
        ...

    def totals(self, sums: Tensors) -> Tensors:
        """What every shard's parts need, from the sums of every shard's statistics."""
        ...

    def parts(self, out: Tensors, batch: dict[str, Array], totals: Tensors, batch_size: int) -> Tensors:
        """A shard's part of each term: ``loss`` (its gradient is the shard's share of the batch's)
        and what ``combine`` adds up."""
        ...

    def combine(self, parts: Tensors, totals: Tensors) -> Tensors:
        """The batch's terms (as ``terms`` gives them) from every shard's ``parts``, stacked ``[V, ...]``."""
        ...


def in_order(parts: Array) -> Array:
    """The sum of ``parts [V, ...]`` over its first axis, added in the order 0, 1, ..., V-1."""
    total = parts[0]
    for i in range(1, parts.shape[0]):
        total = total + parts[i]
    return total


def build(objective_cfg: Any, model_cfg: Any) -> Objective:
    """The registered objective ``objective_cfg.kind`` with its options."""
    import importlib

    from birdjepa.objectives.options import REGISTRY

    module, name = REGISTRY[objective_cfg.kind].implementation.split(":")
    cls = getattr(importlib.import_module(module), name)
    return cls(objective_cfg.options, model_cfg)
