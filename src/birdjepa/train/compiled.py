"""The jitted functions of a run segment, built once per process for each step configuration.

Tracing and lowering the step costs seconds. A process that trains several runs (the fault matrix, the
test suite) with one model, objective and optimizer gets the functions it already built. The key is
everything they read (`StepConfig`, the optimizer's options and length, the devices), so a reused
function is the one a fresh build would give, and it runs the same XLA executable.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from birdjepa import multihost
from birdjepa.config import OptimConfig
from birdjepa.model.vit import encoder_apply
from birdjepa.train import compile_cache, virtual_shards
from birdjepa.train.optim import make_optimizer
from birdjepa.train.recording import RecordableStep, recordable
from birdjepa.train.state import TrainState
from birdjepa.train.step import StepConfig, make_loss_fn, make_next_step

#: The batch arrays a step reads, sharded over the devices along the batch axis.
BATCH_KEYS = ("spectrogram", "label")


@dataclasses.dataclass(frozen=True)
class Compiled:
    spec: StepConfig
    """The step configuration these functions were built for."""
    tx: optax.GradientTransformation
    replicated: NamedSharding
    sharded: NamedSharding
    """Split along the batch axis over every device (of every process)."""
    train_step: Callable
    """``(params, opt_state, batch, key, check) -> (params, opt_state, metrics, stats, guard)``; the
    default step (`birdjepa.train.recording.RecordableStep`, which can also record itself) donates the
    first two, the virtual-shard step (`birdjepa.train.virtual_shards.VirtualShardStep`) leaves them."""
    next_step: Callable
    """``(params, batch, key) -> (loss, terms, gradients)`` (`birdjepa.train.step.make_next_step`): what
    the resume checks record of the next step at save and derive again after a restore."""
    loss_only: Callable
    """``(params, batch, key) -> loss`` by a forward pass alone: the next step's loss as checkpoints
    written before the gradients were recorded hold it (in bfloat16 its last bits are not the step's).
    Compiled only where a resume restores one."""
    encode: Callable
    """``(params, spectrogram) -> embedding`` of the encoder alone (evaluation)."""

    def place(self, state: TrainState) -> TrainState:
        """``state`` with its arrays replicated over the devices. In a group of processes each gives its
        own host copy: an array restored onto one device cannot be sent to another process's devices."""
        arrays = (state.params, state.opt_state)
        if jax.process_count() > 1:
            arrays = multihost.host(arrays)
        params, opt_state = jax.device_put(arrays, self.replicated)
        return dataclasses.replace(state, params=params, opt_state=opt_state)

    def on_device(self, batch: Mapping[str, np.ndarray], *, nan: bool = False) -> dict[str, jax.Array]:
        """The global batch as arrays sharded over every process's devices (each gives its rows);
        ``nan``: its spectrograms made NaN (``--debug.nonfinite-steps``)."""
        arrays = multihost.global_batch({k: batch[k] for k in BATCH_KEYS}, self.sharded)
        if nan:
            arrays["spectrogram"] = arrays["spectrogram"] * np.float32(np.nan)
        return arrays


def compiled(spec: StepConfig, optim: OptimConfig, total_updates: int) -> Compiled:
    """The functions for this step configuration on this process's devices (built on first use); their
    executables come from the persistent compilation cache where it has them (`compile_cache`)."""
    compile_cache.enable()
    return _build(spec, optim, total_updates, tuple(jax.devices()))


def jit_step(
    step: Callable, replicated: NamedSharding, sharded: NamedSharding, extra: int = 0, donate: bool = True
) -> Callable:
    """``step(params, opt_state, batch, key, check, *extra)`` jitted as the loop runs it: the batch sharded
    over the devices, the rest replicated, the parameters and optimizer state donated (``donate``
    False: not, as `docs/issues/007-step-limit/donation.py` measures)."""
    batch = {k: sharded for k in BATCH_KEYS}
    shardings = (replicated, replicated, batch, replicated, None, *(None,) * extra)
    donated = (0, 1) if donate else ()
    return jax.jit(step, in_shardings=shardings, out_shardings=replicated, donate_argnums=donated)


# Eight: a test worker trains ~15 configurations, and 4 of 31 builds in a whole run of the suite were of
# one evicted since (~5 s of tracing each); a step's functions hold no array of its state.
@functools.lru_cache(maxsize=8)
def _build(spec: StepConfig, optim: OptimConfig, total_updates: int, devices: tuple) -> Compiled:
    mesh = Mesh(np.array(devices), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    sharded = NamedSharding(mesh, PartitionSpec("data"))
    batch = {k: sharded for k in BATCH_KEYS}
    tx = make_optimizer(optim, total_updates, spec.seams)
    if spec.virtual_shards:  # its own executables, one device each (see there)
        step = virtual_shards.VirtualShardStep(spec, tx, devices)
        return Compiled(spec, tx, replicated, sharded, step, step.next_step, step.loss, step.encode)
    # The step that can record itself (`birdjepa trace` runs this executable); the loop records nothing.
    step, names = recordable(spec, tx, optim)
    train_step = RecordableStep(jit_step(step, replicated, sharded, extra=1), names)
    loss_fn = make_loss_fn(spec)
    next_step = jax.jit(make_next_step(loss_fn), in_shardings=(replicated, batch, None))
    loss_only = jax.jit(lambda p, b, k: loss_fn(p, b, k)[0], in_shardings=(replicated, batch, None))
    encode = jax.jit(encoder_apply(spec.model), in_shardings=(replicated, sharded), out_shardings=replicated)
    return Compiled(spec, tx, replicated, sharded, train_step, next_step, loss_only, encode)
