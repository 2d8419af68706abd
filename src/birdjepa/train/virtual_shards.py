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

The loss's terms are written as parts that add up (each objective's ``parts``,
`birdjepa.objectives.base`): a mean over the batch is each shard's sum divided by the batch's count.
SIGReg is not a mean: it is a function of the empirical characteristic function of all the batch's
projections. So the step makes two passes. The first (`first_pass_terms`) encodes every shard and
gathers what the whole batch's terms need (the objective's ``statistics``: SIGReg's sums of cos and
sin, the label and mask counts). Added in shard order, they give SIGReg and its gradient ``G`` with
respect to the sums (LeJEPA's ``totals``). The second (`second_pass_terms`) encodes each shard again
under autodiff, with the surrogate ``<G, the shard's sums>``, whose gradient is the shard's share of
SIGReg's gradient. No collective sits inside autodiff. For an objective with no statistics (MAE) the
first pass gives only the label count, and XLA drops the model from it.

What stays topology-dependent: another kind of device or another XLA compiles other kernels; V itself
(another V cuts other shards, so another run).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from birdjepa.model.vit import encoder_apply
from birdjepa.objectives import health
from birdjepa.objectives.base import Objective, build, in_order
from birdjepa.train.digest import tree_digests
from birdjepa.train.step import StepConfig, Terms, make_loss_fn, make_update, scalar_terms, step_keys

AXIS = "data"
"""The mesh axis the batch is sharded over (`birdjepa.train.compiled`)."""


def first_pass_terms(objective: Objective, out: Mapping[str, Any], batch: dict[str, jax.Array]) -> tuple:
    """The first pass: a shard's statistics (the objective's and the probe's), no loss."""
    stats = {"objective": objective.statistics(out, batch), "health": health.statistics(out, batch)}
    return jnp.zeros(()), stats


def batch_totals(objective: Objective, stats: dict[str, Any]) -> dict[str, Any]:
    """What every shard's second pass needs of the batch, from every shard's statistics (``[V, ...]``)
    added in shard order."""
    sums = jax.tree.map(in_order, stats)
    return {"objective": objective.totals(sums["objective"]), "health": sums["health"]}


def second_pass_terms(totals: dict[str, Any], batch_size: int) -> Terms:
    """The second pass: a shard's part of each term (its loss's gradient is the shard's share)."""

    def terms(objective: Objective, out: Mapping[str, Any], batch: dict[str, jax.Array]) -> tuple:
        obj = objective.parts(out, batch, totals["objective"], batch_size)
        probe = health.parts(out, batch, totals["health"])
        return obj["loss"] + probe["probe_ce"], {"objective": obj, "health": probe}

    return terms


def combine(objective: Objective, parts: dict[str, Any], totals: dict[str, Any]) -> tuple[jax.Array, dict]:
    """The step's loss and aux (as `step.make_loss_fn` returns them) from every shard's parts."""
    obj = objective.combine(parts["objective"], totals["objective"])
    probe = health.combine(parts["health"])
    aux = {**obj, **probe}
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
        objective = build(spec.objective, spec.model.resolved())
        statistics = make_loss_fn(spec, terms=first_pass_terms)

        def first(params: Any, batch: dict, key: jax.Array, shard: jax.Array) -> dict:
            shared = step_keys(spec, key)[2]  # the step's: every shard projects on the same directions
            return statistics(params, batch, jax.random.fold_in(key, shard), shared)[1]

        def second(params: Any, batch: dict, key: jax.Array, shard: jax.Array, totals: dict) -> tuple:
            batch_size = batch["label"].shape[0] * n
            loss_fn = make_loss_fn(spec, record=record, terms=second_pass_terms(totals, batch_size))
            grad = jax.value_and_grad(loss_fn, has_aux=True)
            (_, aux), grads = grad(params, batch, jax.random.fold_in(key, shard), step_keys(spec, key)[2])
            return aux, grads

        def combined(parts: list, totals: dict) -> tuple:
            return combine(objective, _stack(parts), totals)

        self._first, self._second = jax.jit(first), jax.jit(second)
        self._totals = jax.jit(lambda stats: batch_totals(objective, _stack(stats)))
        self._combined = jax.jit(combined)
        # Gradients added as they come, in shard order: the first device holds the sum and one shard's,
        # not V shards' at once (the same additions, in the same order, as adding them all at the end).
        self._add = jax.jit(lambda total, grads: jax.tree.map(jnp.add, total, grads), donate_argnums=0)
        self._digests = jax.jit(tree_digests)
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
        """The step's loss, from its own passes (what checkpoints recorded before `next_step`)."""
        return self.gradients(params, batch, key)[0][0]

    def next_step(self, params: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple:
        """What the resume checks record of the step (`birdjepa.train.step.make_next_step`), from the
        step's own passes."""
        (loss, aux), grads = self.gradients(params, batch, key)
        return loss, scalar_terms(aux), self._digests(grads)

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
