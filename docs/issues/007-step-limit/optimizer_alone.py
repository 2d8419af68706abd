"""The optimizer's update timed alone, beside the whole step: what the profile's split should find.

    python docs/issues/007-step-limit/optimizer_alone.py [--presets small base] [--repeats 7]

For each preset (float32, the CPU's batch: `birdjepa.perf.step_cost.CPU_BATCH`): the run's step as
`scripts/bench_step.py` times it, then the run's own optimizer (`fns.tx`: clipping, AdamW, the probe's
scale) updating and applying to the same parameters and state, jitted alone with them donated, on
gradients of ones; beside it a pass that reads two arrays of the parameters' size and writes one
(``p - lr * g``), which only memory bandwidth limits. Medians over ``repeats`` after two. Until
2026-12-04 the step's profile summed its operations' own times; with 8 threads on 2 cores an operation
beside a matrix product stretches while they share the cores, and the update's share read 27-39 % of
those sums (small, base) where alone it takes 7-16 % of the step's time
(`birdjepa.perf.profile.time_by_part` now splits each moment among the operations running then:
12-23 %).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from birdjepa.host_memory import keep_for_reuse
from birdjepa.train.determinism import deterministic_xla

keep_for_reuse()  # as the `birdjepa` command runs
deterministic_xla()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402

from birdjepa.perf.step_cost import CPU_BATCH, bench_config, first_step, measure  # noqa: E402


def timed(f: Callable, carry: Any, *rest: Any, repeats: int) -> float:
    """Median seconds of ``carry = f(carry, *rest)``, outputs ready, after two untimed calls."""
    times = []
    for _ in range(2 + repeats):
        t0 = time.perf_counter()
        carry = f(carry, *rest)
        jax.block_until_ready(carry)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def updating(tx: optax.GradientTransformation) -> Callable[[tuple, Any], tuple]:
    """One optimizer step as the train step applies it: ``(params, opt_state), grads`` to the next."""

    def update(carry: tuple, g: Any) -> tuple:
        p, o = carry
        u, o = tx.update(g, o, p)
        return optax.apply_updates(p, u), o

    return update


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["small", "base"])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print("| preset | batch | parameters | step ms | optimizer update alone ms | share of the step | "
          "p - lr * g ms |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for preset in args.presets:
        cfg = bench_config(preset, "float32", CPU_BATCH[preset])
        step_s = measure(cfg, repeats=args.repeats).step_s
        fns, state, _ = first_step(cfg)
        params, opt_state = state.params, state.opt_state
        n = sum(leaf.size for leaf in jax.tree.leaves(params))
        grads = jax.tree.map(jnp.ones_like, params)
        other = jax.tree.map(jnp.copy, params)  # before the update's first call donates ``params``

        update_s = timed(jax.jit(updating(fns.tx), donate_argnums=0), (params, opt_state), grads,
                         repeats=args.repeats)  # fmt: skip
        plain = jax.jit(lambda p, g: jax.tree.map(lambda a, b: a - 1e-3 * b, p, g), donate_argnums=0)
        plain_s = timed(plain, other, grads, repeats=args.repeats)
        print(f"| {preset} | {cfg.data.batch_size} | {n / 1e6:.1f} M | {1e3 * step_s:.1f} | "
              f"{1e3 * update_s:.1f} | {100 * update_s / step_s:.1f} % | {1e3 * plain_s:.1f} |",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
