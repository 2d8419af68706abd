"""The arithmetic floor of raw's token fits, against item 5's bound (token fits at most 2x the pooled).

XLA's cost analysis of one step of each token probe's fit on raw's patches (32 tokens x 2,048, the
study's recipe: 32 clips a step, J = 20), times the study's 500 steps and 48 (task, n, seed) cells,
over a matrix product's peak on this machine: how long raw's token fits take at the very least.
Run: ``.venv/bin/python docs/issues/006-token-probes/floor.py [--peak-gflops 118.7]`` (no peak given:
measured here, a float32 2048^3 product, as `scripts/bench_step.py` measures it).
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from birdjepa.benchmark.recipe import Recipe, padded
from birdjepa.benchmark.token_probes import _fit

CELLS = {12: 36, 16: 12}
"""Classes -> cells: SYN1-3 (12 species) and the demo split (16), each at 4 n x 3 seeds."""
POOLED_S = 263.0
"""The study's pooled fits (linear, MLP, centroid) of all seven backbones, summed (results.md)."""


def step_gflop(kind: str, classes: int) -> float:
    x = jax.ShapeDtypeStruct((padded(288), 32, 2048), jnp.float32)
    y = jax.ShapeDtypeStruct((padded(288), classes), jnp.float32)
    lowered = _fit.trace(kind, Recipe(steps=1), x, y, jnp.asarray(288), jax.random.key(0)).lower()
    return lowered.cost_analysis()["flops"] / 1e9


def matmul_peak_gflops() -> float:
    a = jnp.ones((2048, 2048), jnp.float32)
    f = jax.jit(lambda a: a @ a)
    f(a).block_until_ready()
    t = time.perf_counter()
    for _ in range(10):
        f(a).block_until_ready()
    return 10 * 2 * 2048**3 / (time.perf_counter() - t) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peak-gflops", type=float, default=None)
    peak = parser.parse_args().peak_gflops or matmul_peak_gflops()
    steps = Recipe().steps
    total = 0.0
    for kind in ("proto", "attentive"):
        for classes, cells in CELLS.items():
            tflop = step_gflop(kind, classes) * steps * cells / 1e3
            total += tflop
            print(f"{kind:9s} {classes} classes: {tflop:6.1f} TFLOP over {cells} fits")
    floor = total * 1e3 / peak
    bound = 2 * POOLED_S
    print(f"raw's token fits: {total:.1f} TFLOP; at {peak:.1f} GFLOP/s at least {floor:.0f} s")
    print(f"the bound, all backbones' token fits: 2 x {POOLED_S:.0f} s = {bound:.0f} s ({floor / bound:.0%})")


if __name__ == "__main__":
    main()
