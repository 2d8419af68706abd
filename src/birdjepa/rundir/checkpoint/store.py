"""`Checkpointer`: the Orbax adapter that writes and reads checkpoints of ``(state pytree, JSON meta)``.

The format is `birdjepa.rundir.checkpoint.format`; the hashes and norms it verifies are
`birdjepa.rundir.checkpoint.integrity`'s; retention and fallback across steps come from
`birdjepa.rundir.checkpoint.retention`. Saving refuses a state whose norms are not finite.

Completeness: on a local filesystem Orbax 0.12.8 writes a step into ``<step>.orbax-checkpoint-tmp`` and
renames it to ``<step>`` when every item is committed (it also drops ``commit_success.txt`` files, which
is the marker it uses instead on GCS). A crash leaves at most a ``*.orbax-checkpoint-tmp`` folder, which
Orbax never lists as a step; ``latest_step`` additionally requires both item folders.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import jax
import numpy as np
import orbax.checkpoint as ocp

from birdjepa.outputs import free_bytes, mib
from birdjepa.rundir.checkpoint.format import (
    FORMAT_VERSION,
    FORMATS_READ,
    RESERVED_META_KEYS,
    CheckpointError,
    IntegrityError,
    NormMismatchError,
    NotFiniteError,
    StructureError,
    dtype_name,
    leaf_spec,
    like_target,
    np_dtype,
    path_str,
    to_host,
)
from birdjepa.rundir.checkpoint.integrity import leaf_hash, main_norm_name, meta_crc, same_float, state_norms
from birdjepa.rundir.checkpoint.retention import RetentionAndFallback
from birdjepa.rundir.checkpoint.space import (
    CheckpointWriteError,
    folder_bytes,
    quiet_orbax_errors,
    reason,
    remove_temporaries,
)
from birdjepa.rundir.layout import CHECKPOINTS

T = TypeVar("T")

#: Seconds `Checkpointer.meta_unless_pruned` waits for a checkpoint that failed to read to be gone.
PRUNE_WAIT_S = 2.0


def guarded_commits(before_commit: Callable[[], None], refused: list[BaseException]) -> type:
    """Orbax's temporary folder of a save, renamed into place only where ``before_commit()`` raises
    nothing (the run's lease is still this process's); what it raised goes into ``refused``. A process
    stopped with a save in flight (a suspended job) and taken over meanwhile committed that save into the
    taker's run once it woke, in the background, after its own loop had stopped writing. The refused
    folder is left where it is: Orbax names it by the step, so it may be the taker's own save of that
    step by then; the taker's next save of the step or start removes it (`remove_temporaries`). Orbax
    0.12.8's ``temporary_path_class`` (deprecated for atomicity modes, which take no check) is the one
    hook between a save's writes and its rename; it is called for each item, then the step."""

    class GuardedRename(ocp.path.atomicity.AtomicRenameTemporaryPath):
        async def finalize(self) -> None:
            try:
                before_commit()
            except BaseException as e:
                refused.append(e)
                raise
            await super().finalize()

    return GuardedRename


def relisted(list_once: Callable[[], T], tries: int = 20) -> T:
    """``list_once()``, called again where a step folder went between Orbax's listing of the checkpoints
    folder and its look into each (its time, its items): a live trainer's retention removed it, and a
    reader on the live run (`trace`, `bisect`, `evaluate`) raised FileNotFoundError. Listed again, the
    step is gone."""
    for _ in range(tries - 1):
        try:
            return list_once()
        except (FileNotFoundError, NotADirectoryError):
            time.sleep(0.05)
    return list_once()


