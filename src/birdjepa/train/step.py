"""One training step as pure functions: the objective, the update, and the key of each step.

Every random draw of a step derives from the step's key by `jax.random.fold_in` with a fixed constant,
so adding a consumer never shifts another's randomness and a resumed step draws what it drew before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from birdjepa.config import NO_AUGMENT, AugmentConfig, PretrainConfig
from birdjepa.data import Features
from birdjepa.diagnostics.monitor import maybe_update_stats
from birdjepa.model.config import ModelConfig
from birdjepa.model.vit import BirdJepa
from birdjepa.objectives import health
from birdjepa.objectives.base import Objective, build
from birdjepa.objectives.options import ObjectiveConfig
from birdjepa.seams import NONE, Seams, planted
from birdjepa.train.augment import augment_views
from birdjepa.train.digest import tree_digests
from birdjepa.train.model_calls import ModelCalls
from birdjepa.train.optim import accumulation_progress, applied_lr, clip_apart, group_norms, update_count

# Fixed sub-keys of the run seed, so adding a consumer never shifts another's randomness.
_INIT_KEY, _STEP_KEY = 0, 1
_AUGMENT_KEY = 2  # folded into a step's key (the objectives' draws: 3 and up, in their modules)


#: Every key of a run (and of a benchmark's probes) is of this PRNG, whatever ``$JAX_DEFAULT_PRNG_IMPL``
#: says: a run started under the default and resumed under ``rbg`` failed its restore with JAX's
#: traceback (a checkpointed chain of 2 words where ``rbg`` has 4), and one started under ``rbg`` drew
#: other numbers than its configuration promises.
PRNG_IMPL = "threefry2x32"


def seed_key(seed: int) -> jax.Array:
    """The key of ``seed``, of `PRNG_IMPL` (of ``seed`` mod `birdjepa.config.SEED_LIMIT`)."""
    return jax.random.key(seed, impl=PRNG_IMPL)


def init_key(cfg: PretrainConfig) -> jax.Array:
    """The key of the initial parameters (also the evaluation's random-init baseline)."""
    return jax.random.fold_in(seed_key(cfg.seed), _INIT_KEY)


def fresh_chain(cfg: PretrainConfig) -> jax.Array:
    """The split chain's first key (``--prng checkpointed`` and ``legacy`` split it once per step)."""
    return jax.random.fold_in(seed_key(cfg.seed), _STEP_KEY)


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
    """No dropout or drop-path draws (``--debug.disable-stochastic`` or both rates 0)."""
    seams: Seams = NONE
    """The verification wing's hooks in the step (`birdjepa.seams`): `NONE` in every real run, and for
    a ``--debug.plant`` that changes only the data."""
    fixed_draws: bool = False
    """``--debug.disable-stochastic``: every draw of the loss (local crops, span masks, SIGReg's
    directions) from one fixed key, the same at every step."""
    virtual_shards: int = 0
    """``--train.virtual-shards``: the step of `birdjepa.train.virtual_shards` (0: the default step)."""

    @classmethod
    def of(cls, cfg: PretrainConfig, model_cfg: ModelConfig) -> StepConfig:
        off = cfg.debug.disable_stochastic
        return cls(
            model=model_cfg,
            objective=cfg.objective,
            augment=NO_AUGMENT if off else cfg.augment,
            features=cfg.data.features,
            deterministic=off or (cfg.model.dropout == 0 and cfg.model.drop_path == 0),
            seams=plant if (plant := planted(cfg.debug.plant)).in_step else NONE,
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


def step_keys(spec: StepConfig, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(the key the loss draws from, its dropout key, the key of draws every shard shares) for a
    step's ``key``."""
    if spec.fixed_draws:  # --debug.disable-stochastic: the step's key changes nothing
        key = seed_key(0)
    dropout_key, shared_key = jax.random.split(key)
    return key, dropout_key, shared_key


Terms = Callable[[Objective, Mapping[str, Any], dict[str, jax.Array]], tuple[jax.Array, dict]]
"""How a loss function turns an objective's forward into ``(loss, aux)``: `whole_batch` (the default
step) or a virtual shard's passes (`birdjepa.train.virtual_shards`)."""


def whole_batch(objective: Objective, out: Mapping[str, Any], batch: dict[str, jax.Array]) -> tuple:
    """The objective's terms of the whole batch, the online probe's and the collapse ranks; the probe
    sees stop_gradient(embedding): adding its loss trains the probe head only."""
    obj, probe = objective.terms(out, batch), health.terms(out, batch)
    return obj["loss"] + probe["probe_ce"], {**obj, **probe}


def make_loss_fn(spec: StepConfig, *, record: bool = False, terms: Terms = whole_batch) -> Callable:
    """``(params, batch, key, shared_key=None) -> (loss, aux)``: the objective's forward (with the
    augmented views) and its ``terms``; ``shared_key`` replaces the one the key gives (a virtual
    shard's loss draws SIGReg's directions from the step's key).

    ``record`` (`birdjepa trace`): ``aux["record"]`` also holds, in the order the step computes them,
    every sub-key and what its draw produced, and the inputs and outputs of every module call of the
    model (`birdjepa.train.calls`). Off, the function is the training one unchanged."""
    objective = build(spec.objective, spec.model.resolved())
    model = BirdJepa(spec.model, spec.objective.options.decoder(spec.model))
    augment = spec.augment
    norm = {"mean": spec.features.mean, "std": spec.features.std}

    def loss_fn(
        params: Any, batch: dict[str, jax.Array], key: jax.Array, shared_key: jax.Array | None = None
    ) -> tuple[jax.Array, dict]:
        rec: list[tuple[str, Any]] | None = [] if record else None
        key, dropout_key, own_shared_key = step_keys(spec, key)
        shared_key = own_shared_key if shared_key is None else shared_key
        calls = ModelCalls(spec.seams, spec.deterministic, model, params, (key, dropout_key, shared_key), rec)
        views = batch["spectrogram"]
        if views.ndim == 3:  # --data.n-views 1: the loader gives [B, T, M]; every objective reads views
            views = views[:, None]
        if augment.active:  # its own sub-key, so turning it on leaves the other draws as they were
            with jax.named_scope("augment"):  # a name in XLA's metadata only (birdjepa.perf.profile)
                views = augment_views(views, calls.draw("augment", _AUGMENT_KEY), augment, **norm)
            calls.note("draws/augmented_views", views)
        loss, aux = terms(objective, objective.forward(calls, views, batch), batch)
        return loss, {**aux, "record": numbered(rec)} if rec is not None else aux

    return loss_fn


def make_next_step(loss_fn: Callable) -> Callable:
    """``(params, batch, key) -> (loss, terms, gradients)``: what the resume checks record of the next
    step at save and derive again after a restore: its loss, the scalar terms of its ``aux`` (each
    loss term, the probe's, the ranks) and `digest.tree_digests` of its gradients. The terms and the
    gradients see what one float32 total hides: a term changed by an ulp, a backward pass changed."""

    def next_step(params: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple:
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, key)
        return loss, scalar_terms(aux), tree_digests(grads)

    return next_step


def scalar_terms(aux: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The scalars of a loss function's ``aux`` (its terms and metrics, not its tensors)."""
    return {k: v for k, v in aux.items() if jnp.ndim(v) == 0}


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
        # The named scopes name the parts in XLA's metadata for the step's profile (birdjepa.perf.profile).
        # Known before the update, so XLA fuses the select below into the update's own pass over the
        # state instead of reading and writing it again (measured: +26 % on the small preset otherwise).
        with jax.named_scope("guard"):
            bad = jnp.stack([~jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)])
            finite = jnp.isfinite(loss) & ~jnp.any(bad)
        with jax.named_scope("optimizer"):
            updates, new_opt_state = tx.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
        with jax.named_scope("guard"):
            new_params, new_opt_state = jax.tree.map(
                lambda new, old: jnp.where(finite, new, old), (new_params, new_opt_state), (params, opt_state)
            )
        with jax.named_scope("metrics"):
            metrics = {f"train/{k}": v for k, v in aux.items() if not k.endswith("n_labelled")}
            metrics["train/lr"] = applied_lr(new_opt_state)
            norms = group_norms(grads)  # apart, as they are clipped (the probe is a diagnostic)
            metrics["train/grad_norm"] = norms["rest"]
            metrics["train/probe_grad_norm"] = norms.get("probe", jnp.zeros([], jnp.float32))
            metrics["train/update_norm"] = optax.tree.norm(jax.tree.map(jnp.subtract, new_params, params))
            metrics["train/update_count"] = update_count(new_opt_state)
            metrics["train/accum_progress"] = accumulation_progress(new_opt_state)
        with jax.named_scope("monitor"):  # a skipped update moved nothing: no check (every parameter
            stats = maybe_update_stats(check & finite, grads, params, new_params)  # read as frozen)
        out = new_params, new_opt_state, metrics, stats, {"finite": finite, "bad": bad}
        if record is None:
            return out
        trace = {**record, "loss": {**aux, "total": loss}, "gradients": grads}
        if clip_norm > 0:
            trace["gradients_clipped"] = clip_apart(clip_norm).update(grads, optax.EmptyState())[0]
        trace["updates"] = updates
        return (*out, trace)

    return update
