"""The parameters' float64 norms, one leaf after another against leaves shared out between threads.

    python scripts/bench_norms.py [--preset small] [--repeats 5]

The loop logs `birdjepa.rundir.checkpoint.norms.tree_norms` of the parameters every step (on the host,
as checkpoints record them). For the preset's parameters, copied to the host as the loop copies them,
side by side in one run: the median of ``--repeats`` calls with one thread (``THREADS = 1``: the
leaves one after another, as before) and with the default, each on an idle machine and right after a
training step (on a CPU, XLA's thread pool is still busy on the cores then). The bits are the same
either way (``tests/test_checkpoint.py``); the script checks it too.
"""

from __future__ import annotations

import argparse
import statistics
import time

from birdjepa.cores import schedulable_cpus
from birdjepa.train.determinism import deterministic_xla

deterministic_xla()

import jax  # noqa: E402

from birdjepa import multihost  # noqa: E402
from birdjepa.perf.step_cost import CPU_BATCH, bench_config, first_step  # noqa: E402
from birdjepa.rundir.checkpoint import norms  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", choices=list(CPU_BATCH))
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    fns, state, x = first_step(bench_config(args.preset, "float32", CPU_BATCH[args.preset]))
    carried = [state.params, state.opt_state]

    def after_a_step() -> None:
        carried[0], carried[1], *_ = fns.train_step(*carried, x.batch, x.key, False)  # monitor off
        jax.block_until_ready(carried[0])

    after_a_step()  # compile
    default, rows = norms.THREADS, []
    for when, before in (("idle", lambda: None), ("right after a step", after_a_step)):
        for threads in (1, default):
            norms.THREADS = threads
            times, values = [], set()
            for _ in range(args.repeats):
                before()
                params = multihost.host(carried[0])
                t0 = time.perf_counter()
                value = norms.tree_norms(params)["param_norm"]
                times.append(time.perf_counter() - t0)
                if when == "idle":  # the same parameters every time
                    values.add(value)
            rows.append((when, threads, 1e3 * statistics.median(times), values))
    norms.THREADS = default
    idle = {threads: values for when, threads, _, values in rows if when == "idle"}
    if idle[1] != idle[default]:
        raise SystemExit(f"the norms differ: one thread {idle[1]}, {default} threads {idle[default]}")
    size = sum(a.size for a in jax.tree.leaves(carried[0]))
    print(f"\n## Parameter norms on the host: {args.preset}, {size / 1e6:.1f} M parameters, "
          f"{len(jax.tree.leaves(carried[0]))} leaves, {schedulable_cpus()} cores\n")  # fmt: skip
    print(f"| when | threads | ms (median of {args.repeats}) | vs one thread |\n|---|---|---|---|")
    one = {when: ms for when, threads, ms, _ in rows if threads == 1}
    for when, threads, ms, _ in rows:
        print(f"| {when} | {threads} | {ms:.1f} | {ms / one[when]:.2f} |")


if __name__ == "__main__":
    main()
