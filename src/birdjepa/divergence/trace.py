"""`birdjepa trace RUN --step N`: re-execute step N of a run and record everything it computes, in order.

The run is restored to just before step N (`birdjepa.divergence.replay`). The step then runs as it
trained, in the executable the loop runs, recording (`birdjepa.train.recording`): the recorded tensors
are the training step's own by construction, and its outputs become the run's next state and the
trace's outputs, which are compared with what the run logged and checkpointed for step N.

Two things come from a recording step compiled apart (`birdjepa.divergence.recording_apart`), checked
against the training step by digest (``inexact`` in the manifest: None where they agree bit for bit):
tensors kept whole (``keep``), and the whole record of the virtual-shard step.

Each tensor is recorded as its shape, dtype, exact digest and statistics (`birdjepa.train.digest`),
and whole only where ``keep`` asks (or where it is small): a trace of a large model stays small, and
no activation leaves the device unless asked for.

Stages, in the order the step computes them (`STAGES`): the resolved config (manifest only); the batch;
the step's key and every sub-key; what each draw produced; the update count, accumulation progress and
LR of the update; every parameter and optimizer-state leaf going in; every module call of the model,
its inputs at its start and its outputs at its end, in the order they ran (`birdjepa.train.calls`);
every loss term; the gradients, the gradients after clipping and every leaf's update; the
parameters and optimizer state coming out; the step's metrics.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from birdjepa import multihost
from birdjepa.config import to_dict
from birdjepa.divergence.diff import diff_traces
from birdjepa.divergence.recording_apart import recording
from birdjepa.divergence.replay import OpenRun, ReplayError, first_mismatch, open_at, replayable
from birdjepa.divergence.trace_file import Entry, Trace
from birdjepa.rundir import checkpoint
from birdjepa.seams import planted
from birdjepa.train.calls import CALL_SITES
from birdjepa.train.digest import hex_digest, summarize
from birdjepa.train.optim import accumulation_progress, lr_table, update_count
from birdjepa.train.recording import Computed, RecordableStep, leaves, matches
from birdjepa.train.segment import step_inputs, stepped, total_updates
from birdjepa.train.step import StepConfig

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


def record_step(
    run: OpenRun, *, repeat: int = 1, keep: Sequence[str] = ()
) -> tuple[Trace, dict[str, float | None]]:
    """Run step ``run.state.step`` as it trained, recording; returns the trace and, for ``repeat`` > 1,
    the noise floor: ``stage/name`` -> the largest difference between executions of the same thing
    (only what differed; None where only the digests were recorded). Afterwards ``run.state`` is the
    state after the step."""
    cfg, state = run.cfg, run.state
    batch = run.batch()
    x = step_inputs(run.fns, cfg, state, batch)
    step = run.fns.train_step
    exact = isinstance(step, RecordableStep)  # else the virtual-shard step: recorded apart
    apart = None if exact else recording(StepConfig.of(cfg, run.model_cfg), cfg.optim, total_updates(cfg))
    traces, after = [], state
    for _ in range(max(repeat, 1)):
        # The step donates its inputs: it gets a copy, and the state stays for the next repeat.
        params, opt_state = _copy((state.params, state.opt_state))
        if exact:
            outputs, summaries = step.recorded(params, opt_state, x.batch, x.key, x.check)
            summaries, computed = jax.device_get(summaries), step.computed
            if keep and apart is None and any(matches(f"{c[0]}/{c[1]}", keep) for c in computed):
                apart = recording(StepConfig.of(cfg, run.model_cfg), cfg.optim, total_updates(cfg), keep)
        else:
            outputs = step(params, opt_state, x.batch, x.key, x.check)
        if apart is not None:  # nothing donated: on the inputs the training step had
            recorded = apart.step(state.params, state.opt_state, x.batch, x.key, x.check)
            out_digests, kept = jax.device_get(recorded)
        if not exact:
            summaries, computed = kept, apart.computed
        after, metrics, stats, guard = stepped(state, x, outputs)
        # The training step's outputs, summarized once: for the trace (and the check of a step recorded
        # apart against them).
        named = trained_outputs(after, metrics, stats, guard)
        whole = [matches(f"{stage}/{name}", keep) for stage, name, _ in named]
        done = list(zip(named, summarize([v for _, _, v in named], whole), strict=True))
        if exact and apart is not None:  # the kept tensors, where their bits are the step's own
            inexact = _kept(summaries, kept, computed)
        elif apart is not None:
            where = [name for name, _ in leaves((after.params, after.opt_state, metrics, stats, guard))]
            inexact = _first_inexact(out_digests, done, where)
        else:
            inexact = None
        built = entries(run, state, batch, x.key, computed, summaries, done, keep)
        traces.append(Trace(manifest(run, state.step, built), built))
        traces[-1].manifest["inexact"] = inexact
        traces[-1].manifest["recorded_apart"] = (
            "the virtual-shard step" if not exact else "the tensors kept whole" if apart is not None else None
        )
    noise: dict[str, float | None] = {}
    for other in traces[1:]:
        for stage in diff_traces(traces[0], other).stages:
            for d in stage.differing:
                key = f"{d.stage}/{d.name}"
                was = noise.get(key, 0.0)
                noise[key] = None if not d.exact or was is None else max(was, d.max_abs)
    run.state = after
    return traces[0], noise


def _kept(summaries: list[dict], kept: list[dict], computed: Computed) -> str | None:
    """Gives ``summaries`` (the training step's own) the whole tensors of ``kept`` (the step recorded
    apart), where their digests agree; the first kept tensor whose bits the step apart did not
    reproduce (it keeps its values, within rounding), or None."""
    first = None
    for (stage, name, *_), own, apart in zip(computed, summaries, kept, strict=True):
        if "array" in apart and "array" not in own:
            own["array"] = apart["array"]
            if first is None and hex_digest(own["digest"]) != hex_digest(apart["digest"]):
                first = f"{stage}/{name}"
    return first


_copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))  # one executable; new buffers (nothing donated)


def trained_outputs(after: Any, metrics: dict, stats: Any, guard: dict) -> list[tuple[str, str, Any]]:
    """The training step's outputs as ``(stage, name, value)``, in `jax.tree` order of the step's
    ``(params, opt_state, metrics, stats, guard)`` (dicts by sorted key), as the recording step digests
    them. The monitor's statistics and the guard are checked, not traced (but ``finite``)."""
    return [
        *(("params_out", n, v) for n, v in leaves(after.params)),
        *(("opt_state_out", n, v) for n, v in leaves(after.opt_state)),
        *(("metrics", n, metrics[n]) for n in sorted(metrics)),
        *(("monitor", n, v) for n, v in leaves(stats)),
        *(("guard", n.strip("[]'"), v) for n, v in leaves(guard)),
    ]


