"""What fixing XLA's CPU thread pool at `MIN_CPU_THREADS` costs on a machine with fewer cores: the
training step's time with the pool the machine would get alone (its cores) and with the one
`birdjepa` sets (max(cores, 8)), side by side in this one run.

    python scripts/bench_cpu_threads.py [--presets tiny small] [--repeats 3] [--steps 8]

Why: on CPU, XLA splits some reductions and matrix products over its thread pool, and the split moves
the last bits; XLA grows the pool with the device count, so `birdjepa` fixes it
(`birdjepa.train.determinism`). More threads than cores is oversubscription. Each measurement is a fresh
process (the pool is sized when JAX's backend starts): the default step of the preset, batch 16, two
views, on random spectrograms; the median step time over the steps after the first two (compiling).
The pools alternate, ``--repeats`` processes each; the table gives the median of their medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from birdjepa.cores import schedulable_cpus
from birdjepa.train.determinism import MIN_CPU_THREADS


def child(preset: str, steps: int) -> None:
    """In a process whose pool is already set: the median step time, as one JSON line."""
    from birdjepa.train.determinism import deterministic_xla

    deterministic_xla()
    import jax
    import numpy as np
    import tyro

    from birdjepa.config import PretrainConfig
    from birdjepa.train.compiled import compiled
    from birdjepa.train.segment import fresh_state, model_config
    from birdjepa.train.step import StepConfig

    cfg = tyro.cli(PretrainConfig, args=["--model.preset", preset, "--data.batch-size", "16"])
    model_cfg = model_config(cfg, 4)
    fns = compiled(StepConfig.of(cfg, model_cfg), cfg.optim, 100)
    state = fns.place(fresh_state(cfg, model_cfg, fns.tx))
    params, opt_state = state.params, state.opt_state
    rng = np.random.default_rng(0)
    batch = fns.on_device({
        "spectrogram": rng.normal(size=(16, 2, cfg.model.n_frames, cfg.model.n_mels)).astype(np.float32),
        "label": rng.integers(-1, 4, size=16),
    })  # fmt: skip
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        params, opt_state, *_ = fns.train_step(params, opt_state, batch, jax.random.key(i), False)
        jax.block_until_ready(params)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"step_s": statistics.median(times[2:])}))


def measure(preset: str, pool: int, steps: int) -> float:
    env = {**os.environ, "PJRT_NPROC": str(pool)}
    cmd = [sys.executable, __file__, "--child", preset, "--steps", str(steps)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["step_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 3:  # the first two steps (the compile, the first run) are not timed: a median of none
        ap.error(f"--steps {args.steps}: must be at least 3")
    if args.child:
        child(args.child, args.steps)
        return
    cores = schedulable_cpus()
    fixed = max(cores, MIN_CPU_THREADS)
    print(f"{cores} schedulable cores; birdjepa's pool: {fixed} threads")
    print(f"{'preset':8} {'pool=' + str(cores):>12} {'pool=' + str(fixed):>12} {'ratio':>7}")
    for preset in args.presets:
        got: dict[int, list[float]] = {cores: [], fixed: []}
        for _ in range(args.repeats):
            for pool in (cores, fixed):
                got[pool].append(measure(preset, pool, args.steps))
        own, ours = statistics.median(got[cores]), statistics.median(got[fixed])
        print(f"{preset:8} {own * 1e3:10.1f}ms {ours * 1e3:10.1f}ms {ours / own:6.2f}x")


if __name__ == "__main__":
    main()
