"""Frozen-feature classifiers: the linear probe and kNN of the SSL literature, on numpy arrays.

Both take features of a labelled train split and an eval split and return eval-split predictions;
nothing here knows about models. Both standardise with the train split's statistics first, so every
row of an evaluation table (trained encoder, random init, raw log-mel) is treated the same way.

* **Linear probe**: multinomial logistic regression (scikit-learn, L-BFGS) on standardised features.
  The L2 strength is chosen by stratified `FOLDS`-fold cross-validation on the train set (folds drawn
  from a seeded generator; the best mean validation accuracy wins), then the probe is refit on the
  whole train set with it. One held-out fifth of a few hundred clips is too small to choose on: on the
  same embeddings, four draws of it chose C from 0.001 to 100 and moved the held-out accuracy by 0.1.
* **kNN**: cosine similarity to every train clip (standardised, then L2-normalised), the `k` most
  similar vote for their class with weight ``exp(similarity / temperature)`` (DINO's weighted kNN,
  k = 20, temperature 0.07). Ties in similarity go to the lower train index, ties in votes to the lower
  class, so the answer is deterministic.

Accuracy is reported two ways: top-1 over clips and macro (the mean over classes present in the eval
split of each class's recall), which does not let a frequent class hide a rare one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings

import numpy as np

KNN_K = 20
KNN_TEMPERATURE = 0.07
#: Inverse L2 strengths tried for the linear probe (sklearn's ``C``), weakest regularisation last.
L2_GRID: tuple[float, ...] = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)
FOLDS = 5
MAX_ITER = 10_000
TOL = 1e-6


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    predictions: np.ndarray
    """Predicted class per eval clip."""
    acc: float
    macro_acc: float
    details: dict
    """What was chosen and how it went (L2 strength, validation accuracies, iterations)."""
    scores: np.ndarray | None = None
    """[N_eval, n_classes]: each class's vote weight (kNN) or probability (linear); a class absent from
    the train split scores 0."""


def accuracies(predictions: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(top-1, macro) accuracy: macro is the mean per-class recall over the classes in ``labels``."""
    predictions, labels = np.asarray(predictions), np.asarray(labels)
    if len(labels) == 0:
        raise ValueError("no labelled clips to score")
    correct = predictions == labels
    per_class = [correct[labels == c].mean() for c in np.unique(labels)]
    return float(correct.mean()), float(np.mean(per_class))


def standardise(train: np.ndarray, *others: np.ndarray) -> list[np.ndarray]:
    """Features centred and scaled by the train split's mean and std (float64; a constant feature
    keeps scale 1)."""
    train = np.asarray(train, np.float64)
    mean = train.mean(axis=0)
    std = train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return [(np.asarray(x, np.float64) - mean) / std for x in (train, *others)]


def _check(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray | None) -> None:
    if train_x.ndim != 2 or test_x.ndim != 2 or train_x.shape[1] != test_x.shape[1]:
        raise ValueError(f"features must be [N, D] with one D, got {train_x.shape} and {test_x.shape}")
    if test_y is None:  # scores only (a multi-label split is scored by the caller)
        test_y = np.zeros(len(test_x), np.int64)
    if len(train_x) != len(train_y) or len(test_x) != len(test_y):
        raise ValueError("one label per clip is needed")
    if len(train_y) == 0 or len(test_y) == 0:
        raise ValueError("both splits need labelled clips")
    if not (np.isfinite(train_x).all() and np.isfinite(test_x).all()):
        raise ValueError("features hold NaN or inf (a diverged encoder?)")


def _scored(predictions: np.ndarray, test_y: np.ndarray | None) -> tuple[float, float]:
    return (math.nan, math.nan) if test_y is None else accuracies(predictions, test_y)


def knn(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray | None,
    *,
    k: int = KNN_K,
    temperature: float = KNN_TEMPERATURE,
    n_classes: int | None = None,
) -> ProbeResult:
    """Similarity-weighted kNN on cosine similarity of standardised features (see the module doc)."""
    _check(train_x, train_y, test_x, test_y)
    train_y = np.asarray(train_y, np.int64)
    a, b = standardise(train_x, test_x)
    a /= np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
    b /= np.maximum(np.linalg.norm(b, axis=1, keepdims=True), 1e-12)
    sims = b @ a.T  # [N_test, N_train]
    k = min(k, len(train_y))
    nearest = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    weights = np.exp(np.take_along_axis(sims, nearest, axis=1) / temperature)
    if n_classes is None:
        n_classes = int(max(train_y.max(), -1 if test_y is None else np.max(test_y))) + 1
    votes = np.zeros((len(b), n_classes))
    np.add.at(votes, (np.arange(len(b))[:, None], train_y[nearest]), weights)
    predictions = votes.argmax(axis=1)
    acc, macro = _scored(predictions, test_y)
    return ProbeResult(predictions, acc, macro, {"k": k, "temperature": temperature}, votes)


