"""The tiny step's two hot spots on a CPU, as they were and as they are: the warp's gathers, the floor's sort.

    python docs/issues/007-step-limit/tiny_step.py [--presets tiny small] [--steps 16]

For each preset (float32, the CPU's batch: `birdjepa.perf.step_cost.CPU_BATCH`), the run's step four
ways, each compiled afresh (`birdjepa.train.compiled` keeps the functions of a step configuration it
built, so a second build of the same configuration would return the first's: the cache is cleared
between them), then called in turn, each round starting at the next, ``--steps`` steps each:

- "before": as until 2026-12-05: the augmentation's warp interpolates by two gathers along each axis,
  and the input's noise floor (`birdjepa.model.noise_floor`) takes `jnp.quantile`, which sorts (in
  place of `noise_floor.low_quantile`, so both of the floor's callers, the model and the augmentation's
  noise, take it);
- "warp by selects": `birdjepa.train.augment._warp`, the mel shift picked among shifted copies, the
  time stretch gathered without XLA's bounds checks; the floor as before;
- "now": that warp, and the floor's quantile from two order statistics (`noise_floor.low_quantile`, top_k);
- "now, no warp": the views as they come, what the warp costs at most (other bits: the views differ).

Medians of the steps after the first two; the parameters after the last step, bit for bit, against
the first row's. A scratch A/B of 2026-12-04 found no gain from dropping the gathers' bounds checks
alone: its two builds came from that cache, one program timed twice (the parameters were equal).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from birdjepa.host_memory import keep_for_reuse
from birdjepa.train.determinism import deterministic_xla

keep_for_reuse()  # as the `birdjepa` command runs
deterministic_xla()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from birdjepa.model import noise_floor  # noqa: E402
from birdjepa.perf.step_cost import CPU_BATCH, bench_config, common_call, first_step  # noqa: E402
from birdjepa.train import augment, compiled  # noqa: E402


def by_gathers(x: jax.Array, shift: jax.Array, stretch: jax.Array, *, reach: float) -> jax.Array:
    """The warp as it was until 2026-12-05: each axis interpolated by two gathers."""

    def interp(x: jax.Array, pos: jax.Array, axis: int) -> jax.Array:
        n = x.shape[axis]
        pos = jnp.clip(pos, 0.0, n - 1.0)
        lo = jnp.floor(pos).astype(jnp.int32)
        hi = jnp.minimum(lo + 1, n - 1)
        shape = [1] * x.ndim
        shape[axis] = -1
        a, c = jnp.take(x, lo, axis=axis), jnp.take(x, hi, axis=axis)
        return a + (c - a) * (pos - lo).reshape(shape)

    t, m = x.shape[2:]

    def one(view: jax.Array, s: jax.Array, r: jax.Array) -> jax.Array:
        view = interp(view, jnp.arange(m, dtype=jnp.float32) - s, axis=1)
        return interp(view, jnp.arange(t, dtype=jnp.float32) / r, axis=0)

    return jax.vmap(jax.vmap(one))(x, shift, stretch)


def quantile_by_sort(a: jax.Array, q: float) -> jax.Array:
    """The noise floor's quantile as it was until 2026-12-05: `jnp.quantile`, a sort of each row."""
    return jnp.quantile(a, q, axis=-1)


def no_warp(x: jax.Array, shift: jax.Array, stretch: jax.Array, *, reach: float) -> jax.Array:
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--steps", type=int, default=16)
    args = ap.parse_args()
    variants: dict[str, tuple[Callable, Callable]] = {
        "before": (by_gathers, quantile_by_sort),
        "warp by selects": (augment._warp, quantile_by_sort),
        "now": (augment._warp, noise_floor.low_quantile),
        "now, no warp": (no_warp, noise_floor.low_quantile),
    }
    now = variants["now"]
    print("| preset | batch | step | ms/step (median) | vs before | parameters after vs before's |")
    print("|---|---|---|---|---|---|")
    for preset in args.presets:
        batch = CPU_BATCH[preset]
        sides = {}
        for name, (warp, quantile) in variants.items():
            augment._warp, noise_floor.low_quantile = warp, quantile  # module names, looked up when traced
            compiled._build.cache_clear()
            fns, state, x = first_step(bench_config(preset, "float32", batch))
            call = common_call(state, x)
            program = fns.train_step.jitted.lower(*call).compile()
            sides[name] = (program, [state.params, state.opt_state], call)
        augment._warp, noise_floor.low_quantile = now
        times: dict[str, list[float]] = {name: [] for name in sides}
        names = list(sides)
        for i in range(args.steps):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                program, carried, call = sides[name]
                t0 = time.perf_counter()
                carried[0], carried[1], *_ = program(*carried, *call[2:])
                jax.block_until_ready(carried[0])
                times[name].append(time.perf_counter() - t0)
        first = jax.tree.leaves(jax.device_get(sides["before"][1][0]))
        base = statistics.median(times["before"][2:])
        for name in names:
            after = jax.tree.leaves(jax.device_get(sides[name][1][0]))
            equal = all(np.array_equal(a, b) for a, b in zip(first, after, strict=True))
            ms = statistics.median(times[name][2:])
            bits = "-" if name == "before" else ("equal" if equal else "DIFFER")
            print(f"| {preset} | {batch} | {name} | {1e3 * ms:.1f} | {ms / base:.3f} | {bits} |", flush=True)


if __name__ == "__main__":
    main()
