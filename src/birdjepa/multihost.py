"""The devices of every process of a run, seen from the host: a global batch made of each process's rows,
arrays brought to the host, and the few values all processes must agree on.

Every process runs the same loader over the same global batch stream and keeps the rows of its own
devices (`local_rows`): the global batch, its indices and the loader state are the same for any process
count. Each process decodes the whole global batch: a record that cannot be decoded shifts the batch
boundaries, so a process cannot know which positions form its slice without decoding the others. Only
process 0 writes logs and prints; every process takes part in checkpoint saves (Orbax writes once).
Joining a group of processes is `birdjepa.slurm.distributed`.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding


def is_main() -> bool:
    return jax.process_index() == 0


def replica(x: Any) -> Any:
    """One device's copy of a replicated array (this process's first); anything else as it is."""
    return x.addressable_data(0) if isinstance(x, jax.Array) and x.is_fully_replicated else x


def host(tree: Any) -> Any:
    """Numpy copies of a tree of replicated (or local) arrays, readable in every process. Every leaf's
    copy starts before the first is waited for (`jax.device_get`): one leaf after another, each copy
    from an accelerator waits out its own transfer (the parameters for a logged step's norms: hundreds
    of leaves)."""
    return jax.device_get(jax.tree.map(replica, tree))


def local_rows(sharding: NamedSharding, batch_size: int) -> slice:
    """The rows of a global batch that this process's devices hold under a batch-sharded ``sharding``."""
    devices = list(sharding.mesh.devices.flat)
    per = batch_size // len(devices)
    mine = sorted(i for i, d in enumerate(devices) if d.process_index == jax.process_index())
    if mine != list(range(mine[0], mine[-1] + 1)):
        raise ValueError(f"process {jax.process_index()} holds non-contiguous mesh positions {mine}")
    return slice(mine[0] * per, (mine[-1] + 1) * per)


def global_batch(batch: dict[str, np.ndarray], sharding: NamedSharding) -> dict[str, jax.Array]:
    """A global batch-sharded array per entry, each process contributing only its own rows."""
    rows = local_rows(sharding, len(next(iter(batch.values()))))
    return {k: jax.make_array_from_process_local_data(sharding, v[rows]) for k, v in batch.items()}


def every_process(value: int) -> list[int]:
    """Each process's ``value``, in process order, in every process (a collective)."""
    if jax.process_count() == 1:
        return [value]
    return [
        int(v) for v in np.asarray(multihost_utils.process_allgather(np.asarray([value], np.int64))).ravel()
    ]


def any_process(flag: bool) -> bool:
    """True in every process if it is true in any (a stop request must be acted on by all together)."""
    return any(every_process(int(flag)))


def first_disagreement(values: Mapping[str, str]) -> str | None:
    """The first of ``values`` (name -> text; the same names in every process) that another process holds
    otherwise, as ``"NAME (processes 0 and K)"``, or None: a collective. A group started with other
    options or data in one process (another --seed, a node's other copy of the shards) trained a run no
    record described, or died in a collective with a C++ stack."""
    if jax.process_count() == 1:
        return None
    names = sorted(values)
    mine = np.asarray([zlib.crc32(values[n].encode()) for n in names], np.int64)
    everyone = np.asarray(multihost_utils.process_allgather(mine)).reshape(jax.process_count(), len(names))
    for j, name in enumerate(names):
        other = np.flatnonzero(everyone[:, j] != everyone[0, j])
        if other.size:
            return f"{name} (processes 0 and {int(other[0])})"
    return None


#: What a collective's error says where another process of the group is gone: gloo's socket to it
#: closed (it was killed, or crashed), or the coordination service missed its heartbeats.
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "heartbeat timeout")


def peer_lost(e: BaseException) -> str | None:
    """The first line of ``e`` where it is a collective that failed because another process of the group
    is gone, else None. The process that waited for it raised a traceback naming no process, and then
    waited out the group's shutdown barrier (100 s) before it aborted with a C++ stack."""
    said = str(e)
    if jax.process_count() == 1 or not any(gone in said for gone in _PEER_GONE):
        return None
    return said.strip().splitlines()[0]


def index_crc32(local_index: np.ndarray) -> float:
    """crc32 of the global batch's sample indices, put together from every process's rows (a
    collective): equal across process counts exactly when the global batches are."""
    if jax.process_count() > 1:
        local_index = np.asarray(multihost_utils.process_allgather(local_index)).reshape(-1)
    return float(zlib.crc32(np.ascontiguousarray(local_index, np.int64).tobytes()))
