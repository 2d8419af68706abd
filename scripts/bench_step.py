"""The training step against this machine's limit: time, FLOPs, achieved FLOP/s and MFU, per preset and dtype.

    python scripts/bench_step.py [--presets tiny small base] [--dtypes float32 bfloat16] [--batch N]
                                 [--reference PATH]

For each preset and dtype, the run's own step (`birdjepa.perf.step_cost.measure`: the loop's compiled
step on a batch of the demo set, 2 views a clip): the median step time, the FLOPs of its training
arithmetic (XLA's cost analysis of the lowered step without its record: `step_cost.training_flops`), the
FLOP/s that gives, and MFU against the peak of square matrix products of the same dtype measured in this
run, the best of several sizes (`matmul_peak`; on a CPU one of 512 ran 1.5x one of 2048). Beside it
XLA's working memory of the step and its compile time. Then where each step's time goes, from an XLA
profile of more steps (`birdjepa.perf.profile`): matrix products, attention, norms and elementwise work,
SIGReg, the optimizer update, the guard and monitor, the copies XLA adds, and what else shows (the
augmentation, the input floor's quantile, the record conds the loop runs off), each as a share of the
time the step's operations took, and what the profile could not attribute to any instruction (a GPU
library's kernels).

Batch sizes: 16 clips a step (the README's and `--data.batch-size`'s default) on an accelerator; on a
CPU 16 for tiny, 4 for small and 2 for base, so that base's steps take seconds, not minutes.

With ``--reference PATH`` (a checkout of samuelstevens/birdjepa), the same run then prints our LeJEPA
step beside the reference's at the small and base presets among ``--presets``: step time and peak
memory as ratios (``scripts/bench_reference.py``, which says what differs; it runs each side in a
process of its own, after this process's own steps, at its own batch sizes: float32, 2 views).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from birdjepa.host_memory import keep_for_reuse
from birdjepa.train.determinism import deterministic_xla

keep_for_reuse()  # the host memory as the `birdjepa` command keeps it (birdjepa.host_memory)
deterministic_xla()

import jax  # noqa: E402

from birdjepa.perf.profile import PART_NAMES  # noqa: E402
from birdjepa.perf.step_cost import CPU_BATCH, StepCost, bench_config, matmul_peak, measure, peak_label  # noqa: E402

DEFAULT_BATCH = 16


def table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # Each checked before the peak is measured (a mistyped preset was a KeyError after it).
    ap.add_argument("--presets", nargs="+", default=["tiny", "small", "base"], choices=sorted(CPU_BATCH))
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    ap.add_argument("--batch", type=int, help="clips a step for every preset (default: see above)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--reference", type=Path, help="a samuelstevens/birdjepa checkout: its step beside ours")
    ap.add_argument("--reference-venv", type=Path, help="bench_reference.py's --venv (default: its own)")
    args = ap.parse_args()
    if args.repeats < 1 or (args.batch is not None and args.batch < 1):  # a median of none; 0 ran batch 16
        ap.error(f"--repeats and --batch are at least 1 (got {args.repeats}, {args.batch})")
    beside = [p for p in args.presets if p in ("small", "base")]
    if args.reference is not None and not beside:
        ap.error("--reference compares the small and base presets: name one in --presets")
    if args.reference is not None and not args.reference.is_dir():  # before minutes of our own steps
        ap.error(f"--reference {args.reference}: no such folder")
    device = jax.devices()[0]
    on_cpu = device.platform == "cpu"
    print(f"jax {jax.__version__}, {device.platform}: {device.device_kind}, {jax.device_count()} device(s)",
          flush=True)  # fmt: skip
    peaks = {dtype: matmul_peak(dtype) for dtype in args.dtypes}
    costs: list[StepCost] = []
    for preset in args.presets:
        batch = args.batch if args.batch is not None else CPU_BATCH[preset] if on_cpu else DEFAULT_BATCH
        for dtype in args.dtypes:
            cfg = bench_config(preset, dtype, batch)
            costs.append(measure(cfg, repeats=args.repeats, warmup=2, profile=args.profile))
            print(f"measured {preset} {dtype} batch {batch}", file=sys.stderr, flush=True)
    print(f"\n## The step against the matrix-product peak ({device.device_kind})\n")
    rates = [(d, f"{p / 1e9:.1f} GFLOP/s") for d, p in peaks.items()]
    table(("dtype", f"matmul peak ({peak_label()})"), rates)
    print()
    rows = [
        (c.preset, c.dtype, str(c.batch), f"{1e3 * c.step_s:.1f}", f"{c.flops / 1e9:.1f}",
         f"{c.flops_per_s / 1e9:.1f}", f"{100 * c.mfu(peaks[c.dtype]):.1f} %",
         f"{c.memory_bytes / 2**20:.0f}", f"{c.compile_s:.0f}")
        for c in costs
    ]  # fmt: skip
    table(("preset", "dtype", "batch", "ms/step", "GFLOP/step", "GFLOP/s", "MFU", "XLA memory MiB",
           "compile s"), rows)  # fmt: skip

    if args.profile:
        print("\n## Where the step's time goes: % of the step's wall time, by part\n")
        print("XLA runs independent operations at once on its thread pool (CPU) or streams (GPU): each "
              "moment of the profile is split equally among the operations running then. The last but one "
              "column is the time no operation of the step ran (dispatch, waiting for the host); the last, "
              "the operations' own times summed over the wall time.\n")  # fmt: skip
        parts = list(PART_NAMES)
        head = ("preset", "dtype", "batch", *parts, "no operation", "operations / wall")
        rows = []
        for c in costs:
            p = c.profiled
            assert p is not None
            idle = p.wall_s - sum(p.parts.values())
            shares = (f"{100 * s / p.wall_s:.1f} %" for s in (*(p.parts.get(n, 0.0) for n in parts), idle))
            rows.append((c.preset, c.dtype, str(c.batch), *shares, f"{p.operations_s / p.wall_s:.2f}"))
        table(head, rows)

    if args.reference is not None:
        cmd = [sys.executable, str(Path(__file__).with_name("bench_reference.py")), "--reference",
               str(args.reference), "--presets", *beside]  # fmt: skip
        if args.reference_venv is not None:
            cmd += ["--venv", str(args.reference_venv)]
        print(flush=True)
        sys.exit(subprocess.run(cmd).returncode)


if __name__ == "__main__":
    main()
