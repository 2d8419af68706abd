"""Checkpoints that hold everything the next step depends on, verified on restore.

Invariant 3 of docs/design.md.

Layout: ``<run_dir>/checkpoints/<step>/`` written by an Orbax ``CheckpointManager`` with two items:

* ``state``: the array pytree (params, opt_state, ...) as a FLAT dict ``{"leaf_000000": np.ndarray, ...}``
  in ``jax.tree_util`` flatten order. Every leaf is copied to host numpy before Orbax sees it: restoring
  replicated device arrays through Orbax once scaled them by sqrt(n_devices); numpy arrays carry no
  sharding, so that cannot happen. Flattening also keeps Orbax away from optax namedtuples, empty nodes
  and odd dict keys: the structure comes back from the caller's target tree, not from Orbax.
* ``meta``: JSON. The caller's dict (config, git commit, loader state, PRNG key data, monitor state, ...)
  plus ``step``, ``norms`` (float64 norms of params / opt_state / the rest, see ``birdjepa.train.norms``),
  ``state_leaves`` (path, shape, dtype of every leaf, so a target with another structure fails loudly)
  and ``hashes`` (the CRC-32 of every leaf's bytes).

Integrity: a restore recomputes every leaf's CRC-32 and the norms of what it returns and compares them
with the recorded ones with ``==``, so a restore that verifies is the saved state bit for bit (a norm
alone misses a flipped low mantissa bit). A checkpoint that does not verify (a changed byte, a truncated
or missing file, a missing meta) raises `IntegrityError`; `restore_latest` then falls back to the newest
one that does, moving each damaged one aside into ``checkpoints.damaged/`` so it is never picked again
(`fallbacks` says which and why). A target of another structure or an older format raises plain
`CheckpointError`: the checkpoint is fine, the run asking for it is not, so it is left where it is.

Saving refuses a state whose norms are not finite. Retention (``keep``) deletes the oldest checkpoints
beyond the newest ``keep``, but never the newest one that verifies (read back from disk, once).

Completeness: on a local filesystem Orbax 0.12.8 writes a step into ``<step>.orbax-checkpoint-tmp`` and
renames it to ``<step>`` when every item is committed (it also drops ``commit_success.txt`` files, which
is the marker it uses instead on GCS). A crash leaves at most a ``*.orbax-checkpoint-tmp`` folder, which
Orbax never lists as a step; ``latest_step`` additionally requires both item folders.

Limitations: single process (multi-host sharded arrays would need a gather first; they raise).
"""

from __future__ import annotations

import json
import math
import shutil
import time
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from birdjepa.train import norms as norms_lib

#: 2: ``hashes`` (CRC-32 of every leaf) beside the norms.
FORMAT_VERSION = 2
RESERVED_META_KEYS = ("step", "norms", "state_leaves", "hashes", "checkpoint_format")
DAMAGED_DIR = "checkpoints.damaged"
NORM_GROUPS = (("params", "param_norm"), ("opt_state", "opt_state_norm"))
_TMP_SUFFIX = ".orbax-checkpoint-tmp"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or restored faithfully."""


class IntegrityError(CheckpointError):
    """A checkpoint is damaged: what is on disk is not what was saved (or not all of it is there)."""


class NormMismatchError(IntegrityError):
    """The norms recomputed after a restore differ from the ones recorded at save time."""


class NoValidCheckpointError(CheckpointError):
    """Checkpoints exist, and none of them verifies."""


# --------------------------------------------------------------------------------------------- helpers
def _path_str(path: tuple) -> str:
    return jax.tree_util.keystr(path) or "<root>"


def _leaf_to_host(path: tuple, x: Any) -> np.ndarray:
    """A private host copy of one leaf (a copy, so later donation/mutation of the source cannot race)."""
    if isinstance(x, jax.Array):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            raise CheckpointError(
                f"leaf {_path_str(path)} is a typed PRNG key array; store jax.random.key_data(key) "
                "(e.g. as a list of ints in meta) instead"
            )
        if x.is_fully_replicated:
            # Every device holds the whole value: take it once, from one device.
            return np.array(x.addressable_data(0), copy=True)
        if x.is_fully_addressable:
            return np.array(jax.device_get(x), copy=True)
        raise CheckpointError(
            f"leaf {_path_str(path)} is sharded across processes (sharding={x.sharding}); multi-host "
            "checkpoints need a gather first, which this module does not do"
        )
    a = np.array(x, copy=True)
    if a.dtype == object or a.dtype.kind in "OUSV":
        raise CheckpointError(f"leaf {_path_str(path)} has unsupported dtype {a.dtype} (type {type(x)})")
    return a


def to_host(tree: Any) -> Any:
    """Same pytree, every leaf replaced by a host numpy copy (replicated arrays read once)."""
    return jax.tree_util.tree_map_with_path(_leaf_to_host, tree)


def _leaf_spec(path: tuple, a: np.ndarray) -> list:
    return [_path_str(path), list(a.shape), a.dtype.name]


def leaf_hash(a: np.ndarray) -> int:
    """CRC-32 of a leaf's bytes (C order): any changed bit changes it."""
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1))


