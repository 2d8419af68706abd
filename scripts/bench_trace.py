"""What `birdjepa trace` costs beside the training it re-executes, measured side by side in one run.

    python scripts/bench_trace.py [--preset base] [--batch-size 32]

Trains a 2-step run (checkpoint after step 0) of the preset on the demo set, then traces step 1 in a
new process (digests of every tensor, the default), again (its compiled steps now in the cache), and
once more keeping one block's module calls whole (``--keep``). Every process shares one JAX
compilation cache, as a user's processes do with ``JAX_COMPILATION_CACHE_DIR`` set: a trace runs the
training step the run compiled (it records itself), and compiles a step apart only for ``--keep``.
The table gives each process's wall time and peak resident memory (``ru_maxrss``), and the ratio to
the training process's; then the trace file's size against what a trace holding every tensor whole
(the format before digests) would take, from the shapes in its manifest. Targets (issue 33): at most
1.5x the training step's peak memory, a file under 1 % of the whole trace.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Runs one birdjepa command in this process and prints its peak RSS (KiB) as the last line.
_MEASURED = """
import resource, sys
from birdjepa.cli import main
try:
    main(sys.argv[1:])
except SystemExit as e:
    if e.code not in (0, None):
        raise
print(json.dumps({"maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def measured(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS in MiB) of ``birdjepa ARGS`` in a process of its own."""
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", "import json\n" + _MEASURED, *args], capture_output=True,
                          text=True, check=False, env=env)  # fmt: skip
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"birdjepa {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    rss = json.loads(done.stdout.strip().splitlines()[-1])["maxrss_kib"] / 1024
    return wall, rss


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch-size", type=int, default=32)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp) / "runs"
        train = ["pretrain", "--run", "r", "--log.runs-dir", str(runs), "--model.preset", a.preset,
                 "--data.batch-size", str(a.batch_size), "--steps", "2", "--ckpt-every", "1",
                 "--eval-every", "0", "--monitor-interval", "0"]  # fmt: skip
        env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(Path(tmp) / "jax-cache"),
               "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}  # fmt: skip
        rows = {"pretrain, 2 steps (compile, step, save)": measured(train, env)}
        trace = ["trace", str(runs / "r"), "--step", "1", "--out", str(Path(tmp) / "t.npz")]
        rows["trace step 1 (restore, record in the training step)"] = measured(trace, env)
        size = (Path(tmp) / "t.npz").stat().st_size
        whole = whole_size(Path(tmp) / "t.npz")
        rows["trace step 1 again"] = measured(trace, env)
        block = [*trace, "--keep", "forward/global/encoder/block_0/*"]
        rows["trace step 1 --keep 'forward/global/encoder/block_0/*'"] = measured(block, env)
        kept = (Path(tmp) / "t.npz").stat().st_size
    base_wall, base_rss = next(iter(rows.values()))
    print(f"preset {a.preset}, batch {a.batch_size} x 2 views\n")
    print("| process | wall s | peak RSS MiB | RSS vs pretrain |")
    print("|---|---:|---:|---:|")
    for name, (wall, rss) in rows.items():
        print(f"| {name} | {wall:.1f} | {rss:.0f} | {rss / base_rss:.2f}x |")
    print(
        f"\ntrace file: {size / 2**20:.2f} MiB (with block 0 kept whole: {kept / 2**20:.1f} MiB); every "
        f"tensor whole: {whole / 2**20:.0f} MiB; ratio {size / whole:.4%}"
    )


def whole_size(path: Path) -> int:
    """Bytes of every tensor of a trace, as a trace that keeps them all whole stores them."""
    import numpy as np

    from birdjepa.divergence.trace_file import read

    return sum(int(np.prod(e.shape)) * np.dtype(_np_dtype(e.dtype)).itemsize for e in read(path).entries)


def _np_dtype(name: str) -> str:
    return "uint16" if name == "bfloat16" else name


if __name__ == "__main__":
    main()
