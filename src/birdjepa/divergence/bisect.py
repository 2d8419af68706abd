"""`birdjepa bisect RUN_A RUN_B`: the first step at which two runs differ, and the first tensor there.

1. The logs and the checkpoints: the first step whose logged metrics differ, and the first common
   checkpoint whose CRC-32s differ (two states can part in their last bits while every logged number
   still agrees). The newest common checkpoint before both that still agrees is where the search starts.
2. Side by side: both runs are restored there and stepped together; the first step whose batch, key,
   outputs or metrics differ in any bit is the step that made them differ.
3. Both runs are traced at that step (`birdjepa.divergence.trace`), digests only, and the traces
   diffed; then traced again with the first differing tensors and their inputs kept whole, and the
   verdict names the stage and tensor of the first real difference (above the noise floor of
   ``--repeat``), with its values. A model small enough that its whole trace is a few MiB is traced
   whole at once (`WHOLE_FIRST_BELOW`).

Runs trained on different device counts cannot be stepped side by side in one process: each is traced in
a process of its own with its device count, and the search relies on the logs and checkpoints alone.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from birdjepa.divergence.diff import TraceDiff, diff_traces
from birdjepa.divergence.region import event
from birdjepa.divergence.replay import (
    ReplayError,
    compared_keys,
    devices_at,
    first_mismatch,
    not_here,
    open_at,
    read_config,
)
from birdjepa.divergence.trace import trace_step
from birdjepa.divergence.trace_file import Trace, read, traced, write
from birdjepa.resume.checks import config_diff
from birdjepa.rundir import checkpoint, layout
from birdjepa.rundir.metrics_log import compared, metrics_by_step, read_metrics
from birdjepa.train.determinism import DEVICE_COUNT_FLAG
from birdjepa.train.step import step_key


@dataclasses.dataclass
class Search:
    """What the logs and checkpoints say, before anything is re-executed."""

    first_logged: int | None
    """The first step whose logged metrics differ (or that only one run logged)."""
    logged_metric: tuple[str, Any, Any] | None
    first_ckpt: int | None
    """The first common checkpoint whose CRC-32s differ."""
    start: int | None
    """The newest common checkpoint before those that agrees (None: the runs' start)."""
    last: int
    """The last step both runs ran."""
    runs: tuple[tuple[list[dict[str, Any]], dict[int, dict[str, Any]]], ...]
    """Each run's log lines and checkpoint metas: which device count trained a step."""
    other: tuple[int, str, Any, Any] | None = None
    """The first logged metric that `compare` compares and no training step writes (an evaluation's),
    that differs: ``(step, name, a, b)``. Bisect replays training only, and read "equal" over it."""

    def devices(self, step: int) -> tuple[int | None, int | None]:
        """The device counts that trained ``step`` in each run (the newest checkpoint's were those of the
        segment that wrote it: a run resumed on 1 device after 4 was traced on 4, and refused)."""
        (la, ma), (lb, mb) = self.runs
        return devices_at(la, ma, step), devices_at(lb, mb, step)


def _ckpt_info(run_dir: Path) -> dict[int, dict[str, Any]]:
    with checkpoint.Checkpointer(run_dir, keep=None, async_save=False, create=False) as ckpt:
        metas = {s: ckpt.meta_unless_pruned(s) for s in ckpt.all_steps()}  # a live run's pruned ones: None
    return {s: meta for s, meta in metas.items() if meta is not None}


#: `Search.logged_metric`'s name where a step is in one run's log only.
ONE_LOG_ONLY = "(logged by one run only)"


def _ckpt_steps(run_dir: Path) -> list[int]:
    return layout.checkpoint_steps(run_dir)


def search(a: Path, b: Path) -> Search:
    # Steps run (`replay.last_step`'s rule): a refused resume logs its checks alone at the step it did not
    # run, which read as "step 2 was never run", exit 2, against its straight twin.
    la, lb = (
        {s: m for s, m in metrics_by_step(r, everything=True).items() if compared_keys(m)}
        if layout.metrics_file(r).exists()
        else {}
        for r in (a, b)
    )
    first_logged, metric, other = None, None, None
    ran = min(max([*la, *_ckpt_steps(a)], default=-1), max([*lb, *_ckpt_steps(b)], default=-1))
    for s in sorted(set(la) | set(lb)):
        if s not in la or s not in lb:
            if s <= ran:  # a step both ran (by their logs or checkpoints) that one log lacks: an emptied
                # or cut log read "equal up to step 5", exit 0, where compare says they differ
                first_logged, metric = s, (ONE_LOG_ONLY, s in la, s in lb)
                break
            continue
        keys = sorted(set(compared_keys(la[s])) | set(compared_keys(lb[s])))
        bad = next((k for k in keys if _differs(la[s].get(k), lb[s].get(k))), None)
        if bad is not None:
            first_logged, metric = s, (bad, la[s].get(bad), lb[s].get(bad))
            break
        if other is None:
            rest = sorted(k for k in set(la[s]) | set(lb[s]) if compared(k) and k not in keys)
            odd = next((k for k in rest if _differs(la[s].get(k), lb[s].get(k))), None)
            other = (s, odd, la[s].get(odd), lb[s].get(odd)) if odd is not None else None
    ca, cb = _ckpt_info(a), _ckpt_info(b)
    for run, logged, ckpts in ((a, la, ca), (b, lb, cb)):
        if not logged and not ckpts:  # else "no difference up to step -1", exit 0, would pass for an answer
            raise ReplayError(f"{run}: it ran no step (nothing logged and no checkpoint): nothing to compare")
    common = sorted(set(ca) & set(cb))
    first_ckpt = next((c for c in common if ca[c]["hashes"] != cb[c]["hashes"]), None)
    bound = min(x for x in (first_logged, first_ckpt, math.inf) if x is not None)
    start = max((c for c in common if c < bound and ca[c]["hashes"] == cb[c]["hashes"]), default=None)
    last = min(max([*la, *ca], default=-1), max([*lb, *cb], default=-1))
    lines = tuple(list(read_metrics(r)) if layout.metrics_file(r).exists() else [] for r in (a, b))
    return Search(first_logged, metric, first_ckpt, start, last, ((lines[0], ca), (lines[1], cb)), other)


def _differs(x: Any, y: Any) -> bool:
    both_nan = isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)
    return x != y and not both_nan


