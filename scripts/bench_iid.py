"""Cost of the IID loader diagnostics per training step.

    python scripts/bench_iid.py [--n-samples 1000000] [--shards 64] [--steps 500]

For B = 256 and B = 2048 prints the mean microseconds of one ``IidMonitor.update`` (window of 100,
full, normalised keys included) next to a trivially comparable baseline, ``np.sort`` of the same
batch, and as a fraction of a 100 ms training step. The one-off costs (constructing the monitor,
simulating the IID null for that batch size) are printed separately.
"""

# ruff: noqa: E402  (the BLAS thread count must be set before numpy is imported)
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import time

import numpy as np

from birdjepa.diagnostics.iid import IidMonitor, _bucket_shares, _iid_null, iid_null, shard_of

STEP_MS = 100.0


def bench(n: int, sizes: list[int], b: int, steps: int, window: int) -> dict[str, float]:
    rng = np.random.default_rng(b)
    batches = []
    for _ in range(window + steps):
        idx = rng.integers(0, n, size=b, dtype=np.int64)
        batches.append((idx, shard_of(idx, sizes)))

    _bucket_shares.cache_clear()
    _iid_null.cache_clear()
    t0 = time.perf_counter()
    mon = IidMonitor(n, sizes, window)
    t1 = time.perf_counter()
    iid_null(n, b, sizes, window)
    t2 = time.perf_counter()
    for bt in batches[:window]:  # fill the window: the steady state costs the subtraction too
        mon.update(*bt)
    t3 = time.perf_counter()
    for bt in batches[window:]:
        mon.update(*bt)
    t4 = time.perf_counter()
    for idx, _ in batches[window:]:
        np.sort(idx)
    t5 = time.perf_counter()
    return {
        "construct_ms": (t1 - t0) * 1e3,
        "null_ms": (t2 - t1) * 1e3,
        "fill_us": (t3 - t2) / window * 1e6,
        "update_us": (t4 - t3) / steps * 1e6,
        "sort_us": (t5 - t4) / steps * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-samples", type=int, default=1_000_000)
    ap.add_argument("--shards", type=int, default=64)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--window", type=int, default=100)
    args = ap.parse_args()
    n, k = args.n_samples, args.shards
    sizes = [n // k + (s < n % k) for s in range(k)]
    print(f"N = {n:,}, {k} shards, window {args.window}, {args.steps} timed steps (after a full window)")
    print(
        f"{'B':>6} {'update us':>10} {'np.sort us':>11} {'ratio':>7} {'% of 100ms':>11}"
        f" {'fill us':>8} {'construct ms':>13} {'null ms':>8}"
    )
    for b in (256, 2048):
        r = bench(n, sizes, b, args.steps, args.window)
        print(
            f"{b:>6} {r['update_us']:>10.1f} {r['sort_us']:>11.1f} {r['update_us'] / r['sort_us']:>7.1f}"
            f" {r['update_us'] / (STEP_MS * 1e3) * 100:>10.3f}% {r['fill_us']:>8.1f}"
            f" {r['construct_ms']:>13.1f} {r['null_ms']:>8.1f}"
        )


if __name__ == "__main__":
    main()
