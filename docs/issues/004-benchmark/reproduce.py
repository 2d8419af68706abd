"""Regenerate docs/issues/004-benchmark: the demo pretrain's encoder on the BirdSet stand-in, beside
random init and raw log-mel, the way BirdSet scores encoders.

    .venv/bin/python docs/issues/004-benchmark/reproduce.py [--work /tmp/birdjepa-004]   # ~15 min, 2 cores

1. The stand-in (`birdjepa demo-data --birdset`: tasks SYN1-3) and the demo set, from the cache.
2. The demo pretrain (`birdjepa pretrain` with its defaults: 600 steps), unless WORK/runs/demo is there.
3. `birdjepa benchmark` on each task: the run, its random init and raw log-mel; linear, MLP and
   centroid probes; n = 1, 4, 16 and all recordings per class; seeds 0-2. One store, WORK/results.
4. The table (`--table`) into results.md and the few-shot figure into figures/fewshot.png.
Console logs go to ``logs/`` next to this file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from runlog import call  # noqa: E402  (docs/issues/runlog.py)

BIRDJEPA = [sys.executable, "-m", "birdjepa.cli"]
TASKS = ("SYN1", "SYN2", "SYN3")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=Path("/tmp/birdjepa-004"))
    work = parser.parse_args().work
    logs = HERE / "logs"
    logs.mkdir(exist_ok=True)
    (HERE / "figures").mkdir(exist_ok=True)
    for name in ("data.log", "pretrain.log", "benchmark.log", "table.log"):
        (logs / name).unlink(missing_ok=True)
    from birdjepa.synthetic.demo import ensure_birdset_data

    tasks = ensure_birdset_data()
    run = work / "runs" / "demo"
    if not (run / "checkpoints").is_dir():
        call(
            [*BIRDJEPA, "pretrain", "--run", "demo", "--log.runs-dir", str(work / "runs")],
            logs / "pretrain.log",
        )
    results = work / "results"
    for task in TASKS:
        call([*BIRDJEPA, "benchmark", "--backbone", str(run), f"random:{run}", "raw",
              "--train", str(tasks / task / "train"), "--test", str(tasks / task / "test_5s"), "--task", task,
              "--n-train", "1", "4", "16", "-1", "--seed", "0", "1", "2", "--results", str(results)],
             logs / "benchmark.log")  # fmt: skip
    call([*BIRDJEPA, "benchmark", "--table", str(results), "--plot", str(HERE / "figures" / "fewshot.png")],
         logs / "table.log")  # fmt: skip


if __name__ == "__main__":
    main()
