"""One training step as pure functions: the objective, the update, and the key of each step.

Every random draw of a step derives from the step's key by `jax.random.fold_in` with a fixed constant,
so adding a consumer never shifts another's randomness and a resumed step draws what it drew before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from birdjepa.config import NO_AUGMENT, AugmentConfig, ObjectiveConfig, PretrainConfig
from birdjepa.data import Features
from birdjepa.diagnostics.collapse import effective_rank
from birdjepa.diagnostics.monitor import maybe_update_stats
from birdjepa.faults import DATA_PLANTS
from birdjepa.model.config import ModelConfig
from birdjepa.model.vit import BirdJepa
from birdjepa.train.augment import augment_views, local_crops
from birdjepa.train.calls import recorded
from birdjepa.train.objectives import (
    lejepa_loss,
    probe_metrics,
    sigreg_directions,
    span_loss,
    span_mask,
    supervised_loss,
)
from birdjepa.train.optim import accumulation_progress, applied_lr, update_count

# Fixed sub-keys of the run seed, so adding a consumer never shifts another's randomness.
_INIT_KEY, _STEP_KEY = 0, 1
_AUGMENT_KEY, _LOCAL_KEY, _SPAN_KEY = 2, 3, 4  # folded into a step's key


def init_key(cfg: PretrainConfig) -> jax.Array:
    """The key of the initial parameters (also the evaluation's random-init baseline)."""
    return jax.random.fold_in(jax.random.key(cfg.seed), _INIT_KEY)


def fresh_chain(cfg: PretrainConfig) -> jax.Array:
    """The split chain's first key (``--prng checkpointed`` and ``legacy`` split it once per step)."""
    return jax.random.fold_in(jax.random.key(cfg.seed), _STEP_KEY)


def step_key(cfg: PretrainConfig, chain: jax.Array, step: int) -> tuple[jax.Array, jax.Array]:
    """(key for this step, chain key after it)."""
    if cfg.prng == "stateless":
        return jax.random.fold_in(fresh_chain(cfg), step), chain
    chain, key = jax.random.split(chain)
    return key, chain


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """Everything the loss reads from the run's configuration, and nothing else: two runs with equal
    ones compute the same function (`birdjepa.train.compiled` shares its compilation between them)."""

    model: ModelConfig
    """The resolved model, with the data set's class count."""
    objective: ObjectiveConfig
    augment: AugmentConfig
    features: Features
    deterministic: bool
    """No dropout or drop-path draws (``--debug-disable-stochastic`` or both rates 0)."""
    plant: str | None = None
    """``--debug-plant`` (`birdjepa.faults`) where it is in the step, None in every real run and for the
    plants the loader applies (`birdjepa.faults.DATA_PLANTS`)."""
    fixed_draws: bool = False
    """``--debug-disable-stochastic``: every draw of the loss (local crops, span masks, SIGReg's
    directions) from one fixed key, the same at every step."""
    virtual_shards: int = 0
    """``--train.virtual-shards``: the step of `birdjepa.train.virtual_shards` (0: the default step)."""

    @classmethod
    def of(cls, cfg: PretrainConfig, model_cfg: ModelConfig) -> StepConfig:
        off = cfg.debug_disable_stochastic
        return cls(
            model=model_cfg,
            objective=cfg.objective,
            augment=NO_AUGMENT if off else cfg.augment,
            features=cfg.data.features,
            deterministic=off or (cfg.model.dropout == 0 and cfg.model.drop_path == 0),
            plant=None if cfg.debug_plant in DATA_PLANTS else cfg.debug_plant,
            fixed_draws=off,
            virtual_shards=cfg.train.virtual_shards,
        )


def ordered_leaves(tree: Any, prefix: str) -> list[tuple[str, Any]]:
    """``(path, leaf)`` of nested dicts and tuples in their own order (the loss terms in the order the
    objective returns them). One-element tuples are not a level of the path."""
    if isinstance(tree, Mapping):
        return [kv for k, v in tree.items() for kv in ordered_leaves(v, f"{prefix}/{k}")]
    if isinstance(tree, (tuple, list)):
        if len(tree) == 1:
            return ordered_leaves(tree[0], prefix)
        return [kv for i, v in enumerate(tree) for kv in ordered_leaves(v, f"{prefix}/{i}")]
    return [(prefix, tree)]


def numbered(items: list[tuple[str, Any]]) -> dict[str, Any]:
    """``{"00000|name": value}``: the order of ``items`` survives jax's key-sorted pytree flattening."""
    return {f"{i:05d}|{name}": value for i, (name, value) in enumerate(items)}


def plant_pos_embed_bf16(params: Any) -> Any:
    """``params`` with the encoder's position embedding rounded to bfloat16 (``--debug-plant``)."""
    encoder = dict(params["encoder"])
    encoder["pos_embed"] = encoder["pos_embed"].astype(jnp.bfloat16).astype(jnp.float32)
    return {**params, "encoder": encoder}


PLANT_SCALE = 1.0 + 2.0**-10
"""How much the forward plants scale one call's input: a few hundred ulps, as a changed constant would."""

NOISE_PHASE_ENV = "BIRDJEPA_DEBUG_NOISE_PHASE"
"""``--debug-plant noisy_execution``: whether a process's first execution of a step is the scaled one
(1) or not (0, the default); this stands in for what makes a GPU's atomics differ from run to run."""


def execution_parity() -> jax.Array:
    """0 or 1, alternating on every execution of the function being compiled (its own count, starting at
    $BIRDJEPA_DEBUG_NOISE_PHASE): a host callback, so no two consecutive executions are the same. One
    device only (each device would count)."""
    count = itertools.count(int(os.environ.get(NOISE_PHASE_ENV, "0")))
    return jax.pure_callback(lambda: np.float32(next(count) % 2), jax.ShapeDtypeStruct((), jnp.float32))


@contextlib.contextmanager
def planted(plant: str | None) -> Iterator[None]:
    """``--debug-plant`` of a code change inside a module (`birdjepa.faults`): one call's input scaled
    by `PLANT_SCALE` on its way from the caller, as if the caller's code between two calls changed;
    ``noisy_execution``: the first block's input scaled on every other execution (`execution_parity`)."""
    targets = {
        "mlp_between_fc1_and_fc2": ("fc2", 0),
        "block_residual_scale": ("DropPath_0", 1),
        "noisy_execution": ("block_0", 0),
    }
    target = targets.get(plant or "")
    if target is None:
        yield
        return
    scale = 1.0 + (PLANT_SCALE - 1.0) * execution_parity() if plant == "noisy_execution" else PLANT_SCALE
    calls: dict[tuple, int] = {}

    def interceptor(next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
        module = context.module
        if module.name == target[0] and context.method_name == "__call__":
            k = calls.get(module.path, 0)
            calls[module.path] = k + 1
            if k == target[1]:  # this module's k-th call
                args = (args[0] * jnp.asarray(scale, args[0].dtype), *args[1:])
        return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
        yield


class BatchTerms:
    """The loss's terms over the whole batch the loss function is given (the default step). The
    virtual-shard step (`birdjepa.train.virtual_shards`) gives the same loss function terms over one
    shard instead, each a shard's part of the batch's term."""

    def __init__(self, spec: StepConfig) -> None:
        self.lej = spec.objective.lejepa

    def lejepa(self, z: jax.Array, key: jax.Array, n_global: int) -> dict[str, jax.Array]:
        lej = self.lej
        return lejepa_loss(
            z,
            key,
            lam=lej.lam,
            num_directions=lej.num_directions,
            num_knots=lej.num_knots,
            t_max=lej.t_max,
            sigreg_per_view=lej.sigreg_per_view,
            n_global=n_global,
        )

    def span(self, prediction: jax.Array, target: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
        return {"span": span_loss(prediction, target, mask)}

    def supervised(self, logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
        return supervised_loss(logits, labels)

    def probe(self, logits: jax.Array, labels: jax.Array) -> dict[str, jax.Array]:
        return probe_metrics(logits, labels)

    def collapse(self, embedding: jax.Array, projection: jax.Array) -> dict[str, jax.Array]:
        return {"embedding_rank": effective_rank(embedding), "projection_rank": effective_rank(projection)}


def step_keys(spec: StepConfig, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(the key the loss draws from, its dropout key, its SIGReg key) for a step's ``key``."""
    if spec.fixed_draws:  # --debug-disable-stochastic: the step's key changes nothing
        key = jax.random.key(0)
    dropout_key, sigreg_key = jax.random.split(key)
    return key, dropout_key, sigreg_key


def make_loss_fn(spec: StepConfig, *, record: bool = False, terms: Any = None) -> Callable:
    """``(params, batch, key, sigreg_key=None) -> (loss, aux)``: the objective plus the online probe's
    cross-entropy, its terms from ``terms`` (default `BatchTerms`); ``sigreg_key`` replaces the one
    the key gives (a virtual shard's loss draws SIGReg's directions from the step's key).

    ``record`` (`birdjepa trace`): ``aux["record"]`` also holds, in the order the step computes them,
    every sub-key and what its draw produced, and the inputs and outputs of every module call of the
    model (global views, local views, masked views; `birdjepa.train.calls`). Off, the function is the
    training one unchanged."""
    model = BirdJepa(spec.model)
    deterministic, augment = spec.deterministic, spec.augment
    lej = spec.objective.lejepa
    model_cfg = spec.model.resolved()
    norm = {"mean": spec.features.mean, "std": spec.features.std}
    terms = BatchTerms(spec) if terms is None else terms

    def loss_fn(
        params: Any, batch: dict[str, jax.Array], key: jax.Array, sigreg_key: jax.Array | None = None
    ) -> tuple[jax.Array, dict]:
        rec: list[tuple[str, Any]] = []  # stays empty unless recording
        key, dropout_key, own_sigreg_key = step_keys(spec, key)
        sigreg_key = own_sigreg_key if sigreg_key is None else sigreg_key
        if spec.plant == "pos_embed_bf16":  # --debug-plant: one parameter computed in bfloat16
            params = plant_pos_embed_bf16(params)

        def apply(call: str, x: jax.Array, dropout: jax.Array, **kw: Any) -> dict[str, jax.Array]:
            def run() -> dict[str, jax.Array]:
                rngs = {"dropout": dropout}
                return model.apply({"params": params}, x, deterministic=deterministic, rngs=rngs, **kw)

            with planted(spec.plant):  # outside the recording: it records what each module received
                if not record:
                    return run()
                rec.append((f"keys/dropout_{call}", jax.random.key_data(dropout)))
                out, calls = recorded(run)
            rec.extend((f"forward/{call}/{name}", value) for name, value in calls)
            return out

        if spec.plant == "dropout_key":  # --debug-plant: another dropout key
            dropout_key = jax.random.fold_in(dropout_key, 1)
        views = batch["spectrogram"]
        if augment.active:  # its own sub-key, so turning it on leaves the other draws as they were
            augment_key = jax.random.fold_in(key, _AUGMENT_KEY)
            views = augment_views(views, augment_key, augment, **norm)
            if record:
                rec.append(("keys/augment", jax.random.key_data(augment_key)))
                rec.append(("draws/augmented_views", views))
        out = apply("global", views, dropout_key)
        if spec.objective.kind == "lejepa":
            z = out["projection"]
            if lej.local_views:  # multi-crop: short views cut from the global ones, encoded apart
                local_key = jax.random.fold_in(key, _LOCAL_KEY)
                local = local_crops(views, local_key, lej.local_views, lej.local_frames)
                if record:
                    rec.append(("keys/local", jax.random.key_data(local_key)))
                    rec.append(("draws/local_views", local))
                local_out = apply("local", local, jax.random.fold_in(local_key, 1))
                z = jnp.concatenate([z, local_out["projection"]], axis=1)
            if record:
                directions = sigreg_directions(sigreg_key, z.shape[-1], lej.num_directions)
                rec += [
                    ("keys/sigreg", jax.random.key_data(sigreg_key)),
                    ("draws/sigreg_directions", directions),
                ]
            obj = terms.lejepa(z, sigreg_key, views.shape[1])
            if lej.span_weight:  # JEPA: a masked copy of the views predicts their tokens at the hidden spans
                span_key = jax.random.fold_in(key, _SPAN_KEY)
                mask = span_mask(span_key, views.shape[:2], model_cfg.grid, lej.span_tokens, lej.span_ratio)
                if record:
                    rec.append(("keys/span", jax.random.key_data(span_key)))
                    rec.append(("draws/span_mask", mask))
                masked = apply("masked", views, jax.random.fold_in(span_key, 1), mask=mask)
                span = terms.span(masked["prediction"], jax.lax.stop_gradient(out["tokens"]), mask)
                obj = {**obj, "loss": obj["loss"] + lej.span_weight * span["span"], **span}
        else:
            obj = terms.supervised(out["projection"], batch["label"])
        probe = terms.probe(out["probe_logits"], batch["label"])
        collapse = terms.collapse(out["embedding"], out["projection"])
        # The probe sees stop_gradient(embedding): adding its loss trains the probe head only.
        aux = {**obj, **probe, **collapse}
        return obj["loss"] + probe["probe_ce"], {**aux, "record": numbered(rec)} if record else aux

    return loss_fn


def make_train_step(
    loss_fn: Callable, tx: optax.GradientTransformation, *, clip_norm: float = 0.0
) -> Callable:
    """The pure step ``(params, opt_state, batch, key, check) -> (params, opt_state, metrics, stats,
    guard)``: ``loss_fn``'s gradients, then `make_update`'s update (see there for what each output is).
    With a recording ``loss_fn`` (``make_loss_fn(..., record=True)``) the step returns a sixth value for
    `birdjepa trace`."""
    update = make_update(tx, clip_norm=clip_norm)

    def step(
        params: Any, opt_state: Any, batch: dict[str, jax.Array], key: jax.Array, check: jax.Array
    ) -> tuple[Any, ...]:
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, key)
        return update(params, opt_state, loss, aux, grads, check)

    return step


def make_update(tx: optax.GradientTransformation, *, clip_norm: float = 0.0) -> Callable:
    """``(params, opt_state, loss, aux, grads, check) -> (params, opt_state, metrics, stats, guard)``:
    the update of a step whose loss function gave ``(loss, aux)`` and ``grads``. ``stats`` are the
    weight-update monitor's per-parameter statistics when ``check`` (raw gradients, before clipping,
    and the change actually applied), else its placeholder.

    The non-finite guard: a step whose loss or gradients hold a NaN or an inf returns the params and
    optimizer state it was given (its gradient accumulation too), and ``guard`` says so: ``finite``
    (bool) and ``bad`` (per parameter, in `jax.tree` order: its gradient is not finite). The loop decides
    what follows (``--on-nonfinite``); a state that still overflows is refused by the checkpoint.

    With ``aux["record"]`` (a recording loss function) it returns a sixth value for `birdjepa trace`:
    the loss function's record, every loss term, the gradients, the gradients after global-norm
    clipping at ``clip_norm`` (when > 0) and every leaf's update, in that order."""

    def update(
        params: Any, opt_state: Any, loss: jax.Array, aux: dict, grads: Any, check: jax.Array
    ) -> tuple[Any, ...]:
        aux = dict(aux)
        record = aux.pop("record", None)
        # Known before the update, so XLA fuses the select below into the update's own pass over the
        # state instead of reading and writing it again (measured: +26 % on the small preset otherwise).
        bad = jnp.stack([~jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)])
        finite = jnp.isfinite(loss) & ~jnp.any(bad)
        updates, new_opt_state = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        new_params, new_opt_state = jax.tree.map(
            lambda new, old: jnp.where(finite, new, old), (new_params, new_opt_state), (params, opt_state)
        )
        metrics = {f"train/{k}": v for k, v in aux.items() if not k.endswith("n_labelled")}
        metrics["train/lr"] = applied_lr(new_opt_state)
        metrics["train/grad_norm"] = optax.tree.norm(grads)
        metrics["train/update_norm"] = optax.tree.norm(jax.tree.map(jnp.subtract, new_params, params))
        metrics["train/update_count"] = update_count(new_opt_state)
        metrics["train/accum_progress"] = accumulation_progress(new_opt_state)
        stats = maybe_update_stats(check, grads, params, new_params)
        out = new_params, new_opt_state, metrics, stats, {"finite": finite, "bad": bad}
        if record is None:
            return out
        trace = {**record, "loss": {**aux, "total": loss}, "gradients": grads}
        if clip_norm > 0:
            trace["gradients_clipped"] = optax.clip_by_global_norm(clip_norm).update(
                grads, optax.EmptyState()
            )[0]
        trace["updates"] = updates
        return (*out, trace)

    return update