#: A training step output with its summary: ``((stage, name, value), summary)``.
Summarized = tuple[tuple[str, str, Any], dict]


def _first_inexact(recorded: list[np.ndarray], trained: list[Summarized], names: list[str]) -> str | None:
    """The first of the training step's outputs whose bits the step recorded apart did not reproduce
    (None: all equal). XLA compiles another executable otherwise; measured on CPU, recording the
    encoder's output tokens moves last bits of the embedding at XLA's default level and in bfloat16."""
    for (_, s), d, name in zip(trained, recorded, names, strict=True):  # named as the step's output tuple
        if hex_digest(d) != hex_digest(s["digest"]):
            return name
    return None


def entries(
    run: OpenRun, state: Any, batch: Any, key: jax.Array, computed: Computed, summaries: list[dict],
    trained: list[Summarized], keep: Sequence[str],
) -> list[Entry]:  # fmt: skip
    """The trace's entries, in `STAGES` order: what the step computed on the way from the recording
    step (summarized on the device), the step's outputs as `trained_outputs` summarized them, and the
    rest (batch, keys, optimizer, state going in) summarized here."""
    cfg = run.cfg
    metrics = {name: value for (stage, name, value), _ in trained if stage == "metrics"}
    # Each row: (stage, name, value, its summary, or None until summarized below), or the index of a
    # tensor the recording step summarized.
    rows: list[tuple[str, str, Any, dict | None] | int] = []
    rows += [("batch", name, batch[name], None) for name in BATCH_ARRAYS if name in batch]
    rows.append(("keys", "step", jax.random.key_data(key), None))
    recorded = {stage: [i for i, c in enumerate(computed) if c[0] == stage] for stage in STAGES}
    rows += recorded["keys"] + recorded["draws"]
    update = int(multihost.host(update_count(state.opt_state)))
    table = lr_table(cfg.optim, total_updates(cfg), planted(cfg.debug.plant))  # schedule(u), read on the host
    rows += [
        ("optimizer", "update_count", np.int32(update), None),
        ("optimizer", "accumulation", multihost.host(accumulation_progress(state.opt_state)), None),
        ("optimizer", "lr", metrics["train/lr"], None),
        ("optimizer", "schedule_lr", np.float32(table[min(update, len(table) - 1)]), None),
    ]
    rows += [("params_in", n, v, None) for n, v in leaves(state.params)]
    rows += [("opt_state_in", n, v, None) for n, v in leaves(state.opt_state)]
    for stage in ("forward", "loss", "gradients", "gradients_clipped", "updates"):
        rows += recorded[stage]
    for (stage, name, value), summary in trained:
        if stage in ("params_out", "opt_state_out", "metrics") or (stage, name) == ("guard", "finite"):
            rows.append(("metrics" if stage == "guard" else stage, name, value, summary))
    pending = [r for r in rows if not isinstance(r, int) and r[3] is None]
    # The batch's indices, labels and crops are a few numbers per clip: always whole (`bisect` reads them).
    whole = [matches(f"{s}/{n}", keep) or (s == "batch" and n != "spectrogram") for s, n, _, _ in pending]
    summarized = iter(summarize([v for _, _, v, _ in pending], whole))
    out = []
    for r in rows:
        if isinstance(r, int):
            stage, name, shape, dtype = computed[r]
            s = summaries[r]
        else:
            stage, name, value, s = r
            s = s if s is not None else next(summarized)
            shape, dtype = tuple(np.shape(value)), np.dtype(value.dtype).name
        array = None if s.get("array") is None else np.asarray(s["array"])
        stats = tuple(float(v) for v in s["stats"])
        out.append(Entry(stage, name, shape, dtype, hex_digest(s["digest"]), stats, array))
    return out


