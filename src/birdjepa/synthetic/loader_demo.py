"""`birdjepa loader-demo`: iterate the loader over the demo set and print its throughput."""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from birdjepa.data import DEFAULTS, DataError, Loader
from birdjepa.exit_codes import USAGE
from birdjepa.synthetic.demo import ensure_demo_data


@dataclasses.dataclass(frozen=True)
class LoaderDemoConfig:
    """Iterate the train split of a data set (default: the embedded demo set) and report clips/s."""

    data: Path | None = None
    """Folder of train shards; default: the demo set, generated on first use into the cache."""
    batches: int = 40
    batch_size: int = 32
    n_workers: int = DEFAULTS["n_workers"]
    """Decode threads; 0: one per CPU this process may run on."""
    seed: int = 0


def run(cfg: LoaderDemoConfig) -> dict[str, float]:
    files = cfg.data if cfg.data is not None else ensure_demo_data() / "train"
    loader = Loader(files, seed=cfg.seed, batch_size=cfg.batch_size, n_workers=cfg.n_workers)
    print(f"loader: {len(loader)} recordings in {len(loader.files)} shards, fingerprint {loader.fingerprint}")
    start = time.perf_counter()
    first = None
    labels: set[int] = set()
    for i, batch in enumerate(loader):
        if first is None:
            first = time.perf_counter() - start
            print(
                f"first batch after {first:.2f} s: spectrogram "
                f"{batch['spectrogram'].shape} {batch['spectrogram'].dtype}"
            )
        labels.update(int(x) for x in batch["label"] if x >= 0)  # -1: an unlabelled clip, no species
        if i + 1 == cfg.batches:
            break
    elapsed = time.perf_counter() - start
    clips = cfg.batches * cfg.batch_size
    steady = (clips - cfg.batch_size) / max(elapsed - (first or 0.0), 1e-9)
    diag = loader.diagnostics()
    print(
        f"{clips} clips in {elapsed:.2f} s: {clips / elapsed:.0f} clips/s overall, "
        f"{steady:.0f} clips/s after the first batch, {loader.n_workers} workers; "
        f"{len(labels)} species seen; skipped {diag['counters']['skipped']}"
    )
    state = loader.state()
    print(
        f"state after {state['counters']['batches']} batches: epoch {state['plan']['epoch']}, "
        f"position {state['plan']['position']}, {len(state['plan']['buffer'])} buffered indices"
    )
    return {"clips_per_s": clips / elapsed, "first_batch_s": float(np.float64(first or 0.0))}


def cli(config: Annotated[LoaderDemoConfig, tyro.conf.OmitArgPrefixes] = LoaderDemoConfig()) -> None:
    """Iterate the loader over the demo set (generated on first use) and print its throughput."""
    # --batches below 1: the loop ends at a batch count it never reaches, so it ran forever.
    for option, value, least in (("batches", config.batches, 1), ("batch-size", config.batch_size, 1),
                                 ("n-workers", config.n_workers, 0)):  # fmt: skip
        if value < least:
            print(f"error: --{option} {value}: must be >= {least}", file=sys.stderr, flush=True)
            raise SystemExit(USAGE)
    try:
        run(config)
    except (DataError, ValueError) as e:  # a folder that holds no shards, a batch size of 0, ...
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE) from None
