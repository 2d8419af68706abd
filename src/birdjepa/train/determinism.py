"""XLA settings that make a step's result independent of thread timing.

On CPU, XLA's multi-threaded Eigen kernels split reductions across threads in a timing-dependent way:
a run resumed in a new process then drifts from the uninterrupted one in the last bits after a few
steps (measured: the first resumed step's invariance loss differed at 3e-7 relative). Single-threaded
Eigen makes every step bit-reproducible; on GPU the deterministic-ops flag plays the same role.
The flags are read when JAX first initialises its backend, so call this before any computation.
"""

from __future__ import annotations

import os

FLAGS = ("--xla_cpu_multi_thread_eigen=false", "--xla_gpu_deterministic_ops=true")


def deterministic_xla() -> None:
    """Add the determinism flags to XLA_FLAGS (keeping whatever the user set)."""
    current = os.environ.get("XLA_FLAGS", "")
    missing = [f for f in FLAGS if f.split("=")[0] not in current]
    if missing:
        os.environ["XLA_FLAGS"] = " ".join([current, *missing]).strip()
