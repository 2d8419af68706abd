"""The cores this process may run on: what its worker pools and thread pools are sized from."""

from __future__ import annotations

import os


def schedulable_cpus() -> int:
    """The cores this process may run on (its affinity mask: a Slurm allocation, a taskset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
