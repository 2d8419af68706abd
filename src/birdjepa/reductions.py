"""Several reductions of one flat array (or of arrays of one length) as one pass: `one_pass`.

XLA compiles each ``jnp.sum``/``jnp.max`` of a step as a loop of its own. Where a step reduces many
small tensors several ways each (the recording's summary of every tensor, the update monitor's five
statistics of every parameter), one variadic ``lax.reduce`` per tensor is one loop instead of several:
fewer kernels to compile, load and launch (the recording step compiled 1.3x as long with a reduction
each; on a CPU each YNNPACK reduction fusion costs a requeued segment time to load). It serves what
runs in a cond, not the every-step path: the update's two norms as one pass gave the base step in bf16
353 MiB more working memory (XLA vectorizes and fuses a variadic reduction less).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

Term = tuple[jax.Array, Any, Callable[[Any, Any], Any]]
"""One reduction: a flat array, the init value, and the binary op that combines two values."""


def one_pass(terms: list[Term]) -> list[jax.Array]:
    """Each flat array reduced by its own ``(init, op)``, in one variadic reduction (one loop)."""
    arrays, inits, ops = zip(*terms, strict=True)
    init = tuple(jnp.asarray(i, a.dtype) for a, i in zip(arrays, inits, strict=True))

    def combine(a: tuple, b: tuple) -> tuple:
        return tuple(op(u, v) for op, u, v in zip(ops, a, b, strict=True))

    return list(jax.lax.reduce(arrays, init, combine, (0,)))