class Checkpointer(RetentionAndFallback):
    """Orbax-backed checkpoints of ``(state pytree, JSON meta)`` under ``run_dir/subdir``.

    ``save`` is asynchronous by default: it copies the state to host numpy, computes the norms and returns
    while Orbax writes in a background thread. Calling ``save`` again while a save is in flight is safe
    (Orbax waits for the previous one first). ``wait`` blocks until everything is on disk.

    A save that cannot be written (a full disk, any I/O error) raises `CheckpointWriteError` from
    ``save`` or, written in the background, from the next ``wait`` or ``save``; after it nothing in the
    run is deleted by the retention (`birdjepa.rundir.checkpoint.space`).
    """

    def __init__(
        self,
        run_dir: str | Path,
        *,
        keep: int | None = 3,
        async_save: bool = True,
        subdir: str = CHECKPOINTS,
        create: bool = True,
        before_commit: Callable[[], None] | None = None,
    ):
        """``create``: make the folder now (a writer's); False for a reader, which leaves a run without
        checkpoints as it found it. ``before_commit``: called as each save is renamed into place, from
        Orbax's thread; where it raises, the save is left out and the next ``wait`` or ``save`` raises
        that exception (`guarded_commits`)."""
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be >= 1 or None (keep all), got {keep}")
        self.directory = Path(run_dir) / subdir if subdir else Path(run_dir)
        self.keep = keep
        self.async_save = async_save
        self._refused: list[BaseException] = []  # what `before_commit` raised, in Orbax's thread
        quiet_orbax_errors()  # before the manager, whose listing reads every checkpoint's metadata
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,  # retention is `_retain`'s: it keeps the newest checkpoint that verifies
            enable_async_checkpointing=async_save,
            create=create,
            temporary_path_class=guarded_commits(before_commit, self._refused) if before_commit else None,
        )
        self._mngr = relisted(
            lambda: ocp.CheckpointManager(
                self.directory.absolute(), item_names=("state", "meta"), options=options
            )
        )
        #: ``ckpt/...`` metrics of the last successful restore (saved/restored main norm and their ratio).
        self.last_restore: dict[str, float] = {}
        #: Damaged checkpoints `restore_latest` passed over: ``{"checkpoint", "reason", "moved_to"}`` each.
        self.fallbacks: list[dict[str, Any]] = []
        self._verified: set[int] = set()
        self._kept_against_policy: set[int] = set()  # old checkpoints that could not be removed (said once)
        self.warnings: list[str] = []  # said since the caller last took them (`take_warnings`), for its log
        self._saved = False  # retention applies once this checkpointer has saved (never on a read)
        self._in_flight: int | None = None  # the step Orbax may still be writing
        self.write_failed = False  # a save failed: retention deletes nothing more, `close` raises no more

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
            raise NotFiniteError(step, bad[0], norms[bad[0]])
        full_meta = {
            **meta,
            "step": step,
            "norms": norms,
            "state_leaves": [leaf_spec(p, a) for p, a in leaves],
            "hashes": [leaf_hash(a) for _, a in leaves],
            "checkpoint_format": FORMAT_VERSION,
        }
        try:
            # Snapshot (the caller may mutate its dicts while the async write runs) and fail here, not in
            # a background thread, if something is not JSON-able.
            full_meta = json.loads(json.dumps(full_meta))
        except TypeError as e:
            raise CheckpointError(f"checkpoint meta for step {step} is not JSON-serialisable: {e}") from e
        full_meta["meta_crc"] = meta_crc(full_meta)
        flat = {f"leaf_{i:06d}": a for i, (_, a) in enumerate(leaves)}
        self.wait()  # the previous save commits (Orbax would wait for it too) and the retention applies
        self._in_flight = step
        try:
            saved = self._mngr.save(
                step,
                args=ocp.args.Composite(state=ocp.args.StandardSave(flat), meta=ocp.args.JsonSave(full_meta)),
                force=True,
            )
        except Exception as e:  # noqa: BLE001 (everything it checks was checked above: what fails is the write)
            self._raise_refused()  # a synchronous save commits here, in this thread
            raise self._failed_write(step, e) from e
        if not saved:
            raise CheckpointError(f"orbax declined to save step {step} in {self.directory}")
        self._saved = True
        main = main_norm_name(norms)
        print(f"CKPT_SAVE step={step} {main}={norms[main]!r}", flush=True)

    def take_warnings(self) -> list[str]:
        """The WARNINGs printed since the last call (an old checkpoint retention could not remove), for a
        log that records them as events: the console alone held them."""
        taken, self.warnings = self.warnings, []
        return taken

    def wait(self) -> None:
        """Block until every pending save is committed (renamed to its final folder), then apply the
        retention. Raises `CheckpointWriteError` if a save could not be written."""
        try:
            self._mngr.wait_until_finished()
        except Exception as e:  # noqa: BLE001 (the background writer's failure, re-raised by Orbax)
            self._raise_refused()
            raise self._failed_write(self._in_flight, e) from e
        self._in_flight = None
        self._retain()

    def _raise_refused(self) -> None:
        """What ``before_commit`` raised, where it refused the save that failed: no failed write (its
        report would remove the run's temporary folders, the taker's among them)."""
        if self._refused:  # one a save: Orbax stops at the first item refused
            self._in_flight, refused = None, self._refused[0]
            self._refused.clear()
            raise refused from None

    def _failed_write(self, step: int | None, e: BaseException) -> CheckpointWriteError:
        """After a save of ``step`` failed: its temporary folders removed, the retention stopped, and the
        one-line error (what, where, the free space, the newest intact checkpoint)."""
        self.write_failed, self._in_flight = True, None
        # Orbax's writer threads may still be writing the failed step's other arrays (a save in the step's
        # thread raised at its first failed write): removed under them, its temporary folder stayed.
        with contextlib.suppress(Exception):
            self._mngr.wait_until_finished()
        remove_temporaries(self.directory)
        intact = next((s for s in reversed(self._committed()) if self.verify(s)), None)
        size = folder_bytes(self.directory / str(intact)) if intact is not None else None
        newest = f"the newest intact checkpoint is {intact}" if intact is not None else "no checkpoint yet"
        takes = f", a checkpoint takes {mib(size)}" if size is not None else ""  # "takes ?" before the first
        return CheckpointWriteError(
            f"could not write checkpoint {step} to {self.directory}: {reason(e)} "
            f"({mib(free_bytes(self.directory))} free there{takes}); {newest}"
        )

    def room(self) -> tuple[int, int | None]:
        """``(free bytes, bytes of the newest checkpoint)`` where checkpoints go (None: no checkpoint yet);
        waits for a save in flight."""
        steps = self.all_steps()
        return free_bytes(self.directory), folder_bytes(self.directory / str(steps[-1])) if steps else None

    # -- listing
    def all_steps(self) -> list[int]:
        """Committed checkpoints on disk, oldest first (waits for in-flight saves). Orbax renames a step's
        folder to its final name only once every item is written, so a final-named folder that lacks an
        item is damaged (and fails `restore`), not in progress."""
        self.wait()
        return self._committed()

    def _committed(self) -> list[int]:
        def once() -> list[int]:
            self._mngr.reload()
            return sorted(s for s in self._mngr.all_steps() if (self.directory / str(s)).is_dir())

        return relisted(once)

    def latest_step(self) -> int | None:
        """Newest committed checkpoint, or None. ``*.orbax-checkpoint-tmp`` folders are never picked."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    # -- restore
    def read_meta(self, step: int) -> dict[str, Any]:
        self._mngr.wait_until_finished()
        out = self._mngr.restore(int(step), args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"])

    def meta_unless_pruned(self, step: int) -> dict[str, Any] | None:
        """`read_meta`, or None where checkpoint ``step`` was removed while it was read (a live trainer's
        retention): a reader on a live run (`trace`, `bisect`) raised a KeyError ("Item meta was not
        found"), a FileNotFoundError or "Found incomplete checkpoint", and lost what it had computed."""
        try:
            return self.read_meta(step)
        except (KeyError, OSError, ValueError):
            deadline = time.monotonic() + PRUNE_WAIT_S  # a removal under way ends in milliseconds
            while time.monotonic() < deadline:
                if step not in self._committed():
                    return None
                time.sleep(0.05)
            raise

    def read_arrays(self, step: int, specs: list | None = None) -> dict[str, np.ndarray]:
        """Every saved leaf of checkpoint `step` as numpy, keyed by its recorded path (e.g.
        ``"['params']['encoder']['norm']['scale']"``), without a target tree and without verification:
        for tools that inspect checkpoints (`scripts/compare_ckpt_param_norms.py`). `specs` is the meta's
        ``state_leaves`` when the caller has already read it."""
        specs = self.read_meta(step)["state_leaves"] if specs is None else specs
        abstract = {
            f"leaf_{i:06d}": np.zeros(shape, dtype=np_dtype(dt)) for i, (_, shape, dt) in enumerate(specs)
        }
        out = self._mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))
        return {name: np.asarray(out["state"][f"leaf_{i:06d}"]) for i, (name, _, _) in enumerate(specs)}

    def checked_meta(self, step: int) -> dict[str, Any]:
        """The meta of ``step``, readable and of this format (else `IntegrityError` / `CheckpointError`)."""
        where = self.directory / str(step)
        if not (where / "meta").is_dir() or not (where / "state").is_dir():
            missing = [item for item in ("meta", "state") if not (where / item).is_dir()]
            folders = "folders are" if len(missing) > 1 else "folder is"
            raise IntegrityError(f"{where}: its {' and '.join(missing)} {folders} missing")
        try:
            meta = self.read_meta(step)
        except Exception as e:  # noqa: BLE001 (any failure to read it back is damage)
            raise IntegrityError(f"{where}: meta unreadable ({type(e).__name__}: {e})") from e
        # The CRC-32 first, whatever format the meta claims (its definition holds for every format from 3
        # on): one changed bit made format 3 read as 7, "a newer birdjepa wrote it", exit 65, and the
        # older checkpoint that verifies was never tried.
        if "meta_crc" in meta and meta["meta_crc"] != meta_crc(meta):
            raise IntegrityError(f"{where}: meta differs from its recorded CRC-32 (bytes changed)")
        fmt = meta.get("checkpoint_format")
        if fmt not in FORMATS_READ:
            raise CheckpointError(
                f"{where}: checkpoint format {fmt}, this birdjepa reads formats "
                f"{', '.join(map(str, FORMATS_READ))} (a newer birdjepa wrote it: resume with that one)"
            )
        if fmt >= 3 and meta.get("meta_crc") != meta_crc(meta):
            raise IntegrityError(f"{where}: meta differs from its recorded CRC-32 (bytes changed)")
        crcs_missing = fmt >= 2 and len(meta.get("hashes", ())) != len(meta.get("state_leaves", ()))
        if meta.get("step") != step or crcs_missing:
            raise IntegrityError(f"{where}: meta does not describe step {step} and its leaves")
        return meta

    def _read_verified(self, step: int, meta: dict[str, Any]) -> dict[str, np.ndarray]:
        """The saved leaves of ``step``, each checked against its recorded shape, dtype and CRC-32 (format 1
        recorded none: its leaves are checked by the norms, in `restore`)."""
        where = self.directory / str(step)
        specs = meta["state_leaves"]
        crcs = meta.get("hashes") or [None] * len(specs)
        try:
            flat = self.read_arrays(step, specs)
        except Exception as e:  # noqa: BLE001 (a truncated or missing file fails somewhere in Orbax)
            raise IntegrityError(f"{where}: arrays unreadable ({type(e).__name__}: {str(e)[:300]})") from e
        for (name, shape, dt), crc in zip(specs, crcs, strict=True):
            a = flat[name]
            if list(a.shape) != shape or a.dtype.name != dt:
                raise IntegrityError(
                    f"{where}: leaf {name} reads back as shape={list(a.shape)} dtype={a.dtype}, recorded "
                    f"shape={shape} dtype={dt}"
                )
            if crc is not None and leaf_hash(a) != crc:
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
        meta = self.checked_meta(step)
        tleaves, treedef = jax.tree_util.tree_flatten_with_path(target)
        specs = meta["state_leaves"]
        want = [[path_str(p), list(np.shape(x)), dtype_name(x)] for p, x in tleaves]
        if [s[0] for s in specs] != [w[0] for w in want]:
            missing = sorted(set(s[0] for s in specs) - set(w[0] for w in want))
            extra = sorted(set(w[0] for w in want) - set(s[0] for s in specs))
            apart = [f"{len(names)} in the {where} only, e.g. {names[0]}"
                     for names, where in ((missing, "checkpoint"), (extra, "target")) if names]  # fmt: skip
            apart.append(f"{len(specs)} saved leaves vs {len(want)} target leaves")
            raise StructureError(
                step, f"checkpoint {step}: target structure differs from the saved one ({'; '.join(apart)})"
            )
        for s, w in zip(specs, want, strict=True):
            if s != w:
                raise StructureError(
                    step,
                    f"checkpoint {step}: leaf {s[0]} saved as shape={s[1]} dtype={s[2]}, "
                    f"target has shape={w[1]} dtype={w[2]}",
                )
        flat = self._read_verified(step, meta)
        names = [name for name, _, _ in specs]
        leaves = [like_target(flat[name], tgt) for (_, tgt), name in zip(tleaves, names, strict=True)]
        state = jax.tree_util.tree_unflatten(treedef, leaves)

        saved_norms = meta["norms"]
        restored_norms = state_norms(state)  # from what is returned (device arrays read back)
        if set(saved_norms) != set(restored_norms):
            raise NormMismatchError(
                f"checkpoint {step}: norm names differ: saved {sorted(saved_norms)}, "
                f"restored {sorted(restored_norms)}"
            )
        main = main_norm_name(saved_norms)
        saved, restored = float(saved_norms[main]), restored_norms[main]
        ratio = restored / saved if saved != 0 else (1.0 if restored == 0 else math.inf)
        print(f"CKPT_RESTORE step={step} saved={saved!r} restored={restored!r} ratio={ratio!r}", flush=True)
        for name, value in saved_norms.items():
            if not same_float(float(value), restored_norms[name]):
                raise NormMismatchError(
                    f"checkpoint {self.directory / str(step)}: {name} saved={float(value)!r} "
                    f"restored={restored_norms[name]!r} (ratio {restored_norms[name] / float(value)!r}); "
                    "the restored state is not the saved state"
                )
        if not (ratio == 1.0 or (math.isnan(saved) and math.isnan(restored))):
            raise NormMismatchError(f"checkpoint {step}: restore ratio {ratio!r} != 1.0")
        if meta["checkpoint_format"] < FORMAT_VERSION:
            fmt = meta["checkpoint_format"]
            how = (f"without CRC-32s: verified by its {len(saved_norms)} norms only" if fmt == 1 else
                   "without a CRC-32 of its meta: its leaves verified by theirs")  # fmt: skip
            print(f"CKPT_FORMAT checkpoint {step} is of format {fmt}, {how}; the next save writes format "
                  f"{FORMAT_VERSION}", flush=True)  # fmt: skip
        self._verified.add(step)
        self.last_restore = {
            "ckpt/restore_step": step,
            "ckpt/restore_norm_saved": saved,
            "ckpt/restore_norm_restored": restored,
            "ckpt/restore_ratio": ratio,
        }
        return state, meta

    def close(self) -> None:
        if not self.write_failed:  # else Orbax would raise the failed write again
            self.wait()
        try:
            self._mngr.close()
        except Exception:  # noqa: BLE001
            if not self.write_failed:
                raise
        if self.write_failed:  # again, its writers closed: one still writing (under load) made it anew
            remove_temporaries(self.directory)

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