def state_norms(state: Any) -> dict[str, float]:
    """Norms recorded in a checkpoint: params, opt_state and every other top-level entry.

    For a Mapping state, ``state["params"]`` -> ``param_norm[/group]``, ``state["opt_state"]`` ->
    ``opt_state_norm[/group]``, the remaining entries -> ``other_norm[/key]``. Any other state ->
    ``state_norm[/group]``.
    """
    if not isinstance(state, Mapping):
        return norms_lib.tree_norms(state, "state_norm")
    out: dict[str, float] = {}
    for key, prefix in NORM_GROUPS:
        if key in state:
            out.update(norms_lib.tree_norms(state[key], prefix))
    rest = {k: v for k, v in state.items() if k not in dict(NORM_GROUPS)}
    if jax.tree_util.tree_leaves(rest):
        out.update(norms_lib.tree_norms(rest, "other_norm"))
    return out


def _same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _main_norm_name(norms: Mapping[str, float]) -> str:
    for name in ("param_norm", "state_norm", "opt_state_norm", "other_norm"):
        if name in norms:
            return name
    return next(iter(norms))


def assert_trees_identical(a: Any, b: Any, what: str = "tree") -> None:
    """Raise AssertionError naming the first leaf where `a` and `b` differ (structure, type, shape, dtype,
    or value; NaNs in the same places count as equal). Passes only for bit-identical trees."""
    la, ta = jax.tree_util.tree_flatten_with_path(a)
    lb, tb = jax.tree_util.tree_flatten_with_path(b)
    if ta != tb:
        raise AssertionError(f"{what}: tree structures differ:\n  {ta}\n  {tb}")
    for (path, x), (_, y) in zip(la, lb, strict=True):
        name = f"{what}{_path_str(path)}"
        xs, ys = (isinstance(v, (int, float, bool)) and not isinstance(v, np.generic) for v in (x, y))
        if xs != ys or (xs and type(x) is not type(y)):
            raise AssertionError(f"{name}: leaf types differ: {type(x).__name__} vs {type(y).__name__}")
        xa, ya = np.asarray(jax.device_get(x)), np.asarray(jax.device_get(y))
        if xa.dtype != ya.dtype:
            raise AssertionError(f"{name}: dtypes differ: {xa.dtype} vs {ya.dtype}")
        if xa.shape != ya.shape:
            raise AssertionError(f"{name}: shapes differ: {xa.shape} vs {ya.shape}")
        # Compare bits, not values: distinguishes -0.0 from 0.0 and treats identical NaNs as equal.
        if xa.tobytes() != ya.tobytes():
            bx = np.ascontiguousarray(xa).reshape(-1).view(np.uint8).reshape(xa.size, -1)
            by = np.ascontiguousarray(ya).reshape(-1).view(np.uint8).reshape(ya.size, -1)
            i = int(np.flatnonzero((bx != by).any(axis=1))[0])
            fx, fy = xa.reshape(-1)[i], ya.reshape(-1)[i]
            raise AssertionError(f"{name}: values differ (first at flat index {i}: {fx!r} vs {fy!r})")


