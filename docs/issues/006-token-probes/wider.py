"""006's first untried lever, measured: a wider and deeper encoder (the small preset: 12 blocks of 384,
against the tiny one's 2 of 64) at the demo's recipe and step count, beside the tiny encoder, the small
one at random init and raw log-mel, with the linear probe on the mean and the prototypical probe on the
tokens, on the BirdSet stand-in's three tasks; writes ``wider.md``.

    .venv/bin/python docs/issues/006-token-probes/wider.py   # ~110 min on 2 cores; --runs, --results: where

1. **Runs** (the demo set, LeJEPA but the last, 600 steps each, everything else the demo's defaults):
   ``lejepa`` (the tiny preset, the demo's run), ``lejepa-small`` (``--model.preset small``: about 14x
   the FLOPs a step), ``lejepa-small-lr2e-4`` (the same at a fifth of the learning rate, warmed up over
   60 steps), ``lejepa-wide2`` (the tiny encoder's 2 blocks at 256 wide), the same for 2,400 steps,
   ``lejepa-wide2-512`` (2 blocks at 512 wide), the same at lr 2e-4 with 60 warm-up steps, and MAE on
   that architecture (``mae-wide2-512``).
   Trained where ``--runs`` lacks them.
2. **Benchmark**: ``birdjepa benchmark`` on SYN1-3 (train -> test_5s), probes linear and proto, n = 1, 4,
   16 and all, seeds 0-2, backbones: the runs, the random init of the small, the 256-wide and the
   512-wide architecture, raw (mean + std; its tokens the 16 x 128 log-mel patches). 006's recipe for every
   probe; rows the results folder holds are not fitted again.
3. ``wider.md``: cmAP per backbone, probe and n (mean over tasks and seeds), per task, and each run's own
   end-of-run evaluation on the demo's held-out clips.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from runlog import call  # noqa: E402  (docs/issues/runlog.py)

sys.path.insert(0, str(HERE))
from reproduce import eval_row  # noqa: E402  (006's)

BIRDJEPA = [sys.executable, "-m", "birdjepa.cli"]
TASKS = ("SYN1", "SYN2", "SYN3")
PROBES = ("linear", "proto")
RUNS: dict[str, tuple[str, ...]] = {
    "lejepa": ("--steps", "600"),
    "lejepa-small": ("--steps", "600", "--model.preset", "small"),
    # the small preset at a fifth of the demo's learning rate, warmed up over a tenth of the run
    "lejepa-small-lr2e-4": ("--steps", "600", "--model.preset", "small", "--optim.lr", "2e-4",
                            "--optim.warmup-steps", "60"),
    # width without depth: the tiny encoder's 2 blocks at 256 wide (the tiny projector)
    "lejepa-wide2": ("--steps", "600", "--model.dim", "256", "--model.heads", "4"),
    "lejepa-wide2-2400": ("--steps", "2400", "--model.dim", "256", "--model.heads", "4"),
    "lejepa-wide2-512": ("--steps", "600", "--model.dim", "512", "--model.heads", "8"),
    # does a lower learning rate keep more of what that architecture's random tokens hold?
    "lejepa-wide2-512-lr2e-4": ("--steps", "600", "--model.dim", "512", "--model.heads", "8", "--optim.lr",
                                "2e-4", "--optim.warmup-steps", "60"),
    # the objective that reconstructs patches, on the architecture whose random tokens beat raw
    "mae-wide2-512": ("--steps", "600", "--objective.kind", "mae", "--model.dim", "512",
                      "--model.heads", "8"),
}  # fmt: skip
RANDOM = ("lejepa-small", "lejepa-wide2", "lejepa-wide2-512")  # each architecture's random init


def arguments(doc: str | None) -> argparse.Namespace:
    """``--runs`` and ``--results``: where this script's and ``depth.py``'s runs and store are."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--runs", type=Path, default=Path("/tmp/birdjepa-006w/runs"))
    parser.add_argument("--results", type=Path, default=Path("/tmp/birdjepa-006w/results"))
    return parser.parse_args()


def main() -> None:
    args = arguments(__doc__)
    logs = HERE / "logs"
    logs.mkdir(exist_ok=True)
    from birdjepa.synthetic.demo import ensure_birdset_data

    tasks = ensure_birdset_data()
    for name, extra in RUNS.items():
        if not (args.runs / name / "checkpoints").is_dir():
            call([*BIRDJEPA, "pretrain", "--run", name, "--log.runs-dir", str(args.runs), *extra],
                 logs / "wider-pretrain.log")  # fmt: skip
    backbones = [str(args.runs / n) for n in RUNS] + [f"random:{args.runs / n}" for n in RANDOM] + ["raw"]
    for task in TASKS:
        call([*BIRDJEPA, "benchmark", "--backbone", *backbones, "--train", str(tasks / task / "train"),
              "--test", str(tasks / task / "test_5s"), "--task", task, "--probe", *PROBES,
              "--n-train", "1", "4", "16", "-1", "--seed", "0", "1", "2", "--results", str(args.results)],
             logs / "wider-benchmark.log")  # fmt: skip
    write(args.results, args.runs)


def named_rows(results: Path, runs: Path) -> tuple[list[dict], dict[str, str]]:
    """The store's rows, and each backbone's name as the scripts write it (its spec, ``runs/`` cut)."""
    from birdjepa.benchmark import store

    rows = store.read(results).to_pylist()
    spec = {r["backbone"]: json.loads(r["config"])["backbone_spec"] for r in rows}
    return rows, {backbone: s.replace(str(runs) + "/", "") for backbone, s in spec.items()}


def write(results: Path, runs: Path) -> None:
    rows, name = named_rows(results, runs)
    cells: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        cells[(r["task"], name[r["backbone"]], r["probe"], r["n"])].append(r["cmap"])
        cells[("mean", name[r["backbone"]], r["probe"], r["n"])].append(r["cmap"])
    mean = {k: sum(v) / len(v) for k, v in cells.items()}
    ns = sorted({k[3] for k in mean}, key=lambda n: n if n > 0 else 1 << 30)
    order = [*RUNS, *(f"random:{n}" for n in RANDOM), "raw"]
    head = "| backbone | probe | " + " | ".join("all" if n < 0 else str(n) for n in ns) + " |"
    lines = ["# 006, wider: measured (written by wider.py)", "",
             "## Each run's end-of-run evaluation (the demo's 64 held-out clips, 16 species, chance 0.062)",
             "", "| run | options | linear | kNN | random init linear / kNN | raw linear / kNN |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    lines += [eval_row(runs, run, extra) for run, extra in RUNS.items()]
    for run in RUNS:
        logged = [json.loads(x) for x in (runs / run / "metrics.jsonl").read_text().splitlines() if x.strip()]
        seconds = sum(m.get("train/step_time", 0.0) for m in logged)
        lines.append(f"\n{run}: {seconds:.0f} s of training steps (`train/step_time` summed).")
    for task in ("mean", *TASKS):
        title = "SYN1-3, mean over tasks and seeds 0-2" if task == "mean" else f"{task}, mean over seeds 0-2"
        lines += ["", f"## cmAP, {title}", "", head, "|---|---|" + "---:|" * len(ns)]
        for b in order:
            for p in PROBES:
                values = [mean.get((task, b, p, n)) for n in ns]
                lines.append(f"| {b} | {p} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in values)
                             + " |")  # fmt: skip
    (HERE / "wider.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
