"""One-off checkpoints outside a run's retention: a synchronous save, a load, and the debug roundtrip
(``--debug.roundtrip-steps``: save, restore into the same structure, assert bit-identical)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from birdjepa.rundir.checkpoint.format import CheckpointError
from birdjepa.rundir.checkpoint.integrity import assert_trees_identical
from birdjepa.rundir.checkpoint.store import Checkpointer


def save_sync(directory: str | Path, step: int, state: Any, meta: Mapping[str, Any] | None = None) -> float:
    """Synchronously write one checkpoint into `directory` (replacing it). Returns seconds taken."""
    directory = Path(directory)
    if directory.exists():
        shutil.rmtree(directory)
    t0 = time.perf_counter()
    with Checkpointer(directory, keep=None, async_save=False, subdir="") as ck:
        ck.save(step, state, meta)
    return time.perf_counter() - t0


def load(directory: str | Path, target: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Restore (and verify) the newest (or given) checkpoint in `directory` into `target`'s structure."""
    with Checkpointer(directory, keep=None, async_save=False, subdir="") as ck:
        step = ck.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(f"no complete checkpoint in {directory}")
        return ck.restore(step, target)


def roundtrip(directory: str | Path, step: int, state: Any, meta: Mapping[str, Any] | None = None) -> Any:
    """Debug check: save `state` to `directory`, restore into its structure, assert bit-identical;
    returns the restored copy (so the caller can go on training from it)."""
    save_sync(directory, step, state, meta)
    restored, rmeta = load(directory, state, step)
    assert_trees_identical(state, restored, "roundtrip")
    if meta is not None:
        for k, v in meta.items():
            if json.loads(json.dumps(v)) != rmeta.get(k):
                raise AssertionError(f"roundtrip: meta[{k!r}] differs after restore")
    leaves = len(jax.tree_util.tree_leaves(state))
    print(f"DEBUG_ROUNDTRIP step={step} leaves={leaves} identical=True", flush=True)
    return restored
