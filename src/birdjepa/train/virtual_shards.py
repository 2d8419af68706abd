"""The virtual-shard step (``--train.virtual-shards V``): the same bits on every device count that
divides V.

The global batch of B rows is cut by position into V shards of B/V rows. Each of D devices holds V/D
consecutive shards and computes them one after the other, each by the same executable compiled for one
device, at the shape B/V (`VirtualShardStep`): no kernel ever sees a batch shape that depends on D.
Nothing summed over the batch is summed by a collective, whose order of addition depends on D: each
shard's part (its gradients, its loss terms, its statistics) moves whole to the first device, which
adds the V parts in the order 0, 1, ..., V-1. What reaches the optimizer is then the same on every D,
and so is the update.

Each shard draws from its own key, ``fold_in(step key, shard)`` (dropout, augmentation, local crops,
span masks); SIGReg's directions are one draw of the step's, shared by every shard.

The loss's terms are written as parts that add up (`ShardTerms`): a mean over the batch is each
shard's sum divided by the batch's count. SIGReg is not a mean: it is a function of the empirical
characteristic function of all the batch's projections. So the step makes two passes. The first
(`ShardStatistics`) encodes every shard and gathers what the whole batch's terms need: SIGReg's sums of
cos and sin and the label and mask counts. Added in shard order, they give SIGReg and its gradient
``G`` with respect to the sums. The second encodes each shard again under autodiff, with the
surrogate ``<G, the shard's sums>``, whose gradient is the shard's share of SIGReg's gradient. No
collective sits inside autodiff.

What stays topology-dependent: another kind of device or another XLA compiles other kernels; V itself
(another V cuts other shards, so another run).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from birdjepa.diagnostics.collapse import effective_rank
from birdjepa.model.vit import encoder_apply
from birdjepa.train.objectives import (
    invariance_residuals,
    masked_ce_sums,
    sigreg_from_sums,
    sigreg_partial_sums,
    span_errors,
)
from birdjepa.train.step import StepConfig, make_loss_fn, make_update, step_keys

AXIS = "data"
"""The mesh axis the batch is sharded over (`birdjepa.train.compiled`)."""


def in_order(parts: jax.Array) -> jax.Array:
    """The sum of ``parts [V, ...]`` over its first axis, added in the order 0, 1, ..., V-1."""
    total = parts[0]
    for i in range(1, parts.shape[0]):
        total = total + parts[i]
    return total


class ShardStatistics:
    """First pass: one shard's parts of what the whole batch's terms need."""

    def __init__(self, spec: StepConfig) -> None:
        self.lej = spec.objective.lejepa

    def lejepa(self, z: jax.Array, key: jax.Array, n_global: int) -> dict[str, jax.Array]:
        lej = self.lej
        sums = sigreg_partial_sums(
            z, key, num_directions=lej.num_directions, num_knots=lej.num_knots, t_max=lej.t_max,
            per_view=lej.sigreg_per_view,
        )  # fmt: skip
        samples = z.shape[0] if lej.sigreg_per_view else z.shape[0] * z.shape[1]
        return {"loss": jnp.zeros(()), "ecf": sums, "ecf_samples": jnp.float32(samples)}

    def span(self, prediction: jax.Array, target: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
        return {"span": jnp.zeros(()), "span_count": jnp.sum(mask).astype(jnp.float32)}

    def supervised(self, logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
        return {"loss": jnp.zeros(()), "n_labelled": masked_ce_sums(logits, labels)[2]}

    def probe(self, logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
        return {"probe_ce": jnp.zeros(()), "probe_n_labelled": masked_ce_sums(logits, labels)[2]}

    def collapse(self, embedding: jax.Array, projection: jax.Array) -> dict[str, jax.Array]:
        return {}


def batch_totals(spec: StepConfig, stats: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The batch's statistics from every shard's (``[V, ...]``), added in shard order, with SIGReg and
    its gradient with respect to its sums."""
    total = {k: in_order(v) for k, v in stats.items() if k not in ("loss", "probe_ce", "span")}
    if "ecf" in total:
        lej = spec.objective.lejepa
        n = total.pop("ecf_samples")
        reg = lambda s: sigreg_from_sums(s, n, num_knots=lej.num_knots, t_max=lej.t_max)  # noqa: E731
        total["sigreg"], total["sigreg_grad"] = jax.value_and_grad(reg)(total.pop("ecf"))
    return total


