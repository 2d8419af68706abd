"""`birdjepa verify-resume`: the headline proof that a resume is a non-event.

It trains the same configuration twice, each time through the real ``birdjepa pretrain`` command in
new processes:

* ``<runs-dir>/verify-<run>/straight``: one uninterrupted process;
* ``<runs-dir>/verify-<run>/resumed``: one process per segment, stopped after every ``--resume-at``
  step by ``--stop-at-step`` and (with ``--signal-at S``) once by a real SIGTERM sent when step ``S``
  has been logged; with ``--workers-after-resume N`` every segment after the first uses N loader
  workers.

The two train side by side (``--sequential``: one after the other). Then it compares every logged
metric step by step (`birdjepa.resume.compare`, the code behind ``birdjepa compare``), prints a table of the
max abs difference per metric and, last, the line ``max_abs_diff=<value>``; the exit status is 0 only
if that value is exactly 0.0 and every interruption happened where it was asked for.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import tyro

from birdjepa import exit_codes, validation
from birdjepa.children import Children
from birdjepa.config import PretrainConfig
from birdjepa.resume.compare import compare_with_coverage, print_table
from birdjepa.rundir import layout
from birdjepa.rundir.layout import LEASE_FILE
from birdjepa.rundir.lease import LeaseHeld, LeaseUnwritable, acquire
from birdjepa.rundir.metrics_log import read_metrics
from birdjepa.train.determinism import X64_WHY, x64_refusal
from birdjepa.validation import OptionError

# The options of this command; everything else on the command line is passed to `pretrain` as given.
_OWN_FLAGS = ("--resume-at", "--signal-at", "--workers-after-resume", "--sequential", "--no-sequential")


@dataclasses.dataclass(frozen=True)
class VerifyOptions:
    resume_at: tuple[int, ...] = ()
    """Steps after which the resumed run stops (--stop-at-step) and a new process resumes it."""
    signal_at: int | None = None
    """Send SIGTERM to the segment running once it has logged this step (it saves and exits 75)."""
    workers_after_resume: int | None = None
    """Loader workers of every segment after the first (the batches must not change)."""
    sequential: bool = False
    """Train the straight run first, then the segments (default: side by side)."""


SIGNAL_SLACK = 4
"""Steps a ``--signal-at`` leaves before the next interruption: the segment stops one to a few steps
after it (one for the log's lag, more where steps are faster than the 50 ms poll)."""


@dataclasses.dataclass(frozen=True)
class Interruption:
    step: int
    by_signal: bool


def plan(opts: VerifyOptions, steps: int, log_every: int = 1) -> list[Interruption]:
    """The interruptions in step order; each must leave at least one step to run after it (a
    ``--signal-at``, `SIGNAL_SLACK` more, and ``log_every - 1`` more: it is sent once its step's row is
    logged). Raises `OptionError` (a usage error) for one that cannot."""
    stops = [Interruption(s, False) for s in opts.resume_at]
    if opts.signal_at is not None:
        stops.append(Interruption(opts.signal_at, True))
    if not stops:  # checked after the plan, a ValueError's traceback from it came first
        raise OptionError("resume_at", opts.resume_at, "give at least one --resume-at step or --signal-at")
    stops.sort(key=lambda i: i.step)
    steps_seen = [i.step for i in stops]
    twice = [s for n, s in enumerate(steps_seen) if s in steps_seen[:n]]
    if twice:
        raise OptionError("resume_at", twice[0], f"the interruption steps (--resume-at, --signal-at) must "
                          f"differ, got {steps_seen}")  # fmt: skip
    for i in stops:
        if not 0 <= i.step < steps - 1:
            allowed = f"must be a step in [0, {steps - 2}]: a step of --steps {steps} before the last"
            raise OptionError("signal_at" if i.by_signal else "resume_at", i.step, allowed)
    slack = SIGNAL_SLACK + max(log_every, 1) - 1  # --log-every 4: its step's row came up to 3 steps late
    for i, after in zip(stops, [*steps_seen[1:], steps - 1], strict=True):
        if i.by_signal and after - i.step < slack:
            # Else the segment stopped past the next interruption, or finished, and verify failed minutes in.
            late = log_every - 1
            logged = f" (with --log-every {log_every}, up to {late} steps late)" if late else ""
            why = (f"must leave {slack} steps before the next --resume-at and the last step ({after}):"
                   f" the SIGTERM goes once the step is logged{logged}, as the next one ends, and the "
                   "segment saves after the step it is in")  # fmt: skip
            raise OptionError("signal_at", i.step, why)
    return stops


def pretrain_args(argv: Sequence[str]) -> list[str]:
    """The command line minus this command's own options and their values."""
    out: list[str] = []
    dropping = False  # inside an own option's values
    for arg in argv:
        if arg.startswith("--"):  # tyro takes --resume_at too: passed on, every trainer refused it
            name, has_value = arg.split("=", 1)[0].replace("_", "-"), "=" in arg
            dropping = name in _OWN_FLAGS and not has_value
            if name in _OWN_FLAGS:
                continue
        if not dropping:
            out.append(arg)
    return out


def _pump(stream: object, prefix: str, log_file: Path) -> None:
    """A trainer's output into its ``console.log`` and, labelled, this command's console. A console that
    cannot be written (``| head`` closed the pipe, a full disk) stops the echo, not the log: the reader
    died, no one read the trainer's pipe, and both trainers blocked writing it, for good."""
    with log_file.open("a") as log:
        for line in stream:  # type: ignore[attr-defined]
            log.write(line)
            try:
                print(f"{prefix}{line}", end="", flush=True)
            except OSError as e:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as after a broken pipe
                with contextlib.suppress(OSError):
                    print(f"WARNING the console cannot be written ({e.strerror}): the runs go on, their "
                          f"output in each run's console.log", file=sys.stderr, flush=True)  # fmt: skip


def _last_logged_step(run_dir: Path) -> int:
    if not layout.metrics_file(run_dir).exists():
        return -1
    # Steps only: a segment's resume event, written at its first step before it trains, sent the SIGTERM
    # before the trainer's handler was there (exit -15).
    return max((line["step"] for line in read_metrics(run_dir) if "event" not in line), default=-1)


def run_segment(
    children: Children, args: list[str], run_dir: Path, label: str, signal_at: int | None = None
) -> int:
    """Runs ``birdjepa pretrain ARGS`` in a new process, streaming its output with a label prefix;
    with ``signal_at`` sends SIGTERM once that step is in the run's metrics file. Returns the exit code."""
    cmd = [sys.executable, "-m", "birdjepa.cli", "pretrain", *args]
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONSOLE_LOG).touch()  # before the trainer writes: the mark of a verification's run
    proc = children.start(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pump = threading.Thread(target=_pump, args=(proc.stdout, f"[{label}] ", run_dir / CONSOLE_LOG))
    pump.start()
    signalled = signal_at is None
    while proc.poll() is None:
        if not signalled and _last_logged_step(run_dir) >= signal_at:
            proc.send_signal(signal.SIGTERM)
            signalled = True
        time.sleep(0.05)
    pump.join()
    children.done(proc)
    return proc.returncode


def _events(run_dir: Path, kind: str) -> list[dict]:
    return [x for x in read_metrics(run_dir) if x.get("event") == kind]


def verify(opts: VerifyOptions, cfg: PretrainConfig, argv: Sequence[str]) -> int:
    """Both runs, compared; the exit code. Raises `OptionError` before anything is written for an option
    that cannot work: pretrain's (`validation.check`, ``--run`` among them: ``root`` is removed below) or
    this command's own."""
    validation.check(cfg)
    if x64_refusal() is not None:  # both runs refused, then an empty table and exit 1 ("differ")
        raise OptionError("$JAX_ENABLE_X64", os.environ.get("JAX_ENABLE_X64", True), X64_WHY)
    leave = "leave --resume and --stop-at-step to verify-resume"
    if cfg.resume != "auto":
        raise OptionError("resume", cfg.resume, leave)
    if cfg.stop_at_step is not None:
        raise OptionError("stop_at_step", cfg.stop_at_step, leave)
    stops = plan(opts, cfg.steps, cfg.log_every)
    if opts.workers_after_resume is not None:  # as pretrain checks it: it failed once both runs trained
        data = dataclasses.replace(cfg.data, n_workers=opts.workers_after_resume)
        try:
            validation.check(dataclasses.replace(cfg, data=data))
        except OptionError as e:
            raise OptionError("workers_after_resume", opts.workers_after_resume, e.allowed) from None
    root = cfg.log.runs_dir / f"verify-{cfg.run}"
    # An earlier verification's output is started afresh (removed); anything else there is not ours: a
    # run named verify-X lost its checkpoints and log to `verify-resume --run X`, without a word.
    if root.is_dir() and (others := sorted(p.name for p in root.iterdir() if not own_output(p))):
        print(f"error: verify-resume writes its two runs into {root}, which holds {', '.join(others[:3])}"
              f"{' ...' if len(others) > 3 else ''}, not an earlier verification's output: give another "
              f"--run or --log.runs-dir; nothing was touched; exit {exit_codes.USAGE}",
              file=sys.stderr, flush=True)  # fmt: skip
        return exit_codes.USAGE
    # Held while it verifies, as a trainer holds its run: a second verify-resume of the same --run removed
    # the first's runs as they trained, and both ended in a traceback.
    try:
        lease = acquire(root)
    except LeaseHeld as e:
        print(f"ERROR: verify-resume: {e}; exit {exit_codes.USAGE}", flush=True)
        return exit_codes.USAGE
    except LeaseUnwritable as e:  # a read-only --log.runs-dir: a traceback (pretrain says this line)
        print(f"ERROR: verify-resume: {e}; exit {exit_codes.IOERR}", flush=True)
        return exit_codes.IOERR
    try:
        return _verify(opts, argv, stops, root)
    finally:
        lease.release()


#: The runs a verification trains in its folder (`_verify`); it writes nothing else there but its report.
OWN_RUNS = ("straight", "resumed")
#: Each of its runs' console output, which no trainer writes: what tells them from a user's run of the
#: same name (`pretrain --run verify-X/straight` was removed by `verify-resume --run X`).
CONSOLE_LOG = "console.log"


def own_output(path: Path) -> bool:
    """A verification's own file: one of its runs (empty, or holding its console.log), its report, or
    its lease's (a takeover marker or a file written aside, left by a process that died holding it)."""
    if path.name in OWN_RUNS:
        return path.is_dir() and (not any(path.iterdir()) or (path / CONSOLE_LOG).is_file())
    return path.name == "verify.json" or path.name.startswith((LEASE_FILE, f".{LEASE_FILE}"))


def _verify(opts: VerifyOptions, argv: Sequence[str], stops: list[Interruption], root: Path) -> int:
    for earlier in root.iterdir():  # our own output from an earlier verification: start both runs afresh
        if earlier.name != LEASE_FILE:
            shutil.rmtree(earlier) if earlier.is_dir() else earlier.unlink()
    base = [*pretrain_args(argv), "--log.runs-dir", str(root)]
    straight, resumed = root / "straight", root / "resumed"

    problems = []
    straight_code: list[int] = []
    # The straight run trains beside the segments: each process computes on one core (deterministic XLA),
    # so on a multi-core machine this halves the wall time and changes no number.
    children = Children()
    straight_job = threading.Thread(
        target=lambda: straight_code.append(
            run_segment(children, [*base, "--run", "straight"], straight, "straight")
        )
    )
    # A Ctrl-C or SIGTERM is the trainers' to act on: each saves and exits (`birdjepa.children`). This
    # process notes it and waits for them, where a KeyboardInterrupt would leave a traceback.
    with children.handling():
        problems += _segments(opts, children, straight_job, base, resumed, stops)
    if children.stopped:
        how = "Ctrl-C" if children.stopped == signal.SIGINT else "SIGTERM"
        print(f"verify-resume: interrupted ({how}); both runs saved where they stopped, under {root}, and "
              f"the next verify-resume starts them afresh", flush=True)  # fmt: skip
        return exit_codes.INTERRUPTED
    if straight_code != [0]:
        problems.insert(0, f"the straight run exited {straight_code[0] if straight_code else 'nothing'}")
    resumes = _events(resumed, "resume") if layout.metrics_file(resumed).exists() else []
    if not problems and len(resumes) != len(stops):
        problems.append(f"{len(resumes)} resume events for {len(stops)} interruptions")
    both_logged = all(layout.metrics_file(r).exists() for r in (straight, resumed))
    diffs, coverage = compare_with_coverage(straight, resumed) if both_logged else ([], [])
    worst = print_table(diffs)
    for line in coverage:  # a segment that lost steps
        print(line)
    (root / "verify.json").write_text(
        json.dumps({"problems": problems, "diffs": [dataclasses.asdict(d) for d in diffs]}, indent=1)
    )
    for p in problems:
        print(f"verify-resume: {p}")
    print(f"max_abs_diff={worst}", flush=True)
    return 0 if worst == 0.0 and not problems else 1


def _segments(
    opts: VerifyOptions,
    children: Children,
    straight_job: threading.Thread,
    base: list[str],
    resumed: Path,
    stops: list[Interruption],
) -> list[str]:
    """The straight run (its thread) beside the resumed run's segments; what went wrong with them."""
    problems: list[str] = []
    straight_job.start()
    if opts.sequential:
        straight_job.join()
    for n, stop in enumerate([*stops, None]):
        if children.stopped:
            break
        args = [*base, "--run", "resumed"]
        if n > 0 and opts.workers_after_resume is not None:
            args += ["--data.n-workers", str(opts.workers_after_resume)]
        if stop is not None and not stop.by_signal:
            args += ["--stop-at-step", str(stop.step)]
        signal_at = stop.step if stop is not None and stop.by_signal else None
        code = run_segment(children, args, resumed, f"segment {n}", signal_at)
        if stop is None:
            if code != 0:
                problems.append(f"the last segment exited {code}")
            break
        expected = exit_codes.REQUEUE if stop.by_signal else 0
        # A segment that ended before its log was written (refused at start): a traceback here.
        events = _events(resumed, "stop") if layout.metrics_file(resumed).exists() else []
        at = events[-1]["step"] if len(events) == n + 1 else None
        if code != expected or at is None:
            problems.append(f"segment {n} exited {code} (expected {expected}) with stop events {events}")
            break
        later = [s.step for s in stops[n + 1 :]]
        if at < stop.step or (later and at >= later[0]):
            problems.append(f"segment {n} stopped at step {at}, not between {stop.step} and {later[:1]}")
            break
        print(f"verify-resume: segment {n} stopped after step {at}", flush=True)

    straight_job.join()
    return problems


def cli(
    opts: Annotated[VerifyOptions, tyro.conf.arg(name="")],
    cfg: Annotated[PretrainConfig, tyro.conf.arg(name="")],
) -> None:
    """Train uninterrupted and with resumes (new processes), compare every logged metric, exit 0 only if
    they are bit-identical. Takes every `pretrain` option."""
    argv = sys.argv[sys.argv.index("verify-resume") + 1 :] if "verify-resume" in sys.argv else []
    try:
        code = verify(opts, cfg, argv)
    except OptionError as e:  # a usage error, as in pretrain: one line, exit 2
        print(f"verify-resume: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(exit_codes.USAGE) from None
    if code:
        raise SystemExit(code)
