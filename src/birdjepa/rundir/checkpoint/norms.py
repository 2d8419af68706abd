"""Bit-reproducible L2 norms of pytrees, computed on host in float64.

`tree_norms` is what the checkpoint module records at save time and recomputes after a restore; the two
are compared with `==`, not with a tolerance. That only works if the same arrays always give the same
bits, so the computation is pinned down completely:

* float64 on host with numpy: the norm does not depend on the device, the XLA version, fusion decisions,
  or on the dtype the leaf happens to have (bf16/f32/int leaves are widened exactly to float64 first);
  float64 also keeps the rounding error of summing ~1e8 squares far below the float32 resolution of the
  parameters, so a single flipped bit in a float32 weight changes the recorded norm.
* a fixed order: leaves are visited in `jax.tree_util` flatten order (dict keys sorted), each leaf's
  sum of squares is one numpy reduction over a fresh C-contiguous float64 vector of its squares
  (numpy's pairwise summation depends only on the length, not on memory layout), and the per-leaf sums
  are added left-to-right in Python. No BLAS, no reduction split whose order could vary: threads
  (`THREADS`) only share out whole leaves, each summed as above, and their sums are added in order.

The loop logs the parameters' norms every step: at the small preset, 27 M parameters, that took 49 ms
a step on 2 cores, one leaf after another (``scripts/bench_loop.py``), host time that a GPU's step
waits for. Hence the threads (``scripts/bench_norms.py``: 0.7-0.9x the time on 2 cores, where XLA's
own threads hold the cores after a step; a GPU's host has them free), and the squares widened as they
are computed (one pass less than a widened copy first; the same values).

The function is pure: arrays in, dict of Python floats out.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from birdjepa.cores import schedulable_cpus

THREADS = 4
"""At most this many threads sum a tree's leaves (fewer on fewer cores): numpy lets go of the GIL in
its reductions, so they run at once; more would take cores from the loader's workers."""

PARALLEL_ABOVE = 1 << 20
"""Elements in a tree below which its leaves are summed in the calling thread (threads cost more)."""


def _key_name(key: Any) -> str:
    """Human-readable name of one pytree path element (dict key, attribute, index)."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def leaf_sum_of_squares(x: Any) -> float:
    """Sum of squares of one array-like leaf, in float64, deterministic for given values and shape."""
    if isinstance(x, jax.Array):
        x = jax.device_get(x)
    a = np.asarray(x)
    if a.dtype.kind not in "biuf" and a.dtype.name != "bfloat16":
        raise TypeError(f"tree_norms: cannot take the norm of a leaf of dtype {a.dtype}")
    # The squares of the widened values, as a fresh C-ordered vector: equal to widening a copy first.
    return float(np.sum(np.square(a.reshape(-1), dtype=np.float64)))


def sums_of_squares(leaves: list[Any]) -> list[float]:
    """`leaf_sum_of_squares` of each leaf, the leaves shared out between threads by size."""
    sizes = [int(np.size(x)) for x in leaves]
    threads = min(THREADS, schedulable_cpus(), len(leaves))
    if threads < 2 or sum(sizes) < PARALLEL_ABOVE:
        return [leaf_sum_of_squares(x) for x in leaves]
    shares: list[list[int]] = [[] for _ in range(threads)]
    load = [0] * threads
    for i in sorted(range(len(leaves)), key=lambda i: -sizes[i]):  # largest first, to the lightest share
        j = load.index(min(load))
        shares[j].append(i)
        load[j] += sizes[i]
    sums: list[float] = [0.0] * len(leaves)

    def run(share: list[int]) -> None:
        for i in share:
            sums[i] = leaf_sum_of_squares(leaves[i])

    with ThreadPoolExecutor(threads, thread_name_prefix="norms") as pool:
        list(pool.map(run, shares))  # re-raises a leaf's error
    return sums


def tree_norms(tree: Any, prefix: str = "param_norm") -> dict[str, float]:
    """Global L2 norm of `tree` and of each of its top-level groups.

    Returns ``{prefix: global_norm, f"{prefix}/{group}": group_norm, ...}`` where a group is the first
    path element of a leaf: a dict key (``params["encoder"]`` -> ``"encoder"``), a namedtuple field
    (``MultiStepsState.acc_grads`` -> ``"acc_grads"``) or a sequence index (``"0"``). A tree that is a
    single leaf gets only the global entry. Groups are listed in flatten order. An empty tree has norm 0.
    """
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    sums = sums_of_squares([leaf for _, leaf in leaves])
    total = 0.0
    groups: dict[str, float] = {}
    for (path, _), s in zip(leaves, sums, strict=True):
        total += s
        if path:
            g = _key_name(path[0])
            groups[g] = groups.get(g, 0.0) + s
    out = {prefix: math.sqrt(total)}
    for g, s in groups.items():
        out[f"{prefix}/{g}"] = math.sqrt(s)
    return out