# ----------------------------------------------------------------------------------------- checkpointer
class Checkpointer:
    """Orbax-backed checkpoints of ``(state pytree, JSON meta)`` under ``run_dir/subdir``.

    ``save`` is asynchronous by default: it copies the state to host numpy, computes the norms and returns
    while Orbax writes in a background thread. Calling ``save`` again while a save is in flight is safe
    (Orbax waits for the previous one first). ``wait`` blocks until everything is on disk.
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        keep: int | None = 3,
        async_save: bool = True,
        subdir: str = "checkpoints",
    ):
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1 or None (keep all), got {keep}")
        self.directory = Path(run_dir) / subdir if subdir else Path(run_dir)
        self.keep = keep
        self.async_save = async_save
        self._mngr = ocp.CheckpointManager(
            self.directory.absolute(),
            item_names=("state", "meta"),
            options=ocp.CheckpointManagerOptions(
                max_to_keep=None,  # retention is `_retain`'s: it keeps the newest checkpoint that verifies
                enable_async_checkpointing=async_save,
                create=True,
            ),
        )
        #: ``ckpt/...`` metrics of the last successful restore (saved/restored main norm and their ratio).
        self.last_restore: dict[str, float] = {}
        #: Damaged checkpoints `restore_latest` passed over: ``{"checkpoint", "reason", "moved_to"}`` each.
        self.fallbacks: list[dict[str, Any]] = []
        self._verified: set[int] = set()
        self._saved = False  # retention applies once this checkpointer has saved (never on a read)

    # -- save
    def save(self, step: int, state: Any, meta: Mapping[str, Any] | None = None) -> None:
        """Save `state` (any pytree of arrays/scalars) and `meta` (JSON-able dict) as checkpoint `step`."""
        step = int(step)
        meta = dict(meta or {})
        clash = [k for k in RESERVED_META_KEYS if k in meta]
        if clash:
            raise ValueError(f"meta keys {clash} are reserved by the checkpoint module")
        host = to_host(state)
        leaves = jax.tree_util.tree_flatten_with_path(host)[0]
        if not leaves:
            raise CheckpointError("refusing to save a state without array leaves")
        norms = state_norms(host)
        bad = [name for name, v in norms.items() if not math.isfinite(v)]
        if bad:
            raise CheckpointError(
                f"refusing to save step {step}: {bad[0]}={norms[bad[0]]!r} is not finite (a diverged state "
                "would push a finite checkpoint out of the retention window)"
            )
        full_meta = {
            **meta,
            "step": step,
            "norms": norms,
            "state_leaves": [_leaf_spec(p, a) for p, a in leaves],
            "hashes": [leaf_hash(a) for _, a in leaves],
            "checkpoint_format": FORMAT_VERSION,
        }
        try:
            # Snapshot (the caller may mutate its dicts while the async write runs) and fail here, not in
            # a background thread, if something is not JSON-able.
            full_meta = json.loads(json.dumps(full_meta))
        except TypeError as e:
            raise CheckpointError(f"checkpoint meta for step {step} is not JSON-serialisable: {e}") from e
        flat = {f"leaf_{i:06d}": a for i, (_, a) in enumerate(leaves)}
        self.wait()  # the previous save commits (Orbax would wait for it too) and the retention applies
        saved = self._mngr.save(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardSave(flat), meta=ocp.args.JsonSave(full_meta)),
            force=True,
        )
        if not saved:
            raise CheckpointError(f"orbax declined to save step {step} in {self.directory}")
        self._saved = True
        main = _main_norm_name(norms)
        print(f"CKPT_SAVE step={step} {main}={norms[main]!r}", flush=True)

    def wait(self) -> None:
        """Block until every pending save is committed (renamed to its final folder), then apply the
        retention."""
        self._mngr.wait_until_finished()
        self._retain()

    # -- listing
    def all_steps(self) -> list[int]:
        """Committed checkpoints on disk, oldest first (waits for in-flight saves). Orbax renames a step's
        folder to its final name only once every item is written, so a final-named folder that lacks an
        item is damaged (and fails `restore`), not in progress."""
        self.wait()
        return self._committed()

    def _committed(self) -> list[int]:
        self._mngr.reload()
        return sorted(s for s in self._mngr.all_steps() if (self.directory / str(s)).is_dir())

    def latest_step(self) -> int | None:
        """Newest committed checkpoint, or None. ``*.orbax-checkpoint-tmp`` folders are never picked."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    # -- retention
    def verify(self, step: int) -> bool:
        """Whether checkpoint ``step`` reads back from disk as it was saved (every hash and norm); once
        per step and process."""
        if step not in self._verified:
            try:
                meta = self._read_meta_checked(step)
                self._read_verified(step, meta)
            except CheckpointError:  # damaged, or of another format
                return False
            self._verified.add(step)
        return True

    def _retain(self) -> None:
        """Delete checkpoints older than the newest ``keep``, except the newest one that verifies."""
        if self.keep is None or not self._saved:
            return
        steps = self._committed()
        if len(steps) <= self.keep:
            return
        keeper = next((s for s in reversed(steps) if self.verify(s)), None)
        for s in steps[: -self.keep]:
            if s != keeper:
                self._mngr.delete(s)

    # -- restore
    def read_meta(self, step: int) -> dict[str, Any]:
        self._mngr.wait_until_finished()
        out = self._mngr.restore(int(step), args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"])

    def read_arrays(self, step: int, specs: list | None = None) -> dict[str, np.ndarray]:
        """Every saved leaf of checkpoint `step` as numpy, keyed by its recorded path (e.g.
        ``"['params']['encoder']['norm']['scale']"``), without a target tree and without verification:
        for tools that inspect checkpoints (`scripts/compare_ckpt_param_norms.py`). `specs` is the meta's
        ``state_leaves`` when the caller has already read it."""
        specs = self.read_meta(step)["state_leaves"] if specs is None else specs
        abstract = {
            f"leaf_{i:06d}": np.zeros(shape, dtype=_np_dtype(dt)) for i, (_, shape, dt) in enumerate(specs)
        }
        out = self._mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
        return {name: np.asarray(out["state"][f"leaf_{i:06d}"]) for i, (name, _, _) in enumerate(specs)}

    def _read_meta_checked(self, step: int) -> dict[str, Any]:
        """The meta of ``step``, readable and of this format (else `IntegrityError` / `CheckpointError`)."""
        where = self.directory / str(step)
        if not (where / "meta").is_dir() or not (where / "state").is_dir():
            missing = [item for item in ("meta", "state") if not (where / item).is_dir()]
            raise IntegrityError(f"{where}: its {' and '.join(missing)} folder is missing")
        try:
            meta = self.read_meta(step)
        except Exception as e:  # noqa: BLE001 (any failure to read it back is damage)
            raise IntegrityError(f"{where}: meta unreadable ({type(e).__name__}: {e})") from e
        fmt = meta.get("checkpoint_format")
        if fmt != FORMAT_VERSION:
            raise CheckpointError(
                f"{where}: checkpoint format {fmt}, this birdjepa reads format {FORMAT_VERSION} (an older "
                "checkpoint: resume it with the birdjepa that wrote it, or start the run afresh)"
            )
        if meta.get("step") != step or len(meta.get("hashes", ())) != len(meta.get("state_leaves", ())):
            raise IntegrityError(f"{where}: meta does not describe step {step} and its leaves")
        return meta

    def _read_verified(self, step: int, meta: dict[str, Any]) -> dict[str, np.ndarray]:
        """The saved leaves of ``step``, each checked against its recorded shape, dtype and CRC-32."""
        where = self.directory / str(step)
        specs = meta["state_leaves"]
        try:
            flat = self.read_arrays(step, specs)
        except Exception as e:  # noqa: BLE001 (a truncated or missing file fails somewhere in Orbax)
            raise IntegrityError(f"{where}: arrays unreadable ({type(e).__name__}: {str(e)[:300]})") from e
        for (name, shape, dt), crc in zip(specs, meta["hashes"], strict=True):
            a = flat[name]
            if list(a.shape) != shape or a.dtype.name != dt:
                raise IntegrityError(
                    f"{where}: leaf {name} reads back as shape={list(a.shape)} dtype={a.dtype}, recorded "
                    f"shape={shape} dtype={dt}"
                )
            if leaf_hash(a) != crc:
                raise IntegrityError(f"{where}: leaf {name} differs from its recorded CRC-32 (bytes changed)")
        return flat

    def restore(self, step: int, target: Any) -> tuple[Any, dict[str, Any]]:
        """Restore checkpoint `step` into the structure of `target` and verify it.

        `target` is a pytree with the saved structure (e.g. freshly initialised params / opt_state).
        Leaves come back by the target leaf's type: ``jax.Array`` -> placed with the target's sharding,
        ``jax.ShapeDtypeStruct`` -> its sharding if it has one, else numpy; numpy -> numpy; Python
        scalar -> same Python type. Namedtuples etc. come from the target's treedef.
        Raises `IntegrityError` if what is on disk is not what was saved (a hash, a norm, a file) and
        `CheckpointError` if the target's structure, shapes or dtypes are not the saved ones or the
        format is another. Returns ``(state, meta)``.
        """
        step = int(step)
        if step not in self.all_steps():
            raise CheckpointError(f"no complete checkpoint for step {step} in {self.directory}")
        meta = self._read_meta_checked(step)
        tleaves, treedef = jax.tree_util.tree_flatten_with_path(target)
        specs = meta["state_leaves"]
        want = [[_path_str(p), list(np.shape(x)), _dtype_name(x)] for p, x in tleaves]
        if [s[0] for s in specs] != [w[0] for w in want]:
            missing = sorted(set(s[0] for s in specs) - set(w[0] for w in want))
            extra = sorted(set(w[0] for w in want) - set(s[0] for s in specs))
            raise CheckpointError(
                f"checkpoint {step}: target structure differs from the saved one "
                f"(in checkpoint only: {missing[:10]}, in target only: {extra[:10]}, "
                f"{len(specs)} saved leaves vs {len(want)} target leaves)"
            )
        for s, w in zip(specs, want, strict=True):
            if s != w:
                raise CheckpointError(
                    f"checkpoint {step}: leaf {s[0]} saved as shape={s[1]} dtype={s[2]}, "
                    f"target has shape={w[1]} dtype={w[2]}"
                )
        flat = self._read_verified(step, meta)
        names = [name for name, _, _ in specs]
        leaves = [_like_target(flat[name], tgt) for (_, tgt), name in zip(tleaves, names, strict=True)]
        state = jax.tree_util.tree_unflatten(treedef, leaves)

        saved_norms = meta["norms"]
        restored_norms = state_norms(state)  # from what is returned (device arrays read back)
        if set(saved_norms) != set(restored_norms):
            raise NormMismatchError(
                f"checkpoint {step}: norm names differ: saved {sorted(saved_norms)}, "
                f"restored {sorted(restored_norms)}"
            )
        main = _main_norm_name(saved_norms)
        saved, restored = float(saved_norms[main]), restored_norms[main]
        ratio = restored / saved if saved != 0 else (1.0 if restored == 0 else math.inf)
        print(f"CKPT_RESTORE step={step} saved={saved!r} restored={restored!r} ratio={ratio!r}", flush=True)
        for name, value in saved_norms.items():
            if not _same_float(float(value), restored_norms[name]):
                raise NormMismatchError(
                    f"checkpoint {self.directory / str(step)}: {name} saved={float(value)!r} "
                    f"restored={restored_norms[name]!r} (ratio {restored_norms[name] / float(value)!r}); "
                    "the restored state is not the saved state"
                )
        if not (ratio == 1.0 or (math.isnan(saved) and math.isnan(restored))):
            raise NormMismatchError(f"checkpoint {step}: restore ratio {ratio!r} != 1.0")
        self._verified.add(step)
        self.last_restore = {
            "ckpt/restore_step": step,
            "ckpt/restore_norm_saved": saved,
            "ckpt/restore_norm_restored": restored,
            "ckpt/restore_ratio": ratio,
        }
        return state, meta

    def restore_latest(self, target: Any) -> tuple[int, Any, dict[str, Any]] | None:
        """``(step, state, meta)`` of the newest checkpoint that verifies, or None if there is none.
        Each newer one that does not verify is moved aside (see the module doc) and listed in
        `fallbacks`, with a WARNING. Raises `NoValidCheckpointError` when checkpoints exist and none
        verifies."""
        for step in reversed(self.all_steps()):
            try:
                state, meta = self.restore(step, target)
            except IntegrityError as e:
                moved = self._move_aside(step)
                self.fallbacks.append({"checkpoint": step, "reason": str(e), "moved_to": str(moved)})
                print(f"WARNING checkpoint {step} is damaged and was moved to {moved}: {e}", flush=True)
                continue
            return step, state, meta
        if self.fallbacks:
            raise NoValidCheckpointError(
                f"no checkpoint in {self.directory} verifies: {len(self.fallbacks)} damaged ones were moved "
                f"to {self.directory.parent / DAMAGED_DIR} (the newest: {self.fallbacks[0]['reason']})"
            )
        return None

    def _move_aside(self, step: int) -> Path:
        """Move damaged checkpoint ``step`` out of the run's checkpoints (never listed again)."""
        aside = self.directory.parent / DAMAGED_DIR
        aside.mkdir(exist_ok=True)
        dest = aside / str(step)
        n = 1
        while dest.exists():
            dest, n = aside / f"{step}-{n}", n + 1
        shutil.move(str(self.directory / str(step)), str(dest))
        self._mngr.reload()
        return dest

    def close(self) -> None:
        self.wait()
        self._mngr.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _np_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        return np.dtype(jax.numpy.bfloat16)
    return np.dtype(name)


def _dtype_name(x: Any) -> str:
    if isinstance(x, (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic)):
        return np.dtype(x.dtype).name
    return np.asarray(x).dtype.name  # Python scalars: as np.asarray converts them at save time


def _like_target(a: np.ndarray, tgt: Any) -> Any:
    """Give a restored host array the container type of the target leaf."""
    if isinstance(tgt, (bool, int, float)) and not isinstance(tgt, np.generic):
        return type(tgt)(a.item())
    if isinstance(tgt, np.generic):
        return a[()]
    sharding = getattr(tgt, "sharding", None)
    if isinstance(tgt, jax.Array) or (isinstance(tgt, jax.ShapeDtypeStruct) and sharding is not None):
        return jax.device_put(a, sharding)
    return a


# ------------------------------------------------------------------------------------ one-off (debug)
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
