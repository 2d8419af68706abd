"""`TrainState`: everything the next step depends on, and how a checkpoint holds it (invariant 3 of
docs/design.md).

The loop advances one `TrainState`. `save` writes it whole: the arrays (params, optimizer state) to
Orbax, the rest into the checkpoint's JSON meta. `restore` reads it back, and `for_prng_mode` says what
a resume keeps in each ``--prng`` mode. The loader and the callbacks keep their live state themselves;
the loop copies it into the `TrainState` before each save (`TrainState.loader_state`, `.callbacks`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from birdjepa.rundir.checkpoint import Checkpointer
from birdjepa.train.step import PRNG_IMPL


@dataclasses.dataclass(frozen=True)
class TrainState:
    step: int
    """The next step to run: 0 for a new run; checkpoint ``s`` resumes at ``s + 1``."""
    restart: int
    """How many times the run was resumed before this segment (0 for its first)."""
    params: Any
    opt_state: Any
    """Optimizer moments, the update count and the gradient-accumulation progress."""
    chain: jax.Array
    """The split-chain key (``--prng checkpointed``; stateless keys derive from (seed, step))."""
    loader_state: dict[str, Any] | None = None
    """The loader's position before batch ``step`` (None: the start of the stream)."""
    callbacks: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The callbacks' state (IID diagnostics' window, the monitor's streaks)."""
    skipped: int = 0
    """Updates skipped because they were not finite (``--on-nonfinite skip``), over the whole run."""
    skip_streak: int = 0
    """Of those, how many in a row up to this step."""

    def arrays(self) -> dict[str, Any]:
        return {"params": self.params, "opt_state": self.opt_state}

    def meta(self) -> dict[str, Any]:
        return {
            "restart": self.restart,
            "loader_state": self.loader_state,
            "prng_chain": np.asarray(jax.random.key_data(self.chain)).tolist(),
            "callbacks": self.callbacks,
            "skipped": self.skipped,
            "skip_streak": self.skip_streak,
        }


def save(ckpt: Checkpointer, state: TrainState, meta: dict[str, Any]) -> dict[str, Any]:
    """Checkpoint ``state.step - 1`` (the step just done): the state, with ``meta`` (config, next-step
    record, ...) beside it. Returns the meta written."""
    written = {**meta, **state.meta()}
    ckpt.save(state.step - 1, state.arrays(), written)
    return written


def restore(ckpt: Checkpointer, template: dict[str, Any]) -> tuple[TrainState, dict[str, Any]] | None:
    """The newest checkpoint that verifies (its hashes and norms; damaged newer ones are moved aside, see
    `Checkpointer.restore_latest`), read into ``template``'s tree (`TrainState.arrays`' of step 0, as
    arrays or as shapes with their placement), with its meta; None when there is none."""
    found = ckpt.restore_latest(template)
    if found is None:
        return None
    step, arrays, meta = found
    return from_checkpoint(step, arrays, meta), meta


def restore_at(ckpt: Checkpointer, template: dict[str, Any], step: int) -> tuple[TrainState, dict[str, Any]]:
    """Checkpoint ``step`` (verified; it must exist) read into ``template``'s tree, with its meta."""
    arrays, meta = ckpt.restore(step, template)
    return from_checkpoint(step, arrays, meta), meta


def from_checkpoint(step: int, arrays: dict[str, Any], meta: dict[str, Any]) -> TrainState:
    """The state that checkpoint ``step`` holds: the one step ``step + 1`` starts from."""
    return TrainState(
        step=step + 1,
        restart=meta["restart"] + 1,
        params=arrays["params"],
        opt_state=arrays["opt_state"],
        chain=jax.random.wrap_key_data(np.asarray(meta["prng_chain"], np.uint32), impl=PRNG_IMPL),
        loader_state=meta["loader_state"],
        callbacks=meta["callbacks"],
        # Absent from checkpoints written before --on-nonfinite skip existed: nothing was skipped then.
        skipped=meta.get("skipped", 0),
        skip_streak=meta.get("skip_streak", 0),
    )


def for_prng_mode(restored: TrainState, prng: str, fresh_chain: jax.Array) -> TrainState:
    """What a resume keeps in each ``--prng`` mode. checkpointed: everything. stateless: the chain is
    never advanced, so it is the fresh one. legacy reproduces the resume bug users hit: the key chain
    restarts from the seed and the loader starts cold."""
    if prng == "checkpointed":
        return restored
    if prng == "legacy":
        return dataclasses.replace(restored, chain=fresh_chain, loader_state=None)
    return dataclasses.replace(restored, chain=fresh_chain)
