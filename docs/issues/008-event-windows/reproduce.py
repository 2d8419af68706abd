"""Regenerate docs/issues/008-event-windows: event windows against uniform crops, at equal steps.

    .venv/bin/python docs/issues/008-event-windows/reproduce.py [--work /tmp/birdjepa-008]  # ~30 min, 2 cores

1. The BirdSet stand-in (tasks SYN1-3), whose focal train recordings carry ``detected_events``: where
   the generator's song sounds (`synth.channel.song_events`, 38 % of a recording on average).
2. Pretrains on the train recordings of all three tasks (816 recordings), the demo recipe
   (`birdjepa pretrain` defaults: LeJEPA, tiny ViT, 600 steps of 16 x 2 views), alike but for the crop:
   ``uniform`` (today's default) and ``events`` (``--data.crop-events``), for each pretraining seed of
   ``--seeds`` (default 0; seed s > 0 names the runs ``uniform-s<s>`` and ``events-s<s>``).
3. `birdjepa benchmark` on each task: every run, the random init and raw log-mel; the default probes,
   n = 4 and all recordings per class, probe seeds 0-2. One store, WORK/results; the table into logs/.
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
RUNS = {"uniform": [], "events": ["--data.crop-events"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=Path("/tmp/birdjepa-008"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()
    work = args.work
    logs = HERE / "logs"
    logs.mkdir(exist_ok=True)
    for name in ("pretrain.log", "benchmark.log", "table.log"):
        (logs / name).unlink(missing_ok=True)
    from birdjepa.synthetic.demo import ensure_birdset_data

    tasks = ensure_birdset_data()
    runs = work / "runs"
    names = []
    for seed in args.seeds:
        for kind, extra in RUNS.items():
            name = kind if seed == 0 else f"{kind}-s{seed}"
            names.append(name)
            if not (runs / name / "checkpoints").is_dir():
                data = ["--data.train", str(tasks / "SYN*" / "train" / "*.arrow"),
                        "--data.eval", str(tasks / "SYN1" / "test_5s")]  # fmt: skip
                call([*BIRDJEPA, "pretrain", "--run", name, "--log.runs-dir", str(runs), "--eval-every", "0",
                      "--seed", str(seed), *data, *extra], logs / "pretrain.log")  # fmt: skip
    results = work / "results"
    backbones = [*(str(runs / n) for n in names), f"random:{runs / 'uniform'}", "raw"]
    for task in TASKS:
        call([*BIRDJEPA, "benchmark", "--backbone", *backbones,
              "--train", str(tasks / task / "train"), "--test", str(tasks / task / "test_5s"), "--task", task,
              "--n-train", "4", "-1", "--seed", "0", "1", "2", "--results", str(results)],
             logs / "benchmark.log")  # fmt: skip
    call([*BIRDJEPA, "benchmark", "--table", str(results)], logs / "table.log")


if __name__ == "__main__":
    main()