def first_differing_step(a: Path, b: Path, s: Search) -> tuple[int | None, str | None]:
    """Step both runs side by side from ``s.start`` until anything differs: batch, key, outputs. Returns
    ``(step, noisy)``: ``noisy`` says how a run's step there differed between two executions here (then
    its replays mean nothing, and its difference from the other run is to be measured against the noise
    floor), else None."""
    begin = 0 if s.start is None else s.start + 1
    end = min(x for x in (s.first_logged, s.first_ckpt, s.last) if x is not None)
    if begin > end:  # the newest agreeing checkpoint is the last step both ran
        return None, None
    # A segment resumed under other options (--allow-config-change) trains with them: each run is opened
    # anew at such a step with its segment's (with the first's, its replay "varied between executions").
    changes = [{x.get("step") for x in lines if x.get("event") == "config_changed"} for lines, _ in s.runs]
    ra, rb = open_at(a, begin), open_at(b, begin)
    try:
        for step in range(begin, end + 1):
            if step > begin and step in changes[0]:
                ra.close()
                ra = open_at(a, step)
            if step > begin and step in changes[1]:
                rb.close()
                rb = open_at(b, step)
            ba, bb = ra.batch(), rb.batch()
            if _differ(ba, bb) or _differ(_key(ra), _key(rb)):
                return step, None
            metrics = []
            for run, batch, (lines, _) in ((ra, ba, s.runs[0]), (rb, bb, s.runs[1])):
                metrics.append(run.step(batch))
                mismatch = first_mismatch(run.logged.get(step, {}), metrics[-1])
                if mismatch is not None:  # other code, another machine, or a step that varies
                    noisy = varies_between_executions(run.run_dir, step, metrics[-1])
                    if noisy is not None:
                        return step, f"{run.run_dir}: {noisy}"
                    name, logged, now = mismatch
                    resumed = next(
                        (x for x in lines if x.get("event") == "resume" and x.get("step") == step), None
                    )
                    if resumed is not None:  # the segment trained from another state than its checkpoint's
                        raise ResumeDiffers(run.run_dir, step, resumed, lines, mismatch)
                    # What the run recorded says which (its machine, its step's revision), else both.
                    why = not_here(run, step) or (": it was trained by other code or on another machine; "
                                                  "trace each run from its own checkout and compare with "
                                                  "`birdjepa diff-trace`")  # fmt: skip
                    raise ReplayError(f"{run.run_dir}: step {step} does not re-execute as it ran ({name} "
                                      f"logged {logged!r}, now {now!r}){why}")  # fmt: skip
            ma, mb = metrics
            if ma != mb or _differ(ra.state.arrays(), rb.state.arrays()):
                return step, None
    finally:
        ra.close()
        rb.close()
    return None, None


