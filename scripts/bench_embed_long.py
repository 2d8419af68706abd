"""What `birdjepa embed` of a folder costs as its recording grows: peak memory and time per length.

    python scripts/bench_embed_long.py [--work /tmp/birdjepa-embed-long] [--minutes 1 8 60]

A tiny encoder is trained for 2 steps on the demo set (its weights do not matter here), then for each
length one 32 kHz mono 16-bit WAV of noise is written into its own folder and `birdjepa embed` runs on
it in a fresh process, so that the peak resident memory (``ru_maxrss`` of the finished child) is its
own. Prints windows, seconds and peak MiB per length, and each length's peak over the first one's: the
windows name their file by path and the loader seeks to each, and a file's length comes from its
container, so memory grows by about one file's bytes (each window once held a copy of the file: 6.3 GB
at 8 minutes; a full decode for the length took 1.3 GB at an hour).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import soundfile as sf

RATE = 32_000


#: Runs the command it is given and prints its peak RSS (KiB) last: a child's own, which the parent's
#: RUSAGE_CHILDREN (the largest of every child so far, the training one among them) does not give.
MEASURE = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(done.returncode)\n"
)


def birdjepa(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "birdjepa.cli", *args], capture_output=True, text=True)


def measured(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    """``birdjepa ARGS`` in a process of its own: (its result, its peak RSS in MiB)."""
    command = [sys.executable, "-c", MEASURE, sys.executable, "-m", "birdjepa.cli", *args]
    done = subprocess.run(command, capture_output=True, text=True)
    return done, int(done.stdout.split()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/birdjepa-embed-long"))
    ap.add_argument("--minutes", type=float, nargs="+", default=[1, 8, 60])
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    run = args.work / "runs" / "enc"
    if not (run / "checkpoints").is_dir():
        done = birdjepa("pretrain", "--run", "enc", "--log.runs-dir", str(args.work / "runs"), "--steps", "2",
                        "--eval-every", "0")  # fmt: skip
        if done.returncode:
            sys.exit(f"pretrain failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    rows = []
    for minutes in args.minutes:
        folder = args.work / f"audio-{minutes:g}min"
        wav = folder / "recording.wav"
        if not wav.is_file():
            folder.mkdir(exist_ok=True)
            noise = np.random.default_rng(0).standard_normal(int(minutes * 60 * RATE)).astype(np.float32)
            sf.write(wav, 0.1 * noise, RATE, subtype="PCM_16")
        t0 = time.perf_counter()
        done, mib = measured(
            "embed", str(folder), "--encoder", str(run), "--out", str(args.work / "e.parquet")
        )
        took = time.perf_counter() - t0
        if done.returncode:
            sys.exit(f"embed failed at {minutes:g} min:\n{done.stderr[-2000:]}")
        said = next(line for line in done.stdout.splitlines() if line.startswith("embedded "))
        rows.append((minutes, said.split()[1], took, mib))
    first = rows[0][3]
    print(f"{'minutes':>8} {'windows':>8} {'seconds':>8} {'peak MiB':>9} {'x first':>8}")
    for minutes, windows, took, mib in rows:
        print(f"{minutes:>8g} {windows:>8} {took:>8.1f} {mib:>9.0f} {mib / first:>8.2f}")


if __name__ == "__main__":
    main()
