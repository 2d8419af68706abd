"""The record's conds in the loop's step: the tensors it records, by stage, and the conditionals in the
lowered step (no compile; ~20 s at small on 2 cores).

    python docs/issues/007-step-limit/count_conds.py [--preset small] [--dtype bfloat16] [--batch 4]
"""

from __future__ import annotations

import argparse
import collections

from birdjepa.perf.step_cost import bench_config, common_call, first_step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    fns, state, x = first_step(bench_config(args.preset, args.dtype, args.batch))
    lowered = fns.train_step.jitted.lower(*common_call(state, x))
    stages = collections.Counter(stage for stage, *_ in fns.train_step.computed)  # filled by the trace
    print(f"{args.preset} {args.dtype} batch {args.batch}: {sum(stages.values())} recorded tensors")
    for stage, n in stages.most_common():
        print(f"  {stage}: {n}")
    print(f"conditionals in the lowered step: {lowered.as_text().count('stablehlo.case')}")


if __name__ == "__main__":
    main()
