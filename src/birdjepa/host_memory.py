"""The process's host memory kept for reuse: a CPU step stops faulting its working memory in every step.

XLA's CPU runtime takes a step's working memory from ``malloc`` anew in every execution (1.3 GB at the
base preset, batch 2), from threads of its own. glibc gives such a thread an arena of its own, and an
arena other than the main one serves a request that large by ``mmap`` and gives it back by
``munmap``: every step then faults the whole buffer in again, page by page, the kernel zeroing each
(at base, batch 2, on 2 cores: 340,000 faults and 0.57 s of system time a step, which took 1.66x as
long as it does without them). With one arena (the main one: the heap), no ``mmap`` for large requests
and no trimming of the heap's top, the buffer freed by a step is the one the next step takes: no
faults from the third step on (`scripts/bench_host_memory.py`; tests/test_host_memory.py). The step
computes the same bits: the suite runs with it, and its step-digest test holds them.

What it costs: memory freed is kept by the process (its resident size stays at its peak), every
thread allocates from one arena (glibc's per-thread caches still take the small requests without a
lock), and so XLA's compiler threads wait on one another: a cold compile of the base step took 1.15x
as long (18.5-21.4 s against 16.9-17.5). A CPU step gains that back within its first steps; a step on
an accelerator gains nothing (its working memory is the device's), so where JAX has an accelerator
plugin installed and ``JAX_PLATFORMS`` does not ask for the CPU, nothing changes. The `birdjepa`
command applies it before JAX starts its threads; importing birdjepa does not. glibc only
(``mallopt``); elsewhere nothing changes either.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import platform

#: ``mallopt``'s parameters (glibc's malloc.h).
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8

#: What `keep_for_reuse` sets: (``mallopt``'s parameter, its glibc tunable, the value). One arena, no
#: ``mmap`` for large blocks, and a trim threshold of the largest size: the heap's top is never given
#: back (``mallopt`` reads -1 as the largest size; a tunable takes it as a number).
SETTINGS = (
    (M_ARENA_MAX, "arena_max", 1),
    (M_MMAP_MAX, "mmap_max", 0),
    (M_TRIM_THRESHOLD, "trim_threshold", -1),
)

#: The same settings as glibc tunables (``GLIBC_TUNABLES``, read when a process starts), for the
#: process of a program that does not call `keep_for_reuse` (`scripts/bench_reference.py --host-memory
#: reuse`, where both sides' steps run so).
TUNABLES = ":".join(f"glibc.malloc.{name}={value % 2**64}" for _, name, value in SETTINGS)

#: Set to "system" to keep the C library's defaults (a process that must give memory back).
ENV = "BIRDJEPA_HOST_MEMORY"


def steps_on_cpu() -> bool:
    """Whether JAX will run the step on the CPU, known before its backend starts: ``JAX_PLATFORMS``
    asks for it, or no accelerator plugin (CUDA, ROCm: JAX's ``jax_plugins``; TPU: libtpu) is
    installed."""
    asked = os.environ.get("JAX_PLATFORMS", "").lower()
    if asked:
        return asked.split(",")[0].strip() == "cpu"
    plugins = importlib.metadata.entry_points(group="jax_plugins")
    return not plugins and importlib.util.find_spec("libtpu") is None


def keep_for_reuse() -> bool:
    """One malloc arena, no ``mmap`` for large blocks, no trimming (see the module doc). Call it before
    anything starts threads that allocate (JAX's backend). Returns whether it was applied: False off
    glibc, where the step runs on an accelerator (`steps_on_cpu`) or with
    ``BIRDJEPA_HOST_MEMORY=system``; `ValueError` for another value."""
    value = os.environ.get(ENV, "reuse")
    if value not in ("reuse", "system"):  # "System", "off": taken for "reuse", unsaid
        raise ValueError(f"{ENV}={value!r}: give 'reuse' (the default) or 'system'")
    if value == "system" or platform.libc_ver()[0] != "glibc" or not steps_on_cpu():
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    return all(libc.mallopt(p, v) == 1 for p, _, v in SETTINGS)
