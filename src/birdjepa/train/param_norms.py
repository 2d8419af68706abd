"""A logged step's parameter norms, computed on a thread while the next step runs.

The log's ``train/param_norm`` (and one per group) are float64 norms on the host, the checkpoint's own
function (`birdjepa.rundir.checkpoint.norms`), so a resume can compare them with ``==``. Computed in
the loop, every parameter's copy to the host and the norms stood between one step's end and the next
step's dispatch: on an H200 (2026-11-27, small, batch 128) 65.6 ms of copies and 21.4 ms of norms in a
214 ms loop around a 35 ms step, while the GPU waited. `later` takes both off that path: it copies the
parameters on the device (the next step donates theirs, and XLA reuses donated memory), then a thread
brings the copy to the host and takes its norms, while the loop fetches the next batch and the next step
runs. The loop writes the step's row once the norms are in (`MetricsLog.flush`: after the next step,
or before anything else is written), so the log holds the same values in the same order as before.
The cost: one more copy of the parameters in device memory while a row is held. On a 2-core CPU the
loop's period does not move (`scripts/bench_param_norms.py`: the device copy is a host copy there, and
the thread shares the cores with the step and the loader).
"""

from __future__ import annotations

import functools
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import jax
import jax.numpy as jnp

from birdjepa import multihost
from birdjepa.rundir.checkpoint.norms import tree_norms


@functools.cache
def _pool() -> ThreadPoolExecutor:
    # One thread: a logged step's norms are done before the next logged step's are asked for (the loop
    # waits for them after the next step), so a second thread would never run.
    return ThreadPoolExecutor(1, thread_name_prefix="param-norms")


@jax.jit
def _copy(tree: Any) -> Any:
    return jax.tree.map(jnp.copy, tree)  # not donated: XLA must write new buffers


def snapshot(params: Any) -> Any:
    """A copy of ``params`` in buffers of their own, of one device's replica (what `multihost.host`
    reads): a program on this process's first device alone, whatever the others run."""
    return _copy(jax.tree.map(multihost.replica, params))


def norms_now(params: Any) -> dict[str, float]:
    """``{"train/param_norm": ..., "train/param_norm/<group>": ...}`` of ``params``, copied to the host
    and summed here (what the thread runs on its copy)."""
    return {f"train/{k}": v for k, v in tree_norms(multihost.host(params), "param_norm").items()}


class Norms:
    """The norms of one step's parameters, being computed on a thread."""

    def __init__(self, future: Future[dict[str, float]]) -> None:
        self._future = future

    def result(self) -> dict[str, float]:
        """``{"train/param_norm": ..., "train/param_norm/<group>": ...}``, waiting for them if need be (a
        failure on the thread is raised here)."""
        return self._future.result()


def later(params: Any) -> Norms:
    """The norms of ``params`` as they are now, computed on a thread: ``params`` may be donated to the
    next step as soon as this returns."""
    return Norms(_pool().submit(norms_now, snapshot(params)))
