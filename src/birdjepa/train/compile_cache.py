"""The persistent compilation cache: a requeued segment loads its compiled steps instead of compiling them.

Every segment of a preempted run traces and compiles the same step (seconds on a CPU, more on a GPU,
where XLA also autotunes its kernels). birdjepa turns on JAX's persistent compilation cache, in
``$BIRDJEPA_CACHE/xla/<machine key>`` by default (the cache folder of the demo set: ``$BIRDJEPA_CACHE``,
else ``$XDG_CACHE_HOME/birdjepa``, else ``~/.cache/birdjepa``), so the next segment loads the
executable the first one compiled: every program it runs, the small ones too.

The bits: a loaded executable is the one XLA compiled, so a segment computes what it would have computed
compiling afresh. On a GPU it is more: XLA picks each kernel by timing candidates (autotuning), and two
compilations can pick different kernels, with other last bits; JAX keeps XLA's autotuning results in
the same folder (``xla_gpu_per_fusion_autotune_cache_dir``), so even a step compiled again picks the
kernels the first compilation picked (XLA's documentation: compilation is deterministic with persisted
autotuning).

The key: JAX's own key holds the module, the XLA flags and jaxlib's version, but not the CPU's
instruction set, which the compiled code depends on. The folder is therefore per
`birdjepa.train.determinism.machine_kind` (JAX and jaxlib, the device or CPU model, its thread pool and
LAPACK kernels, the dependency lock): another machine kind or JAX never reads an entry. (The thread pool's
size changes a run's bits as it runs, not the program compiled: the split by it costs a compile only.)
JAX's key also holds the cache's folder as given (its GPU autotuning folder is a compile option), so the
folder is resolved first: a relative path or a link to it reads the same entries. A cache copied to
another path compiles its programs again.

``BIRDJEPA_COMPILE_CACHE=off`` (or ``0``, ``false``, ``no``, ``none``, ``disabled``, in any case) turns
it off, ``BIRDJEPA_COMPILE_CACHE=<folder>`` puts the machine-key folders there. A cache that JAX's own
``JAX_COMPILATION_CACHE_DIR`` names is left as it is. A folder that cannot be made is a WARNING and no
cache (a read-only home on a compute node was a traceback); one that can be read but not written (a
shared cache) is read, with one WARNING for the entries not kept.

Entries appear whole: JAX (0.10) writes an entry in place, so a process killed while writing one left
it cut short for good (every later start warned and compiled again), and a process reading it while
another wrote it read part of it (seen in the test suite's shared cache). `_put_whole` writes each entry
under a temporary name and renames it, which a reader sees all at once or not at all.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
from jax._src import compilation_cache as jax_cache_format
from jax._src import lru_cache
from jax.experimental.compilation_cache import compilation_cache

from birdjepa.data import DataError
from birdjepa.synthetic.demo import default_cache_dir
from birdjepa.train.determinism import machine_kind

ENV = "BIRDJEPA_COMPILE_CACHE"
OFF = ("off", "0", "false", "no", "none", "disabled")
"""`ENV`'s values that turn the cache off (stripped, any case): "OFF" made a folder named OFF, cache on."""
JAX_CACHE_VARIABLES = ("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE")


@functools.cache  # every open_segment asks; the machine does not change within a process
def machine_key() -> str:
    """16 hex digits naming this machine kind (`machine_kind`)."""
    return hashlib.sha256(json.dumps(machine_kind(), sort_keys=True).encode()).hexdigest()[:16]


def cache_dir() -> Path | None:
    """Where this process keeps its compiled steps (None: off, or left to ``JAX_COMPILATION_CACHE_DIR``):
    a folder per kind of machine (`machine_key`), under the folder ``BIRDJEPA_COMPILE_CACHE`` names too
    (it held the entries itself: on a shared file system, another kind of machine or JAX loaded them)."""
    choice = os.environ.get(ENV, "").strip()
    if _off() or (not choice and os.environ.get("JAX_COMPILATION_CACHE_DIR")):
        return None
    # JAX's key holds the folder as given (its autotuning folder is one of the compile options): the
    # same folder by a relative path or a link missed every entry and grew a copy of each.
    if choice:
        return _real(Path(choice)) / machine_key()
    try:
        return _real(default_cache_dir()) / "xla" / machine_key()
    except DataError as e:  # no home for it: as a folder that cannot be made, said once
        if "home" not in _unmade:
            _unmade.add("home")
            print(f"WARNING no compilation cache ({e}): each process compiles its steps", flush=True)
        return None


def _real(folder: Path) -> Path:
    return Path(os.path.realpath(folder.expanduser()))


def _off() -> bool:
    return os.environ.get(ENV, "").strip().lower() in OFF


