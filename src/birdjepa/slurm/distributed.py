"""Several processes training one model, data parallel: joining the group.

A process joins a group when it is one of several tasks: started by ``srun`` in a Slurm job step
(``SLURM_NTASKS`` > 1; JAX reads the coordinator, process count and rank from Slurm's environment) or
with ``BIRDJEPA_NUM_PROCESSES``, ``BIRDJEPA_PROCESS_ID`` and ``BIRDJEPA_COORDINATOR`` set (the local
equivalent, used by ``birdjepa sweep --local``). On CPU the collectives run over gloo.

What the processes of a group do together once joined (their rows of the global batch, arrays to the
host, agreeing on a flag) is `birdjepa.multihost`; what they agree on about the run's folder (its
checkpoints, its lease) is here.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import jax

from birdjepa import exit_codes, multihost
from birdjepa.rundir import layout
from birdjepa.rundir.lease import Lease, LeaseLost


def launched_tasks() -> int:
    """How many processes this one was started as part of (1 when alone)."""
    if os.environ.get("BIRDJEPA_NUM_PROCESSES"):
        return int(os.environ["BIRDJEPA_NUM_PROCESSES"])
    if os.environ.get("SLURM_STEP_ID") is not None and os.environ.get("SLURM_NTASKS"):
        return int(os.environ["SLURM_NTASKS"])
    return 1


def launched_rank() -> int:
    """This process's rank among the tasks it was started with, read before joining (0 when alone)."""
    if launched_tasks() <= 1:
        return 0
    return int(os.environ.get("BIRDJEPA_PROCESS_ID") or os.environ.get("SLURM_PROCID") or 0)


def initialize() -> None:
    """Join the process group if this process is one of several tasks (no-op otherwise). Must run
    before any JAX computation."""
    n = launched_tasks()
    if n <= 1:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    local = bool(os.environ.get("BIRDJEPA_NUM_PROCESSES"))
    if local and launched_rank() == 0 and (taken := port_taken(os.environ["BIRDJEPA_COORDINATOR"])):
        _cannot_join(n, taken, f"BIRDJEPA_COORDINATOR={os.environ['BIRDJEPA_COORDINATOR']}")
    try:
        if local:
            jax.distributed.initialize(
                coordinator_address=os.environ["BIRDJEPA_COORDINATOR"],
                num_processes=n,
                process_id=int(os.environ["BIRDJEPA_PROCESS_ID"]),
            )
        else:
            jax.distributed.initialize()  # JAX's Slurm detection: coordinator, count and rank from srun
    except jax.errors.JaxRuntimeError as e:  # a traceback; the others waited 300 s for it, then aborted
        where = f"BIRDJEPA_COORDINATOR={os.environ['BIRDJEPA_COORDINATOR']}" if local else "from Slurm's job"
        _cannot_join(n, str(e).strip().splitlines()[0], where)


def port_taken(address: str) -> str | None:
    """Why the coordinator cannot serve on ``address``'s port (HOST:PORT), or None. Asked before JAX
    binds it (on every interface), which on a port in use raised a traceback or, as often, crashed the
    process with a segmentation fault."""
    port = int(address.rpartition(":")[2])
    for family, anywhere in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        with socket.socket(family) as s:
            try:
                s.bind((anywhere, port))
                return None
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return f"its port {port} is in use by another program"
    return None  # neither family here: JAX finds out


def _cannot_join(n: int, said: str, where: str) -> NoReturn:
    print(
        f"error: process {launched_rank()} of {n} could not join the process group ({said}; the "
        f"coordinator's address {where}); exit {exit_codes.GROUP_BROKEN}",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(exit_codes.GROUP_BROKEN) from None


def group_hold(lease: Lease | None, run_dir: Path) -> Callable[[], None]:
    """`Lease.check`, decided for every process together (a collective where there are several): process
    0 alone holds the lease, and when it alone stopped, the others waited for it in their next
    collective, and it for them in its exit, for ever."""

    def hold() -> None:
        lost = None
        if lease is not None:
            try:
                lease.check()
            except LeaseLost as e:
                lost = e
        if multihost.any_process(lost is not None):
            raise lost or LeaseLost(run_dir, None, None)

    return hold


def same_checkpoints(run_dir: Path) -> None:
    """Exit 2 in every process of a group, in one line, unless each finds the same checkpoints in
    ``run_dir`` (a collective). A run folder on each node's own disk under one name (a node-local
    --log.runs-dir) trained its first segment, and the resume, read in one process alone, aborted the group
    in gloo with a C++ stack."""
    ckpts = layout.checkpoints(run_dir)
    found = " ".join(sorted(p.name for p in ckpts.iterdir())) if ckpts.is_dir() else ""
    differs = multihost.first_disagreement({"checkpoints": found})
    if differs is not None:
        print(f"error: the processes of the group find other {differs} in {run_dir}: it must be one "
              "folder that every process reads (a shared file system, not a node's own disk)",
              file=sys.stderr, flush=True)  # fmt: skip
        raise SystemExit(exit_codes.USAGE)