class ResumeDiffers(Exception):
    """A run's step, the first of a resumed segment, does not re-execute from the checkpoint it resumed
    as it trained: that segment trained from another state (a resume that went wrong in memory). It was
    "trained by other code or on another machine", exit 2, naming nothing of the resume."""

    def __init__(
        self, run_dir: Path, step: int, resumed: dict[str, Any], lines: list[dict[str, Any]],
        mismatch: tuple[str, Any, Any],
    ) -> None:  # fmt: skip
        name, logged, now = mismatch
        failed = [x for x in lines if x.get("event") == "resume_check_failed" and x.get("step") == step]
        checks = (f"its resume checks failed: {', '.join(failed[0].get('failed', []))}" if failed else
                  "every resume check passed")  # fmt: skip
        super().__init__(
            f"{run_dir}'s step {step} is the first of a segment resumed from checkpoint "
            f"{resumed.get('checkpoint')}, and it does not re-execute from that checkpoint as it trained "
            f"({name} logged {logged!r}, replayed {now!r}): that segment trained from another state than the "
            f"checkpoint holds, so the resume went wrong in the process that trained it ({checks})."
        )
        self.step = step


def varies_between_executions(run_dir: Path, step: int, first: dict[str, float]) -> str | None:
    """How step ``step`` differs when executed once more on the same inputs (None: it does not): a step
    that is not deterministic on this machine."""
    again = open_at(run_dir, step)
    try:
        second = again.step(again.batch())
    finally:
        again.close()
    mismatch = first_mismatch(first, second)
    if mismatch is None:
        return None
    name, x, y = mismatch
    return f"step {step} is not the same in two executions on its inputs here ({name}: {x!r}, then {y!r})"


def _key(run: Any) -> Any:
    return jax.random.key_data(step_key(run.cfg, run.state.chain, run.state.step)[0])


def _differ(x: Any, y: Any) -> bool:
    try:
        checkpoint.assert_trees_identical(jax.device_get(x), jax.device_get(y))
    except AssertionError:
        return True
    return False


def trace_apart(
    run: Path, step: int, devices: int, repeat: int, out: Path, keep: Sequence[str] = ()
) -> Trace:
    """Trace in a process of its own with ``devices`` CPU devices (another topology than this one's)."""
    # This process's XLA flags too (its optimisation level, say): only the device count is another.
    flags = f"{os.environ.get('XLA_FLAGS', '')} {DEVICE_COUNT_FLAG}={devices}"
    env = {**os.environ, "XLA_FLAGS": flags.strip()}
    cmd = [sys.executable, "-m", "birdjepa.cli", "trace", str(run), "--step", str(step), "--out", str(out),
           "--repeat", str(repeat), *(["--keep", *keep] if keep else [])]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if not traced(done.returncode, out):
        why = done.stderr.strip().splitlines()[-1:] or ["no output"]
        raise ReplayError(f"{run}: tracing step {step} on {devices} devices failed: {why[0]}")
    return read(out)


