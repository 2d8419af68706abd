"""Few-shot train sets: at most ``n`` recordings of each class, drawn with a seed.

A recording belongs to the class of its single label (BirdSet's focal ``ebird_code``), so a draw is
made per class and a class with fewer than ``n`` recordings keeps them all. Each class draws from its
own generator seeded by (seed, class): adding a class or changing ``n`` for one class does not move
the others' draws, and the n = 1 recordings are the first of the n = 4 ones (nested curves).
"""

from __future__ import annotations

import numpy as np

ALL = -1
"""``n`` that keeps every recording."""


def draw(labels: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Sorted indices of the kept recordings of ``labels [N]`` (int, -1 = unlabelled, never kept)."""
    labels = np.asarray(labels, np.int64)
    if n == ALL:
        return np.flatnonzero(labels >= 0)
    if n < 1:
        raise ValueError(f"n must be {ALL} (all) or >= 1, got {n}")
    kept = []
    for c in np.unique(labels[labels >= 0]):
        rng = np.random.Generator(np.random.Philox(key=[seed, int(c)]))
        members = np.flatnonzero(labels == c)
        kept.append(members[rng.permutation(len(members))[:n]])
    return np.sort(np.concatenate(kept)) if kept else np.zeros(0, np.int64)
