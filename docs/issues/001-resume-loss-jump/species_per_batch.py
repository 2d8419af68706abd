"""Distinct species per batch at a cold start and in steady state, for each set-up's train loader.

    .venv/bin/python docs/issues/001-resume-loss-jump/species_per_batch.py [RUNS_DIR]

Opens each set-up's train loader as ``birdjepa pretrain`` does (``open_train_loader``, the options of
``reproduce.SETUPS``) without training, takes the first 150 batches a cold loader yields, and prints
the distinct labels of the first ten and their mean over batches 30-149 (by then every set-up's buffer
is full). Runs after reproduce.py, which writes the data sets and ends by calling this with its runs
folder: ``RUNS_DIR`` (default ``runs/issue-001``) holds ``data-sorted/``, which the ``sorted`` and
``warming`` set-ups read (``demo`` reads the cached demo set).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
from reproduce import SETUPS  # this folder is on sys.path when the script runs

from birdjepa.data import DataConfig, open_train_loader, resolve_files, take
from birdjepa.synthetic.demo import ensure_demo_data

SHOWN = ("demo", "sorted", "warming")  # epoch0 is about replayed clips, not species


def species_per_batch(train: Path, loader_options: dict[str, int], batches: int = 150) -> np.ndarray:
    data = dataclasses.replace(DataConfig(), **loader_options)
    loader, _ = open_train_loader(resolve_files(train), data, seed=0, augment=True, state=None, resumed=False)
    return np.array([len(set(b["label"].tolist())) for b in take(loader, batches)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = Path("runs/issue-001")
    p.add_argument("runs_dir", metavar="RUNS_DIR", type=Path, nargs="?", default=default,
                   help="reproduce.py's runs folder, with data-sorted/ (default: %(default)s)")  # fmt: skip
    runs = p.parse_args().runs_dir
    for name in SHOWN:
        setup = SETUPS[name]
        root = ensure_demo_data() if setup.data is None else runs / f"data-{setup.data}"
        counts = species_per_batch(root / "train", setup.loader)
        print(f"{name}: first ten {counts[:10].tolist()}, mean over batches 30-149 {counts[30:].mean():.2f}")


if __name__ == "__main__":
    main()
