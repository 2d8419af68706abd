"""The encoder options bird-audio ViTs use (`birdjepa.model.config.ModelConfig`: rope, qk_norm, swiglu,
layer_scale, registers), each off by default: what each builds, and a run with all five on resuming
bit for bit. One run proves it for the five: each is arithmetic inside the encoder's forward pass
(a parameter, a function of the tokens), and the resume restores the parameters and replays the step.
With them on, `test_evaluation.py`'s run is exported and embeds as `evaluate` does, and
`test_virtual_shards.py` computes the same bits on 1, 2 and 4 devices. The same run recomputes its
blocks (``remat``, with drop-path: each block's rate and dropout key inside the scan); what
``remat`` computes, and what it keeps, is the test before it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest
from test_train_resume import NO_EVAL, resumed_differs

from birdjepa.model.config import DecoderConfig, ModelConfig, preset
from birdjepa.model.vit import BirdJepa, init_params, rope_angles, rotate
from birdjepa.perf.step_cost import plan_bytes
from birdjepa.rundir.metrics_log import metrics_by_step
from birdjepa.train.calls import recorded

ALL_ON = ("--model.rope", "--model.qk-norm", "--model.swiglu", "--model.layer-scale", "0.1",
          "--model.registers", "2")  # fmt: skip


def test_rotary_attention_scores_depend_on_relative_positions_only() -> None:
    q, k = jax.random.normal(jax.random.key(0), (2, 1, 5, 1, 16))
    pos = jnp.array([[[0, 0], [1, 0], [3, 2], [7, 1], [2, 5]]], jnp.float32)

    def scores(shift: jax.Array) -> np.ndarray:
        angles = rope_angles(pos + shift, 16)
        return np.asarray(jnp.einsum("bnhd,bmhd->bnm", rotate(q, angles), rotate(k, angles)))

    base = scores(jnp.zeros(2))
    assert np.allclose(scores(jnp.array([5.0, 0.0])), base, atol=1e-4)  # float rotations: not exact
    assert np.allclose(scores(jnp.array([0.0, 3.0])), base, atol=1e-4)
    assert not np.allclose(scores(jnp.array([[0.0, 0.0]] * 4 + [[1.0, 0.0]])), base, atol=1e-2)


def test_each_option_builds_what_it_says() -> None:
    base = preset("tiny", n_frames=64)
    on = preset("tiny", n_frames=64, rope=True, qk_norm=True, swiglu=True, layer_scale=0.1, registers=3)
    p0 = init_params(base, jax.random.key(0))["params"]["encoder"]
    p1 = init_params(on, jax.random.key(0))["params"]["encoder"]
    assert "pos_embed" in p0 and "pos_embed" not in p1  # rope replaces the learned positions
    assert p1["registers"].shape == (3, base.dim)
    block = p1["block_0"]
    assert {"q_norm", "k_norm"} <= set(block["attn"]) and set(block["mlp"]) == {"gate", "fc1", "fc2"}
    assert np.array_equal(block["scale1"]["scale"], np.full(base.dim, 0.1, np.float32))
    # SwiGLU's three matrices hold as many weights as GELU's two (hidden 2/3 as wide, rounded down).
    swiglu, gelu = (sum(x.size for x in jax.tree.leaves(b["mlp"])) for b in (block, p0["block_0"]))
    assert (swiglu, gelu) == (3 * 64 * 170 + 2 * 170 + 64, 2 * 64 * 256 + 256 + 64)
    # The registers leave the tokens and the embedding.
    x = jax.random.normal(jax.random.key(1), (2, 64, 128))
    out = BirdJepa(on).apply({"params": init_params(on, jax.random.key(0))["params"]}, x, deterministic=True)
    assert out["tokens"].shape == (2, 4, base.dim)
    assert np.allclose(out["embedding"], out["tokens"].mean(1), atol=0)


def test_remat_scans_the_same_parameters_and_keeps_a_block_s_activations_not_every_block_s() -> None:
    kw = {"depth": 4, "patch_freq": 16, "n_frames": 256}  # 128 tokens: the activations dominate
    unrolled, scanned = preset("tiny", **kw), preset("tiny", remat=True, **kw)
    params = init_params(unrolled, jax.random.key(0))
    assert np.array_equal(  # the checkpoint's layout either way
        jax.flatten_util.ravel_pytree(params)[0],
        jax.flatten_util.ravel_pytree(init_params(scanned, jax.random.key(0)))[0],
    )
    x = jax.random.normal(jax.random.key(1), (8, 256, 128))

    def loss(cfg: ModelConfig) -> Callable:
        return lambda p: BirdJepa(cfg).apply(p, x, deterministic=True)["projection"].sum()

    # The same function: a scan compiles the blocks otherwise, so to float32's last bits only. Jitted, as
    # a step runs them (op by op, the two took ~3 s more), and their memory read from the same programs.
    built = [jax.jit(jax.value_and_grad(loss(cfg))).lower(params).compile() for cfg in (unrolled, scanned)]
    (a, ga), (b, gb) = (step(params) for step in built)
    grads = zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True)
    assert np.allclose(a, b, rtol=1e-5)  # each gradient to 1e-4 of its largest element
    assert all(np.abs(u - v).max() <= 1e-4 * np.abs(u).max() + 1e-7 for u, v in grads)
    assert plan_bytes(built[1]) < 0.5 * plan_bytes(built[0])  # measured: 13.6 against 35.5 MiB

    # The record holds the blocks' input and output, not their insides (which the scan keeps apart).
    calls = [dict(recorded(lambda cfg=cfg: BirdJepa(cfg).apply(params, x, deterministic=True))[1])
             for cfg in (unrolled, scanned)]  # fmt: skip
    stack = ["encoder/blocks.__call__#0/in/0", "encoder/blocks.__call__#0/out"]
    assert sorted(calls[1]) == sorted([name for name in calls[0] if "/block_" not in name] + stack)
    assert np.array_equal(
        calls[1]["encoder/blocks.__call__#0/in/0"], calls[0]["encoder/block_0.__call__#0/in/0"]
    )
    assert calls[1]["encoder/blocks.__call__#0/out"].shape == calls[0]["encoder/block_3.__call__#0/out"].shape


def test_remat_with_drop_path_trains_in_bfloat16() -> None:
    # A scanned block's drop-path rate is a float32 array: it made the bfloat16 activations float32, and
    # the scan's carry changed type (a traceback), with any objective. Each option alone trained.
    cfg = preset("tiny", n_frames=64, remat=True, drop_path=0.1, dtype="bfloat16")
    params = init_params(cfg, jax.random.key(0))
    x = jax.random.normal(jax.random.key(1), (4, 64, 128))
    out = BirdJepa(cfg).apply(params, x, deterministic=False, rngs={"dropout": jax.random.key(2)})
    assert out["tokens"].shape == (4, 4, cfg.dim) and np.isfinite(np.asarray(out["tokens"])).all()


def test_remat_recomputes_the_predictor_s_and_the_decoder_s_blocks_too() -> None:
    # One encoder block, three of each head over every token: what an encoder scanned alone leaves kept.
    kw = {"depth": 1, "predictor_depth": 3, "patch_freq": 16, "n_frames": 256}
    unrolled, scanned = preset("tiny", **kw), preset("tiny", remat=True, **kw)
    decoder = DecoderConfig(dim=64, depth=3, heads=4)
    params = init_params(unrolled, jax.random.key(0), decoder)  # the scanned model reads them too
    x = jax.random.normal(jax.random.key(1), (8, 256, 128))
    keep = jnp.broadcast_to(jnp.arange(0, 128, 2), (8, 64))  # every other patch visible
    mask = jnp.zeros((8, 128), bool).at[:, 1::4].set(True)

    def loss(cfg: ModelConfig) -> Callable:
        def f(p: dict) -> jax.Array:
            out = BirdJepa(cfg, decoder).apply(p, x, deterministic=True, mask=mask, keep=keep)
            return out["prediction"].sum() + out["reconstruction"].sum()

        return f

    steps = [jax.jit(jax.value_and_grad(loss(cfg))).lower(params).compile() for cfg in (unrolled, scanned)]
    (a, ga), (b, gb) = (step(params) for step in steps)
    assert np.allclose(a, b, rtol=1e-5)  # to float32's last bits, as the encoder's (above)
    grads = zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True)
    assert all(np.abs(u - v).max() <= 1e-4 * np.abs(u).max() + 1e-7 for u, v in grads)
    # Measured: 23.0 against 59.0 MiB; with the encoder's blocks alone scanned, 59.1 (one block of seven).
    assert plan_bytes(steps[1]) < 0.5 * plan_bytes(steps[0])


@pytest.mark.slow  # two runs of the larger step, compiling at the default level, as users run
@pytest.mark.default_level
def test_a_run_with_every_encoder_option_on_resumes_exactly(demo_dir: Path, tmp_path: Path) -> None:
    # The masked-span predictor too: with remat its blocks are recomputed in a scan of their own.
    predictor = ("--model.predictor-depth", "1", "--objective.lejepa.span-weight", "0.5")
    args = (*ALL_ON, "--model.remat", *predictor, "--model.drop-path", "0.1", *NO_EVAL,
            "--optim.grad-accum", "2")  # fmt: skip
    assert resumed_differs(demo_dir, tmp_path, *args) == []
    assert metrics_by_step(tmp_path / "straight")[2]["train/accum_progress"] == 1.0  # stopped mid-update
