"""Regenerate docs/issues/001-resume-loss-jump: eleven runs over three data set-ups, and their analyses.

    .venv/bin/python docs/issues/001-resume-loss-jump/reproduce.py          # ~30 min on 2 CPU cores

Set-ups (each trains the demo defaults: LeJEPA, tiny ViT, batch 16, 300 steps, seed 0):

* ``demo``: the embedded demo set (384 clips in shuffled order; the shuffle buffer of 1024 holds the
  whole epoch);
* ``sorted``: the same recordings written grouped by species (``birdjepa demo-data --order species``,
  as a per-species download writes them) and a shuffle buffer of 64, smaller than the data;
* ``epoch0``: a larger demo set (3200 clips, 200 steps per epoch), so a resume at step 150 falls
  inside the first epoch and a cold loader replays clips the model saw only once.

Runs: ``straight`` (one uninterrupted process, the reference); ``exact-<stops>`` (stopped after each
listed step with ``--stop-at-step``, a forced preemption, and resumed in a new process as birdjepa
resumes); ``legacy-<stops>`` (the same stops, resumed with ``--prng legacy``: the loader restarts
cold and the key chain restarts from the seed, a loader without state; ``--resume-checks warn`` lets
it go on although the resume checks fail). Stops: ``one`` = after step 149; ``every30`` = after
steps 29, 59, ..., 269 (``demo`` only). Set-ups other than ``demo`` suffix their run names with
``-<setup>``. All runs use ``--prng checkpointed`` (legacy behaves like it until it resumes), so every
difference starts at a resume. Then ``birdjepa analyze RUN --other <its straight run>`` writes the
figures and tables into ``figures/<run>/`` next to this file; console output goes to ``logs/``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIRDJEPA = [sys.executable, "-m", "birdjepa.cli"]
STOPS = {"one": [149], "every30": list(range(29, 299, 30))}


@dataclass(frozen=True)
class Setup:
    demo_data: tuple[str, ...] | None  # `birdjepa demo-data` options; None: the embedded demo set
    train: tuple[str, ...]  # extra pretrain options
    stops: tuple[str, ...]  # keys of STOPS


SETUPS = {
    "demo": Setup(None, (), ("one", "every30")),
    "sorted": Setup(("--order", "species"), ("--data.shuffle-buffer", "64"), ("one",)),
    "epoch0": Setup(
        ("--per-species-train", "200", "--min-seconds", "8", "--max-seconds", "12"), (), ("one",)
    ),
}


def run_name(kind: str, setup: str) -> str:
    return kind if setup == "demo" else f"{kind}-{setup}"


def call(cmd: list[str], log: Path) -> None:
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd[2:])}\n")
        f.flush()
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd[2:])}` exited {done.returncode}; see {log}")


def trainer(
    runs: Path, run: str, prng: str, steps: int, options: list[str], stops: list[int], log: Path
) -> Callable[[], None]:
    """A job: train `run`, stopping after each of `stops` (a forced preemption) and resuming."""
    base = [*BIRDJEPA, "pretrain", "--run", run, "--log.runs-dir", str(runs), "--steps", str(steps),
            "--log.print-every", "50", *options, "--prng", prng]  # fmt: skip
    resume = ["--resume-checks", "warn"] if prng == "legacy" else []

    def job() -> None:
        for i, stop in enumerate(stops):
            call([*base, "--stop-at-step", str(stop), *(resume if i else [])], log)
        call([*base, *(resume if stops else [])], log)

    return job


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--runs-dir", type=Path, default=Path("runs/issue-001"))
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args()
    runs, steps = args.runs_dir, args.steps
    shutil.rmtree(runs, ignore_errors=True)
    logs = args.out / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)

    jobs: list[Callable[[], None]] = []
    analyses: list[tuple[str, str]] = []  # (run, its straight run)
    for name, setup in SETUPS.items():
        options = list(setup.train)
        if setup.demo_data is not None:
            data = runs / f"data-{name}"
            call([*BIRDJEPA, "demo-data", str(data), *setup.demo_data], logs / f"data-{name}.log")
            options += ["--data.train", str(data / "train"), "--data.eval", str(data / "eval")]
        straight = run_name("straight", name)
        jobs.append(trainer(runs, straight, "checkpointed", steps, options, [], logs / f"{straight}.log"))
        for stops in setup.stops:
            for mode, prng in (("exact", "checkpointed"), ("legacy", "legacy")):
                run = run_name(f"{mode}-{stops}", name)
                jobs.append(trainer(runs, run, prng, steps, options, STOPS[stops], logs / f"{run}.log"))
                analyses.append((run, straight))
    # Three at a time: each process trains on one core (deterministic XLA) and decodes on the others.
    with ThreadPoolExecutor(3) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()
    for run, straight in analyses:
        out = args.out / "figures" / run
        shutil.rmtree(out, ignore_errors=True)
        cmd = [*BIRDJEPA, "analyze", str(runs / run), "--other", str(runs / straight), "--window",
               str(args.window), "--out", str(out)]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        print(f"## {run}\n\n{(out / 'summary.md').read_text()}")


if __name__ == "__main__":
    main()
