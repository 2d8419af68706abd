"""Regenerate docs/issues/001-resume-loss-jump: five runs of one configuration and their analyses.

    .venv/bin/python docs/issues/001-resume-loss-jump/reproduce.py          # ~17 min on 2 CPU cores

* ``straight``: one uninterrupted process (the reference);
* ``exact-<experiment>``: stopped after each of the experiment's steps (``--stop-at-step``, a forced
  preemption) and resumed in a new process, as birdjepa resumes;
* ``legacy-<experiment>``: the same stops, resumed with ``--prng legacy`` (the loader restarts cold and
  the key chain restarts from the seed: a loader without state), with ``--resume-checks warn`` so the
  run goes on although the resume checks fail.

Experiments: ``one`` stops once, after step 149; ``every30`` stops after every 30th step (29, 59, ...).
All runs use ``--prng checkpointed`` (legacy behaves like it until it resumes), so every difference
starts at a resume. Then ``birdjepa analyze RUN --other straight`` writes the figures and tables into
``figures/<run>/`` next to this file; the runs' console output goes to ``logs/``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIRDJEPA = [sys.executable, "-m", "birdjepa.cli"]


def pretrain(runs: Path, run: str, prng: str, steps: int, log: Path, *extra: str) -> None:
    cmd = [*BIRDJEPA, "pretrain", "--run", run, "--log.runs-dir", str(runs), "--steps", str(steps),
           "--prng", prng, "--log.print-every", "50", *extra]  # fmt: skip
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd[2:])}\n")
        f.flush()
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"{run}: `{' '.join(cmd[2:])}` exited {done.returncode}; see {log}")


def segments(runs: Path, run: str, prng: str, steps: int, resume_at: list[int], log: Path) -> None:
    """Stop after each resume_at step (a forced preemption), then resume until the end."""
    resume_flags = ["--resume-checks", "warn"] if prng == "legacy" else []
    for i, stop in enumerate(resume_at):
        pretrain(runs, run, prng, steps, log, "--stop-at-step", str(stop), *(resume_flags if i else []))
    pretrain(runs, run, prng, steps, log, *(resume_flags if resume_at else []))


EXPERIMENTS = {"one": [149], "every30": list(range(29, 299, 30))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--runs-dir", type=Path, default=Path("runs/issue-001"))
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args()
    shutil.rmtree(args.runs_dir, ignore_errors=True)
    logs = args.out / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    runs, steps = args.runs_dir, args.steps
    jobs = [lambda: pretrain(runs, "straight", "checkpointed", steps, logs / "straight.log")]
    for name, stops in EXPERIMENTS.items():
        for mode, prng in (("exact", "checkpointed"), ("legacy", "legacy")):
            run = f"{mode}-{name}"
            jobs.append(lambda run=run, prng=prng, stops=stops: segments(
                runs, run, prng, steps, stops, logs / f"{run}.log"))  # fmt: skip
    # Three at a time: each process trains on one core (deterministic XLA) and decodes on the others.
    with ThreadPoolExecutor(3) as pool:
        for future in [pool.submit(job) for job in jobs]:
            future.result()
    for name in EXPERIMENTS:
        for mode in ("exact", "legacy"):
            run = f"{mode}-{name}"
            out = args.out / "figures" / run
            shutil.rmtree(out, ignore_errors=True)
            cmd = [*BIRDJEPA, "analyze", str(runs / run), "--other", str(runs / "straight"), "--window",
                   str(args.window), "--out", str(out)]  # fmt: skip
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            print((out / "summary.md").read_text())


if __name__ == "__main__":
    main()
