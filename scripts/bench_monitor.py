"""Overhead of the weight-update monitor on the train step (tiny preset by default, CPU).

    python scripts/bench_monitor.py [--preset tiny] [--batch-size 16] [--steps 30] [--interval 10]

Three compiled variants of the same train step, timed in interleaved rounds on the same random batch:

* ``without``: the statistics' outputs dropped, so XLA removes the monitor from the program (the
  script checks that the compiled program has no conditional left);
* ``skip``: the trainer's program on a step that is not a check (the ``lax.cond`` takes the empty
  branch);
* ``check``: the trainer's program on a check step (per-parameter statistics computed in the graph),
  plus the host side: copying the ``[P]`` vectors and ``UpdateMonitor.observe``.

Prints the mean ms of each, the ratios to ``without``, and the mean overhead per step at
``--interval`` (one check and ``interval - 1`` skips).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import jax
import numpy as np

from birdjepa.config import PretrainConfig
from birdjepa.diagnostics.monitor import UpdateMonitor, param_names
from birdjepa.model.config import preset
from birdjepa.model.vit import init_params
from birdjepa.train.determinism import deterministic_xla
from birdjepa.train.optim import make_optimizer
from birdjepa.train.step import StepConfig, make_loss_fn, make_train_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per variant")
    ap.add_argument("--interval", type=int, default=10)
    args = ap.parse_args()
    deterministic_xla()

    cfg = PretrainConfig()
    model_cfg = dataclasses.replace(preset(args.preset), n_classes=16)
    tx = make_optimizer(cfg.optim, 1000)
    step = make_train_step(make_loss_fn(StepConfig.of(cfg, model_cfg)), tx)
    rng = np.random.default_rng(0)
    shape = (args.batch_size, cfg.data.n_views, model_cfg.n_frames, model_cfg.n_mels)
    batch = {
        "spectrogram": rng.standard_normal(shape, dtype=np.float32),
        "label": rng.integers(0, 16, args.batch_size),
    }
    key = jax.random.key(0)
    params = init_params(model_cfg, key)["params"]
    opt_state = tx.init(params)
    names = param_names(params)

    trainer = jax.jit(step)
    without = jax.jit(lambda p, o, b, k: step(p, o, b, k, False)[:3])
    hlo = without.lower(params, opt_state, batch, key).compile().as_text()
    assert "conditional" not in hlo, "XLA kept the monitor in the 'without' program"

    monitor = UpdateMonitor(names)
    counter = [0]

    def run(variant: str) -> float:
        t0 = time.perf_counter()
        if variant == "without":
            out = without(params, opt_state, batch, key)
            jax.block_until_ready(out)
        else:
            out = trainer(params, opt_state, batch, key, variant == "check")
            stats = jax.device_get(out[3])
            if variant == "check":
                counter[0] += 1
                monitor.observe(counter[0], stats)
        return time.perf_counter() - t0

    variants = ("without", "skip", "check")
    for v in variants:  # compile and warm up
        run(v)
        run(v)
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(args.steps):
        for v in variants:
            times[v].append(run(v))
    ms = {v: 1e3 * float(np.mean(t)) for v, t in times.items()}
    base = ms["without"]
    print(f"{args.preset} preset, batch {args.batch_size}, {len(names)} parameters, {args.steps} steps each")
    print(f"{'variant':<8} {'ms/step':>9} {'vs without':>11}")
    for v in variants:
        print(f"{v:<8} {ms[v]:>9.2f} {ms[v] / base:>11.3f}")
    per_step = (ms["check"] + (args.interval - 1) * ms["skip"]) / args.interval
    print(
        f"interval {args.interval}: {per_step:.2f} ms/step on average = {per_step / base:.3f} x without "
        f"({100 * (per_step / base - 1):+.1f} %)"
    )


if __name__ == "__main__":
    main()
