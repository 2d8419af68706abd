"""BirdJepa model: shapes, parameter count, input normalisation, determinism, dropout keys, probe
stop-gradient, param groups."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tyro

from birdjepa.config import PretrainConfig
from birdjepa.model.config import ModelConfig, preset
from birdjepa.model.noise_floor import low_quantile, noise_floor
from birdjepa.model.vit import (
    BirdJepa,
    encode_views,
    init_params,
    named_params,
    param_count,
    param_groups,
    patchify,
)
from birdjepa.objectives.supervised import probe_metrics

T, M = 512, 128


@pytest.fixture(scope="module")
def tiny() -> tuple[ModelConfig, Callable, dict]:
    """(config, jitted apply, params); jitting keeps the tests fast (eager flax dispatch is slow)."""
    cfg = preset("tiny", n_classes=5)
    return cfg, jitted_apply(cfg), init_params(cfg, jax.random.key(0))


def jitted_apply(cfg: ModelConfig) -> Callable:
    return jax.jit(BirdJepa(cfg).apply, static_argnames="deterministic")


def spectrograms(shape: tuple[int, ...], seed: int = 1) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def test_output_shapes_single_and_multi_view(tiny):
    cfg, apply, params = tiny
    out = apply(params, spectrograms((2, T, M)), deterministic=True)
    assert out["embedding"].shape == (2, 64)
    assert out["tokens"].shape == (2, 32, 64)  # frame tokens: 512 / 16
    assert out["projection"].shape == (2, cfg.proj_dim)
    assert out["probe_logits"].shape == (2, 5)

    x = spectrograms((2, 2, T, M))
    out4 = apply(params, x, deterministic=True)
    assert out4["embedding"].shape == (2, 2, 64)
    assert out4["tokens"].shape == (2, 2, 32, 64)
    assert out4["projection"].shape == (2, 2, cfg.proj_dim)
    assert out4["probe_logits"].shape == (2, 2, 5)
    # Views are flattened into the batch: view v of sample b is encoded as if x[b, v] were a plain sample.
    view1 = apply(params, x[:, 1], deterministic=True)
    for k in out4:
        np.testing.assert_allclose(out4[k][:, 1], view1[k], rtol=1e-5, atol=1e-5)
    via_helper = encode_views(params, apply, x, deterministic=True)
    for k in out4:
        np.testing.assert_allclose(via_helper[k], out4[k], rtol=1e-6, atol=1e-6)


def test_wrong_input_shape_is_loud(tiny):
    _, apply, params = tiny
    with pytest.raises(ValueError, match="M=128.*T=512"):
        apply(params, jnp.zeros((2, 500, 128)), deterministic=True)
    with pytest.raises(ValueError, match="shape"):
        apply(params, jnp.zeros((128,)), deterministic=True)


def test_presets():
    assert (preset("tiny").dim, preset("tiny").depth, preset("tiny").heads) == (64, 2, 2)
    assert (preset("small").dim, preset("small").depth, preset("small").heads) == (384, 12, 6)
    assert (preset("base").dim, preset("base").depth, preset("base").heads) == (768, 12, 12)
    assert ModelConfig(preset="small", depth=6).depth == 6  # explicit fields override the preset
    assert ModelConfig().resolved() == preset("tiny")
    # On the command line the preset decides every field not given (the default instance holds None).
    small = tyro.cli(PretrainConfig, args=["--model.preset", "small", "--model.depth", "6"]).model.resolved()
    assert (small.dim, small.depth, small.heads, small.proj_hidden) == (384, 6, 6, 2048)
    # Out-of-range values (an unknown preset, heads that do not divide dim): test_validation.


def test_tiny_parameter_count_by_hand(tiny):
    cfg, _, params = tiny
    d, depth, r, n_patch, patch_px = 64, 2, 4, 32, 16 * 128  # frame tokens: 16 frames x 128 bins
    h, p, c = cfg.proj_hidden, cfg.proj_dim, 5
    dense = lambda i, o: i * o + o  # noqa: E731
    layernorm = 2 * d
    block = layernorm + dense(d, 3 * d) + dense(d, d) + layernorm + dense(d, r * d) + dense(r * d, d)
    encoder = dense(patch_px, d) + n_patch * d + depth * block + layernorm
    projector = dense(d, h) + 2 * h + dense(h, h) + 2 * h + dense(h, p)
    probe = dense(d, c)
    assert encoder == 233_280  # the arithmetic above, spelled out once
    groups = param_groups(params)
    assert param_count(groups["encoder"]) == encoder
    assert param_count(groups["projector"]) == projector
    assert param_count(groups["probe"]) == probe
    assert param_count(params) == encoder + projector + probe
    assert 250_000 < param_count(params) < 300_000


def test_forward_is_bit_deterministic(tiny):
    _, apply, params = tiny
    x = spectrograms((2, T, M))
    a = apply(params, x, deterministic=True)
    b = apply(params, x, deterministic=True)
    for k in a:
        assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k
    # init is a pure function of the key too.
    cfg = preset("tiny", n_classes=5)
    again = init_params(cfg, jax.random.key(0))
    assert all(
        np.array_equal(params_a, params_b)
        for params_a, params_b in zip(
            jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(again), strict=True
        )
    )


def test_deterministic_flag_ignores_dropout_key(tiny):
    _, plain_apply, params = tiny  # dropout adds no parameters: the tiny params fit
    apply = jitted_apply(preset("tiny", dropout=0.2, drop_path=0.3, n_classes=5))
    x = spectrograms((2, T, M))
    k1, k2 = jax.random.key(10), jax.random.key(11)

    def run(deterministic: bool, key=None):
        rngs = {} if key is None else {"dropout": key}
        return np.asarray(apply(params, x, deterministic=deterministic, rngs=rngs)["projection"])

    plain = run(True)
    no_dropout = np.asarray(plain_apply(params, x, deterministic=True)["projection"])
    np.testing.assert_allclose(plain, no_dropout, rtol=1e-6, atol=1e-6)
    assert np.array_equal(plain, run(True, k1))
    assert np.array_equal(plain, run(True, k2))
    # Stochastic mode: reproducible for one key, different across keys, different from deterministic.
    s1 = run(False, k1)
    assert np.array_equal(s1, run(False, k1))
    assert not np.allclose(s1, run(False, k2))
    assert not np.allclose(s1, plain)
    # Stochastic mode without a key is an error, not a silent global RNG.
    with pytest.raises(Exception, match="dropout"):
        run(False)


def test_probe_gradient_does_not_reach_encoder(tiny):
    _, apply, params = tiny
    x = spectrograms((2, 2, T, M))
    labels = jnp.array([1, 3])

    def probe_loss(p):
        out = apply(p, x, deterministic=True)
        return probe_metrics(out["probe_logits"], labels)["probe_ce"]

    grads = param_groups(jax.jit(jax.grad(probe_loss))(params))
    for group in ("encoder", "projector"):
        for leaf in jax.tree_util.tree_leaves(grads[group]):
            assert np.all(np.asarray(leaf) == 0.0), group
    assert any(np.any(np.asarray(leaf) != 0.0) for leaf in jax.tree_util.tree_leaves(grads["probe"]))


def test_param_groups_cover_every_param_once(tiny):
    _, _, params = tiny
    groups = param_groups(params)
    assert set(groups) == {"encoder", "projector", "probe"}
    names = named_params(params)
    grouped = [f"{g}/{n}" for g, tree in groups.items() for n in named_params(tree)]
    assert len(grouped) == len(set(grouped)) == len(names)
    assert set(grouped) == set(names)
    assert len(jax.tree_util.tree_leaves(groups)) == len(jax.tree_util.tree_leaves(params))
    # Readable, stable names.
    assert "encoder/block_0/attn/qkv/kernel" in names
    assert "encoder/block_1/mlp/fc2/bias" in names
    assert "encoder/pos_embed" in names
    assert "projector/out/kernel" in names
    assert "probe/head/kernel" in names
    # The bare inner dict works too, and a stray top-level entry is refused.
    assert param_groups(params["params"]).keys() == groups.keys()
    with pytest.raises(ValueError, match="unexpected"):
        param_groups({**params["params"], "extra": {"w": jnp.zeros(1)}})


def test_patchify_is_time_major():
    x = jnp.arange(32 * 16, dtype=jnp.float32).reshape(1, 32, 16)  # T=32, M=16, patch 16 -> 2 x 1 patches
    p = np.asarray(patchify(x, 16, 16))
    assert p.shape == (1, 2, 256)
    np.testing.assert_array_equal(p[0, 0], np.asarray(x[0, :16, :16]).reshape(-1))
    np.testing.assert_array_equal(p[0, 1], np.asarray(x[0, 16:, :16]).reshape(-1))


@pytest.mark.parametrize("n", [1, 2, 25, 32, 33])
def test_the_low_quantile_gives_the_bits_of_jnp_quantile(n: int) -> None:
    """Two order statistics from top_k in place of a sort of each row: every bit of the quantile, both
    jitted (XLA may fuse the interpolation into one multiply-add), with a NaN, ties, zeros and q at the
    ends. Where a row holds -0 and +0, a zero may come back with the other sign: equal as numbers."""
    rng = np.random.default_rng(n)
    rows = rng.normal(size=(5, 6, n)).astype(np.float32)
    rows[0, 0, 0] = np.nan
    rows[1] = np.abs(np.round(rows[1], 1))  # ties, +0 among them
    rows[2] = 0.0
    rows[4] = np.round(rows[4], 1)  # -0 too
    for q in (0.2, 0.5, 0.0, 1.0):
        want = np.asarray(jax.jit(jnp.quantile, static_argnames="axis")(rows, q, axis=-1))
        got = np.asarray(jax.jit(low_quantile, static_argnums=1)(rows, q))
        assert np.array_equal(got[:4].view(np.uint32), want[:4].view(np.uint32)), q
        assert np.isnan(got[0, 0]) and np.array_equal(got[4], want[4]), q


def test_noise_floor_ignores_bursts_and_the_floor_norm_ignores_the_channel(tiny):
    # Per-bin floor b_m, song bursts of +10 in 5 of 32 windows: the 20th percentile of window means is b_m.
    floor = np.linspace(-3.0, 2.0, M, dtype=np.float32)
    x = np.broadcast_to(floor, (1, T, M)).copy()
    x[0, 16 * 3 : 16 * 8] += 10.0
    np.testing.assert_allclose(np.asarray(noise_floor(jnp.asarray(x), 16))[0, 0], floor, rtol=0, atol=1e-5)
    # A microphone (a smooth per-bin offset) and a gain change the input, not the embedding (float tolerance).
    cfg, apply, params = tiny
    assert cfg.input_norm == "floor"
    song = spectrograms((2, T, M))
    channel = jnp.asarray(np.sin(np.arange(M) / 20.0) * 3.0 + 5.0, jnp.float32)
    a = np.asarray(apply(params, song, deterministic=True)["embedding"])
    b = np.asarray(apply(params, song + channel, deterministic=True)["embedding"])
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)


def test_hidden_spans_do_not_reach_the_predictor():
    # input_norm "none": the floor and standardisation would let a hidden frame move every other.
    cfg = preset("tiny", n_classes=5, predictor_depth=1, input_norm="none")
    params = init_params(cfg, jax.random.key(0))
    assert set(param_groups(params)) == {"encoder", "projector", "probe", "predictor"}
    apply = jitted_apply(cfg)
    x = spectrograms((2, T, M))
    y = x.at[:, 64:128].set(5.0)  # frames 64-127 are tokens 4-7
    mask = jnp.zeros((2, 32), bool).at[:, 4:8].set(True)
    out = apply(params, x, deterministic=True, mask=mask)
    assert out["prediction"].shape == (2, 32, 64)
    assert np.array_equal(out["prediction"], apply(params, y, deterministic=True, mask=mask)["prediction"])
    plain = apply(params, x, deterministic=True)
    assert "prediction" not in plain
    with pytest.raises(ValueError, match="needs a predictor"):  # raised while tracing: nothing compiles
        no_predictor = jax.eval_shape(lambda k: init_params(preset("tiny"), k), jax.random.key(0))
        jax.eval_shape(
            lambda p: BirdJepa(preset("tiny")).apply(p, x, deterministic=True, mask=mask), no_predictor
        )
    assert not np.array_equal(plain["tokens"], apply(params, y, deterministic=True)["tokens"])


def test_bfloat16_computes_in_bfloat16_on_float32_parameters(tiny):
    cfg, apply, params = tiny
    cfg16 = dataclasses.replace(cfg, dtype="bfloat16")
    params16 = init_params(cfg16, jax.random.key(0))
    # The same float32 master weights: the dtype changes the arithmetic, not the parameters.
    leaves, leaves16 = jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(params16)
    same = [
        a.dtype == b.dtype == jnp.float32 and np.array_equal(a, b)
        for a, b in zip(leaves, leaves16, strict=True)
    ]
    assert all(same)
    x = spectrograms((2, T, M))
    out, out16 = apply(params, x, deterministic=True), jitted_apply(cfg16)(params, x, deterministic=True)
    for k in out:
        assert out16[k].dtype == jnp.float32, k  # what the losses and the probe see
    # bfloat16 keeps 8 bits of mantissa: the embedding moves by about 2^-8 of its scale, not by 0.
    diff = np.abs(np.asarray(out16["embedding"]) - np.asarray(out["embedding"]))
    assert 0 < diff.max() < 0.1 * np.abs(np.asarray(out["embedding"])).max(), diff.max()
