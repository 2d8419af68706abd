"""The loop's step with its state donated and updated in place (as it runs), donated with XLA's default
copy insertion, and not donated, side by side in one process: XLA's copies of the state it is given,
XLA's memory, the step's time, and whether the outputs are the same bits (~5 min at small and base on
2 cores).

    python docs/issues/007-step-limit/donation.py [--presets small base] [--rounds 16]

The step reads each parameter and both of its moments around the writes of their updates in place.
With the state donated, XLA's default copy insertion cannot order those reads before the writes and
first copies all three (docs/benchmarks.md, "The state updated in place"). Its region-based analysis,
which the harness sets (`birdjepa.train.determinism.IN_PLACE`), can: it copies none of the given state
(the new parameters alone pass through a buffer of their own, copied into place after the last read).
Without donation XLA writes the new state to buffers of its own. The executables alternate step by
step (each round starting at the next) on the same batch and key, each carrying its own state; the
monitor's placeholder statistics are NaN, so outputs compare with NaN equal to NaN.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

from birdjepa.host_memory import keep_for_reuse
from birdjepa.train.determinism import deterministic_xla

keep_for_reuse()  # as the `birdjepa` command runs a CPU step
deterministic_xla()

import jax  # noqa: E402
import numpy as np  # noqa: E402

import birdjepa.train.compiled as compiled_steps  # noqa: E402
from birdjepa.perf.step_cost import (  # noqa: E402
    CPU_BATCH,
    bench_config,
    common_call,
    first_step,
    plan_bytes,
    state_copies,
)

#: XLA's default copy insertion, where the harness sets the region-based one.
DEFAULT_COPIES = {"xla_cpu_copy_insertion_use_region_analysis": False}


def side(preset: str, batch: int, jit_step, options: dict | None = None) -> dict:  # noqa: ANN001
    compiled_steps.jit_step = jit_step
    compiled_steps._build.cache_clear()  # the step's functions are built again with this jit_step
    fns, state, x = first_step(bench_config(preset, "float32", batch))
    args = common_call(state, x)
    executable = fns.train_step.jitted.lower(*args).compile(options)
    total, copies = plan_bytes(executable), state_copies(executable)
    return {"executable": executable, "state": [state.params, state.opt_state], "rest": args[2:],
            "copies": copies, "memory": total, "times": []}  # fmt: skip


def step(s: dict) -> tuple:
    t0 = time.perf_counter()
    out = s["executable"](*s["state"], *s["rest"])
    jax.block_until_ready(out)
    s["times"].append(time.perf_counter() - t0)
    s["state"] = [out[0], out[1]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["small", "base"])
    ap.add_argument("--rounds", type=int, default=16)
    args = ap.parse_args()
    donating = compiled_steps.jit_step
    print("| preset | batch | state | copies of the given state | XLA memory MiB | ms/step (median) | "
          "vs in place | outputs |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for preset in args.presets:
        batch = CPU_BATCH[preset]
        sides = {"donated, in place": side(preset, batch, donating),
                 "donated, XLA's default copies": side(preset, batch, donating, DEFAULT_COPIES),
                 "not donated": side(preset, batch, functools.partial(donating, donate=False))}  # fmt: skip
        names, outs = list(sides), {}
        for r in range(args.rounds):
            for name in names[r % 3 :] + names[: r % 3]:  # each round starts at the next side
                outs[name] = step(sides[name])
        first = jax.tree.leaves(outs[names[0]])
        base = statistics.median(sides[names[0]]["times"][2:])
        for name, s in sides.items():
            ms = statistics.median(s["times"][2:])
            other = jax.tree.leaves(outs[name])
            equal = len(other) == len(first) and all(
                np.array_equal(x, y, equal_nan=True) for x, y in zip(first, other, strict=True)
            )
            same = "-" if name == names[0] else ("equal" if equal else "DIFFER")
            print(f"| {preset} | {batch} | {name} | {s['copies']} | {s['memory'] / 2**20:.0f} | "
                  f"{1e3 * ms:.1f} | {ms / base:.2f} | {same} |", flush=True)  # fmt: skip
    compiled_steps.jit_step = donating


if __name__ == "__main__":
    main()
