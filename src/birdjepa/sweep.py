"""`birdjepa sweep FILE`: a pretrain sweep (``make_cfgs()``, see `birdjepa.slurm.sweep`) or a benchmark
sweep (``make_benchmarks()``): one `birdjepa benchmark` job per dict of its options, e.g.

    def make_benchmarks():
        return [{"backbone": [f"runs/r1@{s}", "random:runs/r1", "raw"], "task": t, "train": f"{t}/train",
                 "test": f"{t}/test_5s", "n_train": [1, 4, 16, -1], "seed": [0, 1, 2], "results": "results"}
                for s in (1000, 2000) for t in ("S1", "S2")]

Every option is checked against the benchmark's own flags (name and type) before anything is submitted;
an error names the file, the entry and the option. A job writes into the store it names, and skips what
the store holds: a requeued or repeated job redoes only what is missing, and jobs that share a store
lose nothing (`birdjepa.benchmark.store`). The dispatch lives here, on the floor that sees both kinds.
"""

from __future__ import annotations

import inspect
import shlex
import signal
import sys
import typing
from pathlib import Path
from typing import Annotated, Any

import tyro

from birdjepa import exit_codes
from birdjepa.benchmark import cli as benchmark_cli
from birdjepa.children import Children
from birdjepa.config import type_ok
from birdjepa.slurm import sweep as pretrain_sweep
from birdjepa.slurm.sweep import SlurmOptions, SweepError, submit

DEFAULT_SLURM = SlurmOptions()
#: Options a job may not set: they do not run a benchmark.
NOT_IN_JOBS = ("table", "plot", "metric")


def load_benchmarks(path: Path) -> list[dict[str, Any]] | None:
    """``make_benchmarks()`` of a sweep file, or None when it defines none (a pretrain sweep)."""
    module = pretrain_sweep.load_module(path)
    make = getattr(module, "make_benchmarks", None)
    if make is None:
        return None
    if hasattr(module, "make_cfgs"):  # make_cfgs was dropped without a word
        raise SweepError(f"{path}: defines both make_cfgs() and make_benchmarks(): one sweep file, one kind")
    entries = pretrain_sweep.run_own_code(path, make)
    if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
        raise SweepError(f"{path}: make_benchmarks() must return a non-empty list of dicts")
    return entries


def benchmark_flags(entry: dict[str, Any], where: str) -> list[str]:
    """The `birdjepa benchmark` flags of one entry, each option checked by name and type."""
    hints = typing.get_type_hints(benchmark_cli.cli, include_extras=True)
    params = inspect.signature(benchmark_cli.cli).parameters
    flags: list[str] = []
    for key, value in entry.items():
        if key not in params or key in NOT_IN_JOBS:
            allowed = ", ".join(p for p in params if p not in NOT_IN_JOBS)
            raise SweepError(f"{where}: unknown option {key!r} (one of: {allowed})")
        hint = typing.get_args(hints[key])[0] if typing.get_origin(hints[key]) is Annotated else hints[key]
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
        ok = all(type_ok(v, item) for v in value) if item and isinstance(value, list) \
            else type_ok(value, hint)  # fmt: skip
        if not ok:
            raise SweepError(f"{where}: option {key!r} = {value!r} has the wrong type (expected {hint})")
        flag = f"--{key.replace('_', '-')}"
        if isinstance(value, str) and value.startswith("-"):  # as two words, taken for a flag: a usage box
            flags.append(f"{flag}={value}")
        else:
            flags += [flag, *map(str, value if isinstance(value, list) else [value])]
    for needed in ("backbone", "train", "test"):
        if needed not in entry:
            raise SweepError(f"{where}: no {needed!r}: a benchmark job needs backbone, train and test")
    # The values too, as the job would check them first: a bad one failed only once the job ran.
    options = {k: p.default for k, p in params.items()} | entry
    checked = inspect.signature(benchmark_cli.check_options).parameters
    try:
        benchmark_cli.check_options(**{k: options[k] for k in checked})
    except benchmark_cli.BenchmarkError as e:
        raise SweepError(f"{where}: {e}") from None
    return flags


def pretrain_only(
    path: Path, force_resume_at: int | None, runs_dir: Path | None, slurm: SlurmOptions
) -> None:
    """Refuse the options only a pretrain sweep reads: a benchmark sweep ran without them, silently."""
    given = [flag for flag, value, default in (("--force-resume-at", force_resume_at, None),
                                               ("--runs-dir", runs_dir, None),
                                               ("--slurm.ntasks", slurm.ntasks, DEFAULT_SLURM.ntasks))
             if value != default]  # fmt: skip
    if given:
        raise SweepError(
            f"{path}: a benchmark sweep (make_benchmarks) has no {' or '.join(given)}: "
            "pretrain sweeps (make_cfgs) only; a benchmark job writes where its 'results' says"
        )


