"""`birdjepa.perf`: the step's FLOPs are counted from the lowered program, and its profile puts each
operation's time under the part of the step that made it, each moment split among the operations
running then."""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from birdjepa.diagnostics.collapse import effective_rank
from birdjepa.model.noise_floor import noise_floor
from birdjepa.perf import profile
from birdjepa.perf.profile import (
    NOT_ATTRIBUTED,
    SOLVER_PART,
    attribute,
    instructions,
    kernel_names,
    part_of,
    segments,
    split_wall,
    tails,
    time_by_part,
)
from birdjepa.perf.step_cost import (
    bench_config,
    common_call,
    cost_flops,
    first_step,
    state_copies,
    training_flops,
)
from birdjepa.train import compile_cache


def test_a_matrix_product_counts_2mkn_flops_in_the_lowered_program() -> None:
    a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
    assert cost_flops(jax.jit(jnp.matmul).lower(a, b)) == 2 * 64 * 32 * 16


def test_the_flops_are_counted_where_the_backend_analyses_no_lowered_program(monkeypatch) -> None:
    # JAX's `Lowered.cost_analysis` gives None where the backend is a PJRT plugin (the CUDA plugin of
    # jaxlib 0.11.2 on an H200: the step's MFU came out nan there); this flag is what it asks.
    from jax._src import xla_bridge

    monkeypatch.setattr(xla_bridge, "using_pjrt_c_api", lambda backend=None: True)
    a, b = jnp.ones((64, 32)), jnp.ones((32, 16))
    lowered = jax.jit(jnp.matmul).lower(a, b)
    assert lowered.cost_analysis() is None  # as on the H200
    assert cost_flops(lowered) == 2 * 64 * 32 * 16


@pytest.fixture(scope="module")
def tiny_step() -> tuple:
    """The tiny step's functions and the loop's arguments, on the demo set."""
    fns, state, x = first_step(bench_config("tiny", "float32", 2))
    return fns, common_call(state, x)


def test_the_step_s_flops_leave_out_the_summaries_its_record_never_computes(tiny_step: tuple) -> None:
    # XLA's analysis counts a cond as its costliest branch: the recording step's count holds every
    # summary of `birdjepa trace`, which the loop's steps (record off) never compute.
    fns, args = tiny_step
    recording = cost_flops(fns.train_step.jitted.lower(*args))
    training = training_flops(fns, args)
    assert 0 < training < 0.9 * recording


def test_the_record_holds_one_cond_per_stage_and_block(tiny_step: tuple) -> None:
    # On an H200 each cond cost the step ~30 us of the device waiting: a cond per tensor (476 at small)
    # took half the step. At tiny (2 blocks): the forward pass, the clipped gradients and the updates
    # each 2 blocks and the rest (9); the keys, the draws, the loss terms and the gradients (4); and
    # the update monitor's own cond (1).
    fns, args = tiny_step
    assert fns.train_step.jitted.lower(*args).as_text().count("stablehlo.case") == 14


def test_the_step_writes_its_donated_state_in_place_without_copying_it_first(tiny_step: tuple) -> None:
    # With XLA's default copy insertion the CPU compiler copied every parameter and both its AdamW
    # moments before the update wrote them (125 copies at tiny, 485 at small). With the flag the harness
    # sets (`determinism.IN_PLACE`) it copies none of the state it is given.
    fns, args = tiny_step
    compiled = fns.train_step.jitted.lower(*args).compile()
    assert re.search(r"%args_0\S* = f32\[", compiled.as_text())  # the names `state_copies` looks for
    assert state_copies(compiled) == 0


def test_an_operation_s_own_time_leaves_out_the_operations_inside_it() -> None:
    # A cond (0-10 ns) holding a fusion (2-5 ns), then a copy (10-12 ns), on one timeline.
    events = [(10.0, 12.0, "copy"), (0.0, 10.0, "cond"), (2.0, 5.0, "fusion")]
    pieces = [(0.0, 2.0, "cond"), (2.0, 5.0, "fusion"), (5.0, 10.0, "cond"), (10.0, 12.0, "copy")]
    assert segments(events) == pieces


