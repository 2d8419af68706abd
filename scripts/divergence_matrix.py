"""Print the divergence matrix: pairs of short runs that differ in one thing, and where bisect places it.

    python scripts/divergence_matrix.py [--runs-dir /tmp/divergence-matrix] [--only NAME ...]

Each pair (see `birdjepa.verify.divergence_matrix.PAIRS`) trains two 4-step runs on the demo set,
bisects them and compares the stage and tensor of the first difference with the expected ones; the
topology pair trains its twin on 4 simulated devices. Exit status 1 on any miss.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import tyro

from birdjepa.outputs import scratch_folder
from birdjepa.train.determinism import deterministic_xla
from birdjepa.verify.divergence_matrix import PAIRS, format_matrix, run_pair


def main(runs_dir: Path = Path("/tmp/divergence-matrix"), only: tuple[str, ...] = ()) -> None:
    deterministic_xla()
    names = [p.name for p in PAIRS]
    if unknown := [n for n in only if n not in names]:  # a typo ran nothing: an empty table, exit 0
        sys.exit(f"--only {' '.join(unknown)}: no such pair (the pairs: {', '.join(names)})")
    try:  # emptied: run A is shared between pairs, never a stale one
        scratch_folder(runs_dir, "scripts/divergence_matrix.py")
    except ValueError as e:  # a folder of the user's runs was removed whole
        sys.exit(f"--runs-dir {e}")
    pairs = [p for p in PAIRS if not only or p.name in only]
    rows = []
    for p in pairs:
        t0 = time.perf_counter()
        rows.append(run_pair(p, runs_dir))
        print(f"{p.name}: {'ok' if rows[-1].ok else 'MISS'} ({time.perf_counter() - t0:.0f} s)", flush=True)
        print(f"  {rows[-1].verdict}", flush=True)
    print()
    print(format_matrix(rows))
    sys.exit(0 if all(r.ok for r in rows) else 1)


if __name__ == "__main__":
    tyro.cli(main)
