"""006, is the bar the limit? Every self-supervised run so far ties ``raw:input`` (the encoders' own
input patches read by prototypes) from n = 16 on and trails it at n = 1 and 4. Either the objectives
leave something on the table, or on this stand-in nothing an encoder of this shape can learn adds to the
input's patches. Labels answer that: the same architecture trained with them. Writes ``ceiling.md``.

    .venv/bin/python docs/issues/006-token-probes/ceiling.py   # ~75 min on 2 cores; after anchor.py

1. **Runs**: ``anchor.py``'s architecture and schedule (2 blocks of 512, lr 2e-4 warmed up over 60
   steps, 600 steps) with ``--objective.kind supervised`` (cross-entropy of a linear head on the pooled
   embedding): on the demo set, the self-supervised runs' own data with its labels (16 species); and on
   each stand-in task's own train split (``SYN1-3/train``, 12 species each, ``--eval-every 0``: a task
   has no held-out focal split), which sees the very classes, and every train recording, that the
   probes are later fitted on. The first is the ceiling of the data the self-supervised runs had; the
   second is the ceiling of the task itself, a number no self-supervised run is expected to reach.
2. **Benchmark**: as ``anchor.py``'s part 2 (linear on the mean, proto on the tokens, n = 1, 4, 16,
   all, seeds 0-2, 006's recipe): the demo-trained run on SYN1-3 and the demo split; each task's own run
   on that task only. Into ``anchor.py``'s results folder, beside its rows.
3. **Self-supervised on the task's own recordings**: the demo set shares no species with the stand-in
   (its 16 species' note timings recur among the stand-in's 24, in other bands; 8 are new), so every
   self-supervised run so far was scored on species it never heard, where BirdSet's pretraining set
   holds its test species. ``anchor.py``'s best recipe at 600 steps (the patch term, w = 16) trained on
   each task's own train split, its labels unused, and benchmarked as in 2.
4. **Multi-crop, for the few-shot room**: the labels' lead is at n = 1, where a probe has one recording
   of a class and an encoder must already map other recordings of it near that one. LeJEPA's
   multi-crop asks each of a recording's short local views (128 frames, a quarter of a global view)
   to land on the centre of its global views; untried with the patch term. The w = 16 run with 4 local
   views, on the demo set, benchmarked as in 2 (SYN1-3 and the demo split).

If labels put the tokens above ``raw:input``, the bar can be beaten by this architecture and what a
self-supervised run lacks is the objective's; if even the task's own labels leave them at the bar, the
stand-in rewards nothing an encoder adds to its input patches, and a harder stand-in is what 006 needs.
"""

from __future__ import annotations

import sys
from argparse import Namespace
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from runlog import call  # noqa: E402  (docs/issues/runlog.py)

sys.path.insert(0, str(HERE))
from anchor import ARCHITECTURE, BASE, NS, PATCH16  # noqa: E402  (006's)
from wider import BIRDJEPA, PROBES, RUNS, TASKS, arguments, named_rows  # noqa: E402

SUPERVISED = ("--objective.kind", "supervised")
ON_DEMO = "supervised-wide2-512-lr2e-4"
IN_TASK = {task: f"{ON_DEMO}-{task}" for task in TASKS}
SELF = f"{BASE}-patch16"  # anchor.py's w = 16 run (600 steps), on the demo set
SELF_IN_TASK = {task: f"{SELF}-{task}" for task in TASKS}
SELF_IN_TASK_ROW = "LeJEPA + patch term (w = 16) on the task's own train split, no labels"
BEST = f"{BASE}-patch16-2400"  # anchor.py's best self-supervised run
MULTICROP = f"{SELF}-local4"
IN_TASK_ROW = "supervised on the task's own train split"
BESIDE = (BEST, BASE, f"random:{ARCHITECTURE}", "raw:input", "raw")


def spec(runs: Path, name: str) -> str:
    """The ``--backbone`` of a row name: a run (or its random init) in ``runs``, or a raw baseline."""
    if name.startswith("raw"):
        return name
    if name.startswith("random:"):
        return f"random:{runs / name.removeprefix('random:')}"
    return str(runs / name)


