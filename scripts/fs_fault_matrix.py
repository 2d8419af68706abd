"""Print the file-system fault matrix: two writers, a full disk, a torn log, a stale lease, a format-1
checkpoint and an old default, each produced for real, against what must happen and the straight run.

    python scripts/fs_fault_matrix.py [--runs-dir /tmp/fs-fault-matrix] [--steps 64]

Every run is `birdjepa pretrain` in its own process on the embedded demo set (batch 4, a checkpoint
every 4 steps, no evaluation). The full-disk row mounts a tmpfs in a private mount namespace (root, or
``unshare --map-root-user``). The format-1 row resumes the checkpoint the old code wrote, held in
``tests/fixtures/format1``, and compares it with that code's own straight run. Exit status 1 on any
miss: a fault not handled as expected, or a run that does not then equal its straight run.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import tyro

from birdjepa.verify.fs_fault_matrix import MIN_STEPS, STOP_AT, Matrix, format_rows, misses

REPO = Path(__file__).resolve().parents[1]


def main(runs_dir: Path = Path("/tmp/fs-fault-matrix"), steps: int = 64) -> None:
    """Produce each file-system fault; print fault x (expected, observed, equal to the straight run)."""
    if steps < MIN_STEPS:  # each trial then failed, its row blank: --stop-at-step 30 past the run's end
        sys.exit(f"--steps {steps}: must be at least {MIN_STEPS} (trials stop after step {STOP_AT}, and the "
                 "full disk needs 5 checkpoints after it)")  # fmt: skip
    flags = ["--steps", str(steps), "--eval-every", "0", "--ckpt-every", "4", "--data.batch-size", "4"]
    t0 = time.perf_counter()
    try:
        rows = Matrix(runs_dir.absolute(), flags, REPO / "tests" / "fixtures" / "format1").rows()
    except ValueError as e:  # a folder of the user's runs was removed whole
        sys.exit(f"--runs-dir {e}")
    print(format_rows(rows))
    print(f"\n{len(rows)} faults in {time.perf_counter() - t0:.0f} s; runs in {runs_dir}")
    bad = misses(rows)
    if bad:
        print(f"NOT AS EXPECTED: {', '.join(bad)}")
        sys.exit(1)


if __name__ == "__main__":
    tyro.cli(main)
