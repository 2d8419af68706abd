"""Multi-label probes on frozen patch tokens ``[N, T, D]``: each returns ``scores [N_test, C]``.

The mean over a clip's tokens blurs what a probe needs where several species call at once; these two
read every token.

- **proto**, the prototypical probe of Bird-MAE (Rauch et al. 2025, arXiv 2504.12880, after
  ProtoPNet): ``J`` learned prototypes ``p[c, j]`` per class; each scores its best match over the
  clip's tokens, ``s[c, j] = max_t cos(x_t, p[c, j])``, and a class's logit is their weighted sum,
  ``logit[c] = sum_j w[c, j] s[c, j] + b[c]``. ``J`` is ``Recipe.prototypes`` (the paper's 20). Two
  choices of ours, measured on SYN1 (docs/issues/006-token-probes): the weights are kept non-negative
  (``w = softplus(v)``, starting at ``1 / J``), since learned freely they turned negative and
  inverted the ranking (cmAP 0.07 after 100 steps, from 0.62 at the start); and each class's
  prototypes start as unit-length tokens of its own train clips (clip and token drawn from the seed),
  a template matcher from the first step, where noise-initialised ones stayed at chance on raw patches.
- **attentive**, the JEPA papers' attentive probe: one cross-attention pooling layer, ``HEADS``
  learned queries (one per head; initialised at std 0.02 as V-JEPA's, so attention starts near the
  mean) over the tokens' keys and values (``WIDTH`` channels in all), then a linear head. A query's
  score of a token is ``q . (W_k x)``, computed as ``(W_k^T q) . x``: the same number, without
  projecting every token, which is what makes it cheap on 2,048-wide raw patches.

Tokens are standardised per channel with the train tokens' statistics (as the pooled probes
standardise embeddings). Both train with the pooled probes' recipe (loss, AdamW, steps, learning rate),
on ``Recipe.token_batch`` clips per step drawn with replacement from a generator seeded by the seed,
so memory and time per step do not grow with the train split. On CPU the scores are a deterministic
function of (tokens, labels, seed, recipe).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax

from birdjepa.benchmark.recipe import Recipe, padded
from birdjepa.evaluation.single_label_probes import standardise
from birdjepa.train.step import seed_key

TOKEN_PROBES: tuple[str, ...] = ("proto", "attentive")
HEADS = 4
WIDTH = 256
"""The attentive probe's value channels (HEADS x WIDTH / HEADS), as the MLP probe's hidden width."""
SCORE_CHUNK = 64
"""Test clips scored at once (bounds the [chunk, C, J, T] similarities)."""


def _unit(x: jax.Array) -> jax.Array:
    # A norm's gradient at a zero vector is NaN: a collapsed encoder's constant tokens, standardised to
    # zeros and copied into the prototypes, made every proto score NaN. The norm of the others as before.
    squares = jnp.sum(x * x, axis=-1, keepdims=True)
    norm = jnp.where(squares > 0, jnp.sqrt(jnp.where(squares > 0, squares, 1.0)), 0.0)
    return x / jnp.maximum(norm, 1e-12)


def proto_init(x: jax.Array, y: jax.Array, n: jax.Array, key: jax.Array, prototypes: int) -> dict:
    """Each class's prototypes start as tokens of its own train clips (clip and token drawn with the
    key), a template matcher from the first step; a class without train clips starts from noise."""
    c, (rows, t, d) = y.shape[1], x.shape
    k_clip, k_token, k_noise = jax.random.split(key, 3)
    positive = (y > 0) & (jnp.arange(rows) < n)[:, None]  # [N, C]
    clip = jax.random.categorical(k_clip, jnp.where(positive.T, 0.0, -jnp.inf), shape=(prototypes, c)).T
    token = jax.random.randint(k_token, (c, prototypes), 0, t)
    drawn = x[jnp.clip(clip, 0, rows - 1), token].astype(jnp.float32)
    noise = jax.random.normal(k_noise, (c, prototypes, d))
    return {
        "prototypes": _unit(jnp.where(positive.any(axis=0)[:, None, None], drawn, noise)),
        # w = softplus(v) >= 0: a match is evidence for its class, never against it (learned freely, the
        # weights turned negative: with sparse positives every similarity is mostly a negative's).
        "v": jnp.full((c, prototypes), jnp.log(jnp.expm1(1.0 / prototypes))),
        "b": jnp.zeros(c),
    }


def proto_similarities(params: dict, x: jax.Array) -> jax.Array:
    """``s[b, c, j]``: each prototype's best cosine similarity over the tokens of ``x [B, T, D]``."""
    sims = jnp.einsum("btd,cjd->bcjt", _unit(x), _unit(params["prototypes"]))
    return sims.max(axis=-1)


def proto_weights(params: dict) -> jax.Array:
    """``w[c, j]``: how much prototype ``j``'s best match counts for class ``c``."""
    return jax.nn.softplus(params["v"])


def proto_apply(params: dict, x: jax.Array) -> jax.Array:
    return (proto_similarities(params, x) * proto_weights(params)).sum(axis=-1) + params["b"]


def attentive_init(d: int, c: int, key: jax.Array) -> dict:
    kq, kk, kv = jax.random.split(key, 3)
    head = WIDTH // HEADS
    return {
        "query": jax.random.normal(kq, (HEADS, head)) * 0.02,
        "w_k": jax.random.normal(kk, (d, HEADS, head)) * jnp.sqrt(1.0 / d),
        "w_v": jax.random.normal(kv, (d, HEADS, head)) * jnp.sqrt(1.0 / d),
        "b_v": jnp.zeros((HEADS, head)),
        "w": jnp.zeros((WIDTH, c)),
        "b": jnp.zeros(c),
    }


