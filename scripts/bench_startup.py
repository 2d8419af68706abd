"""What a new Python process costs before it trains, with and without bytecode for the installed
packages: every figure measured side by side in this one run.

    python scripts/bench_startup.py [--repeats 3]

Why it matters: the tests, `birdjepa verify-resume`, sweeps and every Slurm segment start `birdjepa`
processes again and again. uv (which `make build` installs with) writes no bytecode unless asked, and
where PYTHONDONTWRITEBYTECODE is set (as on this project's CI machine) Python then compiles JAX, Flax,
Orbax and scikit-learn from source in every process. `make build` asks uv for bytecode
(UV_COMPILE_BYTECODE=1); "without" below replays the other case by pointing Python at an empty
bytecode folder (PYTHONPYCACHEPREFIX) with writing turned off.

Two commands, alternated `--repeats` times per mode, median wall and CPU (user + system) seconds:
- `import birdjepa.pretrain.loop` (what every trainer process imports);
- `birdjepa pretrain` of 6 steps (batch 8, no evaluation) on the SMALL demo set, with the compiled step
  in a JAX compilation cache that a first run filled (as the test suite's runs find it).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from birdjepa.data.demo import SMALL, ensure_demo_data


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU of the child) seconds of one run of ``cmd``, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        demo = ensure_demo_data(SMALL, Path(tmp) / "demo", verbose=False)
        base = {
            **os.environ,
            "PYTHONDONTWRITEBYTECODE": "1",
            "JAX_COMPILATION_CACHE_DIR": str(Path(tmp) / "jax-cache"),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        }
        modes = {
            "with bytecode": base,
            "without": {**base, "PYTHONPYCACHEPREFIX": str(Path(tmp) / "no-bytecode")},
        }
        pretrain = [
            sys.executable, "-m", "birdjepa.cli", "pretrain", "--log.runs-dir", str(Path(tmp) / "runs"),
            "--steps", "6", "--eval-every", "0", "--ckpt-every", "3", "--data.batch-size", "8",
            "--data.train", str(demo / "train"), "--data.eval", str(demo / "eval"),
        ]  # fmt: skip
        timed([*pretrain, "--run", "warm-up"], base)  # fills the compilation cache
        commands = {
            "import birdjepa.pretrain.loop": lambda run: [
                sys.executable,
                "-c",
                "import birdjepa.pretrain.loop",
            ],
            "pretrain, 6 steps (cached step)": lambda run: [*pretrain, "--run", run],
        }
        print(f"python {sys.version.split()[0]}; {args.repeats} runs per mode, alternated; median seconds")
        print("| command | wall with bytecode | wall without | ratio | CPU with | CPU without | ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, cmd in commands.items():
            got: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
            for i in range(args.repeats):
                for k, (mode, env) in enumerate(modes.items()):
                    got[mode].append(timed(cmd(f"m{k}-{i}"), env))  # a new run directory each time
            (w1, c1), (w0, c0) = (
                (statistics.median(x[0] for x in got[m]), statistics.median(x[1] for x in got[m]))
                for m in modes
            )
            print(f"| {name} | {w1:.2f} | {w0:.2f} | {w0 / w1:.2f}x | {c1:.2f} | {c0:.2f} | {c0 / c1:.2f}x |")


if __name__ == "__main__":
    main()
