"""What a smaller budget for the token probes costs (issue 45, item 5): the study's token fits take 9.2x
the pooled fits, 77 % of it raw's 2,048-wide patches. Fewer clip-steps would meet the 2x bound; this
measures what each cut does to cmAP, against the study's own rows.

    .venv/bin/python docs/issues/006-token-probes/budget.py [--work /tmp/birdjepa-006]   # ~20 min, 2 cores

After reproduce.py (it reads its store and embedding cache in WORK/results, and LeJEPA's run in
``--runs``). For each cut, ``birdjepa benchmark --probe proto attentive`` on LeJEPA and raw, on SYN1-3 and
the demo split, n = 1, 4, 16, all, seeds 0-2, into WORK/budget/NAME (sharing the cache: nothing is
embedded again); then per (backbone, probe): the mean, min and max change of cmAP over the 48 (task, n,
seed) cells against the study's row of the same key, and the fit seconds of both. Output: ``budget.md``
and ``logs/budget.log``.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from runlog import call  # noqa: E402  (docs/issues/runlog.py)

BIRDJEPA = [sys.executable, "-m", "birdjepa.cli"]
#: name -> (AdamW steps, clips per step, learning rate); the study's recipe is 500 x 32 at 3e-3.
CUTS = {"steps-200-batch-16-lr-1e-2": (200, 16, 1e-2), "batch-8": (500, 8, 3e-3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=Path("/tmp/birdjepa-006"))
    parser.add_argument("--runs", type=Path, default=Path("/tmp/birdjepa-005/runs"))
    args = parser.parse_args()
    from birdjepa.synthetic.demo import ensure_birdset_data, ensure_demo_data

    tasks, demo = ensure_birdset_data(), ensure_demo_data()
    splits = {t: (tasks / t / "train", tasks / t / "test_5s") for t in ("SYN1", "SYN2", "SYN3")}
    splits["demo"] = (demo / "train", demo / "eval")
    study = args.work / "results"
    log = HERE / "logs" / "budget.log"
    log.unlink(missing_ok=True)
    for name, (steps, batch, lr) in CUTS.items():
        results = args.work / "budget" / name
        results.mkdir(parents=True, exist_ok=True)
        if not (results / "cache").exists():
            (results / "cache").symlink_to(study / "cache")
        for task, (train, test) in splits.items():
            recipe = ["--probe-steps", str(steps), "--token-batch", str(batch), "--probe-lr", str(lr)]
            call([*BIRDJEPA, "benchmark", "--backbone", str(args.runs / "lejepa"), "raw", "--train",
                  str(train), "--test", str(test), "--task", task, "--probe", "proto", "attentive",
                  "--n-train", "1", "4", "16", "-1", "--seed", "0", "1", "2", *recipe, "--results",
                  str(results)], log)  # fmt: skip
    write(study, args.work / "budget")


def write(study: Path, budget: Path) -> None:
    from birdjepa.benchmark import store

    base = {tuple(r[k] for k in store.KEY_FIELDS): r for r in store.read(study).to_pylist()}
    lines = ["# 006: what a smaller token-probe budget costs (written by budget.py)", "",
             "Change of cmAP against the study's recipe (500 steps x 32 clips, lr 3e-3), over the 48 "
             "(task, n, seed) cells of SYN1-3 and the demo split; fit seconds summed over those cells.", "",
             "| cut | backbone | probe | mean change | min | max | fit s (study's) |",
             "|---|---|---|---:|---:|---:|---:|"]  # fmt: skip
    for name in CUTS:
        cells: dict[tuple[str, str], list[tuple[float, float, float]]] = defaultdict(list)
        for r in store.read(budget / name).to_pylist():
            b = base[tuple(r[k] for k in store.KEY_FIELDS)]
            who = "raw" if r["backbone"].startswith("raw") else "lejepa"
            cells[(who, r["probe"])].append((r["cmap"] - b["cmap"], r["fit_s"], b["fit_s"]))
        for (who, probe), v in sorted(cells.items()):
            d = [x[0] for x in v]
            spread = f"{sum(d) / len(d):+.3f} | {min(d):+.3f} | {max(d):+.3f}"
            lines.append(f"| {name} | {who} | {probe} | {spread} | "
                         f"{sum(x[1] for x in v):.0f} ({sum(x[2] for x in v):.0f}) |")  # fmt: skip
    (HERE / "budget.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
