"""The persistent compilation cache: a requeued segment loads its compiled steps instead of compiling them.

Every segment of a preempted run traces and compiles the same step (seconds on a CPU, more on a GPU,
where XLA also autotunes its kernels). birdjepa turns on JAX's persistent compilation cache, in
``$BIRDJEPA_CACHE/xla/<machine key>`` by default (the cache folder of the demo set: ``$BIRDJEPA_CACHE``,
else ``$XDG_CACHE_HOME/birdjepa``, else ``~/.cache/birdjepa``), so the next segment loads the
executable the first one compiled.

The bits: a loaded executable is the one XLA compiled, so a segment computes what it would have computed
compiling afresh. On a GPU it is more: XLA picks each kernel by timing candidates (autotuning), and two
compilations can pick different kernels, with other last bits; JAX keeps XLA's autotuning results in
the same folder (``xla_gpu_per_fusion_autotune_cache_dir``), so even a step compiled again picks the
kernels the first compilation picked (XLA's documentation: compilation is deterministic with persisted
autotuning).

The key: JAX's own key holds the module, the XLA flags and jaxlib's version, but not the CPU's
instruction set or the size of XLA's CPU thread pool, which the compiled code depends on. The folder is
therefore per `birdjepa.train.determinism.machine_kind` (JAX and jaxlib, the device or CPU model and
its thread pool, the dependency lock): another machine kind or JAX never reads an entry.

``BIRDJEPA_COMPILE_CACHE=off`` turns it off, ``BIRDJEPA_COMPILE_CACHE=<folder>`` puts it there (the key
is then yours to keep). A cache that JAX's own ``JAX_COMPILATION_CACHE_DIR`` names is left as it is.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache

from birdjepa.synthetic.demo import default_cache_dir
from birdjepa.train.determinism import machine_kind

ENV = "BIRDJEPA_COMPILE_CACHE"


@functools.cache  # every open_segment asks; the machine does not change within a process
def machine_key() -> str:
    """16 hex digits naming this machine kind (`machine_kind`)."""
    return hashlib.sha256(json.dumps(machine_kind(), sort_keys=True).encode()).hexdigest()[:16]


def cache_dir() -> Path | None:
    """Where this process keeps its compiled steps (None: off, or left to ``JAX_COMPILATION_CACHE_DIR``)."""
    choice = os.environ.get(ENV, "")
    if choice == "off" or (not choice and os.environ.get("JAX_COMPILATION_CACHE_DIR")):
        return None
    return Path(choice) if choice else default_cache_dir() / "xla" / machine_key()


_enabled: str | None = None
"""The folder this process last turned the cache on in ("off": turned off)."""


def enable() -> Path | None:
    """Turn the cache on for the compilations that follow; returns its folder. With
    ``BIRDJEPA_COMPILE_CACHE=off`` it is off, also where ``JAX_COMPILATION_CACHE_DIR`` turned it on."""
    global _enabled
    if os.environ.get(ENV) == "off":
        if _enabled != "off":
            jax.config.update("jax_enable_compilation_cache", False)
            compilation_cache.reset_cache()  # JAX decides once per process whether it uses a cache
            _enabled = "off"
        return None
    folder = cache_dir()
    if folder is not None and _enabled != str(folder):
        folder.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(folder))
        compilation_cache.reset_cache()  # an earlier compilation may have opened another folder
        _enabled = str(folder)
    return folder
