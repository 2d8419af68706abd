"""Regenerate docs/issues/005-objectives: LeJEPA against MAE at an equal CPU budget per run, the
supervised objective as the ceiling, random init and raw log-mel beside them; on the demo set's
held-out split (`evaluate`'s linear probe and kNN) and on the BirdSet stand-in (BirdSet's protocol).

    .venv/bin/python docs/issues/005-objectives/reproduce.py [--work /tmp/birdjepa-005]   # ~1 h, 2 cores

1. **The budget.** Each candidate trains 40 steps (no evaluation, no checkpoint); the median of its
   `train/step_time` over steps 10-39 is its step's cost. LeJEPA at its defaults for the demo's 600
   steps sets the budget B = 600 x its step; every other run trains round(B / its step) steps, so each
   spends the same seconds in its training steps (the LR schedule follows its step count).
2. **The candidates** on the demo set, each its own run with the demo's defaults otherwise:
   LeJEPA at its defaults, with the masked-span JEPA term (002's best), with two local crops; MAE at its
   defaults (random patches), with time-span masking, at mask ratio 0.5, without per-patch targets;
   supervised. The demo's own evaluation ends each run (linear probe and kNN on 64 held-out clips,
   beside random init and raw log-mel).
3. **The best of each objective** on that evaluation's linear probe goes on with its defaults to
   `birdjepa benchmark` on SYN1-3: linear, MLP and centroid probes, n = 1, 4, 16 and all, seeds 0-2,
   with random init (LeJEPA's run's, the same encoder) and raw log-mel.
4. ``results.md``: the budget, the demo evaluation of every candidate, the benchmark table.
Console logs go to ``logs/`` next to this file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from runlog import call  # noqa: E402  (docs/issues/runlog.py)

BIRDJEPA = [sys.executable, "-m", "birdjepa.cli"]
TASKS = ("SYN1", "SYN2", "SYN3")
DEMO_STEPS = 600

CANDIDATES: dict[str, tuple[str, ...]] = {
    "lejepa": (),
    "lejepa-span": ("--objective.lejepa.span-weight", "0.5", "--model.predictor-depth", "1"),
    "lejepa-local": ("--objective.lejepa.local-views", "2"),
    "mae": ("--objective.kind", "mae"),
    "mae-time": ("--objective.kind", "mae", "--objective.mae.masking", "time"),
    "mae-ratio-0.5": ("--objective.kind", "mae", "--objective.mae.mask-ratio", "0.5"),
    "mae-raw-targets": ("--objective.kind", "mae", "--objective.mae.no-norm-pix"),
    "supervised": ("--objective.kind", "supervised"),
}


def logged(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def step_cost(work: Path, name: str, logs: Path) -> float:
    """The median seconds of one training step of ``name`` (steps 10-39 of a 40-step run)."""
    runs = work / "calibrate"
    run = runs / name
    if not (run / "metrics.jsonl").exists():
        short = ["--steps", "40", "--eval-every", "0", "--ckpt-every", "0"]
        call([*BIRDJEPA, "pretrain", "--run", name, "--log.runs-dir", str(runs), *short, *CANDIDATES[name]],
             logs / "calibrate.log")  # fmt: skip
    times = [m["train/step_time"] for m in logged(run) if "train/step_time" in m and 10 <= m["step"] < 40]
    return statistics.median(times)


def final_eval(run: Path) -> dict[str, float]:
    last = [m for m in logged(run) if any(k.startswith("eval/") for k in m)][-1]
    return {k: v for k, v in last.items() if k.startswith("eval/")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=Path("/tmp/birdjepa-005"))
    work = parser.parse_args().work
    logs = HERE / "logs"
    logs.mkdir(exist_ok=True)
    from birdjepa.synthetic.demo import ensure_birdset_data

    tasks = ensure_birdset_data()
    cost = {name: step_cost(work, name, logs) for name in CANDIDATES}
    budget = DEMO_STEPS * cost["lejepa"]
    steps = {name: DEMO_STEPS if name == "lejepa" else round(budget / c) for name, c in cost.items()}
    evals = {}
    for name, extra in CANDIDATES.items():
        run = work / "runs" / name
        if not (run / "checkpoints").is_dir():
            call([*BIRDJEPA, "pretrain", "--run", name, "--log.runs-dir", str(work / "runs"),
                  "--steps", str(steps[name]), *extra], logs / "pretrain.log")  # fmt: skip
        evals[name] = final_eval(run)
    family = {"lejepa": [n for n in CANDIDATES if n.startswith("lejepa")],
              "mae": [n for n in CANDIDATES if n.startswith("mae")]}  # fmt: skip
    best = {f: max(names, key=lambda n: evals[n]["eval/linear_acc"]) for f, names in family.items()}
    chosen = sorted({"lejepa", "mae", best["lejepa"], best["mae"], "supervised"})
    results = work / "results"
    backbones = [str(work / "runs" / n) for n in chosen] + [f"random:{work / 'runs' / 'lejepa'}", "raw"]
    for task in TASKS:
        call([*BIRDJEPA, "benchmark", "--backbone", *backbones,
              "--train", str(tasks / task / "train"), "--test", str(tasks / task / "test_5s"), "--task", task,
              "--n-train", "1", "4", "16", "-1", "--seed", "0", "1", "2", "--results", str(results)],
             logs / "benchmark.log")  # fmt: skip
    (logs / "table.log").unlink(missing_ok=True)
    call([*BIRDJEPA, "benchmark", "--table", str(results)], logs / "table.log")
    lines = [
        "# 005: measured (written by reproduce.py)", "",
        f"Budget: {DEMO_STEPS} LeJEPA steps x {cost['lejepa']:.3f} s = {budget:.0f} s of training steps "
        "per run.", "",
        "| run | options | s/step | steps | demo linear | demo kNN | random init linear / kNN "
        "| raw linear / kNN |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    for name, extra in CANDIDATES.items():
        e = evals[name]
        lines.append(
            f"| {name} | `{' '.join(extra) or 'defaults'}` | {cost[name]:.3f} | {steps[name]} | "
            f"{e['eval/linear_acc']:.3f} | {e['eval/knn_acc']:.3f} | "
            f"{e['eval/linear_acc_random_init']:.3f} / {e['eval/knn_acc_random_init']:.3f} | "
            f"{e['eval/linear_acc_raw']:.3f} / {e['eval/knn_acc_raw']:.3f} |"
        )
    lines += ["", f"Best on the demo's linear probe: {best}.", "", "```",
              (logs / "table.log").read_text().strip(), "```"]  # fmt: skip
    (HERE / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
