"""The cores this process may run on: what its worker pools and thread pools are sized from."""

from __future__ import annotations

import os


def schedulable_cpus() -> int:
    """The cores this process may run on (its affinity mask: a Slurm allocation, a taskset)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_said(n: int, what: str = "decode thread") -> str:
    """``n`` threads, and where they outnumber the cores this process may run on, that they take turns
    (--data.n-workers 64 on an 8-core allocation was said nowhere)."""
    cpus = schedulable_cpus()
    more = f" (more than the {cpus} CPUs this process may run on: they take turns)" if n > cpus else ""
    return f"{n} {what}{'s' * (n != 1)}{more}"
