"""What the training step costs on this machine: its time, its arithmetic, and their ratio to the machine's.

The step is the loop's own (`birdjepa.train.segment.open_segment`, the compiled `RecordableStep` with
recording off, on a real batch of the run's loader). Its FLOPs are the training arithmetic: XLA's cost
analysis of the same step without its record (`unrecorded`) as JAX lowers it, before the backend
rewrites it (a matrix product of m x k by k x n is 2mkn). Without its record, because the analysis
counts a cond as its costliest branch, so the recording step's count holds every summary the loop
never computes (at tiny, batch 8: 823 MFLOP against 650; at small, batch 128: 1128 GFLOP against 1100).
Lowered, not compiled: on a GPU XLA turns the matrix products into cuBLAS calls, which its cost
analysis of the executable counts as nothing (measured on an H200: 7.8 GFLOP for the small step at
batch 16, against 144 from the lowered program; on CPU the two agree within 1 %).
MFU is those FLOPs over the step's time, over the peak of square matrix products in the same dtype,
the best of several sizes, measured on the same device in the same process (`matmul_peak`): the
fraction of what this machine's matrix units gave, not of a data sheet's figure.

On CPU, birdjepa computes with XLA's single-threaded Eigen kernels (`birdjepa.train.determinism`); the
peak is measured under the same flags, so the ratio compares like with like.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.extend
import jax.numpy as jnp
from jax._src.lib import _jax

from birdjepa.config import PretrainConfig, resolve
from birdjepa.perf.profile import Profiled, time_by_part
from birdjepa.train.compile_cache import cache_loads, compiled_afresh
from birdjepa.train.compiled import Compiled, jit_step
from birdjepa.train.segment import StepInputs, open_loader, open_segment, step_inputs
from birdjepa.train.state import TrainState
from birdjepa.train.step import make_loss_fn, make_train_step

CPU_BATCH = {"tiny": 16, "small": 4, "base": 2}
"""Clips a step on a CPU for the benchmarks: base's steps then take seconds, not minutes (the README's
16 on an accelerator)."""


@dataclasses.dataclass(frozen=True)
class StepCost:
    preset: str
    dtype: str
    batch: int
    step_s: float
    """Median wall time of a step, outputs ready, over the timed repeats (compilation left out)."""
    flops: float
    """Per step, the training arithmetic: XLA's cost analysis of the lowered step without its record
    (see the module doc)."""
    memory_bytes: int
    """XLA's working memory of the step: arguments, outputs and temporaries, less what outputs reuse."""
    compile_s: float
    """Lowering and compiling the step (or loading it from the persistent compilation cache)."""
    loaded: bool = False
    """Whether the step was loaded from the persistent compilation cache rather than compiled."""
    profiled: Profiled | None = None
    """Where a step's time goes, by part, from a profile (`birdjepa.perf.profile`)."""

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.step_s

    def mfu(self, peak_flops_per_s: float) -> float:
        return self.flops_per_s / peak_flops_per_s


def bench_config(preset: str, dtype: str, batch: int, **overrides: Any) -> PretrainConfig:
    """The default run at ``preset``, computing in ``dtype``, ``batch`` clips a step (2 views each), on the
    demo set (its shards, built on first use), with ``overrides`` (dotted keys) on top."""
    options = {"model.preset": preset, "model.dtype": dtype, "data.batch_size": batch, **overrides}
    return resolve(PretrainConfig(), options, "bench_config")


def first_step(cfg: PretrainConfig) -> tuple[Compiled, TrainState, StepInputs]:
    """The run's step as the loop first calls it: its functions, the fresh state placed on the devices
    as the loop places it (a step then takes its last outputs without tracing again), and step 0's
    inputs on the run's first batch."""
    segment = open_segment(cfg, None, at=None)
    loader, _ = open_loader(cfg, segment.files[0], None, resumed=False)
    with loader:
        batch = next(loader)
    state = segment.fns.place(segment.state)
    return segment.fns, state, step_inputs(segment.fns, cfg, state, batch)


def common_call(state: TrainState, x: StepInputs) -> tuple:
    """The jitted step's arguments as the loop passes them on most steps: the monitor's check and the
    record off (the monitor measures one step in ``--monitor-interval``; `birdjepa trace` records)."""
    return (state.params, state.opt_state, x.batch, x.key, False, False)


def unrecorded(fns: Compiled) -> Callable:
    """``fns``' step as it would be without its record (`birdjepa.train.recording`): `make_train_step`
    over the plain loss, jitted with the loop's shardings and donation, called as the loop calls its
    step. What the record's conds cost is the loop's step against this (`scripts/bench_record.py`;
    `scripts/gpu_check.py`'s conds, where each cond waits for the device)."""
    return jit_step(make_train_step(make_loss_fn(fns.spec), fns.tx), fns.replicated, fns.sharded)


def compile_step(cfg: PretrainConfig, record: bool = True) -> dict[str, float]:
    """Compile the step `measure` times (``record`` False: `unrecorded`'s, as `scripts/gpu_check.py`
    calls it): the seconds it took (``compile_s``), its XLA memory plan (``plan_bytes``) and the copies
    XLA adds of the state it is given (``state_copies``: `birdjepa.train.determinism.IN_PLACE`). With the
    persistent compilation cache on, a later process loads it instead of compiling it:
    `scripts/gpu_check.py --prebuild` compiles several side by side, then times each alone."""
    fns, state, x = first_step(cfg)
    args = common_call(state, x)
    t0 = time.perf_counter()
    if record:
        compiled = fns.train_step.jitted.lower(*args).compile()
    else:
        compiled = unrecorded(fns).lower(*args[:-1]).compile()  # no record argument
    seconds = time.perf_counter() - t0
    return {"compile_s": seconds, "plan_bytes": plan_bytes(compiled), "state_copies": state_copies(compiled)}


