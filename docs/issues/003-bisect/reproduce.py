"""Regenerate docs/issues/003-bisect: the worked case and the divergence matrix.

    .venv/bin/python docs/issues/003-bisect/reproduce.py [--runs-dir /tmp/birdjepa-003]   # ~15 min, 2 cores

The worked case: two runs of the demo recipe, "mine" and "theirs", 40 steps each with a checkpoint every
10, whose losses agree at step 0 and differ from step 1 on. `birdjepa compare` says where the logged
numbers part; one `birdjepa bisect` says why. Then `scripts/divergence_matrix.py`. Console logs go to
``logs/`` next to this file.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))
from runlog import call  # noqa: E402  (docs/issues/runlog.py)

BIRDJEPA = [sys.executable, "-m", "birdjepa.cli"]
RECIPE = ["--steps", "40", "--ckpt-every", "10", "--eval-every", "0"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs-dir", type=Path, default=Path("/tmp/birdjepa-003"))
    runs, logs = parser.parse_args().runs_dir, HERE / "logs"
    shutil.rmtree(runs, ignore_errors=True)
    logs.mkdir(exist_ok=True)
    for name in ("train.log", "compare.log", "bisect.log", "matrix.log"):
        (logs / name).unlink(missing_ok=True)
    mine, theirs = str(runs / "mine"), str(runs / "theirs")
    train = [*BIRDJEPA, "pretrain", "--log.runs-dir", str(runs), *RECIPE]
    call([*train, "--run", "mine"], logs / "train.log")
    call([*train, "--run", "theirs", "--optim.warmup-steps", "0"], logs / "train.log")
    metrics = ["--metrics", "train/loss", "train/lr"]
    call([*BIRDJEPA, "compare", mine, theirs, *metrics], logs / "compare.log", ok=(1,))
    call([*BIRDJEPA, "bisect", mine, theirs, "--repeat", "2"], logs / "bisect.log", ok=(1,))
    matrix = [
        sys.executable,
        str(ROOT / "scripts" / "divergence_matrix.py"),
        "--runs-dir",
        str(runs / "matrix"),
    ]
    call(matrix, logs / "matrix.log")


if __name__ == "__main__":
    main()
