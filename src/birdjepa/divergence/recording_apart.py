"""A recording step compiled apart from the training step, for what the training executable cannot
record: tensors kept whole (``--keep``), and the virtual-shard step (whose shards' executables record
nothing).

It is the training step's own function and shardings (`make_train_step` over a recording loss), built
into another executable that returns, beside each tensor's summary, the digest of each of the training
step's outputs, so the trace can check it against the training step: XLA may fuse another executable
otherwise and move a last bit (`birdjepa.divergence.trace` says which tensor then).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax

from birdjepa.config import OptimConfig
from birdjepa.train import virtual_shards
from birdjepa.train.compiled import BATCH_KEYS, compiled
from birdjepa.train.digest import digest
from birdjepa.train.recording import Computed, recordable, summaries, traced_clip, when
from birdjepa.train.step import StepConfig


@dataclasses.dataclass(frozen=True)
class Recording:
    step: Callable
    """``(params, opt_state, batch, key, check) -> (digests, summaries)``: the digest of each of the
    training step's outputs (`jax.tree` order), and a summary of each tensor it computed on the way."""
    computed: Computed
    """``(stage, name, shape, dtype)`` of each summary, in order (known once ``step`` has run)."""


def recording(
    spec: StepConfig, optim: OptimConfig, total_updates: int, keep: Sequence[str] = ()
) -> Recording:
    """The recording step for this configuration on this process's devices, keeping ``keep`` whole
    (patterns as in `birdjepa.train.recording.matches`). Nothing is donated, so the training step can
    run after it on the same inputs. Built once per process and ``keep``."""
    return _recording(spec, optim, total_updates, tuple(jax.devices()), tuple(keep))


@functools.lru_cache(maxsize=4)
def _recording(
    spec: StepConfig, optim: OptimConfig, total_updates: int, devices: tuple, keep: tuple[str, ...]
) -> Recording:
    fns = compiled(spec, optim, total_updates)  # the training step's shardings, on these devices
    if spec.virtual_shards:  # the training step's executables, recording each shard's pass ([V, ...])
        clip = traced_clip(optim)
        sharded_step = virtual_shards.VirtualShardStep(spec, fns.tx, devices, record=True, clip_norm=clip)
        names: Computed = []

        @jax.jit
        def summarize(out: list, trace: dict) -> tuple[list, list]:
            return [digest(x) for x in jax.tree.leaves(out)], summaries(trace, True, names, keep)

        def run(*args: Any) -> tuple[list[jax.Array], list[dict[str, jax.Array]]]:
            *out, trace = sharded_step.on_first_device(*args)
            return summarize(out, trace)

        return Recording(run, names)
    step, names = recordable(spec, fns.tx, optim, keep)

    def recorded_step(*args: Any) -> tuple[list[jax.Array], list[dict[str, jax.Array]]]:
        *out, record = step(*args)
        return [when(args[-1], digest, x) for x in jax.tree.leaves(out)], record

    batch = {k: fns.sharded for k in BATCH_KEYS}
    shardings = (fns.replicated, fns.replicated, batch, fns.replicated, None, None)
    jitted = jax.jit(recorded_step, in_shardings=shardings)
    return Recording(lambda *args: jitted(*args, True), names)
