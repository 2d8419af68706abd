"""`birdjepa trace RUN --step N`: re-execute step N of a run and record everything it computes, in order.

The run is restored to just before step N (`birdjepa.divergence.replay`). The step then runs twice on
the same inputs: first the recording step (`birdjepa.train.compiled.recording`: the training step with
the same shardings, also returning what it computed on the way), then the training step itself, the
one compiled executable the loop runs. Their outputs are compared with ``==`` (``faithful`` in the
manifest), and so are the training step's with what the run logged and checkpointed for step N: what
the trace shows is the step that trained.

Stages, in the order the step computes them (`STAGES`): the resolved config (manifest only); the batch;
the step's key and every sub-key; what each draw produced; the update count, accumulation progress and
LR of the update; every parameter and optimizer-state leaf going in; every module call of the model,
its inputs at its start and its outputs at its end, in the order they ran (`birdjepa.train.calls`);
every loss term; the gradients, the gradients after clipping and every leaf's update; the
parameters and optimizer state coming out; the step's metrics.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from birdjepa.config import to_dict
from birdjepa.divergence.diff import diff_traces
from birdjepa.divergence.replay import OpenRun, ReplayError, first_mismatch, open_at, replayable
from birdjepa.divergence.trace_file import Entry, Trace
from birdjepa.slurm import distributed
from birdjepa.train import checkpoint
from birdjepa.train.calls import CALL_SITES
from birdjepa.train.compiled import recording
from birdjepa.train.optim import accumulation_progress, lr_table, update_count
from birdjepa.train.segment import advance, step_inputs, total_updates
from birdjepa.train.step import StepConfig, ordered_leaves

STAGES = (
    "batch",
    "keys",
    "draws",
    "optimizer",
    "params_in",
    "opt_state_in",
    "forward",
    "loss",
    "gradients",
    "gradients_clipped",
    "updates",
    "params_out",
    "opt_state_out",
    "metrics",
)
BATCH_ARRAYS = ("index", "shard_id", "epoch", "label", "crop_offset", "spectrogram")


def leaves(tree: Any) -> list[tuple[str, Any]]:
    """``(path, leaf)`` in `jax.tree` order, named as the checkpoint names them (``['encoder']...``)."""
    return [(jax.tree_util.keystr(p), x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _host(x: Any) -> np.ndarray:
    if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    return np.asarray(distributed.host(x))


def record_step(run: OpenRun, *, repeat: int = 1) -> tuple[Trace, dict[str, float]]:
    """Run step ``run.state.step`` recorded and as it trained, on the same inputs; returns the trace and,
    for ``repeat`` > 1, the noise floor: ``stage/name`` -> the largest difference between executions of
    the same thing (only what differed). Afterwards ``run.state`` is the state after the step."""
    cfg, state = run.cfg, run.state
    batch = run.batch()
    x = step_inputs(run.fns, cfg, state, batch)
    traced = recording(StepConfig.of(cfg, run.model_cfg), cfg.optim, total_updates(cfg))
    traces, first = [], None
    # The training step donates its inputs: it gets copies placed from the host (a transfer, where a
    # copy on the device would compile one small executable per leaf shape), and the state stays.
    host_state = distributed.host((state.params, state.opt_state))
    for _ in range(max(repeat, 1)):
        recorded = distributed.host(traced(state.params, state.opt_state, x.batch, x.key, x.check))
        copy = run.fns.place(dataclasses.replace(state, params=host_state[0], opt_state=host_state[1]))
        trained = distributed.host(run.fns.train_step(copy.params, copy.opt_state, x.batch, x.key, x.check))
        first = first or (recorded, trained)
        traces.append(Trace(manifest(run, state.step), entries(run, batch, x.key, recorded, trained)))
    noise: dict[str, float] = {}
    for other in traces[1:]:
        for stage in diff_traces(traces[0], other).stages:
            for d in stage.differing:
                key = f"{d.stage}/{d.name}"
                noise[key] = max(noise.get(key, 0.0), d.max_abs)
    recorded, trained = first
    traces[0].manifest["faithful"] = _faithful(recorded[:3], trained[:3])
    run.state, _, _, _ = advance(run.fns, cfg, state, batch)
    return traces[0], noise


def entries(run: OpenRun, batch: Any, key: jax.Array, recorded: tuple, trained: tuple) -> list[Entry]:
    """The trace's entries, in `STAGES` order: what the step computed on the way from the recording
    step, its outputs (parameters, optimizer state, metrics) from the training step."""
    cfg, state = run.cfg, run.state
    rec = recorded[5]
    params, opt_state, metrics, _, guard = trained
    update = int(distributed.host(update_count(state.opt_state)))
    t = Trace({})
    for name in BATCH_ARRAYS:
        if name in batch:
            t.add("batch", name, batch[name])
    t.add("keys", "step", _host(key))
    record = {k.split("|", 1)[1]: v for k, v in sorted(rec.items()) if "|" in k}
    for stage in ("keys", "draws"):
        for name, value in record.items():
            if name.startswith(stage + "/"):
                t.add(stage, name.partition("/")[2], value)
    t.add("optimizer", "update_count", update)
    t.add("optimizer", "accumulation", int(distributed.host(accumulation_progress(state.opt_state))))
    t.add("optimizer", "lr", metrics["train/lr"])
    table = lr_table(cfg.optim, total_updates(cfg), cfg.debug_plant)  # schedule(u), read on the host
    t.add("optimizer", "schedule_lr", table[min(update, len(table) - 1)])
    for stage, tree in (("params_in", state.params), ("opt_state_in", state.opt_state)):
        for name, value in leaves(distributed.host(tree)):
            t.add(stage, name, value)
    for name, value in record.items():
        if name.startswith("forward/"):
            t.add("forward", name.partition("/")[2], value)
    for name, value in ordered_leaves(rec.get("loss", {}), ""):
        t.add("loss", name.lstrip("/"), value)
    for stage in ("gradients", "gradients_clipped", "updates"):
        for name, value in leaves(rec.get(stage, {})):
            t.add(stage, name, value)
    for stage, tree in (("params_out", params), ("opt_state_out", opt_state)):
        for name, value in leaves(tree):
            t.add(stage, name, value)
    for name in sorted(metrics):
        t.add("metrics", name, metrics[name])
    t.add("metrics", "finite", guard["finite"])
    return t.entries


def _faithful(recorded: tuple, trained: tuple) -> dict[str, Any]:
    """How far the recording step's outputs are from the training step's (the trace's outputs): XLA
    compiles the two apart, and may fuse the recording one differently (last bits on CPU)."""
    worst, first = 0.0, None
    for (name, a), (_, b) in zip(leaves(recorded), leaves(trained), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.tobytes() != b.tobytes():
            d = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
            first = first or name
            worst = max(worst, d)
    return {"equal": first is None, "first": first, "max_abs": worst}


def manifest(run: OpenRun, step: int) -> dict[str, Any]:
    return {
        "run": str(run.run_dir),
        "step": step,
        "config": to_dict(run.cfg),
        "devices": jax.device_count(),
        "platform": jax.devices()[0].platform,
        "restored_from": run.restored_from,
        "replayed": [run.replayed[0], run.replayed[-1]] if run.replayed else [],
        "stages": list(STAGES),
        "calls": dict(sorted(CALL_SITES.items())),  # where each recorded module method is written
    }


def keep_only(trace: Trace, patterns: Sequence[str]) -> Trace:
    """The entries whose ``stage/name`` matches any of ``patterns`` (fnmatch; a bare stage keeps it)."""
    if not patterns:
        return trace
    pats = [p if any(c in p for c in "*?[/") else f"{p}/*" for p in patterns]
    kept = [e for e in trace.entries if any(fnmatch.fnmatchcase(e.key, p) for p in pats)]
    return Trace({**trace.manifest, "only": list(patterns)}, kept)


def check_against_run(run: OpenRun, trace: Trace) -> dict[str, Any]:
    """The traced step against what the run logged and, where one exists, checkpointed for it."""
    step = trace.manifest["step"]
    out: dict[str, Any] = {}
    logged = run.logged.get(step)
    if logged:
        replayed = replayable(run.state, trace_metrics(trace), {"index": trace.by_key()["batch/index"].array})
        mismatch = first_mismatch(logged, replayed)
        out["logged_metrics_equal"] = mismatch is None
        if mismatch:
            out["logged_mismatch"] = list(mismatch)
    with checkpoint.Checkpointer(run.run_dir, keep=None, async_save=False) as ckpt:
        if step in ckpt.all_steps():
            saved = ckpt.read_meta(step)["hashes"]
            arrays = checkpoint.to_host(run.state.arrays())
            hashes = [checkpoint.leaf_hash(a) for a in jax.tree_util.tree_leaves(arrays)]
            out["checkpoint_equal"] = hashes == saved
    return out


def trace_metrics(trace: Trace) -> dict[str, Any]:
    return {e.name: e.array for e in trace.entries if e.stage == "metrics" and e.name != "finite"}


def trace_step(run_dir: Path, step: int, *, only: Sequence[str] = (), repeat: int = 1) -> Trace:
    """Step ``step`` of ``run_dir`` re-executed and recorded (see the module doc). Raises `ReplayError`."""
    t0 = time.perf_counter()
    run = open_at(Path(run_dir), step)
    try:
        trace, noise = record_step(run, repeat=repeat)
        trace.manifest["matches_run"] = check_against_run(run, trace)
    finally:
        run.close()
    trace.manifest["repeat"] = repeat
    trace.manifest["noise"] = noise
    print(f"traced step {step} of {run_dir} in {time.perf_counter() - t0:.1f} s", flush=True)
    return keep_only(trace, only)


__all__ = ["ReplayError", "STAGES", "trace_step"]
