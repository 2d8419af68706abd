"""The loop's plug-in points: diagnostics that watch training without changing it.

A callback sees every step's host batch and the train step's outputs, returns metrics and warnings to
log, and keeps a JSON-able state that each checkpoint carries (``meta["callbacks"][name]``), so the first
step after a resume reports exactly what the uninterrupted run reports. Adding or removing a callback
never touches the loop: the loop calls `Callbacks.step_end`, `Callbacks.save` and `Callbacks.restore`.

The diagnostics themselves are pure modules (`diagnostics.iid`, `diagnostics.monitor`); the classes here
only adapt them to the hooks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from birdjepa.data import Batch, Loader
from birdjepa.diagnostics.iid import IidMonitor
from birdjepa.diagnostics.monitor import COUNT_STATS, UpdateMonitor


@dataclasses.dataclass(frozen=True)
class StepEnd:
    """What a callback sees after step ``step``: host numpy arrays only."""

    step: int
    batch: Batch
    """The loader batch the step consumed (``index``, ``shard_id``, ``label``, ``spectrogram``, ...)."""
    stats: Mapping[str, Any]
    """In-graph statistics the train step returned (``diagnostics.monitor.update_stats`` or its
    placeholder)."""


@dataclasses.dataclass
class Report:
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    must_log: bool = False
    """The metrics are sparse (a periodic check): log this step even off the ``log_every`` cadence."""


class Callback:
    """Base class: every hook is optional."""

    name: str = "callback"
    stateful: bool = True
    """Its checkpoints carry a state: a checkpoint without one resumes it fresh, with a warning."""

    def on_step_end(self, end: StepEnd) -> Report:
        return Report()

    def on_save(self, step: int) -> dict[str, Any]:
        """State after ``step``, stored in the checkpoint of ``step``."""
        return {}

    def on_restore(self, step: int, state: Mapping[str, Any]) -> None:
        """Continue from the state saved with checkpoint ``step``; raise ValueError if it does not fit."""


class Callbacks:
    """Calls each hook of every callback in order and merges what they return."""

    def __init__(self, items: Sequence[Callback]) -> None:
        names = [c.name for c in items]
        if len(set(names)) != len(names):
            raise ValueError(f"callback names must be unique: {names}")
        self.items = list(items)

    def step_end(self, end: StepEnd) -> Report:
        out = Report()
        for c in self.items:
            r = c.on_step_end(end)
            out.metrics.update(r.metrics)
            out.warnings.extend(r.warnings)
            out.must_log |= r.must_log
        return out

    def save(self, step: int) -> dict[str, Any]:
        return {c.name: c.on_save(step) for c in self.items}

    def restore(self, step: int, states: Mapping[str, Any]) -> list[str]:
        """Restore every callback from checkpoint ``step``; returns warnings for the callbacks that start
        fresh (enabled after the checkpoint was written, or whose saved state no longer fits)."""
        notes = []
        for c in self.items:
            if c.name not in states:
                if not c.stateful:
                    continue
                notes.append(f"{c.name}: checkpoint {step} has no state for it; starting fresh")
                continue
            try:
                c.on_restore(step, states[c.name])
            except ValueError as e:
                notes.append(f"{c.name}: state of checkpoint {step} does not fit ({e}); starting fresh")
        return notes


class IidCallback(Callback):
    """``dataloader/...`` metrics from every batch's ``index`` and ``shard_id`` (see `diagnostics.iid`)."""

    name = "iid"

    def __init__(self, shard_sizes: Sequence[int], window: int) -> None:
        self._args = (int(sum(shard_sizes)), list(shard_sizes), window)
        self.monitor = IidMonitor(*self._args)

    def on_step_end(self, end: StepEnd) -> Report:
        return Report(self.monitor.update(end.batch["index"], end.batch["shard_id"]))

    def on_save(self, step: int) -> dict[str, Any]:
        return self.monitor.state()

    def on_restore(self, step: int, state: Mapping[str, Any]) -> None:
        try:
            self.monitor.load_state(dict(state))
        except ValueError:
            self.monitor = IidMonitor(*self._args)  # a failed load may leave it half-restored
            raise


class UpdateMonitorCallback(Callback):
    """``monitor/...`` metrics and warnings from the in-graph update statistics of the checked steps."""

    name = "update_monitor"

    def __init__(self, names: Sequence[str], idle: tuple[str, ...] = ()) -> None:
        self.monitor = UpdateMonitor(names, idle=idle)

    def on_step_end(self, end: StepEnd) -> Report:
        # Steps off the check interval carry `empty_stats` (counts of -1): nothing was measured.
        if not end.stats or any(int(np.asarray(end.stats[k])) < 0 for k in COUNT_STATS):
            return Report()
        metrics, warnings = self.monitor.observe(end.step, end.stats)
        return Report(metrics, warnings, must_log=True)

    def on_save(self, step: int) -> dict[str, Any]:
        return self.monitor.state()

    def on_restore(self, step: int, state: Mapping[str, Any]) -> None:
        self.monitor.load_state(state)


class SkippedRecordsCallback(Callback):
    """A warning for each record the loader skips (audio it cannot decode, a file a path names that is
    missing, an event outside its recording), naming the shard and row: the run trains on without it,
    the same in every run and resume, and says so as it happens."""

    name = "skipped_records"
    stateful = False  # the loader's own state carries its skip counter

    def __init__(self, loader: Loader) -> None:
        self.loader = loader
        self.said = int(loader.state()["counters"]["skipped"])  # a resumed run's earlier skips: said then

    def on_step_end(self, end: StepEnd) -> Report:
        self.said, lines = self.loader.skipped_since(self.said)
        return Report(warnings=[f"skipped a record the loader cannot read: {line}" for line in lines])