def trace_both(
    a: Path, b: Path, step: int, s: Search, repeat: int, keep: Sequence[str] = ()
) -> tuple[Trace, Trace]:
    here, devices = jax.device_count(), s.devices(step)
    if all(d in (None, here) for d in devices):
        return trace_step(a, step, repeat=repeat, keep=keep), trace_step(b, step, repeat=repeat, keep=keep)
    with tempfile.TemporaryDirectory() as tmp:
        return tuple(  # type: ignore[return-value]
            trace_apart(r, step, d or here, repeat, Path(tmp) / f"{i}.npz", keep)
            for i, (r, d) in enumerate(((a, devices[0]), (b, devices[1])))
        )


#: How many of the first differing tensors the second pass keeps whole, to measure them exactly.
KEPT_DIFFERENCES = 8
#: Below this many encoder parameters a whole trace is a few MiB: the first pass keeps every tensor and
#: no second pass is needed (compiling the step that keeps tensors whole again costs more than the bytes
#: it saves).
WHOLE_FIRST_BELOW = 2_000_000


def encoder_params(run: Path) -> int | None:
    """About how many parameters the run's encoder blocks hold (12 dim^2 a block), from its config."""
    try:
        cfg = read_config(layout.read_config(run), str(layout.config_file(run)))
    except (OSError, ValueError, ReplayError):
        return None
    m = cfg.model.resolved()
    return 12 * m.depth * m.dim**2


def to_keep(d: TraceDiff) -> list[str]:
    """What the second pass re-executes in full: the first differing tensors (whose digests alone say
    only that they differ) and the inputs of the module calls among them."""
    first = [t for st in d.stages for t in st.differing if not t.exact][:KEPT_DIFFERENCES]
    keep = [glob.escape(f"{t.stage}/{t.name}") for t in first]
    for t in first:
        e = event(t.name) if t.stage == "forward" else None
        if e is not None and e.io == "out":
            keep.append(glob.escape(f"forward/{e.call}/in") + "*")
    return keep


#: A first difference this small (relative to the tensor's largest magnitude: a few float32 ulps), where
#: only the device count differs and everything going into the step agrees, is the reduction order's:
#: what another topology computes, not a bug.
TOPOLOGY_RTOL = 1e-5
INPUT_STAGES = ("batch", "keys", "draws", "optimizer", "params_in", "opt_state_in")


def _options(run: Path) -> dict[str, Any]:
    """The options of ``run``'s latest segment that trained (its config.json; none where it is unread)."""
    try:
        return layout.read_config(run)
    except (OSError, ValueError):
        return {}


def _state_in_differs(d: TraceDiff) -> bool:
    return any(t.real for st in d.stages if st.stage in ("params_in", "opt_state_in") for t in st.differing)