def manifest(run: OpenRun, step: int, entries: list[Entry]) -> dict[str, Any]:
    # The sites of the calls this step made only: `CALL_SITES` holds every model this process traced.
    sites = {e.name.split("/", 1)[1].split("#")[0] for e in entries if e.stage == "forward"}
    return {
        "run": str(run.run_dir),
        "step": step,
        "config": to_dict(run.cfg),
        "devices": jax.device_count(),
        "platform": jax.devices()[0].platform,
        "restored_from": run.restored_from,
        "replayed": [run.replayed[0], run.replayed[-1]] if run.replayed else [],
        "replayed_unlogged": len(run.unlogged),
        "stages": list(STAGES),
        "calls": {site: CALL_SITES[site] for site in sorted(sites)},  # where each module method is written
    }


def keep_only(trace: Trace, patterns: Sequence[str]) -> Trace:
    """The entries whose ``stage/name`` matches any of ``patterns`` (see `matches`); `ReplayError` for a
    pattern that matches none (a typo gave a trace of 0 tensors, exit 0)."""
    if not patterns:
        return trace
    unmatched = [p for p in patterns if not any(matches(e.key, [p]) for e in trace.entries)]
    if unmatched:
        raise ReplayError(f"--only {' '.join(unmatched)}: matches no tensor of the step (stages: "
                          f"{', '.join(STAGES)}; e.g. {trace.entries[0].key})")  # fmt: skip
    kept = [e for e in trace.entries if matches(e.key, patterns)]
    return Trace({**trace.manifest, "only": list(patterns)}, kept)


def check_stages(option: str, patterns: Sequence[str]) -> None:
    """`ReplayError` for a pattern whose stage, spelled without a wildcard, is none of `STAGES`."""
    for p in patterns:
        stage = p.split("/", 1)[0]
        if not any(c in stage for c in "*?[") and stage not in STAGES:
            stages = ", ".join(STAGES)
            raise ReplayError(f"--{option} {p}: {stage!r} is no stage of the step (stages: {stages})")


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
    with checkpoint.Checkpointer(run.run_dir, keep=None, async_save=False, create=False) as ckpt:
        # On a live run, its retention may remove the step's checkpoint as it is read: left unknown then.
        if step in ckpt.all_steps() and (meta := ckpt.meta_unless_pruned(step)) is not None:
            saved = meta["hashes"]
            arrays = checkpoint.to_host(run.state.arrays())
            hashes = [checkpoint.leaf_hash(a) for a in jax.tree_util.tree_leaves(arrays)]
            out["checkpoint_equal"] = hashes == saved
    return out


def trace_metrics(trace: Trace) -> dict[str, Any]:
    return {e.name: e.array for e in trace.entries if e.stage == "metrics" and e.name != "finite"}


def trace_step(
    run_dir: Path, step: int, *, only: Sequence[str] = (), keep: Sequence[str] = (), repeat: int = 1
) -> Trace:
    """Step ``step`` of ``run_dir`` re-executed and recorded (see the module doc), the tensors matching
    ``keep`` whole; only the entries matching ``only``, if given. Raises `ReplayError`."""
    for option, patterns in (("only", only), ("keep", keep)):  # a typo found before the step runs
        check_stages(option, patterns)
    t0 = time.perf_counter()
    run = open_at(Path(run_dir), step)
    try:
        trace, noise = record_step(run, repeat=repeat, keep=keep)
        trace.manifest["matches_run"] = check_against_run(run, trace)
        trace.manifest["trained_revision"] = run.revision_at(step)
        trace.manifest["trained_decoder"], trace.manifest["decode_changes"] = run.decoded_at(step)
    finally:
        run.close()
    trace.manifest["repeat"] = repeat
    trace.manifest["noise"] = noise
    trace.manifest["kept"] = list(keep)
    print(f"traced step {step} of {run_dir} in {time.perf_counter() - t0:.1f} s", flush=True)
    if unkept := [p for p in keep if not any(matches(e.key, [p]) for e in trace.entries)]:
        print(f"WARNING --keep {' '.join(unkept)}: matches no tensor of the step, none kept whole by it "
              f"(e.g. {trace.entries[0].key})", flush=True)  # fmt: skip
    return keep_only(trace, only)


__all__ = ["ReplayError", "STAGES", "trace_step"]
