"""What do frozen embeddings carry: the recording's loudness or its species?

    .venv/bin/python docs/issues/002-pretraining-learns/what_it_encodes.py [RUN ...] > table.md

For each run's newest checkpoint: embed the train split (centre crops, as ``birdjepa evaluate``),
standardise each feature, and split the total variance into the part a linear function of the clip's
loudness explains (the mean of its log-mel crop) and the part the species explains (the variance of
the class means). Prints a markdown table: rows encoder / random init / raw log-mel for each run (no
runs: its header only); reproduce.py calls it and appends the table to ``results.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np

from birdjepa.data import Loader
from birdjepa.evaluation.cli import embed_splits, restore_run
from birdjepa.train.determinism import deterministic_xla


def shares(x: np.ndarray, loudness: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(variance share explained linearly by loudness, variance share of the species means)."""
    x = x.astype(np.float64)
    x = (x - x.mean(0)) / (x.std(0) + 1e-9)
    total = np.square(x).sum()
    t = (loudness - loudness.mean()) / loudness.std()
    by_loudness = np.square(np.outer(t, x.T @ t / (t @ t))).sum() / total
    means = np.stack([x[labels == c].mean(0) for c in np.unique(labels)])
    by_species = np.square(means[np.searchsorted(np.unique(labels), labels)]).sum() / total
    return by_loudness, by_species


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", metavar="RUN", type=Path, nargs="*", default=[],
                   help="a run directory (its newest checkpoint)")  # fmt: skip
    args = p.parse_args()
    deterministic_xla()
    print("\n## What the embeddings carry (train split, written by what_it_encodes.py)\n")
    print("| run | features | variance explained by loudness | by species |\n|---|---|---:|---:|")
    for run in args.runs:
        with contextlib.redirect_stdout(sys.stderr):  # the restore's CKPT_RESTORE line: not a table row
            r = restore_run(run)
        cfg = r.cfg
        params = {"encoder": r.params, "random init": r.random_init}
        split, _ = embed_splits(r.train_files, r.eval_files[:1], params, r.model_cfg, cfg.data.features,
                                seed=cfg.seed, batch_size=cfg.data.batch_size, n_workers=2)  # fmt: skip
        loader = Loader(r.train_files, seed=cfg.seed, batch_size=32, train=False, features=cfg.data.features)
        with loader:
            loudness = np.concatenate([b["spectrogram"].mean(axis=(1, 2)) for b in loader])
        for name in ("encoder", "random init", "raw"):
            by_loudness, by_species = shares(split.features[name], loudness, split.labels)
            print(f"| {run.name} | {name} | {by_loudness:.3f} | {by_species:.3f} |")


if __name__ == "__main__":
    main()
