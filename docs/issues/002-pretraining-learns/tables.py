"""Tables and figures of issue 002 from its run directories.

    .venv/bin/python docs/issues/002-pretraining-learns/tables.py RUNS_DIR OUT_DIR [RUN ...]

Writes ``OUT_DIR/results.md`` (one row per listed run, a name under ``RUNS_DIR``, that has
``eval/big.json``, in that order; it overwrites the file) and two figures under ``OUT_DIR``:
``figures/rank.png`` (effective rank of the batch embeddings over training) and
``figures/knn.png`` (the trainer's kNN accuracy on the demo eval split over training, beside random
init and raw log-mel; only if ``RUNS_DIR/v2-default-600`` has metrics). reproduce.py calls it after
its runs, then appends the tables of what_it_encodes.py and band_or_rhythm.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RANK_RUNS = {
    "v1-old": "v1 set, old recipe",
    "v2-old": "v2 set, old recipe",
    "v2-default-600": "v2 set, new defaults",
}


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def last(rows: list[dict], key: str) -> float:
    return next((r[key] for r in reversed(rows) if key in r), float("nan"))  # nan: not logged (supervised)


def row(run: Path) -> str:
    big = json.loads((run / "eval" / "big.json").read_text())
    small = json.loads((run / "eval" / f"{big['step']}.json").read_text())
    m = metrics(run)
    b, s = big["rows"], small["rows"]
    seconds = m[-1]["time"] - m[0]["time"]
    cells = [
        run.name,
        str(big["step"] + 1),
        f"{s['encoder']['linear_acc']:.3f} / {s['encoder']['knn_acc']:.3f}",
        f"{b['encoder']['linear_acc']:.3f} / {b['encoder']['knn_acc']:.3f}",
        f"{b['encoder']['linear']['train_acc']:.3f}",
        f"{b['random_init']['linear_acc']:.3f} / {b['random_init']['knn_acc']:.3f}",
        f"{b['raw']['linear_acc']:.3f} / {b['raw']['knn_acc']:.3f}",
        f"{last(m, 'train/embedding_rank'):.1f}",
        f"{last(m, 'train/sigreg'):.2f}",
        f"{seconds:.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


COLUMNS = [
    "run", "steps", "demo eval (64): linear / kNN", "big eval (256): linear / kNN", "linear train acc",
    "random init (256): linear / kNN", "raw log-mel (256): linear / kNN", "embedding rank (end)",
    "SIGReg (end)", "train s",
]  # fmt: skip
HEADER = "| " + " | ".join(COLUMNS) + " |\n|---|" + "---:|" * (len(COLUMNS) - 1)


def rank_figure(runs: Path, out: Path) -> None:
    fig, ax = plt.subplots(figsize=(5, 3))
    for name, label in RANK_RUNS.items():
        if (runs / name / "metrics.jsonl").is_file():
            m = [r for r in metrics(runs / name) if "train/embedding_rank" in r]
            ax.plot([r["step"] for r in m], [r["train/embedding_rank"] for r in m], label=label, lw=0.8)
    ax.set(xlabel="step", ylabel="effective rank of the batch embeddings", ylim=(0, None))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def knn_figure(run: Path, out: Path) -> None:
    m = [r for r in metrics(run) if "eval/knn_acc" in r]
    fig, ax = plt.subplots(figsize=(5, 3))
    steps = [r["step"] for r in m]
    for key, label in (("eval/knn_acc", "encoder"), ("eval/knn_acc_random_init", "random init"),
                       ("eval/knn_acc_raw", "raw log-mel mean+std")):  # fmt: skip
        ax.plot(steps, [r[key] for r in m], marker="o", ms=3, lw=1, label=label)
    ax.axhline(1 / 16, color="grey", lw=0.5, ls=":")
    ax.set(xlabel="step", ylabel="kNN accuracy (demo eval, 64 clips)", ylim=(0, 1))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs_dir", metavar="RUNS_DIR", type=Path, help="the folder holding the run directories")
    p.add_argument(
        "out",
        metavar="OUT_DIR",
        type=Path,
        help="an existing folder: results.md and figures/ are written there",
    )
    p.add_argument(
        "names", metavar="RUN", nargs="*", default=[], help="a run's name under RUNS_DIR: one table row"
    )
    args = p.parse_args()
    runs, out = args.runs_dir, args.out
    done = [runs / n for n in args.names if (runs / n / "eval" / "big.json").is_file()]
    lines = ["# Results (written by tables.py)", "", HEADER, *[row(r) for r in done], ""]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    (out / "figures").mkdir(exist_ok=True)
    rank_figure(runs, out / "figures" / "rank.png")
    if (runs / "v2-default-600" / "metrics.jsonl").is_file():
        knn_figure(runs / "v2-default-600", out / "figures" / "knn.png")


if __name__ == "__main__":
    main()
