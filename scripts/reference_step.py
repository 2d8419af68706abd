"""The reference implementation's LeJEPA training step, timed: the other side of scripts/bench_reference.py.

Runs in the reference's own scratch environment (its checkout's ``src`` on ``PYTHONPATH``, Equinox and
its other dependencies in a venv of their own), never in birdjepa's: both packages are called
``birdjepa``. It imports nothing of ours. It builds the step as the reference's ``pretrain.worker_fn``
does (its ``TransformerModel`` encoder, its ``LeJEPA`` objective with projector and SIGReg, its online
probe, AdamW after global-norm clipping, its ``make_train_step``) with the reference's defaults except
where the flags say, times it on random views and prints one JSON line: its time, FLOPs, XLA's memory
plan and peak memory. ``--compile-only``: compiles the step and exits, for a later process to load from
JAX's compilation cache (``JAX_COMPILATION_CACHE_DIR`` in the environment; its JSON line says whether
the step was loaded from it).
"""

# ruff: noqa: I001  (ruff takes the reference's modules that ours lacks for third-party ones)
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import equinox as eqx
import jax
import jax.extend
import jax.numpy as jnp
import jax.random as jr
import optax
from jax._src.lib import _jax

# The reference's package, from its checkout on PYTHONPATH (not ours, which has the same name).
import birdjepa.helpers
import birdjepa.nn.objectives
import birdjepa.nn.transformer
import birdjepa.pretrain


def peak_bytes() -> int:
    """The device's peak memory in use (a GPU), else the process's peak resident memory (a CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--depth", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--views", type=int, default=2)
    ap.add_argument("--proj-dim", type=int, default=16)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    loaded = []
    jax.monitoring.register_event_listener(
        lambda event, **_: loaded.append(1) if event == "/jax/compilation_cache/cache_hits" else None
    )

    model_cfg = birdjepa.nn.transformer.Transformer(embed_dim=args.dim, depth=args.depth, n_heads=args.heads)
    objective_cfg = birdjepa.nn.objectives.LeJEPAConfig(n_views=args.views, proj_dim=args.proj_dim)
    k_model, k_objective, k_probe, k_data, k_step = jr.split(jr.key(0), 5)
    encoder = birdjepa.nn.transformer.TransformerModel(model_cfg, key=k_model)
    objective = birdjepa.nn.objectives.LeJEPA(model_cfg, objective_cfg, key=k_objective)
    probe = eqx.nn.Sequential(
        [eqx.nn.LayerNorm(args.dim), eqx.nn.Linear(args.dim, args.classes, key=k_probe)]
    )
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-4, 0, 10_000, 0.0)  # its Config's defaults
    optim = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.05))
    models = {"encoder": encoder, "objective": objective, "probe": probe}
    opt_state = optim.init({k: eqx.filter(m, eqx.is_inexact_array) for k, m in models.items()})
    _, data_sharding, model_sharding = birdjepa.helpers.setup_sharding(1)
    step = birdjepa.pretrain.make_train_step(optim, data_sharding, model_sharding, probe_pooling="cls")
    shape = (args.batch, args.views, model_cfg.input_h, model_cfg.input_w)
    batch = {
        "views": jr.normal(k_data, shape, jnp.float32),
        "target": jnp.arange(args.batch, dtype=jnp.int32) % args.classes,
    }

    t0, hits = time.perf_counter(), len(loaded)
    lowered = step.lower(models, opt_state, batch, key=k_step)
    # Counted as birdjepa.perf.step_cost.cost_flops counts ours (this script imports nothing of ours): by
    # the CPU client, since a GPU's PJRT plugin analyses no lowered program. Equinox's Lowered holds JAX's.
    module = lowered.lowered.compiler_ir("hlo").as_hlo_module()
    flops = float(_jax.hlo_module_cost_analysis(jax.extend.backend.get_backend("cpu"), module)["flops"])
    if args.compile_only:
        lowered.lowered.compile()  # Equinox's Lowered holds JAX's, which writes the cache
        print(json.dumps({"side": "reference", "compile_s": time.perf_counter() - t0}))
        return
    times = []
    for i in range(args.warmup + args.repeats):
        t1 = time.perf_counter()
        models, opt_state, metrics = step(models, opt_state, batch, key=jr.fold_in(k_step, i))
        jax.block_until_ready(metrics["loss"])
        times.append(time.perf_counter() - t1)
        if i == 0:
            compile_s, step_loaded = time.perf_counter() - t0, len(loaded) > hits
    peak = peak_bytes()  # before the plan's compile below, which runs no step
    plan = lowered.lowered.compile().memory_analysis()  # the program the calls compiled: from jit's cache
    # What the step needs while it runs, as birdjepa.perf.step_cost.measure takes ours.
    plan_bytes = (plan.argument_size_in_bytes + plan.output_size_in_bytes + plan.temp_size_in_bytes
                  - plan.alias_size_in_bytes)  # fmt: skip
    print(json.dumps({
        "side": "reference", "step_s": statistics.median(times[args.warmup:]), "flops": flops,
        "peak_bytes": peak, "plan_bytes": plan_bytes, "compile_s": compile_s, "loaded": step_loaded,
        "jax": jax.__version__, "equinox": eqx.__version__, "device": jax.devices()[0].device_kind,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