def test_an_operation_runs_until_its_end_mark_when_its_launch_returns_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A dot launched at 0-1 s whose work ends at 5 s; an add whose mark comes as its launch returns; a
    # GPU kernel, which has no mark.
    launches = [(0.0, 1.0, "dot", 7), (1.0, 2.0, "add", 8), (2.0, 3.0, "kernel", 9)]
    assert tails(launches, {7: 5.0, 8: 2.0}) == [(1.0, 5.0, "dot")]
    # XLA's CPU profile marks them so, pairing a launch (`_p`) with its end mark (`_c`) by id. Whether the
    # work outlives its launch is timing (a loop split across threads did in 26 of 30 profiles on an idle
    # 2-core machine, 17 of 30 with both cores busy, and not at all in one CI run), so the pairing is
    # asserted, not the tails' lengths.
    seen: list = []

    def spy(launches: list, ends: dict) -> list:
        seen.append((launches, ends))
        return tails(launches, ends)

    monkeypatch.setattr(profile, "tails", spy)
    compiled = jax.jit(lambda a: jnp.tanh(jnp.exp(a[::-1]) * 2 + a)).lower(jnp.ones((2048, 2048))).compile()
    a = jnp.ones((2048, 2048))
    time_by_part(compiled.as_text(), lambda: [jax.block_until_ready(compiled(a)) for _ in range(4)], 4)
    ((launches, ends),) = seen
    started = {id_: start for start, _, _, id_ in launches}
    assert ends and all(id_ in started and at >= started[id_] for id_, at in ends.items())


def test_each_moment_is_split_among_the_operations_running_then() -> None:
    # Two threads: an update (0-4 s) then a norm (4-6 s) on one, a matrix product (2-6 s) on the other.
    # Summed, their own times are 10 s of a 6 s wall; split, the product shares 2-6 with the others.
    timelines = [[(0.0, 4.0, "update"), (4.0, 6.0, "norm")], [(2.0, 6.0, "product")]]
    assert split_wall(timelines) == {"update": 3.0, "norm": 1.0, "product": 2.0}


def test_the_profile_puts_each_operation_under_the_part_that_made_it() -> None:
    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        h = jnp.tanh(x @ w)  # a matrix product outside any named part
        with jax.named_scope("sigreg"):
            s = jnp.cos(h @ w.T).sum()
        return s + effective_rank(h) + noise_floor(h.reshape(2, 128, 128)).sum()  # an SVD: a library call

    x, w = jax.random.normal(jax.random.key(0), (256, 128)), jnp.ones((128, 128))
    compiled = jax.jit(f).lower(x, w).compile()
    text = compiled.as_text()
    parts = {part_of(i) for i in instructions(text).values()}
    assert {"SIGReg", "matrix products", SOLVER_PART, "input floor (a quantile)"} <= parts
    p = time_by_part(text, lambda: [jax.block_until_ready(compiled(x, w)) for _ in range(3)], 3)
    assert p.parts["SIGReg"] > 0 and p.parts["matrix products"] > 0 and p.parts[SOLVER_PART] > 0
    # Equal where no two operations overlapped, up to the order of the float sums (hence 1e-9).
    assert sum(p.parts.values()) <= p.wall_s and sum(p.parts.values()) <= p.operations_s * (1 + 1e-9)


LOADED_NAMES = """
import jax, jax.numpy as jnp
from birdjepa.train.compile_cache import compiled_afresh

def program(scope):
    def f(x):
        with jax.named_scope(scope):
            return jnp.sin(x) * 3.0 + 0.25
    return jax.jit(f).lower(jnp.ones(24))

program("first_scope").compile()
second = program("second_scope")
print("first_scope" in second.compile().as_text())  # loaded, with the names of the first
print("second_scope" in compiled_afresh(second).as_text())
print("first_scope" in program("third_scope").compile().as_text())  # the cache on again
"""


def test_a_step_loaded_from_the_cache_is_profiled_under_this_code_s_names(tmp_path: Path) -> None:
    """JAX's persistent cache key leaves out the module's debug information: the same computation under
    another named scope loads the first one's entry, its names with it. The profile's parts read those
    names, so `measure` profiles a loaded step compiled afresh, and the cache is on again after."""
    env = compile_cache.without_jax_settings(os.environ) | {
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", LOADED_NAMES], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True", "True"]


