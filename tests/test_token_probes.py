"""The token probes without a model: the prototypical probe's formula by hand, the attentive probe
against attention computed the textbook way, learning what the mean over tokens hides, bad shapes,
and raw's tokens as the spectrum's own patches."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from birdjepa.benchmark.metrics import all_metrics
from birdjepa.benchmark.multi_label_probes import Recipe, fit_and_score
from birdjepa.benchmark.token_probes import HEADS, attentive_init, attentive_pool, proto_apply, proto_weights


def test_proto_scores_as_the_paper_s_formula_on_a_hand_computed_example() -> None:
    # One clip of three tokens; two classes of J = 2 prototypes. cos(token, prototype), best over tokens:
    #   class 0: [1, 0] -> max(1, 0, 1/sqrt2) = 1;   [0, 1] -> max(0, 1, 1/sqrt2) = 1
    #   class 1: [-1, 0] -> max(-1, 0, -1/sqrt2) = 0; [1, 1] -> max(1/sqrt2, 1/sqrt2, 1) = 1
    # logit[c] = sum_j w[c, j] s[c, j] + b[c] = [0.5 + 2 + 0.1, 0 + 1 - 0.2] = [2.6, 0.8]
    tokens = jnp.array([[[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]]])
    w = np.array([[0.5, 2.0], [3.0, 1.0]])
    params = {
        "prototypes": jnp.array([[[1.0, 0.0], [0.0, 1.0]], [[-1.0, 0.0], [1.0, 1.0]]]),
        "v": jnp.asarray(np.log(np.expm1(w))),  # w = softplus(v): kept >= 0
        "b": jnp.array([0.1, -0.2]),
    }
    np.testing.assert_allclose(np.asarray(proto_weights(params)), w, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(proto_apply(params, tokens)), [[2.6, 0.8]], rtol=1e-6)


def test_attentive_pooling_is_cross_attention_with_a_learned_query_per_head() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5, 12)).astype(np.float32)
    params = {k: np.asarray(v) for k, v in attentive_init(12, 2, jax.random.key(1)).items()}
    params["b_v"] = rng.normal(size=params["b_v"].shape).astype(np.float32)
    head = params["query"].shape[1]
    # The textbook way: project every token to keys and values, softmax(q . k / sqrt(d)), average values.
    keys = np.einsum("btd,dhk->bhtk", x, params["w_k"])
    values = np.einsum("btd,dhk->bhtk", x, params["w_v"]) + params["b_v"][None, :, None]
    logits = np.einsum("bhtk,hk->bht", keys, params["query"]) / np.sqrt(head)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = np.einsum("bht,bhtk->bhk", weights, values).reshape(3, HEADS * head)
    got = np.asarray(attentive_pool(params, jnp.asarray(x)))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)  # float32 sums in another order


def hidden_by_the_mean(seed: int, n: int, c: int = 4, t: int = 8, d: int = 16) -> tuple[np.ndarray, ...]:
    """Clips of ``t`` noise tokens where each present class adds its signature to one token and takes it
    from another: the mean over tokens holds nothing of the classes."""
    rng = np.random.default_rng(seed)
    signature = np.random.default_rng(99).normal(size=(c, d)) * 3
    y = (rng.random((n, c)) < 0.35).astype(np.uint8)
    x = rng.normal(size=(n, t, d))
    for i in range(n):
        slots = rng.permutation(t)
        for k, cls in enumerate(np.flatnonzero(y[i])):
            x[i, slots[2 * k]] += signature[cls]
            x[i, slots[2 * k + 1]] -= signature[cls]
    return x.astype(np.float32), y


def test_token_probes_learn_what_the_mean_over_tokens_hides_deterministically() -> None:
    x_train, y_train = hidden_by_the_mean(0, 64)
    x_test, y_test = hidden_by_the_mean(1, 64)
    pooled = fit_and_score("linear", x_train.mean(axis=1), y_train, x_test.mean(axis=1))
    # Chance: a cmAP of about the share of positives (0.35) and an AUROC of 0.5.
    assert all_metrics(pooled, y_test)["auroc"] < 0.65
    for probe, loss in (("proto", "bce"), ("attentive", "bce"), ("attentive", "asl")):
        recipe = Recipe(loss=loss)
        scores = fit_and_score(probe, x_train, y_train, x_test, seed=3, recipe=recipe)
        m = all_metrics(scores, y_test)
        assert m["cmap"] > 0.75 and m["auroc"] > 0.8, (probe, loss, m)
        assert np.array_equal(scores, fit_and_score(probe, x_train, y_train, x_test, seed=3, recipe=recipe))


def test_bad_shapes_are_said_in_one_line() -> None:
    x, y = hidden_by_the_mean(0, 8)
    cases = [
        ("proto", x.mean(axis=1), x, "the proto probe reads patch tokens [N, T, D]"),
        ("attentive", x, x[:, :, :5], "the attentive probe reads patch tokens [N, T, D] with one D"),
        ("linear", x, x, "the linear probe reads embeddings [N, D]"),
    ]
    for probe, train, test, message in cases:
        with pytest.raises(ValueError, match=r"^" + message.replace("[", r"\[").replace("]", r"\]")) as e:
            fit_and_score(probe, train, y, test)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="NaN"):
        fit_and_score("proto", np.full_like(x, np.nan), y, x)


def test_a_collapsed_encoder_s_constant_tokens_score_chance_not_nan() -> None:
    # Standardised to zeros and copied into the prototypes, their norm's gradient (NaN at 0) made every
    # proto score NaN, and the error said to lower --probe-lr; the attentive probe scored chance.
    x, y = hidden_by_the_mean(0, 16)
    constant = np.ones_like(x)
    for probe in ("proto", "attentive"):
        scores = fit_and_score(probe, constant, y, constant[:4], recipe=Recipe(steps=20))
        assert np.isfinite(scores).all() and (scores == scores[0]).all(), probe  # one score for every clip


def test_raw_tokens_are_the_log_mel_patches_of_the_vit_grid() -> None:
    from birdjepa.benchmark.backbones import _raw
    from birdjepa.evaluation.embed import raw_features
    from birdjepa.model.config import ModelConfig

    x = np.random.default_rng(0).normal(size=(2, 64, 32)).astype(np.float32)
    frames = _raw(ModelConfig(n_frames=64, n_mels=32, patch=16))  # a token: 16 frames of every mel bin
    pooled, tokens = frames.encode(x, tokens=True)
    assert frames.identity == "raw:logmel-mean-std+patches16x32" and np.array_equal(pooled, raw_features(x))
    assert tokens.shape == (2, 4, 16 * 32) and np.array_equal(tokens[1, 2], x[1, 32:48].ravel())
    square = _raw(ModelConfig(n_frames=64, n_mels=32, patch=16, patch_freq=8))
    _, tokens = square.encode(x, tokens=True)
    # Time-major: token (time 2, band 3) is the 11th; inside it, (frame, mel) order.
    assert tokens.shape == (2, 16, 128) and np.array_equal(tokens[0, 2 * 4 + 3], x[0, 32:48, 24:32].ravel())
    assert square.encode(x, tokens=False)[1] is None


def test_raw_input_is_the_log_mel_as_the_encoder_receives_it() -> None:
    from birdjepa.benchmark.backbones import resolve
    from birdjepa.evaluation.embed import raw_features

    # The default model's 512 frames of 128 bins: each bin has its own background level (a channel's
    # gain), and one clip a call in its first window.
    x = (np.random.default_rng(0).normal(size=(2, 512, 128)) + np.linspace(-20, 5, 128)).astype(np.float32)
    x[0, :16, 40:80] += 12
    raw, as_input = resolve(["raw", "raw:input"])  # no run: the default model (input_norm floor)
    assert as_input.identity == "raw:input-floor-mean-std+patches16x128" != raw.identity
    pooled, tokens = as_input.encode(x, tokens=True)
    # By hand (the model's definition): each bin's floor is the 20th percentile over the 32 windows of 16
    # frames of its window means; then the clip standardised over time and bins.
    means = x.astype(np.float64).reshape(2, 32, 16, 128).mean(axis=2)
    y = x - np.quantile(means, 0.2, axis=1, keepdims=True)
    y = (y - y.mean(axis=(1, 2), keepdims=True)) / np.sqrt(y.var(axis=(1, 2), keepdims=True) + 1e-6)
    # Tolerance: JAX reduces in float32, this in float64 (values of order 1; 1e-4 apart at most).
    np.testing.assert_allclose(tokens[1, 2], y[1, 32:48].ravel(), atol=1e-4)
    np.testing.assert_allclose(tokens, y.reshape(2, 32, 16 * 128), atol=1e-4)
    np.testing.assert_allclose(pooled, raw_features(y), atol=1e-4)
    assert np.abs(pooled - raw.encode(x, tokens=False)[0]).max() > 1  # not raw's: the floor is gone


@pytest.mark.slow  # compiles at the default level: CI's last stage
@pytest.mark.default_level
def test_an_encoder_s_tokens_leave_its_embedding_bits_and_probes_repeat_at_the_default_level() -> None:
    """At XLA's default level with the harness's flags, as users run: `with_tokens`'s embedding is
    `encoder(x)`'s, bit for bit (one program returning both once moved its last bit), and a token probe
    fitted twice scores the same bits."""
    from birdjepa.data import Features
    from birdjepa.export.encoder import Encoder
    from birdjepa.model.config import preset
    from birdjepa.model.vit import Encoder as VisionEncoder

    cfg = preset("tiny")
    x = np.random.default_rng(0).normal(size=(16, cfg.n_frames, cfg.n_mels)).astype(np.float32)
    params = VisionEncoder(cfg).init(jax.random.key(0), x[:1], deterministic=True)["params"]
    # Weights off their init, as trained ones are: at init (zero biases, unit scales) both programs
    # happened to agree, and the one-program version went unnoticed; with these it differs.
    rng = np.random.default_rng(1)
    params = jax.tree_util.tree_map(lambda a: a + 0.05 * rng.normal(size=a.shape).astype(np.float32), params)
    encoder = Encoder(cfg, Features(), 16, "test", {"encoder": params})  # the demo's batch
    embedding, tokens = encoder.with_tokens(x)
    assert np.array_equal(embedding, encoder(x)) and tokens.shape == (16, cfg.n_patches, cfg.dim)
    y = np.eye(3, dtype=np.uint8)[np.arange(16) % 3]
    for probe in ("proto", "attentive"):
        first = fit_and_score(probe, tokens, y, tokens, seed=0, recipe=Recipe(steps=20))
        assert np.array_equal(first, fit_and_score(probe, tokens, y, tokens, seed=0, recipe=Recipe(steps=20)))
