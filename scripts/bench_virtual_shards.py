"""What ``--train.virtual-shards`` costs: the virtual-shard step against the default step, side by side.

    python scripts/bench_virtual_shards.py [--presets tiny small] [--devices 1 2 4] [--shards 8]
                                           [--batch-size 16] [--steps 5]

For each preset and device count D (simulated host devices), one process per step kind, each on the
same random batches of the demo shape at XLA's default optimisation level:

* ``default``: the default step (one program over the D devices);
* ``virtual``: the virtual-shard step with V shards (`birdjepa.train.virtual_shards`), and where its
  time goes: the first pass over every shard (SIGReg's statistics), the second (each shard's loss
  and gradients, added on the first device as they come), and the rest (the loss terms combined, the
  update, copying the state to every device);
* ``grads B`` against ``grads B/V x V``: the training loss's forward and backward pass alone (no
  update) on one device, at the whole batch once and at one shard's rows V times: what the smaller
  matmuls cost.

It prints the median step time, the ratio to the default step, the compile time (the first step) and
the process's peak resident memory (``ru_maxrss``: on CPU the devices' memory is the process's).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

#: One process per measurement: its device count is fixed when JAX starts, and its peak memory is its own.
WORKER = "--worker"


def worker(preset: str, devices: int, kind: str, shards: int, batch_size: int, steps: int) -> dict:
    from birdjepa.train.determinism import deterministic_xla

    deterministic_xla()
    import jax
    import numpy as np
    import tyro

    from birdjepa.config import PretrainConfig
    from birdjepa.train.compiled import _build
    from birdjepa.train.segment import fresh_state, model_config
    from birdjepa.train.step import StepConfig, make_loss_fn

    rows = batch_size // shards if kind == "grads-shard" else batch_size
    v = shards if kind == "virtual" else 0
    args = ["--model.preset", preset, "--data.batch-size", str(rows), "--train.virtual-shards", str(v)]
    cfg = tyro.cli(PretrainConfig, args=args)
    model_cfg = model_config(cfg, 12)
    fns = _build(StepConfig.of(cfg, model_cfg), cfg.optim, 1000, tuple(jax.devices()[:devices]))
    state = fns.place(fresh_state(cfg, model_cfg, fns.tx))
    params, opt_state = state.params, state.opt_state
    rng = np.random.default_rng(0)
    shape = (rows, cfg.data.n_views, cfg.model.n_frames, cfg.model.n_mels)
    batch = fns.on_device({"spectrogram": rng.normal(size=shape).astype(np.float32),
                           "label": rng.integers(0, 12, size=rows)})  # fmt: skip
    repeat = shards if kind == "grads-shard" else 1  # a shard's batch, V times: one batch's work
    grads = jax.jit(jax.value_and_grad(make_loss_fn(StepConfig.of(cfg, model_cfg)), has_aux=True))
    times, phases = [], []
    for step in range(steps + 1):
        t0 = time.perf_counter()
        key = jax.random.key(step)
        for _ in range(repeat):
            if kind.startswith("grads"):
                out = grads(params, batch, key)
            else:
                params, opt_state, *out = fns.train_step(params, opt_state, batch, key, False)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
        if kind == "virtual" and step:
            phases.append(_phases(fns.train_step, params, opt_state, batch, jax.random.key(step)))
    out = {
        "compile_s": times[0],
        "step_s": statistics.median(times[1:]),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    if phases:
        out["phases_s"] = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
    return out


def _phases(step, params, opt_state, batch, key) -> dict[str, float]:  # noqa: ANN001
    """The virtual-shard step run pass by pass (`VirtualShardStep`), each pass waited for."""
    import jax

    t0 = time.perf_counter()
    inputs = step.inputs(params, batch, key)
    totals = jax.block_until_ready(step.first_pass(inputs))
    t1 = time.perf_counter()
    (loss, aux), grads = jax.block_until_ready(step.second_pass(inputs, totals))
    t2 = time.perf_counter()
    out = step.update(params, opt_state, loss, aux, grads, False)
    jax.block_until_ready(jax.device_put(out[:2], step._replicated))
    t3 = time.perf_counter()
    return {"first_pass": t1 - t0, "second_pass": t2 - t1, "combine_update_copy": t3 - t2}


def measure(preset: str, devices: int, kind: str, args: argparse.Namespace) -> dict:
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    sizes = [str(args.shards), str(args.batch_size), str(args.steps)]
    cmd = [sys.executable, __file__, WORKER, preset, str(devices), kind, *sizes]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "XLA_FLAGS": flags})
    if done.returncode:
        raise SystemExit(f"{preset} D={devices} {kind}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--devices", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(f"batch {args.batch_size}, V={args.shards}, {args.steps} timed steps (median), default XLA level")
    print(
        "| preset | D | default step s | virtual step s | ratio | fwd+bwd B / B/V x V s | compile default / "
        "virtual s | peak RSS default / virtual MiB | virtual: first pass / second pass / "
        "combine+update+copy s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for preset in args.presets:
        for d in args.devices:
            base = measure(preset, d, "default", args)
            virt = measure(preset, d, "virtual", args)
            ph = virt["phases_s"]
            sized = ""
            if d == args.devices[0]:
                whole, cut = measure(preset, 1, "grads-whole", args), measure(preset, 1, "grads-shard", args)
                w, c = whole["step_s"], cut["step_s"]
                sized = f"{w:.3f} / {c:.3f} ({c / w:.2f}x)"
            print(f"| {preset} | {d} | {base['step_s']:.3f} | {virt['step_s']:.3f} | "
                  f"{virt['step_s'] / base['step_s']:.2f}x | {sized} | ", end="")  # fmt: skip
            print(f"{base['compile_s']:.1f} / {virt['compile_s']:.1f} | {base['peak_rss_mib']:.0f} / "
                  f"{virt['peak_rss_mib']:.0f} | {ph['first_pass']:.3f} / {ph['second_pass']:.3f} / "
                  f"{ph['combine_update_copy']:.3f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == WORKER:
        preset, devices, kind, shards, batch_size, steps = sys.argv[2:8]
        print(json.dumps(worker(preset, int(devices), kind, int(shards), int(batch_size), int(steps))))
    else:
        main()
