"""The step that `birdjepa trace` runs: the training step, also recording what it computes on the way.

It is the training step's own function (`make_train_step` with a recording loss, the same shardings),
built into one executable that returns, beside the step's outputs, a `birdjepa.train.digest.summary`
of every tensor the step computed, in the order it computed them: the whole tensor only for the names
asked for (``keep``), a digest and statistics for the rest, computed on the device. So a trace never
holds every activation on the host, and its memory stays near the step's.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from birdjepa.config import OptimConfig
from birdjepa.train import virtual_shards
from birdjepa.train.compiled import BATCH_KEYS, compiled
from birdjepa.train.digest import digest, summary
from birdjepa.train.step import StepConfig, make_loss_fn, make_train_step, ordered_leaves


def leaves(tree: Any) -> list[tuple[str, Any]]:
    """``(path, leaf)`` in `jax.tree` order, named as the checkpoint names them (``['encoder']...``)."""
    return [(jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def matches(key: str, patterns: Sequence[str]) -> bool:
    """Whether ``stage/name`` matches any of ``patterns`` (fnmatch; a bare stage name means all of it)."""
    return any(fnmatch.fnmatchcase(key, p if any(c in p for c in "*?[/") else f"{p}/*") for p in patterns)


def computed(trace: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """``(stage, name, tensor)`` of what the recording step computed, in the order it computed them:
    sub-keys, draws and module calls (as the loss function recorded them), loss terms, gradients,
    clipped gradients, updates."""
    out = [(*k.split("|", 1)[1].split("/", 1), v) for k, v in sorted(trace.items()) if "|" in k]
    out += [("loss", name.lstrip("/"), v) for name, v in ordered_leaves(trace.get("loss", {}), "")]
    for stage in ("gradients", "gradients_clipped", "updates"):
        out += [(stage, name, v) for name, v in leaves(trace.get(stage, {}))]
    return out


@dataclasses.dataclass(frozen=True)
class Recording:
    step: Callable
    """``(params, opt_state, batch, key, check) -> (digests, summaries)``: the digest of each of the
    training step's outputs (`jax.tree` order), and a summary of each tensor it computed on the way."""
    computed: list[tuple[str, str, tuple[int, ...], str]]
    """``(stage, name, shape, dtype)`` of each summary, in order (known once ``step`` has run)."""


def recording(
    spec: StepConfig, optim: OptimConfig, total_updates: int, keep: Sequence[str] = ()
) -> Recording:
    """The recording step for this configuration on this process's devices, keeping ``keep`` whole
    (patterns as in `matches`). Nothing is donated, so the training step can run after it on the same
    inputs. Built once per process and ``keep``."""
    return _recording(spec, optim, total_updates, tuple(jax.devices()), tuple(keep))


@functools.lru_cache(maxsize=4)
def _recording(
    spec: StepConfig, optim: OptimConfig, total_updates: int, devices: tuple, keep: tuple[str, ...]
) -> Recording:
    fns = compiled(spec, optim, total_updates)  # the training step's shardings, on these devices
    batch = {k: fns.sharded for k in BATCH_KEYS}
    clip = optim.clip_norm if optim.grad_accum == 1 else 0.0  # accumulating: clipped at the update only
    names: list[tuple[str, str, tuple[int, ...], str]] = []

    def summarized(out: list, trace: dict) -> tuple[list[jax.Array], list[dict[str, jax.Array]]]:
        items = computed(trace)
        names[:] = [(s, n, tuple(v.shape), np.dtype(v.dtype).name) for s, n, v in items]  # at trace time
        outputs = [digest(x) for x in jax.tree.leaves(out)]
        return outputs, [summary(v, whole=matches(f"{s}/{n}", keep)) for s, n, v in items]

    if spec.virtual_shards:  # the training step's executables, recording each shard's pass ([V, ...])
        sharded_step = virtual_shards.VirtualShardStep(spec, fns.tx, devices, record=True, clip_norm=clip)
        summarize = jax.jit(summarized)

        def run(*args: Any) -> tuple[list[jax.Array], list[dict[str, jax.Array]]]:
            *out, trace = sharded_step.on_first_device(*args)
            return summarize(out, trace)

        return Recording(run, names)
    step = make_train_step(make_loss_fn(spec, record=True), fns.tx, clip_norm=clip)

    def recorded_step(*args: Any) -> tuple[list[jax.Array], list[dict[str, jax.Array]]]:
        *out, trace = step(*args)
        return summarized(out, trace)

    shardings = (fns.replicated, fns.replicated, batch, fns.replicated, None)
    jitted = jax.jit(recorded_step, in_shardings=shardings)
    return Recording(jitted, names)
