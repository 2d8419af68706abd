"""006, more distinct recordings: the best self-supervised run (``anchor.py``'s w = 16 run at 2,400
steps: 100 passes over the demo set's 384 train recordings) trails ``raw:input`` at n = 1 and 4. Is it
short of data? The same recipe, the same 2,400 steps, on two sets four times the demo's size, drawn by
the demo's own generator (``birdjepa demo-data``). Writes ``recordings.md``.

    .venv/bin/python docs/issues/006-token-probes/recordings.py   # ~100 min on 2 cores; after ceiling.py

1. **Data**: ``rec96``: the demo's 16 species with 96 train recordings each (1,536; a recording's
   draws are keyed by its species and number, so a species' first 24 share the demo's keys, at the
   lengths and in the formats drawn for this set), the demo's eval split unchanged. ``sp64``: 64
   species with the demo's 24 each (1,536): the generator's table at 64 species holds the demo's 16
   songs and the stand-in's 24 (its 8 beyond the demo's), each in a band of its own set's, and 40 more.
   ``sp64-seed1``: the same drawn with ``--seed 1``, whose table holds none of the stand-in's songs
   (``tests/test_birdset_data.py``): pretraining on species the tests lack.
2. **Runs**: ``anchor.py``'s best (2 blocks of 512, lr 2e-4 warmed up over 60 steps, the patch term at
   w = 16, 2,400 steps, batch 16: 25 passes over a set) on each set.
3. **Benchmark**: as ``anchor.py``'s part 2 (linear on the mean, proto on the tokens, n = 1, 4, 16,
   all, seeds 0-2) on SYN1-3 and the demo split, beside the run on the demo set, the architecture's
   random init and ``raw:input``. Into ``anchor.py``'s results folder: rows it holds are not fitted
   again.

If four times the recordings move the few-shot cells toward the bar, the demo set's size is what
holds the encoder back there; if neither set does, it is not. If the seed-1 set scores as ``sp64``
does, hearing the test's songs in pretraining is not what the tokens' level rests on.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from runlog import call  # noqa: E402  (docs/issues/runlog.py)

sys.path.insert(0, str(HERE))
from anchor import ARCHITECTURE, BASE_2400, LONGER  # noqa: E402  (006's)
from ceiling import BEST, benchmark, cell_means, tables  # noqa: E402
from wider import BIRDJEPA, TASKS, arguments  # noqa: E402

SETS = {
    "rec96": ("--per-species-train", "96"),
    "sp64": ("--n-species", "64"),
    "sp64-seed1": ("--n-species", "64", "--seed", "1"),
}
ON_SET = {s: f"{BEST}-{s}" for s in SETS}
BESIDE = (BEST, f"random:{ARCHITECTURE}", "raw:input")


def main() -> None:
    args = arguments(__doc__)
    logs = HERE / "logs"
    from birdjepa.synthetic.demo import ensure_birdset_data, ensure_demo_data

    tasks, demo = ensure_birdset_data(), ensure_demo_data()
    data = args.runs.parent / "data"  # beside the runs: regenerable, a few hundred MB each
    for s, size in SETS.items():
        if not (data / s / "manifest.json").is_file():
            call([*BIRDJEPA, "demo-data", str(data / s), *size], logs / "recordings-data.log")
        if not (args.runs / ON_SET[s] / "checkpoints").is_dir():
            own = ("--data.train", str(data / s / "train"), "--data.eval", str(data / s / "eval"))
            call([*BIRDJEPA, "pretrain", "--run", ON_SET[s], "--log.runs-dir", str(args.runs), *BASE_2400,
                  *LONGER[BEST], *own], logs / "recordings-pretrain.log")  # fmt: skip
    log, runs_on_sets = logs / "recordings-benchmark.log", tuple(ON_SET.values())
    for task in TASKS:
        benchmark(args, (*runs_on_sets, *BESIDE), tasks / task / "train", tasks / task / "test_5s", task, log)
    benchmark(args, (*runs_on_sets, BEST, "raw:input"), demo / "train", demo / "eval", "demo", log)
    write(args.results, args.runs)


def write(results: Path, runs: Path) -> None:
    mean, runs_on_sets = cell_means(results, runs, {}), tuple(ON_SET.values())
    lines = ["# 006, more distinct recordings: measured (written by recordings.py)", "",
             "cmAP, mean over seeds 0-2.", "",
             *tables(mean, (*runs_on_sets, *BESIDE), (*runs_on_sets, BEST, "raw:input"))]  # fmt: skip
    (HERE / "recordings.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
