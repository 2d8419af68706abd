"""Where a step of `birdjepa pretrain`'s loop goes, part by part: a real run with a clock on each call
the loop makes for a step (``scripts/bench_loop.py`` runs one and prints the table).

On a GPU the loop's step is more than the step's executable: on an H200 (2026-11-27) a step of the
small preset at batch 128 took 130.7 ms in the loop against 44.9 ms for the executable alone, 36 % of
it waiting for data. `clock_the_loop` wraps each of the calls a step makes in a clock, in this
process, before it runs `birdjepa pretrain` (a few microseconds a step; no value changes), and
`per_step_ms` gives, per step, the median over the steps after the first few of:

- the loader's next batch (the data wait);
- the step's inputs, less putting the batch on the devices: its PRNG key, the monitor's schedule;
- putting the batch on the devices;
- the step's call, less waiting for the compile-ahead thread (the first step only): the dispatch;
- waiting for the step's outputs (``jax.block_until_ready``, which their copy would wait for anyway:
  on a GPU, the device's time not hidden behind the host's work), then copying them to the host;
- other copies to the host; a logged step's parameters copied on the device for their norms, and the
  wait for those norms at the next step's end (taken on a thread meanwhile: `train.param_norms`;
  the thread's own time is no part of the loop's), the callbacks, the metrics log;
- the rest of the loop's period (from one step's inputs to the next's): evaluation, saves, printing.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax

#: The parts, in the loop's order (the rest comes last).
PARTS = (
    "next batch", "step inputs", "batch to device", "step call (dispatch)", "compile wait",
    "wait for outputs", "outputs to host", "other copies to host", "parameters copied for norms",
    "wait for the norms", "callbacks", "metrics log",
)  # fmt: skip


@dataclasses.dataclass
class Clock:
    starts: list[float] = dataclasses.field(default_factory=list)
    """When each step's inputs began to be built: one loop period to the next."""
    spent: list[dict[str, float]] = dataclasses.field(default_factory=list)
    """Seconds per part, per step (calls before the first step, the segment's set-up, are left out)."""

    def add(self, part: str, seconds: float) -> None:
        if self.spent:
            self.spent[-1][part] = self.spent[-1].get(part, 0.0) + seconds


def _clocked(clock: Clock, part: str, fn: Callable, *, starts_step: bool = False) -> Callable:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():  # off the loop's path
            return fn(*args, **kwargs)
        t0 = time.perf_counter()
        if starts_step:
            clock.starts.append(t0)
            clock.spent.append({})
        try:
            return fn(*args, **kwargs)
        finally:
            clock.add(part, time.perf_counter() - t0)

    return timed


def _host(clock: Clock, host: Callable) -> Callable:
    """`multihost.host`, clocked: for the step's outputs (called from `segment.stepped`) the wait for
    them apart from their copy; every other call as one."""

    @functools.wraps(host)
    def timed(tree: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():  # off the loop's path
            return host(tree)
        if sys._getframe(1).f_code.co_name != "stepped":
            return _clocked(clock, "other copies to host", host)(tree)
        t0 = time.perf_counter()
        jax.block_until_ready(tree)
        t1 = time.perf_counter()
        try:
            return host(tree)
        finally:
            clock.add("wait for outputs", t1 - t0)
            clock.add("outputs to host", time.perf_counter() - t1)

    return timed


def clock_the_loop() -> Clock:
    """Wrap the loop's calls in this process with clocks (before the run starts: for good)."""
    from birdjepa import multihost
    from birdjepa.data.loader import Loader
    from birdjepa.diagnostics.callbacks import Callbacks
    from birdjepa.rundir.metrics_log import MetricsLog
    from birdjepa.train import compiled, param_norms, recording, segment

    clock = Clock()
    segment.step_inputs = _clocked(clock, "step inputs", segment.step_inputs, starts_step=True)
    wrapped: list[tuple[Any, str, str]] = [
        (Loader, "__next__", "next batch"), (compiled.Compiled, "on_device", "batch to device"),
        (recording.RecordableStep, "__call__", "step call (dispatch)"),
        (recording.RecordableStep, "_ready", "compile wait"), (Callbacks, "step_end", "callbacks"),
        (MetricsLog, "_write_row", "metrics log"), (param_norms, "snapshot", "parameters copied for norms"),
        (param_norms.Norms, "result", "wait for the norms"),
    ]  # fmt: skip
    for owner, name, part in wrapped:
        setattr(owner, name, _clocked(clock, part, getattr(owner, name)))
    multihost.host = _host(clock, multihost.host)
    return clock


def per_step_ms(clock: Clock, skip: int) -> dict[str, float]:
    """Median milliseconds per step of each part and of the loop's period, over the steps after the
    first ``skip`` (the last step has no next to end its period: left out). The step's inputs and its
    call are given less what they contain (the batch put on the devices, the compile wait)."""
    steps = range(skip, len(clock.starts) - 1)
    if not steps:
        raise ValueError(f"{len(clock.starts)} steps clocked: at least {skip + 2} are needed")
    rows = []
    for i in steps:
        spent = {p: clock.spent[i].get(p, 0.0) for p in PARTS}
        spent["step inputs"] -= spent["batch to device"]
        spent["step call (dispatch)"] -= spent["compile wait"]
        period = clock.starts[i + 1] - clock.starts[i]
        rows.append({**spent, "rest of the loop": period - sum(spent.values()), "loop period": period})
    return {k: 1e3 * statistics.median(r[k] for r in rows) for k in rows[0]}