def main() -> None:
    args = arguments(__doc__)
    logs = HERE / "logs"
    from birdjepa.synthetic.demo import ensure_birdset_data, ensure_demo_data

    tasks, demo = ensure_birdset_data(), ensure_demo_data()
    todo = {
        ON_DEMO: [*RUNS[BASE], *SUPERVISED],
        MULTICROP: [*RUNS[BASE], *PATCH16, "--objective.lejepa.local-views", "4"],
    }
    for task, name in IN_TASK.items():
        own = ("--data.train", str(tasks / task / "train"), "--eval-every", "0")
        todo[name] = [*RUNS[BASE], *SUPERVISED, *own]
        todo[SELF_IN_TASK[task]] = [*RUNS[BASE], *PATCH16, *own]
    for name, extra in todo.items():
        if not (args.runs / name / "checkpoints").is_dir():
            call([*BIRDJEPA, "pretrain", "--run", name, "--log.runs-dir", str(args.runs), *extra],
                 logs / "ceiling-pretrain.log")  # fmt: skip
    log = logs / "ceiling-benchmark.log"
    for task in TASKS:
        names = (ON_DEMO, IN_TASK[task], SELF_IN_TASK[task], SELF, MULTICROP, *BESIDE)
        benchmark(args, names, tasks / task / "train", tasks / task / "test_5s", task, log)
    benchmark(args, (ON_DEMO, BEST, MULTICROP, "raw:input"), demo / "train", demo / "eval", "demo", log)
    write(args.results, args.runs)


def benchmark(args: Namespace, names: Sequence[str], train: Path, test: Path, task: str, log: Path) -> None:
    """``birdjepa benchmark`` of ``names`` (``spec``) on one task, 006's probes, n and seeds, into
    ``args.results`` (rows it holds are not fitted again)."""
    call([*BIRDJEPA, "benchmark", "--backbone", *(spec(args.runs, n) for n in names),
          "--train", str(train), "--test", str(test), "--task", task, "--probe", *PROBES,
          "--n-train", *NS, "--seed", "0", "1", "2", "--results", str(args.results)], log)  # fmt: skip


def write(results: Path, runs: Path) -> None:
    in_task = {run: (task, IN_TASK_ROW) for task, run in IN_TASK.items()}
    in_task.update({run: (task, SELF_IN_TASK_ROW) for task, run in SELF_IN_TASK.items()})
    mean = cell_means(results, runs, in_task)
    order = [IN_TASK_ROW, ON_DEMO, SELF_IN_TASK_ROW, SELF, MULTICROP, *BESIDE]
    lines = ["# 006, is the bar the limit: measured (written by ceiling.py)", "",
             "cmAP, mean over seeds 0-2. An in-task row is each task's own run, scored on that task.", "",
             *tables(mean, order, [ON_DEMO, BEST, MULTICROP, "raw:input"])]  # fmt: skip
    (HERE / "ceiling.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def cell_means(results: Path, runs: Path, in_task: dict[str, tuple[str, str]]) -> dict[tuple, float]:
    """cmAP per (task or "mean" over SYN1-3, backbone, probe, n), over seeds. ``in_task``: a run trained
    on one task's recordings -> (that task, its row's name); its rows on the other tasks are left out."""
    rows, name = named_rows(results, runs)
    cells: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        b = name[r["backbone"]]
        if b in in_task:
            if in_task[b][0] != r["task"]:
                continue
            b = in_task[b][1]
        cells[(r["task"], b, r["probe"], r["n"])].append(r["cmap"])
        if r["task"] != "demo":
            cells[("mean", b, r["probe"], r["n"])].append(r["cmap"])
    return {k: sum(v) / len(v) for k, v in cells.items()}


def tables(mean: dict[tuple, float], order: Sequence[str], on_demo: Sequence[str]) -> list[str]:
    """Markdown: SYN1-3's mean, each task, then the demo split (``on_demo``'s rows): a row per backbone
    of ``order`` and probe that has a cell, a column per n."""
    ns = (1, 4, 16, -1)

    def table(task: str, order: Sequence[str]) -> list[str]:
        out = ["| backbone | probe | " + " | ".join("all" if n < 0 else str(n) for n in ns) + " |",
               "|---|---|" + "---:|" * len(ns)]  # fmt: skip
        for b in order:
            for p in PROBES:
                values = [mean.get((task, b, p, n)) for n in ns]
                if any(v is not None for v in values):
                    shown = ("-" if v is None else f"{v:.3f}" for v in values)
                    out.append(f"| {b} | {p} | " + " | ".join(shown) + " |")
        return out

    lines = ["## SYN1-3, mean over tasks", "", *table("mean", order)]
    for task in TASKS:
        lines += ["", f"## {task}", "", *table(task, order)]
    return [*lines, "", "## The demo's single-label split (train -> eval)", "", *table("demo", on_demo)]


if __name__ == "__main__":
    main()
