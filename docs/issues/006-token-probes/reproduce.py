"""Regenerate docs/issues/006-token-probes: every probe (linear, MLP, centroid on the mean-pooled
embedding; prototypical and attentive on the patch tokens) on LeJEPA, MAE, random init and raw log-mel,
on the BirdSet stand-in's three tasks and the demo's single-label split, at n = 1, 4, 16 and all, seeds
0-2; the target: with its best probe, a pretrained encoder beats raw features on cmAP at every n, on
every task.

    .venv/bin/python docs/issues/006-token-probes/reproduce.py [--work /tmp/birdjepa-006]   # ~1 h, 2 cores

1. **Runs** (the tiny encoder, the demo set, 005's budget: 132 s of training steps each; reused from
   ``--runs`` where they are there, else trained): LeJEPA (600 steps), MAE (573), MAE with time-span
   masking (449), supervised (639, the ceiling), and two levers' runs at about 4x the budget: LeJEPA
   for 2400 steps, and LeJEPA on square 16 x 16 patches (``--model.patch-freq 16``: 256 tokens, each
   16 frames of 16 mel bins, as Audio-MAE and Bird-MAE cut spectrograms) for 600 steps of 8x the
   tokens. Each run's own end-of-run evaluation (linear probe and kNN on the demo's 64 held-out clips)
   says whether it goes on: the square-patch run, which learned next to nothing there, does not.
2. **Benchmark**: ``birdjepa benchmark`` on SYN1-3 (train -> test_5s) and on the demo set (train -> eval,
   one label per clip), every probe, with random init (LeJEPA's run's) and raw (mean + std; its tokens:
   the 16-frame x 128-bin log-mel patches of the runs' grid).
3. ``results.md``: the store as tables, the best probe per backbone, task and n, the target's outcome
   per (task, n), and where the probes' time went; ``target.png``: each backbone's best-probe curve.
Console logs go to ``logs/`` next to this file.
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

BIRDJEPA = [sys.executable, "-m", "birdjepa.cli"]
TASKS = ("SYN1", "SYN2", "SYN3")
PROBES = ("linear", "mlp", "centroid", "proto", "attentive")
TOKEN = ("proto", "attentive")
RUNS: dict[str, tuple[str, ...]] = {
    "lejepa": ("--steps", "600"),
    "mae": ("--steps", "573", "--objective.kind", "mae"),
    "mae-time": ("--steps", "449", "--objective.kind", "mae", "--objective.mae.masking", "time"),
    "supervised": ("--steps", "639", "--objective.kind", "supervised"),
    "lejepa-long": ("--steps", "2400"),
    "lejepa-square": ("--steps", "600", "--model.patch-freq", "16"),
}
SQUARE = "lejepa-square"
SELF_SUPERVISED = ("lejepa", "lejepa-long", "mae", "mae-time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=Path("/tmp/birdjepa-006"))
    parser.add_argument("--runs", type=Path, default=Path("/tmp/birdjepa-005/runs"),
                        help="where the runs are (005's, reused), or are trained")  # fmt: skip
    args = parser.parse_args()
    logs = HERE / "logs"
    logs.mkdir(exist_ok=True)
    from birdjepa.synthetic.demo import ensure_birdset_data, ensure_demo_data

    tasks, demo = ensure_birdset_data(), ensure_demo_data()
    for name, extra in RUNS.items():
        if not (args.runs / name / "checkpoints").is_dir():
            call([*BIRDJEPA, "pretrain", "--run", name, "--log.runs-dir", str(args.runs), *extra],
                 logs / "pretrain.log")  # fmt: skip
    results = args.work / "results"
    backbones = [str(args.runs / n) for n in RUNS if n != SQUARE] + [f"random:{args.runs / 'lejepa'}", "raw"]
    splits = {t: (tasks / t / "train", tasks / t / "test_5s") for t in TASKS}
    splits["demo"] = (demo / "train", demo / "eval")
    for task, (train, test) in splits.items():
        call([*BIRDJEPA, "benchmark", "--backbone", *backbones, "--train", str(train), "--test", str(test),
              "--task", task, "--probe", *PROBES, "--n-train", "1", "4", "16", "-1", "--seed", "0", "1", "2",
              "--results", str(results)], logs / "benchmark.log")  # fmt: skip
    (logs / "table.log").unlink(missing_ok=True)
    call([*BIRDJEPA, "benchmark", "--table", str(results)], logs / "table.log")
    write_results(results, args.runs)


def eval_row(runs: Path, run: str, extra: tuple[str, ...]) -> str:
    """A table row of ``run``'s end-of-run evaluation: linear, kNN, random init's and raw's."""
    logged = [json.loads(x) for x in (runs / run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    e = [m for m in logged if "eval/linear_acc" in m][-1]
    cells = [e["eval/linear_acc"], e["eval/knn_acc"], e["eval/linear_acc_random_init"],
             e["eval/knn_acc_random_init"], e["eval/linear_acc_raw"], e["eval/knn_acc_raw"]]  # fmt: skip
    return (f"| {run} | `{' '.join(extra)}` | {cells[0]:.3f} | {cells[1]:.3f} | {cells[2]:.3f} / "
            f"{cells[3]:.3f} | {cells[4]:.3f} / {cells[5]:.3f} |")  # fmt: skip


def write_results(results: Path, runs: Path) -> None:
    from birdjepa.benchmark import store

    rows = store.read(results).to_pylist()
    name = {}
    for r in rows:
        spec = json.loads(r["config"])["backbone_spec"]
        name[r["backbone"]] = spec.replace(str(runs) + "/", "")
    cells: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        cells[(r["task"], name[r["backbone"]], r["probe"], r["n"])].append(r["cmap"])
    mean = {k: sum(v) / len(v) for k, v in cells.items()}
    tasks = sorted({k[0] for k in mean})
    ns = sorted({k[3] for k in mean}, key=lambda n: n if n > 0 else 1 << 30)
    label = {n: "all" if n < 0 else str(n) for n in ns}
    backbones = sorted({k[1] for k in mean})

    def best(task: str, backbone: str, n: int) -> tuple[float, str]:
        got = [(mean[(task, backbone, p, n)], p) for p in PROBES if (task, backbone, p, n) in mean]
        return max(got) if got else (float("nan"), "-")

    lines = ["# 006: measured (written by reproduce.py)", "",
             "## Each run's end-of-run evaluation (the demo's 64 held-out clips, 16 species, chance 0.062)",
             "", "| run | options | linear | kNN | random init linear / kNN | raw linear / kNN |",
             "|---|---|---:|---:|---:|---:|"]  # fmt: skip
    lines += [eval_row(runs, run, extra) for run, extra in RUNS.items()]
    lines += ["", "## The benchmark", "",
             "cmAP, mean over seeds 0-2. Best probe per backbone, task and n (in brackets).", ""]  # fmt: skip
    for task in tasks:
        lines += [f"### {task}", "", "| backbone | " + " | ".join(f"n = {label[n]}" for n in ns) + " |",
                  "|---|" + "---:|" * len(ns)]  # fmt: skip
        for b in backbones:
            lines.append(f"| {b} | " + " | ".join("{:.3f} ({})".format(*best(task, b, n)) for n in ns) + " |")
        lines += ["", "| backbone | probe | " + " | ".join(label[n] for n in ns) + " |",
                  "|---|---|" + "---:|" * len(ns)]  # fmt: skip
        for b in backbones:
            for p in PROBES:
                values = [mean.get((task, b, p, n)) for n in ns]
                lines.append(f"| {b} | {p} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in values)
                             + " |")  # fmt: skip
        lines.append("")
    lines += ["## The target: a pretrained (self-supervised) encoder beats raw, each with its best probe", "",
              "| task | n | best self-supervised (probe) | raw's best (probe) | margin | beats raw |",
              "|---|---|---|---|---:|---|"]  # fmt: skip
    held = 0
    for task in tasks:
        for n in ns:
            ours = max((*best(task, b, n), b) for b in SELF_SUPERVISED if b in backbones)
            raw = best(task, "raw", n)
            win = ours[0] > raw[0]
            held += win
            verdict = "yes" if win else "no"
            lines.append(f"| {task} | {label[n]} | {ours[2]} {ours[0]:.3f} ({ours[1]}) | "
                         f"{raw[0]:.3f} ({raw[1]}) | {ours[0] - raw[0]:+.3f} | {verdict} |")  # fmt: skip
    lines += ["", f"Held at {held} of {len(tasks) * len(ns)} (task, n) cells.", "",
              "## Where the probes' time went (sum of fit_s over every row)", "",
              "| backbone | pooled probes (linear, mlp, centroid) s | token probes (proto, attentive) s |",
              "|---|---:|---:|"]  # fmt: skip
    spent: dict[tuple[str, bool], float] = defaultdict(float)
    for r in rows:
        spent[(name[r["backbone"]], r["probe"] in TOKEN)] += r["fit_s"]
    for b in backbones:
        lines.append(f"| {b} | {spent[(b, False)]:.1f} | {spent[(b, True)]:.1f} |")
    pooled, tokens = (sum(v for (_, t), v in spent.items() if t == k) for k in (False, True))
    lines += [f"| all | {pooled:.1f} | {tokens:.1f} ({tokens / pooled:.1f}x the pooled) |", ""]
    (HERE / "results.md").write_text("\n".join(lines) + "\n")
    figure(tasks, ns, label, best)


def figure(tasks: list[str], ns: list[int], label: dict, best) -> None:
    """``target.png``: per task, each backbone's cmAP with its best probe against n (the target's view)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = {"lejepa": "LeJEPA 600", "lejepa-long": "LeJEPA 2400", "mae": "MAE", "supervised": "supervised",
             f"random:{'lejepa'}": "random init", "raw": "raw"}  # fmt: skip
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks), 3.2), sharey=True)
    for ax, task in zip(axes, tasks, strict=True):
        for b, name in shown.items():
            ys = [best(task, b, n)[0] for n in ns]
            ax.plot(range(len(ns)), ys, "o-" if b != "raw" else "s--", label=name,
                    color="black" if b == "raw" else None)  # fmt: skip
        ax.set_xticks(range(len(ns)), [label[n] for n in ns])
        ax.set_title(task)
        ax.set_xlabel("train recordings per class")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cmAP, best probe")
    axes[-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(HERE / "target.png", dpi=110)


if __name__ == "__main__":
    main()
