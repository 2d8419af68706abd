"""What recording costs the training step: the step that can record itself against one that cannot.

    python scripts/bench_record.py [--presets tiny small] [--batch-size 16] [--repeats 7]

The training step is one executable that can also record itself (`birdjepa.train.recording`): a
summary of every tensor it computes, each in a ``lax.cond`` of its own on a ``record`` argument. The
loop runs it with recording off; `birdjepa trace` runs the same executable with recording on, so a
trace is the training step's own record by construction. This measures, on one batch of the demo set
for each preset, at the optimisation level of the process (XLA's default unless ``XLA_FLAGS`` says
otherwise):

* ``without recording``: the step the loop ran before (`make_train_step` over the plain loss), jitted
  with the same shardings and donation;
* ``record off``: the training step as the loop runs it;
* ``record on``: the same executable recording, as `birdjepa trace` runs it.

It prints the median step time of each (steps interleaved, so drifts of the machine hit all three), the
compile time, XLA's temporary-buffer size (`memory_analysis`: the step's working memory beyond its
inputs and outputs), and whether each gives the params, optimizer state and metrics of the step without
recording bit for bit.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from birdjepa.divergence.replay import open_at
from birdjepa.perf.step_cost import unrecorded
from birdjepa.train.segment import step_inputs


def bench(preset: str, batch_size: int, repeats: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", "r", "--log.runs-dir", tmp,
                        "--steps", "1", "--eval-every", "0", "--ckpt-every", "0", "--model.preset", preset,
                        "--data.batch-size", str(batch_size)], check=True, capture_output=True)  # fmt: skip
        run = open_at(Path(tmp) / "r", 0)
        cfg, state, fns = run.cfg, run.state, run.fns
        x = step_inputs(fns, cfg, state, run.batch())
        run.close()
    without = unrecorded(fns)
    args = (state.params, state.opt_state, x.batch, x.key, x.check)
    steps = {"without recording": (without, ()), "record off": (fns.train_step.jitted, (False,)),
             "record on": (fns.train_step.jitted, (True,))}  # fmt: skip
    compile_s, temp_mib, executables = {}, {}, {}
    for name, (fn, extra) in steps.items():
        t0 = time.perf_counter()
        executables[name] = fn.lower(*args, *extra).compile()
        compile_s[name] = time.perf_counter() - t0
        analysis = executables[name].memory_analysis()
        temp_mib[name] = analysis.temp_size_in_bytes / 2**20 if analysis is not None else float("nan")
    copy = jax.jit(lambda t: jax.tree.map(jnp.copy, t))
    times: dict[str, list[float]] = {name: [] for name in steps}
    outputs: dict[str, list] = {}
    for _ in range(repeats + 1):  # the first round warms up
        for name, (_, extra) in steps.items():
            params, opt_state = copy((state.params, state.opt_state))
            jax.block_until_ready(params)
            t0 = time.perf_counter()
            out = executables[name](params, opt_state, x.batch, x.key, x.check, *extra)
            jax.block_until_ready(out)
            times[name].append(time.perf_counter() - t0)
            outputs[name] = jax.device_get(out[:3])
    median = {name: float(np.median(t[1:])) * 1e3 for name, t in times.items()}
    base = "without recording"
    same = {
        name: all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(outputs[name]),
                                                       jax.tree.leaves(outputs[base]), strict=True))
        for name in steps
        if name != base
    }  # fmt: skip
    compile_s["record on"] = float("nan")  # the executable of record off
    rows = [
        f"| {preset} | {name} | {median[name]:.1f} | {median[name] / median[base]:.2f}x | "
        f"{compile_s[name]:.1f} | {temp_mib[name]:.1f} | {same.get(name, '-')} |"
        for name in steps
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=7)
    a = parser.parse_args()
    print(f"batch {a.batch_size} x 2 views, median of {a.repeats} steps, {jax.devices()[0].device_kind}")
    print("| preset | step | ms | vs without | compile s | XLA temp MiB | outputs == without |")
    print("|---|---|---:|---:|---:|---:|---|")
    for preset in a.presets:
        print(bench(preset, a.batch_size, a.repeats), flush=True)


if __name__ == "__main__":
    main()
