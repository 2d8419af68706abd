"""A CPU step with the host memory kept for reuse (`birdjepa.host_memory`, what the `birdjepa` command
does) beside the C library's default, side by side.

    python scripts/bench_host_memory.py [--presets small base] [--steps 8]

Per preset (float32, `birdjepa.perf.step_cost.CPU_BATCH`), each setting in a process of its own: the
run's step compiled, then ``--steps`` steps; per step its time, its minor page faults and its system
time. The first two steps are left out of the medians (the first runs the executable's one-off set-up;
the heap grows to its size in the first two). Also each process's peak resident size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from birdjepa.perf.step_cost import CPU_BATCH

SETTINGS = {"kept for reuse": "reuse", "C library's default": "system"}


def measure(preset: str, steps: int) -> None:
    """In this process (its host memory set by its environment): print one JSON line of the step's figures."""
    import resource
    import time

    from birdjepa.host_memory import keep_for_reuse

    applied = keep_for_reuse()  # before JAX starts its threads, as the command does
    from birdjepa.train.determinism import deterministic_xla

    deterministic_xla()
    import jax

    from birdjepa.perf.step_cost import bench_config, common_call, first_step

    fns, state, x = first_step(bench_config(preset, "float32", CPU_BATCH[preset]))
    args = common_call(state, x)
    compiled = fns.train_step.jitted.lower(*args).compile()
    carried, rows = [state.params, state.opt_state], []
    for _ in range(steps):
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        carried[0], carried[1], *_ = compiled(*carried, *args[2:])
        jax.block_until_ready(carried[0])
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        rows.append((time.perf_counter() - t0, r1.ru_minflt - r0.ru_minflt, r1.ru_stime - r0.ru_stime))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print("ROW " + json.dumps({"applied": applied, "steps": rows, "peak_rss_mib": rss}), flush=True)


def run(preset: str, setting: str, steps: int) -> dict:
    env = {**os.environ, "BIRDJEPA_HOST_MEMORY": setting}
    cmd = [sys.executable, __file__, "--measure", preset, "--steps", str(steps)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.split("ROW ")[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["small", "base"], choices=list(CPU_BATCH))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # the child process: this preset
    args = ap.parse_args()
    if args.steps < 3:  # the first two steps (the compile, the first run) are not timed: a median of none
        ap.error(f"--steps {args.steps}: must be at least 3")
    if args.measure:
        measure(args.measure, args.steps)
        return
    print("\n## A CPU step with the host memory kept for reuse, beside the C library's default\n")
    print("| preset | batch | host memory | ms/step | minor faults/step | system s/step | peak RSS MiB | "
          "step time / default |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for preset in args.presets:
        found = {name: run(preset, setting, args.steps) for name, setting in SETTINGS.items()}
        default_ms = statistics.median(s[0] for s in found["C library's default"]["steps"][2:]) * 1e3
        for name, r in found.items():
            later = r["steps"][2:]
            ms = statistics.median(s[0] for s in later) * 1e3
            faults = statistics.median(s[1] for s in later)
            sys_s = statistics.median(s[2] for s in later)
            print(f"| {preset} | {CPU_BATCH[preset]} | {name} | {ms:.1f} | {faults:.0f} | {sys_s:.2f} | "
                  f"{r['peak_rss_mib']:.0f} | {ms / default_ms:.2f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
