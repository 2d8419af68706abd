"""What each objective's training step costs, side by side: LeJEPA (the default), MAE (the encoder sees
a quarter of the patches; a light decoder sees them all) and supervised, at each preset.

    python scripts/bench_objectives.py [--presets tiny small] [--steps 8] [--batch-size 16]

One process per measurement (its compile and memory are its own), the same random batches of the demo
shape (two views), XLA's default level; the median step time over the steps after the first two, the
ratio to LeJEPA's, the compile time (the first step) and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

OBJECTIVES: dict[str, list[str]] = {
    "lejepa": [],
    "mae": ["--objective.kind", "mae"],
    "supervised": ["--objective.kind", "supervised"],
}


def worker(preset: str, objective: str, batch_size: int, steps: int) -> dict:
    from birdjepa.train.determinism import deterministic_xla

    deterministic_xla()
    import jax
    import numpy as np
    import tyro

    from birdjepa.config import PretrainConfig
    from birdjepa.train.compiled import compiled
    from birdjepa.train.segment import fresh_state, model_config
    from birdjepa.train.step import StepConfig

    args = ["--model.preset", preset, "--data.batch-size", str(batch_size), *OBJECTIVES[objective]]
    cfg = tyro.cli(PretrainConfig, args=args)
    model_cfg = model_config(cfg, 4)
    fns = compiled(StepConfig.of(cfg, model_cfg), cfg.optim, 100)
    state = fns.place(fresh_state(cfg, model_cfg, fns.tx))
    params, opt_state = state.params, state.opt_state
    rng = np.random.default_rng(0)
    shape = (batch_size, cfg.data.n_views, cfg.model.n_frames, cfg.model.n_mels)
    batch = fns.on_device({
        "spectrogram": rng.normal(size=shape).astype(np.float32),
        "label": rng.integers(-1, 4, size=batch_size),
    })  # fmt: skip
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        params, opt_state, *_ = fns.train_step(params, opt_state, batch, jax.random.key(i), False)
        jax.block_until_ready(params)
        times.append(time.perf_counter() - t0)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"step_s": statistics.median(times[2:]), "compile_s": times[0], "rss_mib": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps < 3:  # the first two steps (the compile, the first run) are not timed: a median of none
        ap.error(f"--steps {args.steps}: must be at least 3")
    if args.worker:
        print(json.dumps(worker(*args.worker, args.batch_size, args.steps)))
        return
    print(f"{'preset':8} {'objective':11} {'step s':>8} {'ratio':>6} {'compile s':>9} {'RSS MiB':>8}")
    for preset in args.presets:
        base = None
        for objective in OBJECTIVES:
            cmd = [sys.executable, __file__, "--worker", preset, objective,
                   "--batch-size", str(args.batch_size), "--steps", str(args.steps)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, check=True)
            r = json.loads(done.stdout.strip().splitlines()[-1])
            base = base or r["step_s"]
            print(f"{preset:8} {objective:11} {r['step_s']:8.3f} {r['step_s'] / base:5.2f}x "
                  f"{r['compile_s']:9.1f} {r['rss_mib']:8.0f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
