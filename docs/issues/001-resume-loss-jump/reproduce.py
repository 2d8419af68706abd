"""Regenerate docs/issues/001-resume-loss-jump: fourteen runs over four set-ups, and their analyses.

    .venv/bin/python docs/issues/001-resume-loss-jump/reproduce.py                    # ~32 min on 2 cores
    .venv/bin/python docs/issues/001-resume-loss-jump/reproduce.py --setups warming   # one set-up

Set-ups (each trains the demo defaults: LeJEPA, tiny ViT, batch 16, 300 steps, seed 0):

* ``demo``: the embedded demo set (384 clips in shuffled order; the shuffle buffer of 1024 holds the
  whole epoch);
* ``sorted``: the same recordings written grouped by species (``birdjepa demo-data --order species``,
  as a per-species download writes them) and a shuffle buffer of 64, smaller than the data;
* ``epoch0``: a larger demo set (3200 clips, 200 steps per epoch), so a resume at step 150 falls
  inside the first epoch and a cold loader replays clips the model saw only once;
* ``warming``: the species-grouped shards read as webdataset reads them with its shuffle defaults:
  one shard at a time, a buffer of 1000 that starts drawing at 100 samples and grows by one per draw.

Runs: ``straight`` (one uninterrupted process, the reference); ``exact-<stops>`` (stopped after each
listed step with ``--stop-at-step``, a forced preemption, and resumed in a new process as birdjepa
resumes); ``legacy-<stops>`` (the same stops, resumed with ``--prng legacy``: the loader restarts
cold and the key chain restarts from the seed, a loader without state; ``--resume-checks warn`` lets
it go on although the resume checks fail). Stops: ``one`` = after step 149; ``every30`` = after
steps 29, 59, ..., 269 (``demo`` only). Set-ups other than ``demo`` suffix their run names with
``-<setup>``. All runs use ``--prng checkpointed`` (legacy behaves like it until it resumes), so every
difference starts at a resume. Then ``birdjepa analyze RUN --other <its straight run>`` writes the
figures and tables into ``figures/<run>/`` next to this file; console output goes to ``logs/``.
Last, ``species_per_batch.py`` counts the species in the first batches of each set-up's cold loader.
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
sys.path.insert(0, str(HERE.parent))
from runlog import call  # noqa: E402  (docs/issues/runlog.py)

BIRDJEPA = [sys.executable, "-m", "birdjepa.cli"]
STOPS = {"one": [149], "every30": list(range(29, 299, 30))}


DATA = {  # `birdjepa demo-data` options of the data sets other than the embedded demo set
    "sorted": ("--order", "species"),
    "epoch0": ("--per-species-train", "200", "--min-seconds", "8", "--max-seconds", "12"),
}


@dataclass(frozen=True)
class Setup:
    data: str | None  # a key of DATA; None: the embedded demo set
    loader: dict[str, int]  # DataConfig fields that differ from the defaults
    stops: tuple[str, ...]  # keys of STOPS

    def data_flags(self) -> list[str]:
        return [a for k, v in self.loader.items() for a in (f"--data.{k.replace('_', '-')}", str(v))]


SETUPS = {
    "demo": Setup(None, {}, ("one", "every30")),
    "sorted": Setup("sorted", {"shuffle_buffer": 64}, ("one",)),
    "epoch0": Setup("epoch0", {}, ("one",)),
    "warming": Setup("sorted", {"interleave": 1, "shuffle_buffer": 1000, "shuffle_initial": 100}, ("one",)),
}


def run_name(kind: str, setup: str) -> str:
    return kind if setup == "demo" else f"{kind}-{setup}"


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
    p.add_argument("--setups", nargs="+", choices=list(SETUPS), default=list(SETUPS),
                   help="redo only these set-ups (their data, runs, logs and figures)")  # fmt: skip
    args = p.parse_args()
    runs, steps, logs = args.runs_dir, args.steps, args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    setups = {name: SETUPS[name] for name in args.setups}
    for data in sorted({s.data for s in setups.values() if s.data is not None}):
        out, log = runs / f"data-{data}", logs / f"data-{data}.log"
        shutil.rmtree(out, ignore_errors=True)
        log.unlink(missing_ok=True)
        call([*BIRDJEPA, "demo-data", str(out), *DATA[data]], log)

    jobs: list[Callable[[], None]] = []
    analyses: list[tuple[str, str]] = []  # (run, its straight run)
    for name, setup in setups.items():
        options = setup.data_flags()
        if setup.data is not None:
            data = runs / f"data-{setup.data}"
            options += ["--data.train", str(data / "train"), "--data.eval", str(data / "eval")]
        straight = run_name("straight", name)
        planned = [(straight, "checkpointed", [])]
        for stops in setup.stops:
            for mode, prng in (("exact", "checkpointed"), ("legacy", "legacy")):
                planned.append((run_name(f"{mode}-{stops}", name), prng, STOPS[stops]))
                analyses.append((planned[-1][0], straight))
        for run, prng, stop_steps in planned:
            shutil.rmtree(runs / run, ignore_errors=True)
            (logs / f"{run}.log").unlink(missing_ok=True)
            jobs.append(trainer(runs, run, prng, steps, options, stop_steps, logs / f"{run}.log"))
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
    if "sorted" in setups or "warming" in setups:  # they write the data set it reads
        print("## distinct species per batch of a cold loader\n", flush=True)
        subprocess.run([sys.executable, str(HERE / "species_per_batch.py"), str(runs)], check=True)


if __name__ == "__main__":
    main()
