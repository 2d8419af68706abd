"""Features of every clip of a split, from one ordered pass of an eval-mode loader.

Eval mode takes one crop per recording (its window's start where the row has one, else its centre; no
averaging over crops), with no masks, so a clip's features depend only on the recording and the encoder.
One pass feeds every encoder being compared (trained, random init) and the raw log-mel baseline, so each
decodes the audio once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from birdjepa.data import Loader

#: ``spectrogram [B, T, M] -> embedding [B, D]`` for one fixed batch size.
Encode = Callable[[np.ndarray], np.ndarray]
RAW = "raw"


@dataclasses.dataclass(frozen=True)
class Split:
    features: dict[str, np.ndarray]
    """Name -> [N, D] float32, one row per labelled clip, in loader order."""
    labels: np.ndarray
    """[N] int64."""
    skipped_unlabelled: int
    fingerprint: str = ""
    """The data set's fingerprint (`birdjepa.data.Loader.fingerprint`): equal ones hold the same data."""
    unreadable: tuple[int, tuple[str, ...]] = (0, ())
    """Records of the pass the loader could not read: their count, and ``FILE row R: REASON`` of each
    (`birdjepa.data.Loader.skipped_since`)."""


def raw_features(spectrogram: np.ndarray) -> np.ndarray:
    """The baseline with nothing learned: per clip, the mean and the std over time of every mel bin
    (``[B, T, M] -> [B, 2M]``)."""
    x = np.asarray(spectrogram, np.float64)
    return np.concatenate([x.mean(axis=1), x.std(axis=1)], axis=1).astype(np.float32)


def batched(apply: Callable[[np.ndarray], Any], batch_size: int) -> Encode:
    """``apply`` on batches padded to ``batch_size`` (so the last, short batch compiles nothing new)."""

    def encode(x: np.ndarray) -> np.ndarray:
        n = len(x)
        if n < batch_size:
            x = np.concatenate([x, np.zeros((batch_size - n, *x.shape[1:]), x.dtype)])
        return np.asarray(apply(x), np.float32)[:n]

    return encode


def embed_split(loader: Loader, encoders: Mapping[str, Encode], raw: bool = True) -> Split:
    """One pass of an eval-mode ``loader``: each encoder's features (and the raw baseline's when
    ``raw``) for every labelled clip; unlabelled clips (label -1) are counted and left out."""
    if loader.train:
        raise ValueError("embed_split needs an eval-mode loader (train=False): one pass, one crop a row")
    parts: dict[str, list[np.ndarray]] = {name: [] for name in [*encoders, *([RAW] if raw else [])]}
    labels: list[np.ndarray] = []
    skipped = 0
    before = loader.diagnostics()["counters"]["skipped"]
    for batch in loader:
        keep = batch["label"] >= 0
        skipped += int((~keep).sum())
        spec = batch["spectrogram"]
        for name, encode in encoders.items():
            parts[name].append(encode(spec)[keep])
        if raw:
            parts[RAW].append(raw_features(spec[keep]))
        labels.append(batch["label"][keep])
    features = {name: np.concatenate(p) if p else np.zeros((0, 0), np.float32) for name, p in parts.items()}
    label_array = np.concatenate(labels).astype(np.int64) if labels else np.zeros(0, np.int64)
    now, lines = loader.skipped_since(before)
    return Split(features, label_array, skipped, loader.fingerprint, (now - before, tuple(lines)))
