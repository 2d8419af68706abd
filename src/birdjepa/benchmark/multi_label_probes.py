"""Multi-label probes on frozen embeddings: each returns ``scores [N_test, C]`` for ``C`` classes.

All three standardise with the train split's statistics first
(`evaluation.single_label_probes.standardise`), so every backbone's row is treated alike.

- **linear**: one dense layer, ``C`` logits;
- **mlp**: one hidden layer of `HIDDEN` GELU units, then ``C`` logits;
  both trained full-batch with AdamW for a fixed number of steps from a seeded init, with binary
  cross-entropy or the asymmetric loss (ASL, Ridnik et al. 2021: gamma- = 4, gamma+ = 0, clip 0.05;
  several BirdSet baselines train with it). A fixed recipe and no validation split: at n = 1 recording
  per class there is nothing to hold out, and one recipe keeps the few-shot curve comparable across n.
- **proto** and **attentive** read patch tokens, not embeddings: `token_probes`.
- **centroid**: nothing trained; the cosine similarity to each class's mean (standardised, then
  L2-normalised) train embedding.
- **softmax** and **knn**: `birdjepa evaluate`'s single-label probes
  (`birdjepa.evaluation.single_label_probes`: multinomial logistic regression with cross-validated L2,
  and weighted cosine kNN), fitted on each train recording's one class, its focal species (a BirdSet
  train row lists secondary ones too); their scores are class probabilities and kNN vote weights. For
  single-label tasks, and to compare with `evaluate`'s numbers.

Whatever the probe, a class no train recording has scores one constant, below every other class's score
(`unseen_alike`): its AP is its share of the test windows, the same for every probe and backbone.

Train batches are padded to a power of two with zero-weight rows, so the few-shot sizes compile a
handful of shapes, not one per n; padded rows change no sum. On CPU the scores are a deterministic
function of (features, labels, seed, recipe).
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax

from birdjepa.benchmark.recipe import Loss, Recipe, padded
from birdjepa.benchmark.token_probes import TOKEN_PROBES, fit_and_score_tokens
from birdjepa.evaluation.single_label_probes import standardise
from birdjepa.train.step import seed_key

ProbeName = Literal["linear", "mlp", "centroid", "proto", "attentive", "softmax", "knn"]
PROBES: tuple[str, ...] = ("linear", "mlp", "centroid", "proto", "attentive", "softmax", "knn")
MULTI_LABEL: tuple[str, ...] = ("linear", "mlp", "centroid")
"""The probes a benchmark runs unless told otherwise (BirdSet's tasks are multi-label)."""
HIDDEN = 256
__all__ = ["HIDDEN", "MULTI_LABEL", "PROBES", "TOKEN_PROBES", "Loss", "ProbeName", "Recipe", "first_class",
           "fit_and_score"]  # fmt: skip


def _init(kind: str, d: int, c: int, key: jax.Array) -> dict:
    k1, k2 = jax.random.split(key)
    if kind == "linear":
        return {"w": jnp.zeros((d, c)), "b": jnp.zeros(c)}
    return {
        "w1": jax.random.normal(k1, (d, HIDDEN)) * jnp.sqrt(2.0 / d),
        "b1": jnp.zeros(HIDDEN),
        "w2": jax.random.normal(k2, (HIDDEN, c)) * jnp.sqrt(1.0 / HIDDEN),
        "b2": jnp.zeros(c),
    }


def _apply(params: dict, x: jax.Array) -> jax.Array:
    if "w" in params:
        return x @ params["w"] + params["b"]
    return jax.nn.gelu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


@partial(jax.jit, static_argnames=("kind", "recipe"))
def _fit(kind: str, recipe: Recipe, x: jax.Array, y: jax.Array, weight: jax.Array, key: jax.Array) -> dict:
    loss_fn = recipe.loss_fn()
    tx = optax.adamw(recipe.lr, weight_decay=recipe.weight_decay)
    params = _init(kind, x.shape[1], y.shape[1], key)

    def objective(p: dict) -> jax.Array:
        per_row = loss_fn(_apply(p, x), y).sum(axis=1)
        return (per_row * weight).sum() / weight.sum()

    def step(carry: tuple, _: None) -> tuple:
        p, opt = carry
        grads = jax.grad(objective)(p)
        updates, opt = tx.update(grads, opt, p)
        return (optax.apply_updates(p, updates), opt), None

    (params, _), _ = jax.lax.scan(step, (params, tx.init(params)), None, length=recipe.steps)
    return params


def fit_and_score(
    probe: ProbeName,
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    *,
    seed: int = 0,
    recipe: Recipe = Recipe(),
    train_label: np.ndarray | None = None,
) -> np.ndarray:
    """Scores of ``test_x`` for every class of ``train_y [N, C]`` (multi-hot) after fitting ``probe``:
    on embeddings ``[N, D]``, or, for a token probe (`TOKEN_PROBES`), patch tokens ``[N, T, D]``.
    ``train_label``: each train recording's one class for softmax and knn (-1: none), its focal species;
    by default its first listed class."""
    train_y = np.asarray(train_y, np.float32)
    return unseen_alike(_fit_and_score(probe, train_x, train_y, test_x, seed, recipe, train_label), train_y)


def first_class(y: np.ndarray) -> np.ndarray:
    """Each row's first listed class of multi-hot ``y`` (-1: none)."""
    return np.where(y.any(axis=1), y.argmax(axis=1), -1)


def unseen_alike(scores: np.ndarray, train_y: np.ndarray) -> np.ndarray:
    """``scores`` with each class no train recording has set to one constant below every other score. A
    probe's own scores there are float noise (a trained probe's are a near-constant logit, tied but for
    rounding): they ranked the test windows, and one fit gave cmAP 0.645 or 0.650 as XLA's flags moved
    the last bits."""
    unseen = ~train_y.any(axis=0)
    if not unseen.any():
        return scores
    scores = np.array(scores, copy=True)
    seen = scores[:, ~unseen]
    scores[:, unseen] = seen.min() - 1.0 if seen.size else 0.0
    return scores


def _fit_and_score(
    probe: ProbeName, train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, seed: int, recipe: Recipe,
    train_label: np.ndarray | None,
) -> np.ndarray:  # fmt: skip
    if probe in TOKEN_PROBES:
        return fit_and_score_tokens(probe, train_x, train_y, test_x, seed=seed, recipe=recipe)
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"the {probe} probe reads embeddings [N, D] with one D, got {train_x.shape} and "
                         f"{test_x.shape}")  # fmt: skip
    if len(train_x) != len(train_y) or len(train_x) == 0:
        raise ValueError(f"need one label row per train clip and at least one clip, got {train_y.shape}")
    if not (np.isfinite(train_x).all() and np.isfinite(test_x).all()):
        raise ValueError("features hold NaN or inf (a diverged encoder?)")
    if probe in ("softmax", "knn"):
        if train_label is None:
            train_label = first_class(train_y)
        return _single_label(probe, train_x, np.asarray(train_label), test_x, seed, train_y.shape[1])
    a, b = standardise(train_x, test_x)
    if probe == "centroid":
        return _centroid_scores(a, train_y, b)
    if probe not in ("linear", "mlp"):
        raise ValueError(f"unknown probe {probe!r}; choose from {', '.join(PROBES)}")
    n, size = len(a), padded(len(a))
    x = np.zeros((size, a.shape[1]), np.float32)
    y = np.zeros((size, train_y.shape[1]), np.float32)
    weight = np.zeros(size, np.float32)
    x[:n], y[:n], weight[:n] = a, train_y, 1.0
    params = _fit(probe, recipe, jnp.asarray(x), jnp.asarray(y), jnp.asarray(weight), seed_key(seed))
    return np.asarray(_apply(params, jnp.asarray(b, jnp.float32)), np.float64)


def _centroid_scores(train: np.ndarray, train_y: np.ndarray, test: np.ndarray) -> np.ndarray:
    def unit(v: np.ndarray) -> np.ndarray:
        return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)

    train, test = unit(train), unit(test)
    counts = train_y.sum(axis=0)
    means = (train_y.T.astype(np.float64) @ train) / np.maximum(counts, 1)[:, None]
    return test @ unit(means).T


def _single_label(
    probe: str, train_x: np.ndarray, train_label: np.ndarray, test_x: np.ndarray, seed: int, n_classes: int
) -> np.ndarray:
    """`evaluate`'s probes on each train recording's one class (recordings without one left out)."""
    from birdjepa.evaluation import single_label_probes as single

    if len(train_label) != len(train_x):
        raise ValueError(f"need one train label per train clip, got {len(train_label)} for {len(train_x)}")
    keep = train_label >= 0
    labels = train_label[keep]
    if not keep.any():
        raise ValueError("no train recording has a class")
    if probe == "knn":
        return single.knn(train_x[keep], labels, test_x, None, n_classes=n_classes).scores
    return single.linear_probe(train_x[keep], labels, test_x, None, seed=seed, n_classes=n_classes).scores