def benchmark_command(flags: list[str]) -> list[str]:
    return [sys.executable, "-m", "birdjepa.cli", "benchmark", *flags]


def job_script(name: str, flags: list[str], slurm: SlurmOptions, workdir: Path, log_dir: Path) -> str:
    """A requeueable sbatch script: a preempted job starts again and skips what its store holds."""
    output = f"{pretrain_sweep.in_pattern(log_dir)}/{pretrain_sweep.in_pattern(name)}-%j.out"
    sbatch = pretrain_sweep.sbatch_lines(f"birdjepa-{name}", output, slurm, 1)
    command = benchmark_command(flags)
    lines = ["#!/bin/bash", *(f"#SBATCH {s}" for s in sbatch), "",
             f"# birdjepa sweep: benchmark {name}", "set -u", f"cd {shlex.quote(str(workdir))}",
             "export PYTHONUNBUFFERED=1", f"exec {shlex.join(command)}"]  # fmt: skip
    return "\n".join(lines) + "\n"


def cli(
    sweep_file: tyro.conf.Positional[Path],
    dry_run: bool = False,
    local: bool = False,
    force_resume_at: int | None = None,
    runs_dir: Path | None = None,
    slurm: Annotated[SlurmOptions, tyro.conf.arg(name="slurm")] = DEFAULT_SLURM,
) -> None:
    """Submit one job per entry of a sweep file (Slurm), or run them here (--local): pretrain runs
    (make_cfgs) or benchmarks (make_benchmarks).

    --dry-run prints each job's script; --force-resume-at STEP (pretrain) makes every job stop after STEP
    and requeue itself once; --runs-dir sets log.runs_dir where a pretrain config does not."""
    try:
        pretrain_sweep.check_slurm(slurm)
        entries = load_benchmarks(sweep_file)
        if entries is None:
            return pretrain_sweep.cli(sweep_file, dry_run, local, force_resume_at, runs_dir, slurm)
        pretrain_only(sweep_file, force_resume_at, runs_dir, slurm)
        jobs = []
        for i, entry in enumerate(entries):
            flags = benchmark_flags(entry, f"{sweep_file}: entry {i}")
            results = Path(entry.get("results", "results"))
            name = f"{sweep_file.stem}-{i}"  # its job's name and log file, in #SBATCH lines too
            if not local:  # here, no #SBATCH line is read
                where = f"{sweep_file}: entry {i}"
                pretrain_sweep.slurm_safe(results.absolute(), "its results folder", where)
                pretrain_sweep.slurm_safe(Path(name), "its name (the sweep file's)", where)
            jobs.append((name, flags, results))
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(exit_codes.USAGE) from None
    failed = 0
    children = Children()  # a SIGTERM to the sweep is its benchmark's too (it ran on as an orphan)
    for name, flags, results in jobs:
        log_dir = (results / "jobs").absolute()
        script = job_script(name, flags, slurm, Path.cwd(), log_dir)
        command = benchmark_command(flags)
        if dry_run:  # --local runs the command, no script (it printed the Slurm script)
            print(f"# {name}: birdjepa benchmark {shlex.join(flags)}")
            print(shlex.join(command) if local else script)
            continue
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / f"{name}.sbatch").write_text(script)
        if local:
            code = pretrain_sweep.launch_local(command, 1, children)
            failed += code != 0
            print(f"{name}: local exit {code}")
            if children.stopped:  # a Ctrl-C or SIGTERM: the sweep stops, not just this entry
                break
        else:
            try:
                print(f"{name}: job {submit(log_dir / f'{name}.sbatch')}")
            except RuntimeError as e:  # a traceback
                print(
                    f"error: {name}: {e}; the entries above were submitted, those below not", file=sys.stderr
                )
                raise SystemExit(exit_codes.FAILED) from None
    if children.stopped:  # as its job exits for the stop: 130 for a Ctrl-C, 75 for a SIGTERM
        raise SystemExit(exit_codes.INTERRUPTED if children.stopped == signal.SIGINT else exit_codes.REQUEUE)
    if failed:
        raise SystemExit(exit_codes.FAILED)
