"""The checkpoint format: what a checkpoint holds and how a state becomes it (format 2).

Layout: ``<run_dir>/checkpoints/<step>/`` with two items (written by `birdjepa.rundir.checkpoint.store`):

* ``state``: the array pytree (params, opt_state, ...) as a FLAT dict ``{"leaf_000000": np.ndarray, ...}``
  in ``jax.tree_util`` flatten order. Every leaf is copied to host numpy before Orbax sees it: restoring
  replicated device arrays through Orbax once scaled them by sqrt(n_devices); numpy arrays carry no
  sharding, so that cannot happen. Flattening also keeps Orbax away from optax namedtuples, empty nodes
  and odd dict keys: the structure comes back from the caller's target tree, not from Orbax.
* ``meta``: JSON. The caller's dict (config, git commit, loader state, PRNG key data, monitor state, ...)
  plus ``step``, ``norms`` (float64 norms of params / opt_state / the rest, see
  ``birdjepa.rundir.checkpoint.norms``),
  ``state_leaves`` (path, shape, dtype of every leaf, so a target with another structure fails loudly)
  ``hashes`` (the CRC-32 of every leaf's bytes; `birdjepa.rundir.checkpoint.integrity`) and
  ``meta_crc`` (the CRC-32 of the meta itself: its config is the options a bare resume trains with).

Limitations: single process (multi-host sharded arrays would need a gather first; they raise).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

#: 3: ``meta_crc`` (a byte changed in the meta's config trained on silently with it); 2: ``hashes``
#: (CRC-32 of every leaf) beside the norms. Format 1 had the norms only.
FORMAT_VERSION = 3
#: What `Checkpointer` restores: format 1 is verified by its norms alone (it recorded no CRC-32s), format 2
#: by its leaves' CRC-32s (its meta by its shape only).
FORMATS_READ = (1, 2, 3)
RESERVED_META_KEYS = ("step", "norms", "state_leaves", "hashes", "checkpoint_format", "meta_crc")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or restored faithfully."""


class IntegrityError(CheckpointError):
    """A checkpoint is damaged: what is on disk is not what was saved (or not all of it is there)."""


class NormMismatchError(IntegrityError):
    """The norms recomputed after a restore differ from the ones recorded at save time."""


class StructureError(CheckpointError):
    """A checkpoint holds another tree than the target asks for (options that shape the state changed)."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(message)
        self.step = step


class NotFiniteError(CheckpointError):
    """A state to save holds a NaN or an inf (an update that overflowed with finite gradients)."""

    def __init__(self, step: int, norm: str, value: float) -> None:
        super().__init__(f"refusing to save step {step}: {norm}={value!r} is not finite (a diverged state "
                         "would push a finite checkpoint out of the retention window)")  # fmt: skip
        self.step, self.norm, self.value = step, norm, value


class NoValidCheckpointError(CheckpointError):
    """Checkpoints exist, and none of them verifies."""


def path_str(path: tuple) -> str:
    return jax.tree_util.keystr(path) or "<root>"


def _leaf_to_host(path: tuple, x: Any, copy: bool = True) -> np.ndarray:
    """A private host copy of one leaf (a copy, so later donation/mutation of the source cannot race);
    without ``copy``, a read-only view where the array already lives on the host (a CPU device)."""
    if isinstance(x, jax.Array):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            raise CheckpointError(
                f"leaf {path_str(path)} is a typed PRNG key array; store jax.random.key_data(key) "
                "(e.g. as a list of ints in meta) instead"
            )
        if x.is_fully_replicated:
            # Every device holds the whole value: take it once, from one device.
            return np.array(x.addressable_data(0), copy=copy or None)
        if x.is_fully_addressable:
            return np.array(jax.device_get(x), copy=copy or None)
        raise CheckpointError(
            f"leaf {path_str(path)} is sharded across processes (sharding={x.sharding}); multi-host "
            "checkpoints need a gather first, which this module does not do"
        )
    a = np.array(x, copy=copy or None)
    if a.dtype == object or a.dtype.kind in "OUSV":
        raise CheckpointError(f"leaf {path_str(path)} has unsupported dtype {a.dtype} (type {type(x)})")
    return a


def to_host(tree: Any, copy: bool = True) -> Any:
    """Same pytree, every leaf replaced by a host numpy copy (replicated arrays read once). Without
    ``copy``, for reading at once (the norms of a resumed state: at the base preset a copy of the state
    took a resumed segment 1.2 s on a CPU), leaves already on the host are viewed, not copied."""
    return jax.tree_util.tree_map_with_path(lambda p, x: _leaf_to_host(p, x, copy), tree)


def leaf_spec(path: tuple, a: np.ndarray) -> list:
    return [path_str(path), list(a.shape), a.dtype.name]


def np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        return np.dtype(jax.numpy.bfloat16)
    return np.dtype(name)


def dtype_name(x: Any) -> str:
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic)):
        return np.dtype(x.dtype).name
    return np.asarray(x).dtype.name  # Python scalars: as np.asarray converts them at save time


def like_target(a: np.ndarray, tgt: Any) -> Any:
    """Give a restored host array the container type of the target leaf."""
    if isinstance(tgt, (bool, int, float)) and not isinstance(tgt, np.generic):
        return type(tgt)(a.item())
    if isinstance(tgt, np.generic):
        return a[()]
    sharding = getattr(tgt, "sharding", None)
    if isinstance(tgt, jax.Array) or (isinstance(tgt, jax.ShapeDtypeStruct) and sharding is not None):
        return jax.device_put(a, sharding)
    return a
