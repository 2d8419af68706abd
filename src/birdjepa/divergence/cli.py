"""The commands `birdjepa trace`, `birdjepa diff-trace` and `birdjepa bisect`.

Every failure that is the input's (a run directory that is not one, a step never run, a missing
checkpoint, a damaged metrics log, a file that is not a trace, an output that cannot be written) is one
line on stderr and exit 2; the output is checked before any step is re-executed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import tyro

from birdjepa import exit_codes

RUN = Annotated[Path, tyro.conf.Positional]


def _fail(e: Exception) -> None:
    print(f"error: {e}", file=sys.stderr, flush=True)
    raise SystemExit(exit_codes.USAGE)


def trace(
    run: RUN,
    step: int,
    out: Path | None = None,
    keep: tuple[str, ...] = (),
    only: tuple[str, ...] = (),
    repeat: int = 1,
) -> None:
    """Re-execute step STEP of the run in RUN exactly as it ran and record everything it computes, in
    order, into one file (default: trace-<run>-<step>.npz here).

    Every tensor is recorded as its shape, dtype, an exact digest and statistics (min, max, mean, norm,
    non-finite count); --keep stores some whole (fnmatch on stage/name, e.g. --keep gradients
    'forward/global/encoder/block_0/*'; --keep '*' keeps all). --only records only some stages or
    tensors; --repeat K runs the step K times and records what differs between executions (the noise
    floor). Exit 0; 1 where the re-executed step's outputs differ from what the run logged or saved
    for it (the file is written either way)."""
    from birdjepa.divergence import trace_file
    from birdjepa.divergence.replay import ReplayError
    from birdjepa.divergence.trace import trace_step
    from birdjepa.outputs import unwritable
    from birdjepa.rundir.metrics_log import MetricsFileError

    if repeat < 1:
        _fail(ValueError(f"--repeat {repeat}: must be at least 1"))
    path = out or Path(f"trace-{run.name}-{step}.npz")
    why = unwritable(path)  # before the step is re-executed, not after
    if why is None and path.exists() and not trace_file.is_trace(path):  # --out RUN/metrics.jsonl: a zip
        why = f"{path}: exists and is no trace (a run's own file?): give another --out"
    # The default name holds the run's folder name alone: two sweeps' run b traced here replaced each other.
    traced = trace_file.traced_run(path) if why is None and out is None and path.exists() else None
    if traced is not None and Path(traced).resolve() != run.resolve():
        why = f"{path} holds a trace of another run named {run.name} ({traced}): give --out"
    if why is not None:
        _fail(ValueError(why))
    try:
        t = trace_step(run, step, only=only, keep=keep, repeat=repeat)
    except (ReplayError, MetricsFileError) as e:
        _fail(e)
    path.parent.mkdir(parents=True, exist_ok=True)  # a missing folder is made, as `embed --out` makes it
    trace_file.write(t, path)
    print(summary(t, path), flush=True)
    if differs_from_run(t.manifest):
        raise SystemExit(exit_codes.FAILED)


def differs_from_run(manifest: dict) -> bool:
    """The traced step's outputs differ from what the run logged or saved for it."""
    return any(v is False for v in manifest["matches_run"].values())


def summary(t: Any, path: Path) -> str:
    """One line: where the step came from, what the file holds, and whether it is the step that trained."""
    from birdjepa.divergence.replay import decoded_apart, revised

    m = t.manifest
    origin = f"checkpoint {m['restored_from']}" if m["restored_from"] is not None else "the run's start"
    if m["replayed"]:
        origin += f", steps {m['replayed'][0]}-{m['replayed'][1]} replayed with their logged metrics equal"
        if m.get("replayed_unlogged"):  # else called equal with nothing compared (--log-every N)
            origin += f" ({m['replayed_unlogged']} of them logged none to compare)"
    checks = {"logged_metrics_equal": "its logged metrics", "checkpoint_equal": "its checkpoint"}
    matched = [what for k, what in checks.items() if m["matches_run"].get(k)]
    missed = [what for k, what in checks.items() if m["matches_run"].get(k) is False]
    trained = (
        f"outputs equal {' and '.join(matched)}" if matched and not missed
        else f"outputs DIFFER from {' and '.join(missed)}{revised(m.get('trained_revision'))}"
             f"{decoded_apart(m.get('trained_decoder'), m.get('decode_changes', []))}" if missed
        else "outputs from the training step (nothing logged or saved for it to compare)"
    )  # fmt: skip
    whole = sum(e.array is not None for e in t.entries)
    if m["inexact"] is not None:
        trained += (
            f"; WARNING: {m['inexact']} differs in its last bits between the training step and the step "
            f"compiled apart to record {m['recorded_apart']} (XLA fuses the two otherwise), so what that "
            "step recorded is within rounding of the training step's, not its own"
        )
    noise = f"; {len(m['noise'])} tensors differ between {m['repeat']} executions" if m["repeat"] > 1 else ""
    kept = "all whole" if whole == len(t.entries) else f"{whole} whole, the rest as digests"
    return f"{path}: step {m['step']} from {origin}; {len(t.entries)} tensors ({kept}); {trained}{noise}"


def diff_trace(a: RUN, b: RUN) -> None:
    """Compare two traces stage by stage in computation order: the config differences, the first
    quantity that differs, then one line per stage. Exit 0 if identical, 1 otherwise."""
    from birdjepa.divergence import trace_file
    from birdjepa.divergence.diff import diff_traces

    try:
        ta, tb = trace_file.read(a), trace_file.read(b)
    except trace_file.TraceFileError as e:
        _fail(e)
    d = diff_traces(ta, tb)
    print(f"A {a}\nB {b}\n{d.report()}", flush=True)
    raise SystemExit(0 if d.identical else exit_codes.FAILED)


def bisect(
    a: RUN,
    b: RUN,
    repeat: int = 1,
    save: Path | None = None,
) -> None:
    """Find the first step at which runs A and B differ in anything (logged metrics, checkpoint CRC-32s,
    or, stepped side by side, any bit of the batch, key or state), trace both there, and name the first
    tensor that differs, in computation order, with a verdict. --repeat K measures the noise floor (K
    executions of the step in each run); --save DIR keeps both traces. Exit 0 if the runs do not differ,
    1 if they do."""
    from birdjepa.divergence.bisect import bisect as run_bisect
    from birdjepa.divergence.replay import ReplayError
    from birdjepa.outputs import unwritable
    from birdjepa.rundir.metrics_log import MetricsFileError

    if repeat < 1:
        _fail(ValueError(f"--repeat {repeat}: must be at least 1"))
    why = unwritable(save, folder=True) if save is not None else None  # before the search, not after
    if why is not None:
        _fail(ValueError(why))
    try:
        code, report, _ = run_bisect(a, b, repeat=repeat, save=save)
    except (ReplayError, MetricsFileError) as e:
        _fail(e)
    print(report, flush=True)
    raise SystemExit(code)
