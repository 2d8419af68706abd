"""Optimizer and learning-rate schedule.

Invariant 5 of docs/design.md: the LR applied by optimizer update ``s`` is ``schedule(s)``, the first update
uses ``schedule(0)``, and the logged LR is the applied one. The schedule is wrapped with
``optax.inject_hyperparams``, whose state stores the learning rate each update actually used; the
trainer logs that value (``applied_lr``), never a recomputation.

With gradient accumulation (``grad_accum = k``) the loop's unit is the micro-step (one loader
batch); ``optax.MultiSteps`` sums k micro-gradients and applies one update, so update ``s`` happens
at micro-step ``(s + 1) * k - 1`` and the accumulation progress lives in the optimizer state (and
therefore in every checkpoint).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from birdjepa.config import OptimConfig
from birdjepa.seams import NONE, Seams


def wsd_decay_start(cfg: OptimConfig, total: int) -> int:
    """The update ``wsd``'s linear decay starts at, of ``total`` (warmup included): a positive
    ``decay_fraction`` decays over one update at least; 0 keeps the peak (it decayed the last update)."""
    return total - max(int(round(cfg.decay_fraction * total)), 1) if cfg.decay_fraction > 0 else total


def lr_table(cfg: OptimConfig, total_updates: int, seams: Seams = NONE) -> np.ndarray:
    """LR of every optimizer update ``s`` in ``[0, total)``, computed on the host in float64.

    Warmup is ``peak * (s + 1) / warmup`` so update 0 already learns (optax's warmup starts at 0);
    then cosine decay to ``peak * min_lr_ratio`` (``cosine``) or stable then linear decay (``wsd``);
    ``seams``: the verification wing's (`birdjepa.seams`), which may change the table.
    """
    peak, floor = cfg.lr, cfg.lr * cfg.min_lr_ratio
    warmup = max(cfg.warmup_steps, 0)
    total = max(total_updates, warmup + 1)
    decay_start = wsd_decay_start(cfg, total)
    out = np.empty(total, np.float64)
    for s in range(total):
        if s < warmup:
            out[s] = peak * (s + 1) / warmup
        elif cfg.schedule == "cosine":
            t = min(max((s - warmup) / max(total - warmup - 1, 1), 0.0), 1.0)
            out[s] = floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * t))
        else:
            t = min(max((s - decay_start + 1) / max(total - decay_start, 1), 0.0), 1.0)
            out[s] = peak + (floor - peak) * t
    return seams.lr_table(out, peak).astype(np.float32)


def make_schedule(cfg: OptimConfig, total_updates: int, seams: Seams = NONE) -> optax.Schedule:
    """``schedule(s)`` looks the LR up in `lr_table` (the last value after the end).

    A table rather than arithmetic in the graph: XLA may fuse or contract float ops differently under
    ``jit`` than eagerly, and the resume checks compare the applied LR with ``schedule(s)`` using
    ``==``. A lookup returns the same bits in every context.
    """
    table = lr_table(cfg, total_updates, seams)

    def schedule(step: jax.Array | int) -> jax.Array:
        return jnp.asarray(table)[jnp.clip(jnp.asarray(step), 0, len(table) - 1)]

    return schedule


def make_optimizer(cfg: OptimConfig, total_updates: int, seams: Seams = NONE) -> optax.GradientTransformation:
    """AdamW (or Muon) on the scheduled LR after global-norm clipping (`clip_apart`); ``seams``: the
    verification wing's (`birdjepa.seams`)."""
    schedule = make_schedule(cfg, total_updates, seams)
    decay_mask = seams.decay_mask()

    def scheduled(learning_rate: jax.Array) -> optax.GradientTransformation:
        if cfg.name == "adamw":
            base = optax.adamw(
                learning_rate, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay, mask=decay_mask
            )
        else:
            base = optax.contrib.muon(
                learning_rate,
                weight_decay=cfg.weight_decay,
                adam_b1=cfg.b1,
                adam_b2=cfg.b2,
                adam_weight_decay=cfg.weight_decay,
            )
        probe_scale = optax.multi_transform(
            {"probe": optax.scale(cfg.probe_lr_scale), "rest": optax.identity()}, _probe_labels
        )
        return optax.chain(clip_apart(cfg.clip_norm), base, probe_scale)

    tx = optax.inject_hyperparams(scheduled)(learning_rate=schedule)
    if cfg.grad_accum > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=cfg.grad_accum)
    return tx


def clip_apart(max_norm: float) -> optax.GradientTransformation:
    """Global-norm clipping at ``max_norm`` (0: none) of the online probe's gradients and, apart, of every
    other parameter's. The probe is a diagnostic: in one norm with the rest, its gradient (as large as all
    the others' together in the demo run) scaled theirs by 0.66, 0.72 and 0.88 at steps 100, 300 and 500
    (alone: 0.94, 1.0, 1.0). Stateless, as `optax.clip_by_global_norm` is: the optimizer state keeps its
    layout."""
    if max_norm <= 0:
        return optax.identity()
    clip = optax.clip_by_global_norm(max_norm)

    def apart(updates: optax.Updates, params: optax.Params | None = None) -> optax.Updates:
        leaves, treedef = jax.tree.flatten(updates)
        out = list(leaves)
        for index in _groups(updates).values():
            clipped, _ = clip.update([leaves[i] for i in index], optax.EmptyState())
            for i, leaf in zip(index, clipped, strict=True):
                out[i] = leaf
        return jax.tree.unflatten(treedef, out)

    return optax.stateless(apart)


def group_norms(grads: optax.Updates) -> dict[str, jax.Array]:
    """The global norm of each group `clip_apart` clips: ``rest`` (every parameter but the online
    probe's: what ``--optim.clip-norm`` bounds for the encoder) and ``probe``."""
    leaves = jax.tree.leaves(grads)
    return {g: optax.tree.norm([leaves[i] for i in index]) for g, index in _groups(grads).items()}


def _groups(tree: optax.Updates) -> dict[str, list[int]]:
    """``{"probe" | "rest": the indices of its leaves in `jax.tree` order}``, groups in sorted order."""
    labels = jax.tree.leaves(_probe_labels(tree))
    return {g: [i for i, label in enumerate(labels) if label == g] for g in sorted(set(labels))}


def _probe_labels(params: optax.Params) -> optax.Params:
    """ "probe" for every leaf under the top-level ``probe`` group (birdjepa.model.vit), "rest" elsewhere."""

    def label(path: tuple, _leaf: object) -> str:
        keys = [getattr(k, "key", None) for k in path]
        return "probe" if "probe" in keys[:2] else "rest"

    return jax.tree_util.tree_map_with_path(label, params)


def _injected(opt_state: optax.OptState) -> optax.OptState:
    return opt_state.inner_opt_state if isinstance(opt_state, optax.MultiStepsState) else opt_state


def applied_lr(opt_state: optax.OptState) -> jax.Array:
    """The LR the most recent optimizer update used, read from the optimizer's own state."""
    return _injected(opt_state).hyperparams["learning_rate"]


def update_count(opt_state: optax.OptState) -> jax.Array:
    """Optimizer updates applied so far (not micro-steps)."""
    return _injected(opt_state).count


def accumulation_progress(opt_state: optax.OptState) -> jax.Array:
    """Micro-batches accumulated towards the next update (0 without accumulation)."""
    if isinstance(opt_state, optax.MultiStepsState):
        return opt_state.mini_step
    return jnp.zeros([], jnp.int32)
