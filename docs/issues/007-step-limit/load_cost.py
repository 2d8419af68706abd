"""What loading the step from the compilation cache costs on a CPU, against compiling it, and why.

    python docs/issues/007-step-limit/load_cost.py [--preset small] [--batch 4]

For each YNNPACK setting of XLA's CPU backend (its default; reductions left to XLA; no YNNPACK fusion
at all), in a process of its own: the run's step (`birdjepa.perf.step_cost`'s: the loop's compiled
step on a batch of the demo set, float32) compiled, its executable's size in HLO instructions,
computations and YNNPACK fusions, then serialized (``jax.experimental.serialize_executable``, what
the persistent compilation cache stores) and loaded back twice: the load is what a requeued segment
pays instead of the compile. The step's time under each setting is ``scripts/bench_step.py`` with the
same ``XLA_FLAGS``.

Why the load costs what it does (a ``perf record`` of a warm resume, 2026-11-28, jax 0.10.2): XLA
rebuilds the executable's thunks, and for each YNNPACK fusion thunk it looks its HLO instruction up
by walking every instruction of the module (``YnnFusionThunkFromProto``): fusions x instructions.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

SETTINGS = {
    "default": "",
    "reductions not in YNNPACK": "--xla_cpu_experimental_ynn_fusion_type=-LIBRARY_FUSION_TYPE_REDUCE",
    "no YNNPACK fusion": "--xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INVALID",
}


def measure(preset: str, batch: int) -> None:
    """In this process: compile, count, serialize and load the step; print one table row's values."""
    from birdjepa.train.determinism import deterministic_xla

    deterministic_xla()  # the harness's flags, before JAX starts
    from jax.experimental import serialize_executable

    from birdjepa.perf.step_cost import bench_config, common_call, first_step

    fns, state, x = first_step(bench_config(preset, "float32", batch))
    lowered = fns.train_step.jitted.lower(*common_call(state, x))
    t0 = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    text = compiled.as_text()
    lines = text.splitlines()
    instructions = sum(1 for line in lines if re.match(r"\s+(ROOT )?%?[\w.\-]+ = ", line))
    computations = sum(1 for line in lines if re.match(r"^(ENTRY )?%?[\w.\-]+ .*\{$", line))
    payload, in_tree, out_tree = serialize_executable.serialize(compiled)
    loads = []
    for _ in range(2):
        t0 = time.perf_counter()
        serialize_executable.deserialize_and_load(payload, in_tree, out_tree)
        loads.append(time.perf_counter() - t0)
    print(f"ROW {instructions} {computations} {text.count('__ynn_fusion')} {len(payload) / 2**20:.1f} "
          f"{compile_s:.1f} {min(loads):.1f} {max(loads):.1f}", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args()
    if args.measure:
        return measure(args.preset, args.batch)
    head = ("HLO instructions", "computations", "YNNPACK fusions", "serialized MiB", "compile s", "load s",
            "load / compile")  # fmt: skip
    print(f"| {args.preset}, batch {args.batch}, float32 | {' | '.join(head)} |")
    print("|---" * (len(head) + 1) + "|")
    for name, flag in SETTINGS.items():
        env = {**os.environ, "BIRDJEPA_COMPILE_CACHE": "off"}
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
        cmd = [sys.executable, __file__, "--measure", "--preset", args.preset, "--batch", str(args.batch)]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        row = next(line for line in done.stdout.splitlines() if line.startswith("ROW ")).split()[1:]
        instructions, computations, fusions, mib, compile_s, fastest, slowest = row
        ratio = float(fastest) / float(compile_s)
        print(f"| {name} | {instructions} | {computations} | {fusions} | {mib} | {compile_s} | "
              f"{fastest}-{slowest} | {ratio:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
