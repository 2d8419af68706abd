"""What a new Python process costs before it trains, with and without bytecode for the installed
packages, and with CPython's default garbage-collection threshold against the `birdjepa` command's:
every figure measured side by side in this one run.

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

Then the same pretrain, with bytecode, as the command runs it (`birdjepa.cli.fewer_collections`: the
youngest generation collected every `GC_YOUNG_THRESHOLD` allocations) against CPython's default (700),
by the same entry point with `fewer_collections` replaced by a no-op.
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
import uuid
from pathlib import Path

from birdjepa.synthetic.demo import SMALL, ensure_demo_data


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
        print(f"python {sys.version.split()[0]}; {args.repeats} runs per mode, alternated; median seconds")
        print("| command | wall with bytecode | wall without | ratio | CPU with | CPU without | ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        import_loop = [sys.executable, "-c", "import birdjepa.pretrain.loop"]
        importing = {m: (import_loop, env) for m, env in modes.items()}
        print(row("import birdjepa.pretrain.loop", importing, args.repeats))
        runs = {m: ([*pretrain, "--run"], env) for m, env in modes.items()}
        print(row("pretrain, 6 steps (cached step)", runs, args.repeats))

        default_gc = "import birdjepa.cli as c; c.fewer_collections = lambda: None; c.main()"
        entries = {"as shipped": pretrain[:3], "default": [sys.executable, "-c", default_gc]}
        print("\n| collections | wall shipped | wall default | ratio | CPU shipped | CPU default | ratio |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        runs = {m: ([*entry, *pretrain[3:], "--run"], base) for m, entry in entries.items()}
        print(row("pretrain, 6 steps (cached step)", runs, args.repeats))


def row(name: str, modes: dict[str, tuple[list[str], dict[str, str]]], repeats: int) -> str:
    """A table row: two modes' commands alternated ``repeats`` times; the second's median over the first's.
    A command ending in ``--run`` gets a new run directory each time (a finished run would only say so)."""
    got: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    for _ in range(repeats):
        for mode, (cmd, env) in modes.items():
            got[mode].append(timed([*cmd, uuid.uuid4().hex] if cmd[-1] == "--run" else cmd, env))
    (w1, c1), (w0, c0) = (
        (statistics.median(x[0] for x in got[m]), statistics.median(x[1] for x in got[m])) for m in modes
    )
    return f"| {name} | {w1:.2f} | {w0:.2f} | {w0 / w1:.2f}x | {c1:.2f} | {c0:.2f} | {c0 / c1:.2f}x |"


if __name__ == "__main__":
    main()
