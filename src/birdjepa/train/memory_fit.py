"""Whether a run's state fits its devices' memory, known from its shapes before an array is allocated.

A model far too large for the machine (``--model.dim 20000``: 38 GB of parameters) first allocated its
parameters one by one: on a GPU, or a CPU process under a memory limit, XLA's ``RESOURCE_EXHAUSTED``
ended it in a traceback; on a CPU host without one, the kernel let the allocations through and its
out-of-memory killer ended the process (and maybe another) without a word. What the parameters, their
gradients and the optimizer state take is known from the config alone (`segment.state_template`), and
is a lower bound of what a step needs: where it is more than the device holds, no step can run.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Any

import jax

GIB = 2**30


class DoesNotFit(ValueError):
    """A run whose state alone is larger than its devices' memory."""


def host_bytes() -> int:
    """The memory this process may use on its host: the physical memory, or less where a cgroup limits
    it (a Slurm job's ``--mem``; the nearest limit on the process's cgroup path, v2 or v1) or a limit of
    the process (``ulimit -v``, ``ulimit -d``: a model 3x too large for one passed, and XLA's
    RESOURCE_EXHAUSTED came after the compile, told to use a smaller batch)."""
    limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for rlimit in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        soft = resource.getrlimit(rlimit)[0]
        if soft != resource.RLIM_INFINITY:
            limit = min(limit, soft)
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return limit
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy, a memory.max at each level
            root, name = Path("/sys/fs/cgroup"), "memory.max"
        elif "memory" in controllers.split(","):
            root, name = Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"
        else:
            continue
        folder = root / path.lstrip("/")
        for level in (folder, *folder.parents):
            if not level.is_relative_to(root):
                break
            try:
                text = (level / name).read_text().strip()
            except OSError:
                continue
            if text.isdigit():  # "max" (v2) is no limit
                limit = min(limit, int(text))
    return limit


def device_bytes(device: jax.Device) -> int | None:
    """What one device holds: an accelerator's memory as its runtime reports it, the host's for a CPU
    device; None where neither is known."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return host_bytes() if device.platform == "cpu" else None


def check_fits(template: dict[str, Any]) -> None:
    """Raise `DoesNotFit` where the parameters, their gradients and the optimizer state of ``template``
    (`segment.state_template`: shapes only) are more than one device holds. Every device holds all of
    them (they are replicated); the CPU devices of one process share its host's memory."""
    nbytes = [sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(template[k])) for k in template]
    params, opt_state = nbytes
    count = sum(a.size for a in jax.tree.leaves(template["params"]))
    devices = jax.local_devices()
    have = device_bytes(devices[0])
    copies = len(devices) if devices[0].platform == "cpu" else 1
    need = (2 * params + opt_state) * copies
    if have is not None and need > have:
        on = f"{copies} CPU devices on one host" if copies > 1 else f"one {devices[0].platform} device"
        raise DoesNotFit(
            f"the model's {count:,} parameters, their gradients and the optimizer state take "
            f"{need / GIB:.1f} GiB on {on}, which holds {have / GIB:.1f} GiB, before a step's activations: "
            "train a smaller model (--model.preset, --model.dim, --model.depth, --model.mlp-ratio), or "
            "resume a run that trained elsewhere on a machine with that memory"
        )


def out_of_memory(e: BaseException) -> str | None:
    """XLA's line where ``e`` is a device running out of memory (a `jax.errors.JaxRuntimeError`, or a
    ValueError where an array is placed on a device; XlaRuntimeError in older JAX), else None."""
    text = str(e).strip()
    if isinstance(e, (RuntimeError, ValueError)) and "RESOURCE_EXHAUSTED" in text:
        return text.splitlines()[0]
    return None


def smaller_step(trained: bool) -> str:
    """What to change after the device ran out of memory in a step: for a run with checkpoints, what
    goes on with it (a smaller batch or model was advised, and a resume refused them: they change what
    the run trains), and what trains in a new run."""
    if not trained:
        return ("a smaller --data.batch-size (--optim.grad-accum keeps the batch an update sees), a smaller "
                "model, or --model.remat")  # fmt: skip
    return ("--model.remat --allow-config-change goes on with this run (activations recomputed, the same "
            "parameters); a smaller --data.batch-size (--optim.grad-accum keeps the batch an update sees) or "
            "a smaller model trains in a new run")  # fmt: skip
