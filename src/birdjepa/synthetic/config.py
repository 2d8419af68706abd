"""What a synthetic set is drawn from: `DemoConfig` (the demo set's size and seed; the scale set takes
its species table from one), `RecordingPlan` (one recording to render) and the seeded draws every
module makes (`rng_for`, `largest_remainder`, `stratified`).

The bottom of `birdjepa.synthetic`: `songs`, `channel`, `codecs` and `writer` build on it; the demo
set's presets (`DEFAULT`, `SMALL`) are in `birdjepa.synthetic.demo`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class DemoConfig:
    """Size and randomness of the synthetic set."""

    n_species: int = 16
    """Number of invented species (labels)."""
    per_species_train: int = 24
    """Recordings per species in OUT/train."""
    per_species_eval: int = 4
    """Held-out recordings per species in OUT/eval."""
    min_seconds: float = 8.0
    """Shortest recording (durations are log-uniform in [min_seconds, max_seconds])."""
    max_seconds: float = 40.0
    """Longest recording."""
    seed: int = 0
    """Seed of everything: species, songs, noise, codec/rate assignment, order."""
    shard_mb: float = 36.0
    """Target shard size in MiB (a shard is closed once its audio bytes reach it)."""
    order: Literal["shuffled", "species"] = "shuffled"
    """Row order of each split. shuffled: random; species: grouped by species as a per-species download
    (e.g. Xeno-Canto queried species by species) writes them. The recordings are the same in both."""

    def __post_init__(self) -> None:
        if not 1 <= self.n_species <= 1000:
            raise ValueError(f"n_species must be in [1, 1000], got {self.n_species}")
        if self.per_species_train < 1 or self.per_species_eval < 0:
            raise ValueError(
                f"need per_species_train >= 1 and per_species_eval >= 0, "
                f"got {self.per_species_train}, {self.per_species_eval}"
            )
        if not 1.0 <= self.min_seconds <= self.max_seconds <= 600.0:
            raise ValueError(
                f"need 1 <= min_seconds <= max_seconds <= 600, got {self.min_seconds}, {self.max_seconds}"
            )
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if not self.shard_mb > 0:  # NaN too: "cannot convert float NaN to integer", later
            raise ValueError(f"shard_mb must be positive, got {self.shard_mb}")
        if self.order not in ("shuffled", "species"):
            raise ValueError(f"order must be 'shuffled' or 'species', got {self.order!r}")


@dataclass(frozen=True)
class RecordingPlan:
    """One recording to render: its split, species, storage format, length, and the keys of its own
    generators (`entropy`)."""

    split: str
    species: int
    k: int
    recording_id: str
    codec: str
    sample_rate: int
    channels: int
    seconds: float
    entropy: tuple[int, ...]


# ---------------------------------------------------------------- randomness


def rng_for(*key: int) -> np.random.Generator:
    """A generator for one purpose, derived from integer keys (never global state)."""
    return np.random.Generator(np.random.Philox(np.random.SeedSequence(list(key))))


SPLIT_KEY = {"species": 1, "train": 2, "eval": 3, "order": 4}
"""Entropy keys: the species table (both sets sing it) and the demo set's splits and order (the scale
set's keys start at 11)."""


def largest_remainder(n: int, weights: np.ndarray) -> np.ndarray:
    """`n` split in proportion to `weights` into whole counts that sum to `n` (largest remainder)."""
    exact = n * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - counts), kind="stable")[: n - int(counts.sum())]:
        counts[i] += 1
    return counts


def stratified(n: int, mix: Mapping, rng: np.random.Generator) -> list:
    """`n` draws from `mix` with exact (largest-remainder) counts, every category at least once when
    n >= len(mix), in random order."""
    keys = list(mix)
    counts = largest_remainder(n, np.array([mix[k] for k in keys], dtype=np.float64))
    if n >= len(keys):
        for i in range(len(keys)):
            if counts[i] == 0:
                counts[int(np.argmax(counts))] -= 1
                counts[i] = 1
    out = [k for k, c in zip(keys, counts, strict=True) for _ in range(int(c))]
    return [out[i] for i in rng.permutation(n)]