def test_a_gpu_kernel_in_a_command_buffer_is_found_by_its_kernel_s_name() -> None:
    # On an H200 (jaxlib 0.11.2) the profile names a kernel inside a CUDA graph's command buffer by the
    # buffer (hlo_op "command_buffer_1"); XLA names a fusion's kernel after the fusion, dots made
    # underscores. The library kernels' names below are the H200's.
    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        with jax.named_scope("sigreg"):
            return jnp.cos(x @ w).sum()

    x, w = jnp.ones((256, 128)), jnp.ones((128, 128))
    table = instructions(jax.jit(f).lower(x, w).compile().as_text())
    kernels = kernel_names(table)
    (fusion,) = [n for n, i in table.items() if "sigreg" in i.name_stack and "." in n and i.inside][:1]
    assert attribute(table, kernels, "command_buffer_1", fusion.replace(".", "_")) == "SIGReg"
    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1"
    assert attribute(table, kernels, "command_buffer_1", gemm) == "matrix products"
    svd = "void svd_column_rotate_batch<float, 5, 3>(long, int const*, int, float*, int)"
    assert attribute(table, kernels, "command_buffer_1", svd) == SOLVER_PART
    assert attribute(table, kernels, "command_buffer_1", "void some_other_kernel<float>()") == NOT_ATTRIBUTED


def test_the_guard_s_select_goes_to_the_update_it_roots_and_xla_s_copies_to_a_part_of_their_own() -> None:
    # As in the training step: the update's pass over the donated state with the guard's select as its
    # root, and the old state read again after it (by the update's direction), which XLA keeps by a copy
    # with its default copy insertion (the harness sets region analysis, which leaves no copy here).
    def f(p: jax.Array, g: jax.Array, finite: jax.Array) -> tuple[jax.Array, jax.Array]:
        with jax.named_scope("optimizer"):
            m = 0.9 * p + 0.1 * g
            direction = m / (jnp.sqrt(jnp.abs(m)) + 1.0)
        with jax.named_scope("guard"):
            return jnp.where(finite, m, p), p + direction

    p, g = jnp.ones((64, 64)), jnp.ones((64, 64))
    default_copies = {"xla_cpu_copy_insertion_use_region_analysis": False}
    text = jax.jit(f, donate_argnums=0).lower(p, g, jnp.bool_(True)).compile(default_copies).as_text()
    table = instructions(text)
    fused = [i for i in table.values() if "guard" in i.name_stack and i.inside]
    assert fused and all(any("optimizer" in n for n in i.inside) for i in fused)
    assert {part_of(i) for i in fused} == {"optimizer update"}
    assert "copies XLA adds" in {part_of(i) for i in table.values()}


def test_the_loop_s_parts_leave_out_what_they_contain_and_the_rest_closes_the_period() -> None:
    from birdjepa.perf.loop_parts import Clock, per_step_ms

    # Four steps, 100 ms apart from the second on; the first is left out (skip=1), the last has no period.
    clock = Clock(starts=[0.0, 0.5, 0.6, 0.7], spent=[
        {"compile wait": 0.4, "step call (dispatch)": 0.41},
        *[{"step inputs": 0.012, "batch to device": 0.010, "step call (dispatch)": 0.003,
           "wait for outputs": 0.050, "next batch": 0.020}] * 2,
        {},
    ])  # fmt: skip
    ms = per_step_ms(clock, skip=1)
    assert round(ms["step inputs"], 9) == 2.0 and round(ms["batch to device"], 9) == 10.0
    assert round(ms["step call (dispatch)"], 9) == 3.0 and ms["compile wait"] == 0.0
    assert round(ms["loop period"], 9) == 100.0
    assert round(ms["rest of the loop"], 9) == 100.0 - 2 - 10 - 3 - 50 - 20


def test_bench_step_refuses_what_it_cannot_measure_before_it_measures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A mistyped preset was a KeyError, float16 a ConfigError, each after the peak was measured; 0 repeats
    # a StatisticsError; --batch 0 ran batch 16.
    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_step.py"
    for args, said in ((["--presets", "tnyi"], "argument --presets: invalid choice: 'tnyi'"),
                       (["--dtypes", "float16"], "argument --dtypes: invalid choice: 'float16'"),
                       (["--batch", "0"], "--repeats and --batch are at least 1 (got 5, 0)")):  # fmt: skip
        monkeypatch.setattr(sys, "argv", [str(script), *args])
        with pytest.raises(SystemExit) as done:  # as `python scripts/bench_step.py` runs it, in this process
            runpy.run_path(str(script), run_name="__main__")
        out, err = capsys.readouterr()
        assert done.value.code == 2 and said in err and "jax " not in out, (out, err)