def verdict(step: int, d: TraceDiff, s: Search, repeat: int, ta: Trace, tb: Trace) -> str:
    """The answer in one paragraph."""
    first = d.first
    harmless, breaking = d.config
    changed = f" Config: {'; '.join(breaking)}." if breaking else " The configs agree."
    if first is None:
        noise = {k for t in (ta, tb) for k in t.manifest.get("noise", {})}
        if noise:
            return (
                f"No tensor differs at step {step} beyond what the step itself varies: {len(noise)} tensors "
                f"differ between executions of it on the same inputs (measured with --repeat {repeat}). The "
                f"runs' difference is at the noise floor: not a bug.{changed}"
            )
        # The logs differ and the re-executions do not: a run's step is not what it trained (it said "the
        # configs agree" under a header of differing metrics).
        apart = [name for name, t in (("A", ta), ("B", tb))
                 if t.manifest.get("matches_run", {}).get("logged_metrics_equal") is False]  # fmt: skip
        if apart:
            runs = " and ".join(apart)
            return (f"No tensor differs at step {step} as the runs re-execute here, but {runs}'s "
                    f"step {step} does not re-execute as it trained (its logged metrics differ): it trained "
                    "under other conditions than these (XLA flags, machine or code: its checkpoint's machine "
                    f"record, and the resume's WARNING, say which).{changed}")  # fmt: skip
        return f"No tensor differs at step {step}.{changed}"
    order = [st.stage for st in d.stages]
    before = [st.stage for st in d.stages[: order.index(first.stage)] if st.identical and st.compared]
    same = f"; {', '.join(before)} identical" if before else ""
    where = f"first difference at step {step}, stage {first.stage}: {first.line()}{same}."
    if d.region:
        where += f" Where: {d.region}."
    if first.stage == "batch" and first.name == "index":
        xa, xb = ta.by_key()["batch/index"].array, tb.by_key()["batch/index"].array
        if sorted(xa.tolist()) == sorted(xb.tolist()):
            where += " The batches hold the same samples in another order."
        else:
            where += f" {len(set(xa.tolist()) ^ set(xb.tolist())) // 2} of {len(xa)} samples differ."
    inputs_agree = all(st.identical for st in d.stages if st.stage in INPUT_STAGES)
    if all(t.bits_only for st in d.stages for t in st.differing):  # no noise floor: nothing is above one
        where += (
            " Every value is equal as a number: only bits differ (a zero's sign, a NaN's payload), "
            "as another order of the same operations gives."
        )
    elif not first.real:
        floor = f"measured with --repeat {repeat}" if repeat > 1 else "of this hardware"
        where += f" It is at the noise floor ({floor}): not a bug."
    elif (trained := s.devices(step))[0] != trained[1] and None not in trained:
        devices = f" The runs trained on {trained[0]} and {trained[1]} devices"
        if inputs_agree and first.rel_to_scale <= TOPOLOGY_RTOL:
            where += (
                f"{devices} and everything going into the step agrees: a topology difference at the noise "
                f"floor of the reduction order ({first.rel_to_scale:.2g} of the tensor's scale, at most "
                f"{TOPOLOGY_RTOL:g}), not a bug."
            )
        else:
            where += f"{devices}, but this is more than a topology's last bits."
    if ta.manifest.get("inexact") or tb.manifest.get("inexact"):
        where += (" What a step compiled apart recorded is within rounding of the training steps' own (XLA "
                  "fuses it otherwise); the digests of the tensors and the outputs are exact.")  # fmt: skip
    later = [st.stage for st in d.stages if not st.identical and st.stage != first.stage]
    # What goes into the step is no consequence of what it computes: another seed's keys and initial
    # parameters were "consequences" of its batch.
    inputs = [x for x in later if x in INPUT_STAGES]
    computed = [x for x in later if x not in INPUT_STAGES]
    also = f" Also differing going into the step: {', '.join(inputs)}." if inputs else ""
    consequence = f" Later stages that differ (consequences): {', '.join(computed)}." if computed else ""
    return where[0].upper() + where[1:] + changed + also + consequence


