"""Bit-reproducible L2 norms of pytrees, computed on host in float64.

`tree_norms` is what the checkpoint module records at save time and recomputes after a restore; the two
are compared with `==`, not with a tolerance. That only works if the same arrays always give the same
bits, so the computation is pinned down completely:

* float64 on host with numpy: the norm does not depend on the device, the XLA version, fusion decisions,
  or on the dtype the leaf happens to have (bf16/f32/int leaves are widened exactly to float64 first);
  float64 also keeps the rounding error of summing ~1e8 squares far below the float32 resolution of the
  parameters, so a single flipped bit in a float32 weight changes the recorded norm.
* a fixed order: leaves are visited in `jax.tree_util` flatten order (dict keys sorted), each leaf's
  sum of squares is one numpy reduction over a fresh C-contiguous float64 copy (numpy's pairwise
  summation depends only on the length, not on memory layout), and the per-leaf sums are added
  left-to-right in Python. No threads, no BLAS, no parallel reductions whose order could vary.

The function is pure: arrays in, dict of Python floats out.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np


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
    a64 = np.array(a, dtype=np.float64, order="C", copy=True).reshape(-1)
    return float(np.sum(np.square(a64)))


def tree_norms(tree: Any, prefix: str = "param_norm") -> dict[str, float]:
    """Global L2 norm of `tree` and of each of its top-level groups.

    Returns ``{prefix: global_norm, f"{prefix}/{group}": group_norm, ...}`` where a group is the first
    path element of a leaf: a dict key (``params["encoder"]`` -> ``"encoder"``), a namedtuple field
    (``MultiStepsState.acc_grads`` -> ``"acc_grads"``) or a sequence index (``"0"``). A tree that is a
    single leaf gets only the global entry. Groups are listed in flatten order. An empty tree has norm 0.
    """
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    total = 0.0
    groups: dict[str, float] = {}
    for path, leaf in leaves:
        s = leaf_sum_of_squares(leaf)
        total += s
        if path:
            g = _key_name(path[0])
            groups[g] = groups.get(g, 0.0) + s
    out = {prefix: math.sqrt(total)}
    for g, s in groups.items():
        out[f"{prefix}/{g}"] = math.sqrt(s)
    return out