def attentive_pool(params: dict, x: jax.Array) -> jax.Array:
    """``[B, WIDTH]``: each head's softmax(q . k_t / sqrt(head)) average of the values ``W_v x_t``."""
    head = params["query"].shape[1]
    direction = jnp.einsum("dhk,hk->hd", params["w_k"], params["query"]) / jnp.sqrt(head)
    weights = jax.nn.softmax(jnp.einsum("btd,hd->bht", x, direction), axis=-1)
    pooled = jnp.einsum("bht,btd->bhd", weights, x)  # values are linear: average first, project after
    values = jnp.einsum("bhd,dhk->bhk", pooled, params["w_v"]) + params["b_v"]
    return values.reshape(len(x), -1)


def attentive_apply(params: dict, x: jax.Array) -> jax.Array:
    return attentive_pool(params, x) @ params["w"] + params["b"]


def _init(kind: str, x: jax.Array, y: jax.Array, n: jax.Array, key: jax.Array, recipe: Recipe) -> dict:
    if kind == "proto":
        return proto_init(x, y, n, key, recipe.prototypes)
    return attentive_init(x.shape[2], y.shape[1], key)


def _apply(kind: str, params: dict, x: jax.Array) -> jax.Array:
    return proto_apply(params, x) if kind == "proto" else attentive_apply(params, x)


@partial(jax.jit, static_argnames=("kind", "recipe"))
def _fit(kind: str, recipe: Recipe, x: jax.Array, y: jax.Array, n: jax.Array, key: jax.Array) -> dict:
    """``recipe.steps`` AdamW steps, each on ``recipe.token_batch`` of the first ``n`` rows of ``x``."""
    init_key, draw_key = jax.random.split(key)
    loss_fn = recipe.loss_fn()
    tx = optax.adamw(recipe.lr, weight_decay=recipe.weight_decay)
    params = _init(kind, x, y, n, init_key, recipe)

    def step(carry: tuple, step_key: jax.Array) -> tuple:
        p, opt = carry
        rows = jax.random.randint(step_key, (recipe.token_batch,), 0, n)
        xb, yb = x[rows].astype(jnp.float32), y[rows]
        grads = jax.grad(lambda q: loss_fn(_apply(kind, q, xb), yb).sum(axis=1).mean())(p)
        updates, opt = tx.update(grads, opt, p)
        return (optax.apply_updates(p, updates), opt), None

    keys = jax.random.split(draw_key, recipe.steps)
    (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), keys)
    return params


@partial(jax.jit, static_argnames=("kind",))
def _scores(kind: str, params: dict, x: jax.Array) -> jax.Array:
    return _apply(kind, params, x.astype(jnp.float32))


def standardise_tokens(train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """Tokens centred and scaled per channel by the train tokens' mean and std (float32 out; a constant
    channel keeps scale 1)."""
    arrays = (train, *others)
    flat = standardise(*(x.reshape(-1, x.shape[-1]) for x in arrays))  # every token a row
    return [f.reshape(x.shape).astype(np.float32) for f, x in zip(flat, arrays, strict=True)]


def fit_and_score_tokens(
    probe: str,
    train_tokens: np.ndarray,
    train_y: np.ndarray,
    test_tokens: np.ndarray,
    *,
    seed: int = 0,
    recipe: Recipe = Recipe(),
) -> np.ndarray:
    """Scores of ``test_tokens [N_test, T, D]`` for every class of ``train_y [N, C]`` (multi-hot) after
    fitting ``probe`` (proto or attentive) on ``train_tokens [N, T, D]``."""
    if probe not in TOKEN_PROBES:
        raise ValueError(f"{probe!r} is not a token probe ({', '.join(TOKEN_PROBES)})")
    if train_tokens.ndim != 3 or test_tokens.ndim != 3 or train_tokens.shape[2] != test_tokens.shape[2]:
        raise ValueError(
            f"the {probe} probe reads patch tokens [N, T, D] with one D, got {train_tokens.shape} and "
            f"{test_tokens.shape}"
        )
    if len(train_tokens) != len(train_y) or len(train_tokens) == 0:
        raise ValueError(f"need one label row per train clip and at least one clip, got {train_y.shape}")
    if recipe.prototypes < 1:
        raise ValueError(f"the proto probe needs at least one prototype per class, got {recipe.prototypes}")
    a, b = standardise_tokens(train_tokens, test_tokens)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("tokens hold NaN or inf (a diverged encoder?)")
    n, size = len(a), padded(len(a))
    x = np.zeros((size, *a.shape[1:]), np.float32)
    y = np.zeros((size, train_y.shape[1]), np.float32)
    x[:n], y[:n] = a, train_y
    params = _fit(probe, recipe, jnp.asarray(x), jnp.asarray(y), jnp.asarray(n), seed_key(seed))
    out = []
    for start in range(0, len(b), SCORE_CHUNK):
        chunk = b[start : start + SCORE_CHUNK]
        pad = np.zeros((SCORE_CHUNK - len(chunk), *chunk.shape[1:]), np.float32)
        scores = _scores(probe, params, jnp.asarray(np.concatenate([chunk, pad])))
        out.append(np.asarray(scores)[: len(chunk)])
    return np.concatenate(out).astype(np.float64) if out else np.zeros((0, train_y.shape[1]))
