"""Checkpoint integrity: a CRC-32 of every leaf and the norms of every group, recorded at save and
compared with ``==`` on restore, so a restore that verifies is the saved state bit for bit (a norm alone
misses a flipped low mantissa bit). Pure functions over host arrays; `birdjepa.rundir.checkpoint.store`
calls them.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from birdjepa.rundir.checkpoint import norms as norms_lib
from birdjepa.rundir.checkpoint.format import path_str

NORM_GROUPS = (("params", "param_norm"), ("opt_state", "opt_state_norm"))


def meta_crc(meta: Mapping[str, Any]) -> int:
    """CRC-32 of a checkpoint's meta as canonical JSON, every key but ``meta_crc`` itself."""
    rest = {k: v for k, v in meta.items() if k != "meta_crc"}
    text = json.dumps(rest, sort_keys=True, separators=(",", ":"))
    return zlib.crc32(text.encode())


def leaf_hash(a: np.ndarray) -> int:
    """CRC-32 of a leaf's bytes (C order): any changed bit changes it."""
    return zlib.crc32(np.ascontiguousarray(a).view(np.uint8).reshape(-1))


def state_norms(state: Any) -> dict[str, float]:
    """Norms recorded in a checkpoint: params, opt_state and every other top-level entry.

    For a Mapping state, ``state["params"]`` -> ``param_norm[/group]``, ``state["opt_state"]`` ->
    ``opt_state_norm[/group]``, the remaining entries -> ``other_norm[/key]``. Any other state ->
    ``state_norm[/group]``.
    """
    if not isinstance(state, Mapping):
        return norms_lib.tree_norms(state, "state_norm")
    out: dict[str, float] = {}
    for key, prefix in NORM_GROUPS:
        if key in state:
            out.update(norms_lib.tree_norms(state[key], prefix))
    rest = {k: v for k, v in state.items() if k not in dict(NORM_GROUPS)}
    if jax.tree_util.tree_leaves(rest):
        out.update(norms_lib.tree_norms(rest, "other_norm"))
    return out


def same_float(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def main_norm_name(norms: Mapping[str, float]) -> str:
    for name in ("param_norm", "state_norm", "opt_state_norm", "other_norm"):
        if name in norms:
            return name
    return next(iter(norms))


def assert_trees_identical(a: Any, b: Any, what: str = "tree") -> None:
    """Raise AssertionError naming the first leaf where `a` and `b` differ (structure, type, shape, dtype,
    or value; NaNs in the same places count as equal). Passes only for bit-identical trees."""
    la, ta = jax.tree_util.tree_flatten_with_path(a)
    lb, tb = jax.tree_util.tree_flatten_with_path(b)
    if ta != tb:
        raise AssertionError(f"{what}: tree structures differ:\n  {ta}\n  {tb}")
    for (path, x), (_, y) in zip(la, lb, strict=True):
        name = f"{what}{path_str(path)}"
        xs, ys = (isinstance(v, (int, float, bool)) and not isinstance(v, np.generic) for v in (x, y))
        if xs != ys or (xs and type(x) is not type(y)):
            raise AssertionError(f"{name}: leaf types differ: {type(x).__name__} vs {type(y).__name__}")
        xa, ya = np.asarray(jax.device_get(x)), np.asarray(jax.device_get(y))
        if xa.dtype != ya.dtype:
            raise AssertionError(f"{name}: dtypes differ: {xa.dtype} vs {ya.dtype}")
        if xa.shape != ya.shape:
            raise AssertionError(f"{name}: shapes differ: {xa.shape} vs {ya.shape}")
        # Compare bits, not values: distinguishes -0.0 from 0.0 and treats identical NaNs as equal.
        if xa.tobytes() != ya.tobytes():
            bx = np.ascontiguousarray(xa).reshape(-1).view(np.uint8).reshape(xa.size, -1)
            by = np.ascontiguousarray(ya).reshape(-1).view(np.uint8).reshape(ya.size, -1)
            i = int(np.flatnonzero((bx != by).any(axis=1))[0])
            fx, fy = xa.reshape(-1)[i], ya.reshape(-1)[i]
            raise AssertionError(f"{name}: values differ (first at flat index {i}: {fx!r} vs {fy!r})")
