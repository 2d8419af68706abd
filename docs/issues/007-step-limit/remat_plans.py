"""What ``--model.remat`` saves of a whole step's memory, and what it costs in time, per objective.

    python docs/issues/007-step-limit/remat_plans.py [PRESET BATCH]        # default: small 64, ~3 min
    python docs/issues/007-step-limit/remat_plans.py small 16 --time       # plans and step times, ~8 min

Compiles the run's first step as the loop compiles it (`birdjepa.perf.step_cost.compile_step`), float32,
for LeJEPA, LeJEPA with its masked-span predictor and MAE, each with its blocks unrolled and with
``--model.remat``, and prints XLA's memory plan of each (arguments, outputs and temporaries, less
donated aliases): the parameters, their gradients and AdamW's moments take the same share of both
sides; the rest is what the blocks keep for the backward pass. MAE's encoder sees a quarter of each
view's patches and its decoder every patch, so there the decoder's blocks keep most of it.
``--time``: each step timed instead (`birdjepa.perf.step_cost.measure`: the median of three steps
after one, the same program the plan is of): what the recomputed forward pass costs. ``PRESET`` and
``BATCH`` come together or not at all.
"""

from __future__ import annotations

import argparse

from birdjepa.host_memory import keep_for_reuse
from birdjepa.train.determinism import deterministic_xla

keep_for_reuse()  # as the `birdjepa` command runs a CPU step: its working memory not faulted in anew
deterministic_xla()

from birdjepa.perf.step_cost import bench_config, compile_step, measure  # noqa: E402

OBJECTIVES = {
    "lejepa": {},
    "lejepa + predictor": {"model.predictor_depth": 2, "objective.lejepa.span_weight": 0.5},
    "mae": {"objective.kind": "mae"},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "preset", metavar="PRESET", nargs="?", help="the model preset: tiny, small or base (default: small)"
    )
    p.add_argument(
        "batch", metavar="BATCH", type=int, nargs="?", help="clips a step, 2 views each (default: 64)"
    )
    p.add_argument("--time", action="store_true", help="also time each step (the median of three after one)")
    args = p.parse_intermixed_args()  # `small --time 16` as well as `small 16 --time`
    if (args.preset is None) != (args.batch is None):
        p.error("give PRESET and BATCH together, or neither")
    timed = args.time
    preset, batch = (args.preset, args.batch) if args.batch is not None else ("small", 64)
    print(f"{preset}, float32, batch {batch} (2 views each)\n")
    if not timed:
        print("| objective | XLA plan, unrolled MiB | with --model.remat MiB | ratio |")
        print("|---|---:|---:|---:|")
    else:
        print("| objective | unrolled: plan MiB, step s | remat: plan MiB, step s "
              "| plan ratio | time ratio |")  # fmt: skip
        print("|---|---:|---:|---:|---:|")
    for name, options in OBJECTIVES.items():
        cfgs = [bench_config(preset, "float32", batch, **options, **{"model.remat": remat})
                for remat in (False, True)]  # fmt: skip
        if not timed:
            plans = [compile_step(cfg)["plan_bytes"] / 2**20 for cfg in cfgs]
            print(f"| {name} | {plans[0]:.0f} | {plans[1]:.0f} | {plans[1] / plans[0]:.2f} |", flush=True)
            continue
        costs = [measure(cfg, repeats=3, warmup=1) for cfg in cfgs]
        plans, times = [c.memory_bytes / 2**20 for c in costs], [c.step_s for c in costs]
        print(f"| {name} | {plans[0]:.0f}, {times[0]:.2f} | {plans[1]:.0f}, {times[1]:.2f} | "
              f"{plans[1] / plans[0]:.2f} | {times[1] / times[0]:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