def without_jax_settings(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without JAX's own cache variables (its folder, its thresholds): a ``birdjepa`` process
    started with it keeps its compiled programs as users' runs do (the benchmarks and the tests of this
    module, whose suite sets them for its own cache)."""
    return {k: v for k, v in env.items() if not k.startswith(JAX_CACHE_VARIABLES)}


def compiled_not_loaded(log: str) -> int:
    """The programs a process compiled rather than loaded from the cache, by its ``JAX_LOG_COMPILES=1``
    log: JAX logs a compilation for every program it builds, after a cache hit where it loaded one."""
    return log.count("Finished XLA compilation") - log.count("compilation cache hit")


@functools.cache  # one listener a process
def _cache_hits() -> list[int]:
    hits = [0]

    def count(event: str, **_: object) -> None:
        hits[0] += event == "/jax/compilation_cache/cache_hits"

    jax.monitoring.register_event_listener(count)
    return hits


def cache_loads() -> int:
    """Programs this process has loaded from the persistent compilation cache since it first asked (in
    this process; `compiled_not_loaded` reads another's log)."""
    return _cache_hits()[0]


_enabled: str | None = None
"""The folder this process last turned the cache on in ("off": turned off)."""
_unmade: set[str] = set()
"""Folders this process could not make (said once each)."""


def enable() -> Path | None:
    """Turn the cache on for the compilations that follow; returns its folder. With
    ``BIRDJEPA_COMPILE_CACHE=off`` it is off, also where ``JAX_COMPILATION_CACHE_DIR`` turned it on."""
    global _enabled
    off = _off()
    folder = None if off else cache_dir()
    if folder is not None and _enabled != str(folder) and not _made(folder):
        folder, off = None, True  # a folder that cannot be made: as off
    if off:
        if _enabled != "off":
            jax.config.update("jax_enable_compilation_cache", False)
            compilation_cache.reset_cache()  # JAX decides once per process whether it uses a cache
            _enabled = "off"
        return None
    if folder is not None and _enabled != str(folder):
        jax.config.update("jax_compilation_cache_dir", str(folder))
        # Every program, not only those that took JAX's default second to compile: the 13 small ones a
        # resumed segment runs before its step (key derivation, the resume checks' lookups) were
        # compiled again at every requeue (0.5-0.8 s of CPU here; more per program on a GPU).
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        compilation_cache.reset_cache()  # an earlier compilation may have opened another folder
        _enabled = str(folder)
    return folder


def _made(folder: Path) -> bool:
    """Whether ``folder`` exists or could be made; a WARNING, once a process, where not (a read-only home
    or cache, a file where the folder goes: each was a traceback, and the cache is only a speed-up)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return True
    except OSError as e:
        if str(folder) not in _unmade:
            print(
                f"WARNING the compilation cache {folder} cannot be made ({e.strerror or e}): each process "
                f"compiles its steps; give {ENV}=<a folder you can write>, or {ENV}=off",
                flush=True,
            )
            _unmade.add(str(folder))
        return False


_jax_put = lru_cache.LRUCache.put
_jax_get = lru_cache.LRUCache.get
_read: set[str] = set()
"""Keys this process read an entry of: put again, that entry failed to load (JAX compiles, then puts)."""
_UMASK = os.umask(0)
os.umask(_UMASK)  # read once, at import: the mode JAX's in-place write gave its entries


def _put_whole(self: lru_cache.LRUCache, key: str, value: bytes) -> None:
    """`LRUCache.put` without its size cap (JAX's default, the only one birdjepa sets), on a local file
    system: the entry is written to a temporary file in the cache's folder and renamed into place
    (atomic). A killed writer leaves that ``.<key>.*.tmp`` file, which JAX never reads. With a cap, or
    a remote folder, JAX's own put, whose lock and eviction this does not redo."""
    if self.eviction_enabled or not key or not lru_cache._is_local_filesystem(str(self.path)):
        return _jax_put(self, key, value)
    path = self.path / f"{key}{lru_cache._CACHE_SUFFIX}"
    # As JAX's: the first writer's entry stays (another process's, written since this one looked), unless
    # it is damaged: cut short, or read here and failed to load (decompressed, then not an executable:
    # every later segment warned and compiled again).
    if path.exists() and key not in _read and _whole(path):
        return None
    try:
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=f".{key}.", suffix=".tmp")
    except OSError as e:  # a shared cache read-only here: JAX warned twice a program
        _not_written(self.path, e)
        return None
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would hide a shared folder's entries from others
        with os.fdopen(fd, "wb") as f:
            f.write(value)
        os.replace(tmp, path)
    except OSError as e:  # a full disk or quota: JAX warned twice a program, 8 programs a run
        Path(tmp).unlink(missing_ok=True)
        _not_written(self.path, e)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return None


def _not_written(folder: Path, e: OSError) -> None:
    """The WARNING, once a process and folder, that ``folder`` takes no entry."""
    if str(folder) not in _unwritable:
        print(f"WARNING the compilation cache {folder} takes no new entry ({e.strerror}): the programs "
              "compiled here are not kept", flush=True)  # fmt: skip
        _unwritable.add(str(folder))


_unwritable: set[str] = set()
"""Cache folders this process found it cannot write (said once each)."""


def _whole(entry: Path) -> bool:
    """Whether a cache entry decompresses: one cut short (written in place by an older birdjepa or JAX,
    or damaged on disk) failed to load at every start, compiled again, and was never replaced."""
    try:
        jax_cache_format.decompress_executable(entry.read_bytes())
        return True
    except OSError:
        return True  # gone meanwhile, or unreadable: not this writer's to replace
    except Exception:  # noqa: BLE001 (zlib's and zstandard's errors: any failure to decompress)
        return False


def _get_noted(self: lru_cache.LRUCache, key: str) -> bytes | None:
    """`LRUCache.get`, noting the keys it found an entry of (`_read`)."""
    value = _jax_get(self, key)
    if value is not None:
        _read.add(key)
    return value


lru_cache.LRUCache.put = _put_whole  # type: ignore[method-assign]
lru_cache.LRUCache.get = _get_noted  # type: ignore[method-assign]


def compiled_afresh(lowered: Any) -> Any:
    """``lowered`` compiled here, neither loaded from the cache nor kept in it. The cache's key (JAX's)
    leaves out the module's debug information, so a loaded program's instructions carry the name stacks
    of whichever code compiled it first: a named scope added since (which the step's profile reads,
    `birdjepa.perf.profile`) would not show until its entry left the cache."""
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    jax.clear_caches()  # JAX keeps the executables it compiled or loaded in memory too, by module
    try:
        return lowered.compile({})  # options given: not the executable ``lowered`` keeps
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