class ShardTerms:
    """Second pass: one shard's part of each term, so that the parts of the V shards add up to the
    batch's term (and their gradients to its gradient)."""

    def __init__(self, spec: StepConfig, totals: dict[str, jax.Array], batch_size: int) -> None:
        self.lej, self.totals, self.batch_size = spec.objective.lejepa, totals, batch_size

    def lejepa(self, z: jax.Array, key: jax.Array, n_global: int) -> dict[str, jax.Array]:
        lej = self.lej
        inv = jnp.sum(invariance_residuals(z, n_global)) / (self.batch_size * z.shape[1] * z.shape[2])
        sums = sigreg_partial_sums(
            z, key, num_directions=lej.num_directions, num_knots=lej.num_knots, t_max=lej.t_max,
            per_view=lej.sigreg_per_view,
        )  # fmt: skip
        surrogate = jnp.sum(self.totals["sigreg_grad"] * sums)  # its gradient: the shard's share of SIGReg's
        return {"loss": (1.0 - lej.lam) * inv + lej.lam * surrogate, "invariance": inv}

    def span(self, prediction: jax.Array, target: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
        count = jnp.maximum(self.totals["span_count"], 1.0)
        return {"span": jnp.sum(span_errors(prediction, target) * mask) / count}

    def supervised(self, logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
        ce, correct, n = masked_ce_sums(logits, labels)
        d = jnp.maximum(self.totals["n_labelled"], 1.0)
        return {"loss": ce / d, "ce": ce / d, "acc": correct / d, "n_labelled": n}

    def probe(self, logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
        ce, correct, n = masked_ce_sums(logits, labels)
        d = jnp.maximum(self.totals["probe_n_labelled"], 1.0)
        return {"probe_ce": ce / d, "probe_acc": correct / d, "probe_n_labelled": n}

    def collapse(self, embedding: jax.Array, projection: jax.Array) -> dict[str, jax.Array]:
        return {"embedding": embedding, "projection": projection}  # the ranks are taken of the whole batch


def combine(spec: StepConfig, parts: dict[str, Any], totals: dict[str, jax.Array]) -> tuple[jax.Array, dict]:
    """The step's loss and aux (as `step.make_loss_fn` returns them) from every shard's parts."""
    whole = ("loss", "embedding", "projection", "record")  # not added up
    added = {k: in_order(v) for k, v in parts.items() if k not in whole}
    if spec.objective.kind == "lejepa":
        lej = spec.objective.lejepa
        inv, reg = added["invariance"], totals["sigreg"]
        obj = {"loss": (1.0 - lej.lam) * inv + lej.lam * reg, "invariance": inv, "sigreg": reg}
        if lej.span_weight:
            obj = {**obj, "loss": obj["loss"] + lej.span_weight * added["span"], "span": added["span"]}
    else:
        obj = {"loss": added["ce"], **{k: added[k] for k in ("ce", "acc", "n_labelled")}}
    probe = {k: added[k] for k in ("probe_ce", "probe_acc", "probe_n_labelled")}
    collapse = {
        "embedding_rank": effective_rank(parts["embedding"]),
        "projection_rank": effective_rank(parts["projection"]),
    }
    aux = {**obj, **probe, **collapse}
    if "record" in parts:  # each shard's, [V, ...]
        aux["record"] = parts["record"]
    return obj["loss"] + probe["probe_ce"], aux


class VirtualShardStep:
    """The training step with ``--train.virtual-shards V`` on ``devices`` (D of them, D dividing V):
    called as the jitted default step is, ``(params, opt_state, batch, key, check) -> (params,
    opt_state, metrics, stats, guard)``, with the batch sharded and the state replicated over
    ``devices`` and the same outputs (``record``: and a sixth, the trace's, as `step.make_update`).

    Every piece is an executable compiled for one device, run wherever its inputs are: each shard's
    first and second pass on the device holding its rows, then the sums, the combination and the update
    on the first device, whose results are copied to the others. The same executable on the same
    inputs gives the same bits, so the result cannot depend on D. One program over all the devices
    would not do: XLA compiles a program for one device with other rewrites than a partitioned one
    (measured: the softmax's backward division became a multiplication by its reciprocal on one
    device only, and the gradients differed in their last bits)."""

    def __init__(
        self, spec: StepConfig, tx: Any, devices: tuple, *, record: bool = False, clip_norm: float = 0.0
    ) -> None:
        n = spec.virtual_shards
        if n % len(devices):
            raise ValueError(f"--train.virtual-shards {n}: the {len(devices)} devices must divide it")
        self.n_shards, self.devices = n, devices
        self.per_device = n // len(devices)
        statistics = make_loss_fn(spec, terms=ShardStatistics(spec))

        def first(params: Any, batch: dict, key: jax.Array, shard: jax.Array) -> dict:
            sigreg_key = step_keys(spec, key)[2]  # the step's: every shard projects on the same directions
            return statistics(params, batch, jax.random.fold_in(key, shard), sigreg_key)[1]

        def second(params: Any, batch: dict, key: jax.Array, shard: jax.Array, totals: dict) -> tuple:
            batch_size = batch["label"].shape[0] * n
            loss_fn = make_loss_fn(spec, record=record, terms=ShardTerms(spec, totals, batch_size))
            grad = jax.value_and_grad(loss_fn, has_aux=True)
            (_, aux), grads = grad(params, batch, jax.random.fold_in(key, shard), step_keys(spec, key)[2])
            return aux, grads

        def combined(parts: list, totals: dict) -> tuple:
            return combine(spec, _stack(parts), totals)

        self._first, self._second = jax.jit(first), jax.jit(second)
        self._totals = jax.jit(lambda stats: batch_totals(spec, _stack(stats)))
        self._combined = jax.jit(combined)
        # Gradients added as they come, in shard order: the first device holds the sum and one shard's,
        # not V shards' at once (the same additions, in the same order, as adding them all at the end).
        self._add = jax.jit(lambda total, grads: jax.tree.map(jnp.add, total, grads), donate_argnums=0)
        self._update = jax.jit(make_update(tx, clip_norm=clip_norm))
        self._split = jax.jit(lambda x: tuple(jnp.split(x, self.per_device)))
        self._encode = jax.jit(encoder_apply(spec.model))
        self.where = [devices[i // self.per_device] for i in range(n)]
        """The device of each shard."""
        self._replicated = NamedSharding(Mesh(np.array(devices), (AXIS,)), PartitionSpec())

    def _shards(self, batch: dict[str, jax.Array]) -> list[dict[str, jax.Array]]:
        """Each shard's rows, on the device that holds them (in shard order)."""
        on_device = {
            k: {s.device: self._split(s.data) for s in v.addressable_shards} for k, v in batch.items()
        }
        return [{k: on_device[k][d][i % self.per_device] for k in batch} for i, d in enumerate(self.where)]

    def gradients(self, params: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple:
        """``((loss, aux), grads)`` of the whole batch, on the first device."""
        inputs = self.inputs(params, batch, key)
        return self.second_pass(inputs, self.first_pass(inputs))

    def inputs(self, params: Any, batch: dict[str, jax.Array], key: jax.Array) -> list[tuple]:
        """Each shard's ``(device, params, rows, key, index)``, on its device."""
        params_on, shards = _per_device(params), self._shards(batch)
        key_on = {d: jax.device_put(key, d) for d in self.devices}
        return [
            (d, params_on[d], shards[i], key_on[d], jax.device_put(np.int32(i), d))
            for i, d in enumerate(self.where)
        ]

    def first_pass(self, inputs: list[tuple]) -> dict[str, jax.Array]:
        """The batch's statistics (SIGReg's and its gradient, the counts), on the first device."""
        stats = [self._first(*x[1:]) for x in inputs]
        return self._totals(jax.device_put(stats, self.devices[0]))

    def second_pass(self, inputs: list[tuple], totals: dict[str, jax.Array]) -> tuple:
        """``((loss, aux), grads)``: each shard's loss and gradients, the gradients added on the first
        device as they come (dispatched in shard order: each device runs its own in turn)."""
        first = self.devices[0]
        totals_on = {d: jax.device_put(totals, d) for d in self.devices}
        parts, total = [], None
        for d, *shard in inputs:
            aux, grads = self._second(*shard, totals_on[d])
            parts.append(jax.device_put(aux, first))
            grads = jax.device_put(grads, first)
            total = grads if total is None else self._add(total, grads)
        return self._combined(parts, totals), total

    def encode(self, params: Any, spectrogram: jax.Array) -> np.ndarray:
        """The encoder's embeddings of a sharded batch, shard by shard as the step cuts it: the
        evaluations logged during training do not depend on D either."""
        params_on = _per_device(params)
        shards = self._shards({"spectrogram": spectrogram})
        out = [self._encode(params_on[d], shards[i]["spectrogram"]) for i, d in enumerate(self.where)]
        return np.concatenate(jax.device_get(out))

    def loss(self, params: Any, batch: dict[str, jax.Array], key: jax.Array) -> jax.Array:
        """The step's loss (what the resume checks re-derive)."""
        return self.gradients(params, batch, key)[0][0]

    def on_first_device(
        self, params: Any, opt_state: Any, batch: dict[str, jax.Array], key: jax.Array, check: bool
    ) -> tuple[Any, ...]:
        """The step's outputs, all on the first device."""
        (loss, aux), grads = self.gradients(params, batch, key)
        return self.update(params, opt_state, loss, aux, grads, check)

    def update(
        self, params: Any, opt_state: Any, loss: jax.Array, aux: dict, grads: Any, check: bool
    ) -> tuple:
        """`step.make_update`'s outputs, on the first device."""
        state = _per_device((params, opt_state))[self.devices[0]]
        return self._update(*state, loss, aux, grads, check)

    def __call__(
        self, params: Any, opt_state: Any, batch: dict[str, jax.Array], key: jax.Array, check: bool
    ) -> tuple[Any, ...]:
        out = self.on_first_device(params, opt_state, batch, key, check)
        new_params, new_opt_state = jax.device_put(
            out[:2], self._replicated
        )  # copies: the same bits everywhere
        return (new_params, new_opt_state, *out[2:])


def _stack(trees: list) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _per_device(tree: Any) -> dict[Any, Any]:
    """``{device: tree}``: the copy on each device of each replicated array of ``tree``."""
    leaves, treedef = jax.tree.flatten(tree)
    copies = [{s.device: s.data for s in x.addressable_shards} for x in leaves]
    devices = copies[0] if copies else {}
    return {d: jax.tree.unflatten(treedef, [c[d] for c in copies]) for d in devices}
