"""What a training step that can record itself would cost: the design for an exact trace by construction.

    python scripts/bench_record.py [--presets tiny small] [--batch-size 16] [--repeats 7]

`birdjepa trace` runs a recording step compiled apart from the training step; at XLA's default level
XLA fuses the two otherwise, and their outputs can differ in a last bit (the trace says so). One
executable for both would make the trace the training step's own record by construction: the training
step with a ``lax.cond`` that, when asked, summarizes (`birdjepa.train.digest.summary`) every tensor
the step computed (`summarized` below). This measures that design, not used by training, on one batch
of the demo set for each preset, at XLA's default optimisation level:

* ``plain``: the training step as the loop runs it (`make_train_step` over the training loss);
* ``record off``: the step with the ``lax.cond``, recording off, as training would run it;
* ``record on``: the same executable with recording on, as `birdjepa trace` would;
* ``staged off`` / ``on``: the same with the forward pass's record summarized in a cond of its own,
  inside the loss (`staged`).

It prints the median step time of each (steps interleaved, so drifts of the machine hit all three), the
compile time, XLA's temporary-buffer size (`memory_analysis`, the step's working memory beyond its
inputs and outputs), and whether ``record off`` and ``record on`` give the plain step's params,
optimizer state and metrics bit for bit. The cond keeps every recorded tensor alive to the end of the
step: that is where its memory goes (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from birdjepa.divergence.replay import open_at
from birdjepa.train.compiled import BATCH_KEYS
from birdjepa.train.digest import summary
from birdjepa.train.recording import computed
from birdjepa.train.segment import step_inputs
from birdjepa.train.step import StepConfig, make_loss_fn, make_train_step


def summarized(step: Callable) -> Callable:
    """``step`` (`make_train_step` over a recording loss) as ``(params, opt_state, batch, key, check,
    record) -> (params, opt_state, metrics, stats, guard, summaries)``: a summary of every tensor it
    computed where ``record``, zeros where not, in one executable."""

    def run(*args: Any) -> tuple[Any, ...]:
        *inputs, record = args
        *out, trace = step(*inputs)
        values = [v for _, _, v in computed(trace)]

        def on(vs: list[jax.Array]) -> list[dict[str, jax.Array]]:
            return [summary(v) for v in vs]

        def off(vs: list[jax.Array]) -> list[dict[str, jax.Array]]:
            return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(on, vs))

        return (*out, jax.lax.cond(record, on, off, values))

    return run


def staged(spec: StepConfig, tx: Any, clip: float) -> Callable:
    """As `summarized`, the forward pass's record summarized in a cond inside the loss, on stop-gradient
    operands (so it can run as soon as the forward pass is done, and the activations die when the
    backward pass is done with them), the loss terms, gradients and updates in a cond at the end."""
    base = make_loss_fn(spec, record=True)

    def on(vs: list[jax.Array]) -> list[dict[str, jax.Array]]:
        return [summary(v) for v in vs]

    def off(vs: list[jax.Array]) -> list[dict[str, jax.Array]]:
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(on, vs))

    def loss_fn(params: Any, batch: dict[str, jax.Array], key: jax.Array) -> tuple[jax.Array, dict]:
        loss, aux = base(params, batch, key)
        rec = aux.pop("record")
        values = [jax.lax.stop_gradient(rec[k]) for k in sorted(rec)]
        return loss, {**aux, "forward": jax.lax.cond(batch["record"], on, off, values), "record": {}}

    step = make_train_step(loss_fn, tx, clip_norm=clip)

    def run(*args: Any) -> tuple[Any, ...]:
        params, opt_state, batch, key, check, record = args
        *out, trace = step(params, opt_state, {**batch, "record": record}, key, check)
        return (*out, jax.lax.cond(record, on, off, [v for _, _, v in computed(trace)]))

    return run


def bench(preset: str, batch_size: int, repeats: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "birdjepa.cli", "pretrain", "--run", "r", "--log.runs-dir", tmp,
                        "--steps", "1", "--eval-every", "0", "--ckpt-every", "0", "--model.preset", preset,
                        "--data.batch-size", str(batch_size)], check=True, capture_output=True)  # fmt: skip
        run = open_at(Path(tmp) / "r", 0)
        cfg, state, fns = run.cfg, run.state, run.fns
        x = step_inputs(fns, cfg, state, run.batch())
        run.close()
    spec = StepConfig.of(cfg, run.model_cfg)
    clip = cfg.optim.clip_norm if cfg.optim.grad_accum == 1 else 0.0
    recording = summarized(make_train_step(make_loss_fn(spec, record=True), fns.tx, clip_norm=clip))
    shardings = (fns.replicated, fns.replicated, {k: fns.sharded for k in BATCH_KEYS}, fns.replicated, None)
    one = jax.jit(recording, in_shardings=(*shardings, None), donate_argnums=(0, 1))
    args = (state.params, state.opt_state, x.batch, x.key, x.check)
    two = jax.jit(staged(spec, fns.tx, clip), in_shardings=(*shardings, None), donate_argnums=(0, 1))
    steps = {"plain": (fns.train_step, ()), "record off": (one, (False,)), "record on": (one, (True,)),
             "staged off": (two, (False,)), "staged on": (two, (True,))}  # fmt: skip
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
            metrics = {k: v for k, v in out[2].items() if k != "train/forward"}  # staged: its summaries
            outputs[name] = jax.device_get((out[0], out[1], metrics))
    median = {name: float(np.median(t[1:])) * 1e3 for name, t in times.items()}
    same = {
        name: all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(outputs[name]),
                                                       jax.tree.leaves(outputs["plain"]), strict=True))
        for name in steps
        if name != "plain"
    }  # fmt: skip
    rows = [
        f"| {preset} | {name} | {median[name]:.1f} | {median[name] / median['plain']:.2f}x | "
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
    print("| preset | step | ms | vs plain | compile s | XLA temp MiB | outputs == plain |")
    print("|---|---|---:|---:|---:|---:|---|")
    for preset in a.presets:
        print(bench(preset, a.batch_size, a.repeats), flush=True)


if __name__ == "__main__":
    main()