def _stratified_folds(labels: np.ndarray, k: int, seed: int) -> list[np.ndarray]:
    """``k`` validation folds (sorted index arrays): each class's clips, in an order drawn from a
    generator seeded by ``seed``, dealt round-robin, so every fold holds about 1/k of every class."""
    rng = np.random.Generator(np.random.Philox(seed))
    fold = np.empty(len(labels), np.int64)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        fold[idx] = np.arange(len(idx)) % k
    return [np.flatnonzero(fold == f) for f in range(k)]


@functools.cache
def _blas():  # -> threadpoolctl.ThreadpoolController
    """The BLAS libraries loaded with scikit-learn, found once: `threadpool_limits` looks them up in the
    process's memory map at every call (3.5 s of the test suite's CPU, over its probes' fits)."""
    import sklearn.linear_model  # noqa: F401  (loads the BLAS it uses)
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _logistic(x: np.ndarray, y: np.ndarray, c: float):  # -> LogisticRegression
    from sklearn.linear_model import LogisticRegression

    # One BLAS thread: on a small problem OpenBLAS's threads only contend (measured 15x slower with 2
    # threads on 2 cores beside the loader), and one thread sums in one fixed order.
    with warnings.catch_warnings(), _blas().limit(limits=1):
        # Non-convergence is reported through n_iter_ (see `linear_probe`), not as a warning.
        warnings.simplefilter("ignore")
        return LogisticRegression(C=c, max_iter=MAX_ITER, tol=TOL).fit(x, y)


def linear_probe(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    test_y: np.ndarray | None,
    *,
    seed: int = 0,
    grid: tuple[float, ...] = L2_GRID,
    n_classes: int | None = None,
) -> ProbeResult:
    """Multinomial logistic regression on standardised features; L2 chosen by stratified k-fold
    cross-validation on the train split (ties go to the stronger regularisation), then refit on all of it."""
    _check(train_x, train_y, test_x, test_y)
    train_y = np.asarray(train_y, np.int64)
    # A fold takes part when it holds a clip and the clips left to fit it hold two classes or more.
    folds = [v for v in _stratified_folds(train_y, FOLDS, seed)
             if len(v) and len(np.unique(np.delete(train_y, v))) > 1]  # fmt: skip
    val_acc: dict[str, float] = {}
    if folds:
        # Each fold standardised once, then shared by every C.
        splits = []
        for val in folds:
            fit = np.setdiff1d(np.arange(len(train_y)), val)
            splits.append((*standardise(train_x[fit], train_x[val]), train_y[fit], train_y[val]))
        for c in grid:
            accs = [accuracies(_logistic(a, ya, c).predict(b), yb)[0] for a, b, ya, yb in splits]
            val_acc[repr(c)] = float(np.mean(accs))
        best = max(grid, key=lambda c: (val_acc[repr(c)], -c))
    else:  # too few clips to hold any out
        best = 1.0
    a, b = standardise(train_x, test_x)
    scores = np.zeros((len(b), n_classes or int(train_y.max()) + 1))
    if len(np.unique(train_y)) == 1:  # one class: nothing to fit
        predictions, train_predictions = np.full(len(b), train_y[0]), train_y
        scores[:, train_y[0]] = 1.0
        iterations = 0
    else:
        model = _logistic(a, train_y, best)
        predictions, train_predictions = model.predict(b), model.predict(a)
        scores[:, model.classes_] = model.predict_proba(b)
        iterations = int(np.max(model.n_iter_))
    acc, macro = _scored(predictions, test_y)
    details = {
        "l2_c": best,
        "val_acc": val_acc,
        "folds": [int(len(v)) for v in folds],
        "iterations": iterations,
        "converged": iterations < MAX_ITER,
        "train_acc": accuracies(train_predictions, train_y)[0],
    }
    return ProbeResult(predictions, acc, macro, details, scores)
