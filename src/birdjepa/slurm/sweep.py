"""`birdjepa sweep sweeps/NAME.py`: one pretrain run per config of a sweep file, on Slurm or locally.

A sweep file is Python and defines ``make_cfgs() -> list[dict]``: overrides of the pretrain config,
as dotted keys (``{"optim.lr": 1e-3}``) or nested dicts (``{"optim": {"lr": 1e-3}}``). Every override
is checked against the config's fields and types before anything is submitted; an error names the file,
the config number and the key. Each config becomes a run ``<sweep>-<i>`` (or the ``run`` it sets) in
its own run directory, and a job whose script is written there (``job.sbatch``).

A job is a good Slurm citizen: it asks for ``--signal=B:USR1@GRACE`` and ``--requeue``. The batch
script forwards USR1/TERM to the trainer, which saves at the step boundary and exits 75; the script
then requeues the job (``scontrol requeue``), and the next start resumes the same run directory
automatically. A preempting partition requeues the job itself after the same save. A job that finishes
exits 0 and is not requeued. ``--force-resume-at STEP`` makes each job's first start stop after STEP
and requeue itself: the whole preemption path, on demand.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import traceback
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import tyro

from birdjepa import exit_codes, validation
from birdjepa.children import Children
from birdjepa.config import ConfigError, PretrainConfig, flatten, resolve, to_dict
from birdjepa.outputs import unwritable
from birdjepa.rundir import layout
from birdjepa.slurm.resumed_runs import SweepError, refused_resume, trained_config
from birdjepa.validation import OptionError


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    hours: float = 4.0
    """Time limit per job start (a requeued job gets it again)."""
    cpus: int = 2
    """CPUs per task."""
    mem: str | None = None
    """Memory per node, e.g. 16G (default: the partition's)."""
    gpus: int = 0
    """GPUs per node."""
    ntasks: int = 1
    """Tasks (processes) per job."""
    grace: int = 120
    """Seconds before the time limit at which Slurm sends USR1 (the trainer saves and requeues)."""
    extra: tuple[str, ...] = ()
    """Extra sbatch lines, e.g. '--constraint=a100' (written as '#SBATCH <line>')."""


def check_slurm(slurm: SlurmOptions) -> None:
    """`SweepError` for Slurm options no job can run with: a grace of the whole time limit sent the warning
    at every start (each start trained a step, saved and requeued, for ever); hours <= 0 became 1 min."""
    if not (math.isfinite(slurm.hours) and slurm.hours > 0):
        raise SweepError(f"--slurm.hours {slurm.hours}: must be > 0")
    counts = (("--slurm.cpus", slurm.cpus, 1), ("--slurm.ntasks", slurm.ntasks, 1),
              ("--slurm.gpus", slurm.gpus, 0), ("--slurm.grace", slurm.grace, 0))  # fmt: skip
    for flag, value, least in counts:
        if value < least:
            raise SweepError(f"{flag} {value}: must be >= {least}")
    # Written into unquoted #SBATCH lines: "gpu debug" and a newline ("16G\nsrun hostname") put the rest on
    # a line of its own, a command that ended the job's options.
    words = [("--slurm.partition", slurm.partition), ("--slurm.account", slurm.account),
             ("--slurm.qos", slurm.qos), ("--slurm.mem", slurm.mem)]  # fmt: skip
    for flag, value in [*words, *(("--slurm.extra", line) for line in slurm.extra)]:
        spaced = flag != "--slurm.extra" and any(c.isspace() for c in value or "")
        if value is not None and (spaced or not value.strip() or not value.isprintable()):
            raise SweepError(f"{flag} {value!r}: a space, a control character or nothing, which its #SBATCH "
                             "line cannot hold")  # fmt: skip
    limit = time_limit_minutes(slurm) * 60
    if slurm.grace >= limit:
        raise SweepError(f"--slurm.grace {slurm.grace}: not below the job's time limit ({limit} s, "
                         "--slurm.hours): the warning would come as each start begins")  # fmt: skip


# ----------------------------------------------------------------------------------------- sweep files
_LOADED: dict[tuple[str, bytes], types.ModuleType] = {}
"""Sweep files executed in this process, by path and content: `birdjepa sweep` asks for
make_benchmarks, then make_cfgs, and a file's own code (its prints, the folders it makes) ran twice."""


def load_module(path: Path) -> types.ModuleType:
    """A sweep file, executed as a module of its own (once per content in a process)."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"{path}: no such sweep file")
    source = path.read_bytes()
    key = (str(path.resolve()), hashlib.sha256(source).digest())
    if key not in _LOADED:
        # The bytes hashed, compiled here: an import's loader took a __pycache__ entry by the file's
        # size and time (a sweep file rewritten in the same second, at the same size, ran its old
        # code) and wrote one beside the user's file. Whatever its name ends in, and able to import a
        # module beside it, as `python FILE` is.
        module = types.ModuleType(f"birdjepa_sweep_{path.stem}")
        module.__file__ = str(path)
        # Registered, as an import registers it: a dataclass under `from __future__ import annotations`
        # looks its module up there ("'NoneType' object has no attribute '__dict__'" without).
        sys.modules[module.__name__] = module

        def execute() -> None:
            exec(compile(source, str(path), "exec", dont_inherit=True), vars(module))

        sys.path.insert(0, str(path.resolve().parent))
        try:
            run_own_code(path, execute)
        finally:
            sys.path.remove(str(path.resolve().parent))
        _LOADED[key] = module
    return _LOADED[key]


def run_own_code(path: Path, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, which runs the sweep file's own code: an error there (a syntax error, an import
    that fails, an exception in make_cfgs) is a `SweepError` naming the file and its line, not a
    traceback."""
    try:
        return fn(*args)
    except (Exception, SystemExit) as e:  # noqa: BLE001 (anything the user's file raises; sys.exit(0)
        # in it ended the sweep with exit 0, nothing run and nothing said)
        if isinstance(e, SyntaxError) and e.lineno is not None:
            line: int | None = e.lineno
        else:
            frames = traceback.extract_tb(e.__traceback__)
            own = [f for f in frames if Path(f.filename).resolve() == path.resolve()]
            line = own[-1].lineno if own else None
        raise SweepError(f"{path}{f':{line}' if line else ''}: {type(e).__name__}: {e}") from None


def load_sweep(path: Path) -> list[dict[str, Any]]:
    """``make_cfgs()`` of a sweep file, checked to be a non-empty list of dicts."""
    module = load_module(path)
    make = getattr(module, "make_cfgs", None)
    if not callable(make):
        raise SweepError(f"{path}: defines no make_cfgs() function")
    cfgs = run_own_code(path, make)
    if not isinstance(cfgs, list) or not cfgs:
        got = "an empty list" if isinstance(cfgs, list) else f"a {type(cfgs).__name__}"  # "got list"
        raise SweepError(f"{path}: make_cfgs() must return a non-empty list of dicts, got {got}")
    for i, c in enumerate(cfgs):
        if not isinstance(c, Mapping):
            raise SweepError(f"{path}: config {i} is a {type(c).__name__}, not a dict")
    return [dict(c) for c in cfgs]


def to_flags(overrides: Mapping[str, Any]) -> list[str]:
    """`birdjepa pretrain` flags that set ``overrides`` (tyro's spelling: dashes, --flag/--no-flag)."""
    out: list[str] = []
    for key, value in flatten(overrides).items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            head, _, last = flag.rpartition(".")
            out.append(flag if value else (f"{head}.no-{last}" if head else f"--no-{flag[2:]}"))
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        elif str(value).startswith("-") and not isinstance(value, (int, float)):
            out.append(f"{flag}={value}")  # as two words, tyro took "--x" for a flag: a usage box
        else:
            out += [flag, str(value)]
    return out


@dataclasses.dataclass(frozen=True)
class Job:
    index: int
    cfg: PretrainConfig
    flags: list[str]
    """The `birdjepa pretrain` flags of this run (parsed back to ``cfg`` exactly, see `plan`)."""
    kept: tuple[str, ...] = ()
    """Options its run's checkpoint holds at other values than ``cfg`` and the flags leave to it, which
    the job trains on (``key:config's->checkpoint's``): an override dropped from the file, or a default
    changed since the run trained."""


#: What Slurm's ``#SBATCH`` lines read otherwise than as a path's characters: ``#`` starts a comment (a
#: run's log went to a file named as its path cut there), a backslash is dropped (the log's folder did
#: not exist: the job failed at launch, its log nowhere) and a quote must be matched (sbatch refused the
#: script, the configs before it submitted).
NOT_IN_SBATCH = "#\\'\""


def slurm_safe(path: Path, what: str, where: str) -> None:
    """`SweepError` for a path an sbatch line cannot hold: ``#SBATCH`` lines are not quoted, and a newline
    in a run name ended them, its next line a command of the job script."""
    if any(c.isspace() or not c.isprintable() or c in NOT_IN_SBATCH for c in str(path)):
        raise SweepError(f"{where}: {what} {str(path)!r} has a space, a control character or one of "
                         f"{' '.join(NOT_IN_SBATCH)}, which a Slurm job script's #SBATCH lines cannot hold "
                         "as they are; nothing was submitted")  # fmt: skip


def plan(
    path: Path, runs_dir: Path | None = None, force_resume_at: int | None = None, submits: bool = True
) -> list[Job]:
    """Every config of a sweep file, validated and resolved; raises SweepError before any submission.
    ``submits``: its job scripts go to Slurm (not --local), whose #SBATCH lines must hold its paths."""
    jobs = []
    for i, overrides in enumerate(load_sweep(path)):
        where = f"{path}: config {i}"
        try:
            overrides = flatten(overrides, where=where)
        except ConfigError as e:
            raise SweepError(str(e)) from None
        overrides.setdefault("run", f"{Path(path).stem}-{i}")
        if runs_dir is not None:
            overrides.setdefault("log.runs_dir", str(Path(runs_dir).absolute()))
        try:
            cfg = resolve(PretrainConfig(), overrides, where)
        except ConfigError as e:
            raise SweepError(str(e)) from None
        try:  # the values pretrain would reject, here, before anything is submitted
            validation.check(cfg, saved=trained_config(cfg))  # as pretrain's start
        except OptionError as e:
            raise SweepError(f"{where}: {e}") from None
        flags = to_flags(overrides)
        parsed = tyro.cli(PretrainConfig, args=flags)
        if parsed != cfg:  # the job's command line must mean exactly this config
            raise SweepError(f"{where}: flags {shlex.join(flags)} do not parse back to the config")
        if submits:
            slurm_safe(cfg.run_dir.absolute(), "its run directory", where)
        if cfg.resume == "never":  # refused at its first requeue's start (exit 2): the run left half done
            raise SweepError(f"{where}: --resume never: a sweep's job is requeued, and each start after its "
                             "first must resume the run")  # fmt: skip
        kept = refused_resume(cfg, flags, where)
        newest = max(layout.checkpoint_steps(cfg.run_dir.absolute()), default=-1)
        if cfg.stop_at_step is not None and cfg.stop_at_step <= newest:  # refused at its job's start, exit 2
            raise SweepError(f"{where}: stop_at_step {cfg.stop_at_step}: run {cfg.run} has trained that step "
                             f"already (newest checkpoint {newest}): give a later one, or none")  # fmt: skip
        if force_resume_at is not None and not 0 <= force_resume_at < cfg.steps - 1:
            raise SweepError(
                f"{where}: --force-resume-at {force_resume_at} is not inside its {cfg.steps} steps"
            )
        # Its stop came after the config's on the command line and won: the run trained past the config's
        # stop, and the requeued start was refused, "has trained that step already", exit 2.
        if (
            force_resume_at is not None
            and cfg.stop_at_step is not None
            and force_resume_at >= cfg.stop_at_step
        ):
            raise SweepError(f"{where}: --force-resume-at {force_resume_at} is not before its stop_at_step "
                             f"{cfg.stop_at_step}: give an earlier step, or none")  # fmt: skip
        jobs.append(Job(i, cfg, flags, kept))
    first: dict[Path, int] = {}
    for job in jobs:  # it listed every config's run directory, and named no config
        run_dir = job.cfg.run_dir.absolute()
        # Resolved: B/../A or a link to A spelled one folder as two runs, which then trained it at once.
        if (other := first.setdefault(run_dir.resolve(), job.index)) != job.index:
            raise SweepError(f"{path}: configs {other} and {job.index} share the run directory {run_dir}")
    return jobs


# ---------------------------------------------------------------------------------------- job scripts
def in_pattern(path: Path | str) -> str:
    """``path`` as it stands in an sbatch ``--output`` pattern, whose ``%`` Slurm expands (``%j``, ``%x``,
    ...): a run named ``lr%x`` failed at launch, its log written nowhere."""
    return str(path).replace("%", "%%")


def time_limit_minutes(slurm: SlurmOptions) -> int:
    return max(int(round(slurm.hours * 60)), 1)


def sbatch_lines(name: str, output: str, slurm: SlurmOptions, ntasks: int, *more: str) -> list[str]:
    """The ``#SBATCH`` options every birdjepa job has: requeueable, appending to one log, then ``more``,
    the resources ``slurm`` asks for and its extra lines last."""
    minutes = time_limit_minutes(slurm)
    sbatch = [f"--job-name={name}", f"--output={output}", "--open-mode=append",
              f"--time={minutes // 60}:{minutes % 60:02d}:00", f"--ntasks={ntasks}",
              f"--cpus-per-task={slurm.cpus}", "--requeue", *more]  # fmt: skip
    for opt, value in (("partition", slurm.partition), ("account", slurm.account), ("qos", slurm.qos),
                       ("mem", slurm.mem)):  # fmt: skip
        if value:
            sbatch.append(f"--{opt}={value}")
    if slurm.gpus:
        sbatch.append(f"--gpus-per-node={slurm.gpus}")
    return sbatch + list(slurm.extra)


def job_script(job: Job, slurm: SlurmOptions, force_resume_at: int | None, workdir: Path) -> str:
    """The sbatch script of one run (see the module docstring for what it does on signals)."""
    run_dir = job.cfg.run_dir.absolute()
    output = f"{in_pattern(run_dir)}/slurm-%j.out"
    sbatch = sbatch_lines(f"birdjepa-{job.cfg.run}", output, slurm, slurm.ntasks,
                          f"--signal=B:USR1@{slurm.grace}")  # fmt: skip
    command = [sys.executable, "-m", "birdjepa.cli", "pretrain", *job.flags]
    if slurm.ntasks > 1:  # one process per task; they find each other through Slurm's environment
        command = ["srun", "--kill-on-bad-exit=1", *command]
    force = "" if force_resume_at is None else str(force_resume_at)
    lines = ["#!/bin/bash", *(f"#SBATCH {s}" for s in sbatch), ""]
    lines += [
        f"# birdjepa sweep: config {job.index}, run {job.cfg.run}",
        "set -u",
        f"cd {shlex.quote(str(workdir))}",
        "export PYTHONUNBUFFERED=1",
        f"export BIRDJEPA_LEASE_WAIT_S={slurm.grace}  # a requeue waits this long for its predecessor's save",
        "restart=${SLURM_RESTART_COUNT:-0}",
        f"force={force}",
        f"cmd=({shlex.join(command)})",
        "forced=0",
        'if [ -n "$force" ] && [ "$restart" -eq 0 ]; then cmd+=(--stop-at-step "$force"); forced=1; fi',
        "started=$(date +%s)",
        f"limit_s={time_limit_minutes(slurm) * 60}",
        'echo "birdjepa job ${SLURM_JOB_ID:-local} start ${restart} on $(hostname) at $started"',
        '"${cmd[@]}" &',
        "child=$!",
        "# Slurm's warning signal (and a preemption's) goes to this shell: pass it on, the trainer saves.",
        "signalled=0",
        "termed=0",
        "trap 'echo \"got USR1\"; signalled=1; kill -USR1 $child 2>/dev/null' USR1",
        "trap 'echo \"got TERM\"; signalled=1; termed=1; kill -TERM $child 2>/dev/null' TERM",
        'while :; do wait "$child"; code=$?; kill -0 "$child" 2>/dev/null || break; done',
        'echo "trainer exited $code"',
        "# scancel's TERM: the user stopped the job (the trainer saved); a requeue would start it again.",
        "# Not a preemption's (Slurm sets PreemptTime), nor the time limit's (a TERM at it, no USR1 before:",
        "# this script starts after the job, so the last minute counts as the limit).",
        'if [ "$termed" -eq 1 ] && [ $(($(date +%s) - started)) -lt $((limit_s - 60)) ] \\',
        '  && scontrol show job "${SLURM_JOB_ID:-}" 2>/dev/null | grep -q "PreemptTime=None"; then',
        '  echo "cancelled: not requeued (the same sweep resumes it)"',
        '  exit "$code"',
        "fi",
        "# Killed by the signal passed on (138 USR1, 143 TERM): it came before the trainer's handler was in",
        "# place or after its run had finished. Requeue: the next start resumes from the last checkpoint.",
        'if [ "$signalled" -eq 1 ] && { [ "$code" -eq 138 ] || [ "$code" -eq 143 ]; }; then code=75; fi',
        'if [ "$code" -eq 75 ] || { [ "$code" -eq 0 ] && [ "$forced" -eq 1 ]; }; then',
        # Slurm's start count, as the "start N" line above: the run's own "restart" counts its resumes.
        '  echo "requeueing ${SLURM_JOB_ID:-local} (its start $((restart + 1)) will resume)"',
        '  scontrol requeue "${SLURM_JOB_ID:-}" || echo "requeue failed (a preemption may be requeueing it)"',
        "  exit 0",
        "fi",
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"


def submit(script: Path) -> str:
    """sbatch a script; returns the job id."""
    try:
        done = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    except FileNotFoundError:
        raise RuntimeError("sbatch is not on PATH: not a Slurm login node? (--local runs here)") from None
    if done.returncode != 0:
        raise RuntimeError(f"sbatch {script} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def local_commands(job: Job, force_resume_at: int | None) -> list[list[str]]:
    """The commands a job runs here, one after another: its pretrain (twice with --force-resume-at:
    stop, then resume)."""
    command = [sys.executable, "-m", "birdjepa.cli", "pretrain", *job.flags]
    starts = [[*command, "--stop-at-step", str(force_resume_at)]] if force_resume_at is not None else []
    return [*starts, command]


def run_local(job: Job, force_resume_at: int | None, ntasks: int, children: Children) -> int:
    """Run a job's `local_commands` here, each as ``ntasks`` processes that form one group through
    ``BIRDJEPA_*`` variables (see `birdjepa.slurm.distributed`)."""
    for argv in local_commands(job, force_resume_at):
        code = launch_local(argv, ntasks, children)
        if code != 0 or children.stopped:
            return code
    return 0


def launch_local(argv: list[str], ntasks: int, children: Children | None = None) -> int:
    """Start ``argv`` as ``ntasks`` processes of one group on this machine; the worst exit code. A Ctrl-C
    or SIGTERM while they run is theirs to act on (`birdjepa.children`); ``children``: noted there."""
    envs: list[dict[str, str] | None] = [None]  # one process: this one's environment
    if ntasks > 1:
        with socket.socket() as s:  # a free port for the coordinator
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        group = {"BIRDJEPA_NUM_PROCESSES": str(ntasks), "BIRDJEPA_COORDINATOR": f"127.0.0.1:{port}"}
        envs = [{**os.environ, **group, "BIRDJEPA_PROCESS_ID": str(i)} for i in range(ntasks)]
    children = children or Children()
    with children.handling():
        procs = [children.start(argv, env=env) for env in envs]
        return wait_group(procs)


#: How long the other processes of a group may take to end once one was killed by a signal (they wait
#: for it in a collective: each finds it gone within seconds, and says so, exit 69), and once one exited
#: with a failure code: those that stop together (a saved preemption, a refused option) end together,
#: but process 0 may still be closing its wandb mirror.
GROUP_GRACE_S = {"killed": 20.0, "exited": 300.0}


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal
        return f"signal {number}"


def wait_group(procs: list[subprocess.Popen], grace_s: float | None = None) -> int:
    """The first failure's exit code among ``procs`` (0 where each exits 0). A process killed by a signal
    is said in one line (it could say nothing), and once one failed, the others still running after
    ``grace_s`` (default: `GROUP_GRACE_S`) are killed, as srun's --kill-on-bad-exit does on Slurm: a
    group cannot go on without one of its processes, and where that was process 0, the coordinator, the
    others waited for it in a collective, then aborted with a C++ stack."""
    first: subprocess.Popen | None = None
    deadline = math.inf
    while [p for p in procs if p.poll() is None] and time.monotonic() < deadline:  # polls each
        if first is None and (failed := [p for p in procs if p.returncode not in (None, 0)]):
            # One killed by a signal is the cause where both are seen ended: no process kills a peer.
            first = min(failed, key=lambda p: p.returncode >= 0)
            grace_s = grace_s or GROUP_GRACE_S["killed" if first.returncode < 0 else "exited"]
            deadline = time.monotonic() + grace_s
        time.sleep(0.1)
    late = [p for p in procs if p.poll() is None]
    for p in late:
        p.kill()
    for i, p in enumerate(procs):
        if p.wait() < 0 and p not in late:
            print(f"sweep: process {i} of {len(procs)} was killed by {signal_name(-p.returncode)}",
                  file=sys.stderr, flush=True)  # fmt: skip
    if late:
        print(f"sweep: stopped process{'es' if len(late) > 1 else ''} "
              f"{', '.join(str(procs.index(p)) for p in late)} of {len(procs)}, still running "
              f"{grace_s:.0f} s after process {procs.index(first)} ended",
              file=sys.stderr, flush=True)  # fmt: skip
    ended = [p for p in procs if p.returncode] if first is None else [first]
    return min(ended, key=lambda p: p.returncode >= 0).returncode if ended else 0


def cli(
    sweep_file: tyro.conf.Positional[Path],
    dry_run: bool = False,
    local: bool = False,
    force_resume_at: int | None = None,
    runs_dir: Path | None = None,
    slurm: Annotated[SlurmOptions, tyro.conf.arg(name="slurm")] = SlurmOptions(),
) -> None:
    """Submit one pretrain job per config of a sweep file (Slurm), or run them here (--local).

    --dry-run prints each resolved config and its job script; --force-resume-at STEP makes every job
    stop after STEP and requeue itself once; --runs-dir sets log.runs_dir where a config does not."""
    try:
        check_slurm(slurm)
        jobs = plan(sweep_file, runs_dir, force_resume_at, submits=not local)
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(exit_codes.USAGE) from None
    if not dry_run:  # before the first job: a read-only runs folder was a traceback, jobs started or not
        for job in jobs:
            if (why := unwritable(job.cfg.run_dir.absolute(), folder=True)) is not None:
                print(f"error: config {job.index}: {why}; nothing was started", file=sys.stderr, flush=True)
                raise SystemExit(exit_codes.IOERR)
    for job in jobs:  # as pretrain's first line says them at the resume; --dry-run printed the file's
        if job.kept:
            print(f"WARNING config {job.index}: run {job.cfg.run_dir.absolute()} resumes options from its "
                  f"checkpoint that the config gives other values ({', '.join(job.kept)}: the config's, then "
                  "the checkpoint's, which its job trains on): set them in the config to train them, or give "
                  "it another run", flush=True)  # fmt: skip
    workdir = Path.cwd()
    rows = []
    failed = ""
    children = Children()
    for job in jobs:
        run_dir = job.cfg.run_dir.absolute()
        # A run already past the forced stop (the same sweep run again after a Ctrl-C, or finished) is
        # resumed as it is: the stop was refused, "has trained that step already", exit 2.
        newest = max(layout.checkpoint_steps(run_dir), default=-1)
        past = force_resume_at is not None and newest >= force_resume_at
        force = None if past else force_resume_at
        script = job_script(job, slurm, force, workdir)
        if dry_run:
            print(f"# config {job.index} ({run_dir}), resolved:")
            print(json.dumps(to_dict(job.cfg), indent=1))
            print(f"# config {job.index}: birdjepa pretrain {shlex.join(job.flags)}")
            if local:  # no script runs here (it printed the Slurm script): the commands, in turn
                group = f"  # as {slurm.ntasks} processes of one group" if slurm.ntasks > 1 else ""
                print("".join(f"{shlex.join(argv)}{group}\n" for argv in local_commands(job, force)))
            else:
                print(script)
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "job.sbatch").write_text(script)
        if local:
            code = run_local(job, force, slurm.ntasks, children)
            rows.append((job.index, f"local{' (past the forced stop)' if past else ''} exit {code}", run_dir))
            if children.stopped:  # a Ctrl-C or SIGTERM: the sweep stops, not just this run
                break
        else:
            try:
                rows.append((job.index, submit(run_dir / "job.sbatch"), run_dir))
            except RuntimeError as e:  # a traceback, and the jobs already submitted said nowhere
                failed = f"error: config {job.index}: {e}; the configs above were submitted, those below not"
                break
    if rows:
        print(f"{'config':>6}  {'job':<14}  run directory")
        for i, job_id, run_dir in rows:
            print(f"{i:>6}  {job_id:<14}  {run_dir}")
    if failed:
        print(failed, file=sys.stderr, flush=True)
    if children.stopped:  # as its trainers exit for the stop: 130 for a Ctrl-C, 75 for a SIGTERM (it was 1)
        raise SystemExit(exit_codes.INTERRUPTED if children.stopped == signal.SIGINT else exit_codes.REQUEUE)
    if failed or (local and any(not str(r[1]).endswith(" 0") for r in rows)):
        raise SystemExit(exit_codes.FAILED)
