"""One training step as pure functions: the objective, the update, and the key of each step.

Every random draw of a step derives from the step's key by `jax.random.fold_in` with a fixed constant,
so adding a consumer never shifts another's randomness and a resumed step draws what it drew before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from birdjepa.config import AugmentConfig, ObjectiveConfig, PretrainConfig
from birdjepa.data import Features
from birdjepa.diagnostics.collapse import effective_rank
from birdjepa.diagnostics.monitor import maybe_update_stats
from birdjepa.model.config import ModelConfig
from birdjepa.model.vit import BirdJepa
from birdjepa.train.augment import augment_views, local_crops
from birdjepa.train.objectives import lejepa_loss, probe_metrics, span_loss, span_mask, supervised_loss
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

    @classmethod
    def of(cls, cfg: PretrainConfig, model_cfg: ModelConfig) -> StepConfig:
        off = cfg.debug_disable_stochastic
        return cls(
            model=model_cfg,
            objective=cfg.objective,
            augment=AugmentConfig() if off else cfg.augment,
            features=cfg.data.features,
            deterministic=off or (cfg.model.dropout == 0 and cfg.model.drop_path == 0),
        )


def make_loss_fn(spec: StepConfig) -> Callable:
    """``(params, batch, key) -> (loss, aux)``: the objective plus the online probe's cross-entropy."""
    model = BirdJepa(spec.model)
    deterministic, augment = spec.deterministic, spec.augment
    lej = spec.objective.lejepa
    model_cfg = spec.model.resolved()
    norm = {"mean": spec.features.mean, "std": spec.features.std}

    def loss_fn(params: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, dict]:
        dropout_key, sigreg_key = jax.random.split(key)
        views = batch["spectrogram"]
        if augment.active:  # its own sub-key, so turning it on leaves the other draws as they were
            views = augment_views(views, jax.random.fold_in(key, _AUGMENT_KEY), augment, **norm)
        out = model.apply(
            {"params": params},
            views,
            deterministic=deterministic,
            rngs={"dropout": dropout_key},
        )
        if spec.objective.kind == "lejepa":
            z = out["projection"]
            if lej.local_views:  # multi-crop: short views cut from the global ones, encoded apart
                local_key = jax.random.fold_in(key, _LOCAL_KEY)
                local = local_crops(views, local_key, lej.local_views, lej.local_frames)
                local_out = model.apply({"params": params}, local, deterministic=deterministic,
                                        rngs={"dropout": jax.random.fold_in(local_key, 1)})  # fmt: skip
                z = jnp.concatenate([z, local_out["projection"]], axis=1)
            obj = lejepa_loss(
                z,
                sigreg_key,
                lam=lej.lam,
                num_directions=lej.num_directions,
                num_knots=lej.num_knots,
                t_max=lej.t_max,
                sigreg_per_view=lej.sigreg_per_view,
                n_global=views.shape[1],
            )
            if lej.span_weight:  # JEPA: a masked copy of the views predicts their tokens at the hidden spans
                span_key = jax.random.fold_in(key, _SPAN_KEY)
                mask = span_mask(span_key, views.shape[:2], model_cfg.grid, lej.span_tokens, lej.span_ratio)
                masked = model.apply({"params": params}, views, deterministic=deterministic, mask=mask,
                                     rngs={"dropout": jax.random.fold_in(span_key, 1)})  # fmt: skip
                span = span_loss(masked["prediction"], jax.lax.stop_gradient(out["tokens"]), mask)
                obj = {**obj, "loss": obj["loss"] + lej.span_weight * span, "span": span}
        else:
            obj = supervised_loss(out["projection"], batch["label"])
        probe = probe_metrics(out["probe_logits"], batch["label"])
        collapse = {
            "embedding_rank": effective_rank(out["embedding"]),
            "projection_rank": effective_rank(out["projection"]),
        }
        # The probe sees stop_gradient(embedding): adding its loss trains the probe head only.
        return obj["loss"] + probe["probe_ce"], {**obj, **probe, **collapse}

    return loss_fn


def make_train_step(loss_fn: Callable, tx: optax.GradientTransformation) -> Callable:
    """The pure step ``(params, opt_state, batch, key, check) -> (params, opt_state, metrics, stats,
    guard)``; ``stats`` are the weight-update monitor's per-parameter statistics when ``check`` (raw
    gradients, before clipping, and the change actually applied), else its placeholder.

    The non-finite guard: a step whose loss or gradients hold a NaN or an inf returns the params and
    optimizer state it was given (its gradient accumulation too), and ``guard`` says so: ``finite``
    (bool) and ``bad`` (per parameter, in `jax.tree` order: its gradient is not finite). The loop decides
    what follows (``--on-nonfinite``); a state that still overflows is refused by the checkpoint."""

    def step(
        params: Any, opt_state: Any, batch: dict[str, jax.Array], key: jax.Array, check: jax.Array
    ) -> tuple[Any, Any, dict, dict, dict]:
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch, key)
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
        return new_params, new_opt_state, metrics, stats, {"finite": finite, "bad": bad}

    return step
