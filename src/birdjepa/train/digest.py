"""An exact digest and a few statistics of a tensor, computed where it lives (`birdjepa trace`).

A trace of a large model cannot bring every activation to the host: it records, for each tensor, a
64-bit digest of its bytes and five statistics, computed on the device inside the recording step, and
the whole tensor only where asked. Two tensors of one shape and dtype have the same digest exactly when
their bits agree (up to a 2^-64 chance of a collision).

The digest reads the tensor as 32-bit words (narrower types widened, 64-bit host arrays split in two)
and sums a mixed hash of each word and its position, in two independent lanes, modulo 2^32. A wrapping
integer sum is exact in any order, so the digest does not depend on how XLA or the devices reduce it:
the same bits on 1 or 8 devices, on the device or from the host, give the same digest.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from birdjepa.reductions import Term, one_pass

#: Tensors of at most this many elements are always kept whole (their summary would be larger).
SMALL = 64
STATS = ("min", "max", "mean", "norm", "nonfinite")
_LANES = (0x9E3779B9, 0x7F4A7C15)  # two odd constants: independent lanes


def _fmix32(h: jax.Array) -> jax.Array:
    """MurmurHash3's finalizer: every input bit flips each output bit with probability about 1/2."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _words(x: jax.Array) -> jax.Array:
    """The tensor's bits as a flat uint32 array (one word per element)."""
    if x.dtype == jnp.bool_:
        return x.reshape(-1).astype(jnp.uint32)
    bits = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    return jax.lax.bitcast_convert_type(x.reshape(-1), bits).astype(jnp.uint32)


def _lanes(x: jax.Array) -> list[jax.Array]:
    """The mixed hash of each word and its position, one array per lane (their sums are the digest)."""
    w = _words(x)
    i = jnp.arange(w.size, dtype=jnp.uint32)
    return [_fmix32(w + i * jnp.uint32(c)) for c in _LANES]


def _wrapping_sum(lane: jax.Array) -> Term:
    return lane, 0, jax.lax.add  # uint32: modulo 2^32, exact in any order


def digest(x: jax.Array) -> jax.Array:
    """``uint32[2]``: the tensor's digest (see the module doc)."""
    return jnp.stack(one_pass([_wrapping_sum(h) for h in _lanes(x)]))


def tree_digests(tree: Any) -> dict[str, jax.Array]:
    """`digest` of each leaf of ``tree``, keyed by its path (``encoder/block_0/attn/qkv/kernel``), in
    flatten order: what the resume checks compare of the next step's gradients."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(p, simple=True, separator="/"): digest(x) for p, x in leaves}


@functools.partial(jax.jit, static_argnames="whole", inline=True)
def summary(x: jax.Array, *, whole: bool = False) -> dict[str, jax.Array]:
    """What a trace records of ``x``: its digest, `STATS` over its values (zeros for an empty tensor),
    and ``x`` itself when ``whole`` or small. One reduction computes the digest and the statistics.

    Jitted: on the host, one small executable per shape and dtype; inside the recording step, traced
    once per shape and dtype, where the step has a summary for each of its tensors (the tiny step's
    lowering 2.1 -> 1.5 s), and inlined (as a call of its own, it slowed the step 7 % at tiny)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    f = x.reshape(-1).astype(jnp.float32)
    inf, add = jnp.inf, jax.lax.add
    h0, h1, lo, hi, total, squares, nonfinite = one_pass([
        *(_wrapping_sum(h) for h in _lanes(x)),
        (f, inf, jax.lax.min), (f, -inf, jax.lax.max), (f, 0.0, add), (f * f, 0.0, add),
        ((~jnp.isfinite(f)).astype(jnp.float32), 0.0, add),
    ])  # fmt: skip
    stats = jnp.stack([lo, hi, total / float(max(f.size, 1)), jnp.sqrt(squares), nonfinite])
    out = {"digest": jnp.stack([h0, h1]), "stats": stats if f.size else jnp.zeros_like(stats)}
    if whole or x.size <= SMALL:
        out["array"] = x
    return out


def summarize(arrays: list[Any], whole: list[bool]) -> list[dict[str, np.ndarray]]:
    """`summary` of each host or device array, brought to the host. A 64-bit host array (which JAX
    would narrow) is digested as the 32-bit words of its bytes. One small executable per shape and
    dtype: a model's tensors come in a few dozen shapes, so a process compiles a few dozen."""
    out = []
    for a, w in zip(arrays, whole, strict=True):
        x = a
        if isinstance(a, np.ndarray | np.generic) and np.asarray(a).dtype.itemsize == 8:
            x = np.ascontiguousarray(a).view(np.uint32).reshape(*np.shape(a), 2)
        s = jax.device_get(summary(x, whole=w))
        if "array" in s and isinstance(a, np.ndarray | np.generic):
            s["array"] = np.asarray(a)  # the host's own bytes (and dtype), not a copy back from the device
        out.append(s)
    return out


def hex_digest(d: np.ndarray) -> str:
    """The digest as 16 hex digits."""
    return "".join(f"{int(w):08x}" for w in np.asarray(d, np.uint32))
