"""The spread of the demo's learning over seeds, from which `tests/test_learning.py` takes its thresholds.

    .venv/bin/python docs/issues/002-pretraining-learns/seed_spread.py            # seeds 0-4 (~20 min)
    .venv/bin/python docs/issues/002-pretraining-learns/seed_spread.py --seeds 0 1 2 3 4 5 6 7

Each seed runs the demo exactly as `make demo` does (`birdjepa pretrain` with its defaults, at XLA's
default optimisation level) but for ``--seed``, which changes the model's init, every step key and the
loader's order; the random-init row is that seed's own init. From the trainer's final evaluation on the
demo's 64 held-out clips it prints, per seed, the frozen encoder's linear and kNN accuracy beside
random init and raw log-mel, and four margins:

* linear: encoder - random init;
* kNN: encoder - random init;
* linear: encoder - raw log-mel;
* kNN: encoder - raw log-mel.

A threshold for each is its mean over seeds minus 3 standard deviations (sample), rounded down to 0.01:
a run of the recipe falls below it by chance about once in a thousand if the margins are roughly
normal, while a recipe that stops learning falls far below it; a threshold at or below 0 is no claim.
Written to ``seed_spread.md`` beside this file; a run directory that already holds its evaluation is
reused (runs are deterministic); each run it trains appends its console to ``logs/seed_spread.log``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from runlog import call  # noqa: E402  (docs/issues/runlog.py)

BIRDJEPA = [sys.executable, "-m", "birdjepa.cli"]
MARGINS = {
    "linear: encoder - random init": ("encoder", "random_init", "linear_acc"),
    "kNN: encoder - random init": ("encoder", "random_init", "knn_acc"),
    "linear: encoder - raw log-mel": ("encoder", "raw", "linear_acc"),
    "kNN: encoder - raw log-mel": ("encoder", "raw", "knn_acc"),
}


def rows_of(runs: Path, seed: int, log: Path) -> dict[str, dict[str, float]]:
    run = runs / f"seed-{seed}"
    evals = sorted((run / "eval").glob("*.json"), key=lambda p: int(p.stem)) if run.exists() else []
    if not evals:
        call(
            [*BIRDJEPA, "pretrain", "--run", run.name, "--seed", str(seed), "--log.runs-dir", str(runs)], log
        )
        evals = sorted((run / "eval").glob("*.json"), key=lambda p: int(p.stem))
    return json.loads(evals[-1].read_text())["rows"]


def threshold(values: list[float]) -> float:
    return math.floor((statistics.mean(values) - 3 * statistics.stdev(values)) * 100) / 100


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--runs", type=Path, default=Path("runs/seed-spread"))
    args = p.parse_args()
    args.runs.mkdir(parents=True, exist_ok=True)
    log = HERE / "logs" / "seed_spread.log"
    log.parent.mkdir(exist_ok=True)
    table = {s: rows_of(args.runs, s, log) for s in args.seeds}
    lines = [
        "# The demo's learning over seeds (written by seed_spread.py)",
        "",
        "Final evaluation on the demo's 64 held-out clips, each seed trained as `make demo` trains.",
        "",
        "| seed | encoder linear / kNN | random init linear / kNN | raw log-mel linear / kNN | "
        + " | ".join(MARGINS) + " |",
        "|---:|---:|---:|---:|" + "---:|" * len(MARGINS),
    ]  # fmt: skip
    margins: dict[str, list[float]] = {m: [] for m in MARGINS}
    for s, rows in table.items():
        cells = [
            f"{rows[r]['linear_acc']:.3f} / {rows[r]['knn_acc']:.3f}"
            for r in ("encoder", "random_init", "raw")
        ]
        for m, (a, b, metric) in MARGINS.items():
            margins[m].append(rows[a][metric] - rows[b][metric])
        lines.append(f"| {s} | " + " | ".join(cells + [f"{margins[m][-1]:+.3f}" for m in MARGINS]) + " |")
    lines += [
        "",
        "| margin | mean | sd | min | threshold (mean - 3 sd, rounded down) |",
        "|---|---:|---:|---:|---:|",
    ]
    for m, v in margins.items():
        mean, sd = statistics.mean(v), statistics.stdev(v)
        lines.append(f"| {m} | {mean:+.3f} | {sd:.3f} | {min(v):+.3f} | {threshold(v):+.2f} |")
    text = "\n".join(lines) + "\n"
    (HERE / "seed_spread.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
