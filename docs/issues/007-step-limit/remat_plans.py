"""What ``--model.remat`` saves of a whole step's memory, per objective.

    python docs/issues/007-step-limit/remat_plans.py [PRESET BATCH]   # default: small 64, ~3 min

Compiles the run's first step as the loop compiles it (`birdjepa.perf.step_cost.compile_step`), float32,
for LeJEPA, LeJEPA with its masked-span predictor and MAE, each with its blocks unrolled and with
``--model.remat``, and prints XLA's memory plan of each (arguments, outputs and temporaries, less
donated aliases): the parameters, their gradients and AdamW's moments take the same share of both
sides; the rest is what the blocks keep for the backward pass. MAE's encoder sees a quarter of each
view's patches and its decoder every patch, so there the decoder's blocks keep most of it.
"""

from __future__ import annotations

import sys

from birdjepa.train.determinism import deterministic_xla

deterministic_xla()

from birdjepa.perf.step_cost import bench_config, compile_step  # noqa: E402

OBJECTIVES = {
    "lejepa": {},
    "lejepa + predictor": {"model.predictor_depth": 2, "objective.lejepa.span_weight": 0.5},
    "mae": {"objective.kind": "mae"},
}


def main() -> None:
    preset, batch = (sys.argv[1], int(sys.argv[2])) if len(sys.argv) > 2 else ("small", 64)
    print(f"{preset}, float32, batch {batch} (2 views each)\n")
    print("| objective | XLA plan, unrolled MiB | with --model.remat MiB | ratio |")
    print("|---|---:|---:|---:|")
    for name, options in OBJECTIVES.items():
        plans = [compile_step(bench_config(preset, "float32", batch, **options, **{"model.remat": remat}))
                 ["plan_bytes"] / 2**20 for remat in (False, True)]  # fmt: skip
        print(f"| {name} | {plans[0]:.0f} | {plans[1]:.0f} | {plans[1] / plans[0]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