def plan_bytes(compiled: Any) -> int:
    """A compiled program's XLA memory plan: arguments, outputs and temporaries, less the outputs that
    reuse a donated argument's buffer (what it needs while it runs)."""
    m = compiled.memory_analysis()
    total = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    return int(total - m.alias_size_in_bytes)


def state_copies(compiled: Any) -> int:
    """The copies XLA adds of a compiled step's arguments (its donated state) before it runs."""
    return len(re.findall(r"[\]}] copy\(%args", compiled.as_text()))


def measure(
    cfg: PretrainConfig, repeats: int = 10, warmup: int = 2, profile: bool = False, names_fresh: bool = False
) -> StepCost:
    """Compile the run's step, count its FLOPs, and time ``repeats`` steps after ``warmup`` untimed ones
    (each on the same batch: the step's time does not depend on the values); ``profile``: then profile
    ``repeats`` more and split their time by part of the step, on the step compiled afresh if it was
    loaded from the cache (`compiled_afresh`), unless ``names_fresh``: the caller takes the loaded
    step's names as they are (`scripts/gpu_check.py` on a GPU, whose budget a second compile takes)."""
    fns, state, x = first_step(cfg)
    args = common_call(state, x)  # compiled once here for both the cost analysis and the timing
    loads, t0 = cache_loads(), time.perf_counter()
    lowered = fns.train_step.jitted.lower(*args)
    compiled = lowered.compile()
    compile_s, loaded = time.perf_counter() - t0, cache_loads() > loads
    flops = training_flops(fns, args)
    memory_bytes = plan_bytes(compiled)
    carried = [state.params, state.opt_state]  # donated to each step, taken back from its outputs

    def step() -> float:
        t0 = time.perf_counter()
        carried[0], carried[1], *_ = compiled(*carried, *args[2:])
        jax.block_until_ready(carried[0])
        return time.perf_counter() - t0

    times = [step() for _ in range(warmup + repeats)]
    profiled = None
    if profile:
        if loaded and not names_fresh:  # its instructions carry the names of the code that compiled it
            compiled = compiled_afresh(lowered)
        profiled = time_by_part(compiled.as_text(), lambda: [step() for _ in range(repeats)], repeats)
    return StepCost(
        cfg.model.preset, cfg.model.dtype, cfg.data.batch_size, statistics.median(times[warmup:]), flops,
        int(memory_bytes), compile_s, loaded, profiled,
    )  # fmt: skip


def training_flops(fns: Compiled, args: tuple) -> float:
    """The FLOPs of the step's training arithmetic at ``args`` (`common_call`'s): its program without the
    record, lowered (see the module doc), with the blocks unrolled: XLA counts a loop's body once, so
    a ``--model.remat`` step's count would hold one block; and a recomputed forward pass is not the
    model's arithmetic, which MFU counts."""
    model = dataclasses.replace(fns.spec.model, remat=False)
    unrolled = dataclasses.replace(fns, spec=dataclasses.replace(fns.spec, model=model))
    return cost_flops(unrecorded(unrolled).lower(*args[:-1]))  # no record argument


def cost_flops(lowered: Any) -> float:
    """FLOPs of one execution of a lowered function: XLA's cost analysis of its HLO, asked of the CPU
    client on every platform. A GPU's PJRT plugin analyses no lowered program (jaxlib 0.11.2's CUDA
    plugin on an H200: `Lowered.cost_analysis` gives None, for a program lowered for the CPU too, since
    that asks the default backend), and the analysis counts the program's operations, whichever backend
    would run them. ``_jax.hlo_module_cost_analysis`` is what `Lowered.cost_analysis` itself calls."""
    module = lowered.compiler_ir("hlo").as_hlo_module()
    return float(_jax.hlo_module_cost_analysis(jax.extend.backend.get_backend("cpu"), module)["flops"])


#: The square matrix products `matmul_peak` takes the best of, by platform: on a CPU one of 512 ran at
#: 1.5x one of 2048 (its blocks in cache), and the step's own products, smaller, past the "peak" of 2048.
PEAK_SIZES = {"cpu": (256, 512, 1024, 2048), "accelerator": (2048, 4096, 8192)}


def peak_sizes() -> tuple[int, ...]:
    """`PEAK_SIZES` of the default device's platform."""
    return PEAK_SIZES["cpu" if jax.devices()[0].platform == "cpu" else "accelerator"]


def peak_label() -> str:
    """What `matmul_peak` measured, for a table: "best of n^3 for n in 256, ..., 2048"."""
    return f"best of n^3 for n in {', '.join(map(str, peak_sizes()))}"


def matmul_peak(dtype: str, n: int | None = None, repeats: int = 10) -> float:
    """FLOP/s of an ``n`` x ``n`` by ``n`` x ``n`` matrix product in ``dtype`` on the default device
    (median of ``repeats`` after a warm-up); with no ``n``, the best of `PEAK_SIZES`' for the platform."""
    if n is None:
        return max(matmul_peak(dtype, size, repeats) for size in peak_sizes())
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (n, n), jnp.dtype(dtype))
    b = jax.random.normal(kb, (n, n), jnp.dtype(dtype))
    product = jax.jit(jnp.matmul).lower(a, b).compile()
    jax.block_until_ready(product(a, b))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(product(a, b))
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)