def bisect(
    a: Path, b: Path, *, repeat: int = 1, save: Path | None = None, whole_first: bool | None = None
) -> tuple[int, str, TraceDiff | None]:
    """``(exit code, report, diff)``: 0 when the runs do not differ, 1 when they do. ``whole_first``:
    the first pass keeps every tensor whole (default: for encoders under `WHOLE_FIRST_BELOW`
    parameters), else it records digests and a second pass keeps what differs."""
    for r in (a, b):
        if not layout.is_run(r):
            raise ReplayError(layout.no_run_at(r))
    s = search(a, b)
    lines = [f"A {a}", f"B {b}"]
    if s.first_logged is not None:
        name, va, vb = s.logged_metric or ("?", None, None)
        if name == ONE_LOG_ONLY:  # it read "((logged by one run only): True vs False)"
            lines.append(f"logged metrics: step {s.first_logged} is in {'A' if va else 'B'}'s log only")
        else:
            lines.append(f"logged metrics: first differ at step {s.first_logged} ({name}: {va!r} vs {vb!r})")
    elif s.other is not None:
        at, name, va, vb = s.other
        # A monitor's or the loader's diagnostic was said to be the evaluation's.
        what, why = ("which the evaluation writes", "the runs evaluate otherwise")
        if not name.startswith("eval/"):
            what = "a diagnostic the training logs beside its metrics"
            # Options that change no training bit set some diagnostics (--iid-window): named first.
            harmless = "; ".join(config_diff(*(_options(r) for r in (a, b)))[0])
            options = (
                f"the options that differ and change no training bit ({harmless}), or " if harmless else ""
            )
            why = (f"it is computed otherwise (by {options}code of another version, where a resume crossed "
                   "one: `birdjepa analyze` says)")  # fmt: skip
        lines.append(f"logged metrics: the training's equal up to step {s.last}; {name}, {what}, first "
                     f"differs at step {at} ({va!r} vs {vb!r}): {why}")  # fmt: skip
    else:
        lines.append(f"logged metrics: equal up to step {s.last}")
    lines.append(
        f"checkpoint CRC-32s: first differ at checkpoint {s.first_ckpt}"
        if s.first_ckpt is not None
        else "checkpoint CRC-32s: equal wherever both runs have one"
    )
    here = jax.device_count()
    known = [x for x in (s.first_logged, s.first_ckpt) if x is not None]
    if all(d in (None, here) for d in s.devices(min(known, default=s.last))):
        try:
            step, noisy = first_differing_step(a, b, s)
        except ResumeDiffers as e:
            return (
                1,
                "\n".join([*lines, f"side by side: step {e.step} replays otherwise", "", f"VERDICT: {e}"]),
                None,
            )
        origin = f"checkpoint {s.start}" if s.start is not None else "step 0"
        found = f"first differ at step {step}" if step is not None else "no step differs"
        if step is None and s.start is not None and s.start >= s.last:  # "no step differs" of none run
            found = f"no step left to run (checkpoint {s.start} agrees, at the last step both ran)"
        lines.append(f"side by side from {origin}: {found}")
        if noisy is not None:  # the noise floor decides what of the difference is real
            repeat = max(repeat, 2)
            lines.append(f"{noisy}: tracing it with --repeat {repeat} to measure its noise floor")
    else:  # another topology: each run is re-executed in its own process, at the first logged difference
        known = [x for x in (s.first_logged, s.first_ckpt) if x is not None]
        step = min(known) if known else None
    if step is None:
        logs = " (their logs differ, as said above)" if s.first_logged is not None or s.other else ""
        said = f"No difference between the runs up to step {s.last}{logs}."
        # The options that differ all the same (a plant, an option changed): said where a difference is.
        _, breaking = config_diff(*(_options(r) for r in (a, b)))
        if breaking:
            said += f" Config: {'; '.join(breaking)}, which changed nothing up to it."
        return 0, "\n".join([*lines, said]), None
    if whole_first is None:
        sizes = [encoder_params(r) for r in (a, b)]
        whole_first = all(n is not None and n < WHOLE_FIRST_BELOW for n in sizes)
    first = ("*",) if whole_first else ()
    ta, tb = trace_both(a, b, step, s, repeat, first)
    floor = s.start + 1 if s.start is not None else 0
    while step > floor and _state_in_differs(diff_traces(ta, tb)):  # made to differ by an earlier step
        step -= 1
        lines.append(f"the state going into step {step + 1} already differs: stepping back to {step}")
        ta, tb = trace_both(a, b, step, s, repeat, first)
    d = diff_traces(ta, tb)
    keep = to_keep(d)
    if keep:  # digests first; now the differing tensors, and what went into them, whole
        lines.append(f"digests differ at step {step}: re-executing it with {len(keep)} tensors kept whole")
        ta, tb = trace_both(a, b, step, s, repeat, keep)
        d = diff_traces(ta, tb)
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        write(ta, save / f"A-step{step}.npz")
        write(tb, save / f"B-step{step}.npz")
    lines += ["", d.report(), "", "VERDICT: " + verdict(step, d, s, repeat, ta, tb)]
    return 1, "\n".join(lines), d
