"""Multi-label metrics as BirdSet reports them, on ``scores [N, C]`` (any real numbers, higher = more
likely) and ``targets [N, C]`` (0/1).

- **cmAP** (class-wise mean average precision): each class's average precision, averaged over the
  classes with at least one positive in ``targets`` (a class never present has no AP). AP is the step
  sum over the distinct score thresholds, ``sum_k (R_k - R_{k-1}) P_k``, without interpolation; tied
  scores form one threshold.
- **AUROC**: each class's area under the ROC curve (ties count one half), averaged over the classes
  with at least one positive and one negative.
- **top-1**: the share of segments whose highest-scoring class is one of their labels, over the
  segments with at least one label (a "no call" segment has no right answer and is left out, as
  BirdSet's ``TopKAccuracy`` leaves it out by default). Ties in score go to the lower class index.

Written in numpy (float64) so that the probes and the tests share nothing with the reference they are
checked against (scikit-learn).
"""

from __future__ import annotations

import numpy as np


def _check(scores: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores, targets = np.asarray(scores, np.float64), np.asarray(targets)
    if scores.ndim != 2 or scores.shape != targets.shape:
        raise ValueError(f"scores and targets must both be [N, C], got {scores.shape} and {targets.shape}")
    if not np.isfinite(scores).all():
        raise ValueError("scores hold NaN or inf")
    return scores, targets.astype(bool)


def average_precision(score: np.ndarray, target: np.ndarray) -> float:
    """AP of one class (``target`` must hold a positive)."""
    order = np.argsort(-score, kind="stable")
    score, target = score[order], target[order]
    # The last position of each run of tied scores is one threshold.
    last = np.r_[np.flatnonzero(np.diff(score)), len(score) - 1]
    tp = np.cumsum(target)[last]
    precision = tp / (last + 1)
    recall = tp / target.sum()
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def roc_auc(score: np.ndarray, target: np.ndarray) -> float:
    """AUROC of one class (``target`` must hold a positive and a negative): the chance that a random
    positive outscores a random negative, ties counting one half (the Mann-Whitney statistic)."""
    ranks = _average_ranks(score)
    n_pos = int(target.sum())
    n_neg = len(target) - n_pos
    return float((ranks[target].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, tied values sharing their mean rank."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_x)) + 1]
    ends = np.r_[starts[1:], len(x)]
    mean_rank = (starts + ends + 1) / 2.0  # ranks start+1 .. end
    ranks = np.empty(len(x))
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def cmap(scores: np.ndarray, targets: np.ndarray) -> float:
    """Mean AP over the classes with a positive (NaN if none has one)."""
    scores, targets = _check(scores, targets)
    present = np.flatnonzero(targets.any(axis=0))
    if len(present) == 0:
        return float("nan")
    return float(np.mean([average_precision(scores[:, c], targets[:, c]) for c in present]))


def auroc(scores: np.ndarray, targets: np.ndarray) -> float:
    """Mean AUROC over the classes with a positive and a negative (NaN if none has both)."""
    scores, targets = _check(scores, targets)
    both = np.flatnonzero(targets.any(axis=0) & ~targets.all(axis=0))
    if len(both) == 0:
        return float("nan")
    return float(np.mean([roc_auc(scores[:, c], targets[:, c]) for c in both]))


def top1(scores: np.ndarray, targets: np.ndarray) -> float:
    """Share of labelled segments whose top-scoring class is a label (NaN if none is labelled)."""
    scores, targets = _check(scores, targets)
    labelled = targets.any(axis=1)
    if not labelled.any():
        return float("nan")
    best = scores[labelled].argmax(axis=1)
    return float(targets[labelled][np.arange(len(best)), best].mean())


def all_metrics(scores: np.ndarray, targets: np.ndarray) -> dict[str, float]:
    return {"cmap": cmap(scores, targets), "auroc": auroc(scores, targets), "top1": top1(scores, targets)}
