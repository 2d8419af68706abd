"""Distinct species per batch at a cold start and in steady state, for each set-up's loader.

    .venv/bin/python docs/issues/001-resume-loss-jump/species_per_batch.py [RUNS_DIR]

Reads the loader alone (no training): the first 150 batches of 16 that a cold loader of each set-up
yields, and prints the distinct labels of the first ten batches and their mean over batches 30-149
(by then every set-up's buffer is full). Runs after reproduce.py, which writes the data sets.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from birdjepa.data import Loader
from birdjepa.demo_data import ensure_demo_data

LOADERS: dict[str, tuple[str | None, dict[str, Any]]] = {  # set-up -> (data set, loader options)
    "demo": (None, {"shuffle_buffer": 1024, "interleave": 4}),
    "sorted": ("sorted", {"shuffle_buffer": 64, "interleave": 4}),
    "warming": ("sorted", {"shuffle_buffer": 1000, "shuffle_initial": 100, "interleave": 1}),
}


def species_per_batch(train: Path, batches: int = 150, **options: Any) -> np.ndarray:
    loader = Loader(train, seed=0, batch_size=16, **options)
    return np.array([len(set(b["label"].tolist())) for _, b in zip(range(batches), loader, strict=False)])


def main() -> None:
    runs = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/issue-001")
    for setup, (data, options) in LOADERS.items():
        root = ensure_demo_data() if data is None else runs / f"data-{data}"
        counts = species_per_batch(root / "train", **options)
        print(f"{setup}: first ten {counts[:10].tolist()}, mean over batches 30-149 {counts[30:].mean():.2f}")


if __name__ == "__main__":
    main()
