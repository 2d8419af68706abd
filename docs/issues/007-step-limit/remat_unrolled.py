"""Does recomputing each block in the backward pass (``jax.checkpoint``) cut a step's memory on XLA:CPU?

    python docs/issues/007-step-limit/remat_unrolled.py     # the whole table (~1 min)

The reference keeps its step's working memory low by recomputing each transformer block in the
backward pass (``grad_ckpt``) over blocks in a ``lax.scan``; ours unrolls its blocks. This prints XLA's
memory plan (arguments, outputs and temporaries, less donated aliases) of the gradient of:

* a stack of 8 attention-and-MLP blocks (width 384, 256 tokens, 64 sequences), unrolled or scanned,
  each block plain, in ``jax.checkpoint``, or (unrolled) recomputed by a ``custom_vjp`` whose
  recompute waits, behind an optimization barrier, for the block's incoming gradient; and the peak
  resident memory of running it (a process each, so the peaks are apart);
* our encoder at the small preset with 4 blocks on 256-token views (``patch_freq`` 16, 32 views), its
  blocks plain or each in ``flax.linen.remat`` (built here: the model has no such option).

Each toy-stack row runs in a process of its own: the script calls itself as ``remat_unrolled.py LAYOUT
RECOMPUTE`` (LAYOUT ``unrolled`` or ``scanned``; RECOMPUTE one of ``no``, ``each block``, ``each block,
after its gradient``), which prints that one row.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys

import jax
import jax.numpy as jnp

D, H, N, B, L = 384, 1536, 256, 64, 8


def plan_mib(compiled: jax.stages.Compiled) -> float:
    m = compiled.memory_analysis()
    total = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
    return total / 2**20


def block(w: tuple[jax.Array, ...], x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ w[0])
    a = jax.nn.softmax(jnp.einsum("bnd,bmd->bnm", h, h), -1)
    return x + jnp.tanh(jnp.einsum("bnm,bmd->bnd", a, x) @ w[1]) @ w[2]


@jax.custom_vjp
def tied(w: tuple[jax.Array, ...], x: jax.Array) -> jax.Array:
    """`block`, recomputed in the backward pass only once its incoming gradient exists."""
    return block(w, x)


def _tied_fwd(w: tuple[jax.Array, ...], x: jax.Array) -> tuple[jax.Array, tuple]:
    return block(w, x), (w, x)


def _tied_bwd(saved: tuple, grad: jax.Array) -> tuple:
    w, x, grad = jax.lax.optimization_barrier((*saved, grad))
    return jax.vjp(block, w, x)[1](grad)


tied.defvjp(_tied_fwd, _tied_bwd)
RECOMPUTE = {"no": block, "each block": jax.checkpoint(block), "each block, after its gradient": tied}


def stack(layout: str, recompute: str) -> None:
    """One process: the toy stack's gradient, its plan and the process's peak resident memory."""
    f = RECOMPUTE[recompute]
    ws = [(jnp.full((D, D), 0.01), jnp.full((D, H), 0.01), jnp.full((H, D), 0.01)) for _ in range(L)]
    x = jnp.ones((B, N, D))

    def loss(ws: list) -> jax.Array:
        if layout == "scanned":
            y, _ = jax.lax.scan(lambda y, w: (f(w, y), None), x, jax.tree.map(lambda *a: jnp.stack(a), *ws))
        else:
            y = x
            for w in ws:
                y = f(w, y)
        return y.sum()

    compiled = jax.jit(jax.grad(loss)).lower(ws).compile()
    jax.block_until_ready(compiled(ws))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"| toy stack, {layout} | {recompute} | {plan_mib(compiled):.0f} | {peak:.0f} |", flush=True)


def encoder() -> None:
    import flax.linen as nn

    from birdjepa.model import vit
    from birdjepa.model.config import preset

    x = jnp.zeros((32, 512, 128))
    plain = vit.Block
    for remat in (False, True):
        vit.Block = nn.remat(plain, static_argnums=(2,)) if remat else plain  # the Encoder's blocks
        cfg = preset("small", depth=4, patch_freq=16)
        params = vit.init_params(cfg, jax.random.key(0))

        def loss(p: dict, cfg: object = cfg) -> jax.Array:
            return vit.BirdJepa(cfg).apply(p, x, deterministic=True)["projection"].sum()

        compiled = jax.jit(jax.grad(loss)).lower(params).compile()
        print(f"| our encoder, small, 4 blocks, unrolled | {'each block' if remat else 'no'} | "
              f"{plan_mib(compiled):.0f} | |")  # fmt: skip
    vit.Block = plain


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("layout", metavar="LAYOUT", nargs="?", choices=["unrolled", "scanned"],
                   help="print one toy-stack row only, its blocks unrolled or scanned")  # fmt: skip
    p.add_argument("recompute", metavar="RECOMPUTE", nargs="?", choices=list(RECOMPUTE),
                   help="that row's recompute: " + ", ".join(map(repr, RECOMPUTE)))  # fmt: skip
    args = p.parse_args()
    if (args.layout is None) != (args.recompute is None):
        p.error("give LAYOUT and RECOMPUTE together, or neither")
    if args.layout is not None:
        stack(args.layout, args.recompute)
        return
    print("| program | recomputed | XLA plan MiB | peak resident MiB |\n|---|---|---|---|", flush=True)
    for layout, recompute in [("unrolled", r) for r in RECOMPUTE] + [
        ("scanned", "no"),
        ("scanned", "each block"),
    ]:
        subprocess.run([sys.executable, __file__, layout, recompute], check=True)
    encoder()


if __name__ == "__main__":
    main()
