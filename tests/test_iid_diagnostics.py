"""IID loader diagnostics: hand-computed values, a sequential loader against the IID null, exact resume."""

from __future__ import annotations

import json
import math
from collections import Counter, deque

import numpy as np
import pytest

from birdjepa.diagnostics.iid import IidMonitor, _hash64, iid_null, shard_of

P = "dataloader/"
HASH_MULT = 0x9E3779B97F4A7C15


def py_hash(i: int, bits: int) -> int:
    """Top `bits` bits of the wrapping uint64 Fibonacci hash, in plain Python ints."""
    return ((i * HASH_MULT) % (1 << 64)) >> (64 - bits)


def py_chi2(buckets: list[int], shares: list[int], n: int) -> float:
    b = len(buckets)
    cnt = Counter(buckets)
    return sum((cnt[k] - b * s / n) ** 2 / (b * s / n) for k, s in enumerate(shares) if s > 0)


def py_overlap(a: list[int], b: list[int]) -> int:
    ca, cb = Counter(a), Counter(b)
    return sum(min(ca[k], cb[k]) for k in ca)


def test_hand_computed_small_case() -> None:
    n, sizes = 512, [128, 128, 128, 128]
    mon = IidMonitor(n, sizes, normalise=False)
    b1 = [0, 1, 256, 511]
    m1 = mon.update(np.array(b1), np.array([0, 0, 2, 3]))
    # mod buckets {0: 2, 1: 1, 255: 1}, div buckets (i // 2) {0: 2, 128: 1, 255: 1}; every bucket holds
    # 2 of the 512 indices, e = 4 * 2 / 512 = 1/64: chi2 = Σ c²/e - 2B + B = 6 * 64 - 4 = 380 (exact).
    assert m1[P + "bucket_chi2/mod"] == 380.0
    assert m1[P + "bucket_chi2/div"] == 380.0
    hash_shares = [0] * 256
    for i in range(n):
        hash_shares[py_hash(i, 8)] += 1
    assert m1[P + "bucket_chi2/hash"] == pytest.approx(
        py_chi2([py_hash(i, 8) for i in b1], hash_shares, n), rel=1e-12
    )
    # shards [2, 0, 1, 1], e = 4 * 128 / 512 = 1: chi2 = 1 + 1 + 0 + 0
    assert m1[P + "shard_chi2"] == 2.0
    assert m1[P + "unique_in_batch"] == 4.0
    assert m1[P + "batch_size"] == 4.0
    # no previous batch: lag-1 and overlaps are 0 by definition
    for k in ("bucket_lag1/mod", "bucket_lag1/div", "bucket_lag1/hash", "shard_lag1"):
        assert m1[P + k] == 0.0
    assert m1[P + "overlap_prev"] == 0.0 and m1[P + "overlap_prev_iid_expected"] == 0.0
    assert m1[P + "hash_overlap_prev"] == 0.0
    assert m1[P + "window_unique"] == 4.0 and m1[P + "window_batches"] == 1.0

    b2 = [0, 0, 5, 300]
    m2 = mon.update(np.array(b2), np.array([0, 0, 0, 2]))
    assert m2[P + "unique_in_batch"] == 3.0
    assert m2[P + "overlap_prev"] == 1.0  # only index 0: min(1, 2)
    # N Σ_k P(X ≥ k)², X ~ Bin(4, 1/512), from the binomial's terms (about 16 / 512); summed in another
    # order than the monitor's: equal to 1e-12.
    q = 511 / 512
    pmf = [math.comb(4, j) * (1 / 512) ** j * q ** (4 - j) for j in range(5)]
    at_least = [sum(pmf[j:]) for j in range(1, 5)]
    assert m2[P + "overlap_prev_iid_expected"] == pytest.approx(512 * sum(a * a for a in at_least), rel=1e-12)
    assert m2[P + "hash_overlap_prev"] == float(
        py_overlap([py_hash(i, 12) for i in b1], [py_hash(i, 12) for i in b2])
    )
    # mod {0: 2, 5: 1, 44: 1} -> 380; div {0: 2, 2: 1, 150: 1} -> 380
    assert m2[P + "bucket_chi2/mod"] == 380.0
    assert m2[P + "bucket_chi2/div"] == 380.0
    # shards [3, 0, 1, 0]: 4 + 1 + 0 + 1
    assert m2[P + "shard_chi2"] == 6.0
    # shard lag-1: x = [3,0,1,0] - 1, y = [2,0,1,1] - 1 -> Σxy = 3, Σx² = 6, Σy² = 2 -> 3 / sqrt(12)
    assert m2[P + "shard_lag1"] == pytest.approx(3 / math.sqrt(12), rel=1e-12)
    h1 = np.bincount(np.array(b1) % 256, minlength=256)
    h2 = np.bincount(np.array(b2) % 256, minlength=256)
    assert m2[P + "bucket_lag1/mod"] == pytest.approx(np.corrcoef(h2, h1)[0, 1], rel=1e-12)
    assert m2[P + "window_unique"] == 6.0  # {0, 1, 256, 511, 5, 300}
    assert m2[P + "window_unique_iid_expected"] == pytest.approx(512 * (1 - (511 / 512) ** 8), rel=1e-12)
    assert m2[P + "window_batches"] == 2.0


def test_hash_is_wrapping_uint64() -> None:
    big = np.array([1, 2, 1000, 2**40 + 3, 2**62 + 12345])
    assert (_hash64(big) >> np.uint64(56)).tolist() == [py_hash(int(i), 8) for i in big]


def test_non_multiple_n_expected_shares() -> None:
    # N = 1000 is not a multiple of 256: a batch holding every index exactly once has chi2 = 0 only if the
    # expected counts are the exact per-bucket shares.
    n = 1000
    mon = IidMonitor(n, [600, 400], normalise=False)
    idx = np.arange(n)
    m = mon.update(idx, shard_of(idx, [600, 400]))
    for k in ("mod", "div", "hash"):
        assert m[P + f"bucket_chi2/{k}"] == pytest.approx(0.0, abs=1e-9)
    assert m[P + "shard_chi2"] == 0.0


def test_sequential_loader_far_above_iid_null_random_stays_below() -> None:
    n, b = 20_000, 64
    sizes = [5_000] * 4
    null = iid_null(n, b, sizes, window=20, steps=200)
    assert null == iid_null(n, b, sizes, window=20, steps=200)  # deterministic
    seq = IidMonitor(n, sizes, window=20)
    rnd = IidMonitor(n, sizes, window=20)
    rng = np.random.default_rng(123)
    seq_div, rnd_div, rnd_hash, rnd_lag = [], [], [], []
    for t in range(40):
        idx = (np.arange(b) + t * b) % n
        ms = seq.update(idx, shard_of(idx, sizes))
        seq_div.append(ms[P + "bucket_chi2/div/vs_iid95"])
        idx = rng.integers(0, n, size=b)
        mr = rnd.update(idx, shard_of(idx, sizes))
        rnd_div.append(mr[P + "bucket_chi2/div/vs_iid95"])
        rnd_hash.append(mr[P + "bucket_chi2/hash/vs_iid95"])
        rnd_lag.append(mr[P + "bucket_lag1/div/vs_iid95"])
    # 64 consecutive indices all land in one or two of the 256 contiguous buckets
    assert min(seq_div) > 10.0
    assert ms[P + "shard_chi2/vs_iid95"] > 3.0
    for vals in (rnd_div, rnd_hash, rnd_lag):
        assert np.median(vals) < 1.0
        assert np.mean(np.asarray(vals) > 1.0) < 0.25  # ~5% expected
    assert abs(mr[P + "unique_in_batch/vs_iid95"] - 1.0) < 0.05


def test_repeated_batch_full_overlap_and_lag1_one() -> None:
    n, sizes = 10_000, [2_500] * 4
    mon = IidMonitor(n, sizes, normalise=False)
    idx = np.random.default_rng(7).integers(0, n, size=48)
    idx[5] = idx[6]  # a duplicate inside the batch: overlap counts it twice, as B
    sid = shard_of(idx, sizes)
    mon.update(idx, sid)
    m = mon.update(idx[::-1].copy(), sid[::-1].copy())
    assert m[P + "overlap_prev"] == 48.0
    assert m[P + "hash_overlap_prev"] == 48.0
    for k in ("bucket_lag1/mod", "bucket_lag1/div", "bucket_lag1/hash", "shard_lag1"):
        assert m[P + k] == 1.0
    assert m[P + "window_unique"] == m[P + "unique_in_batch"] == float(len(set(idx.tolist())))


def test_state_round_trip_is_exact() -> None:
    n, b, w = 3_000, 32, 7
    sizes = [1_000, 0, 1_500, 500]
    rng = np.random.default_rng(11)
    batches = []
    for t in range(25):
        idx = rng.integers(0, n, size=b - (t % 3))  # varying batch size too
        if t % 5 == 0:
            idx[: b // 2] = idx[0]  # some structure: repeats inside the batch
        batches.append((idx, shard_of(idx, sizes)))
    ref = IidMonitor(n, sizes, window=w)
    ref_out = [ref.update(*bt) for bt in batches]
    for k in (1, 3, w, 12):
        first = IidMonitor(n, sizes, window=w)
        for bt in batches[:k]:
            first.update(*bt)
        saved = json.loads(json.dumps(first.state()))
        resumed = IidMonitor(n, sizes, window=w, state=saved)
        assert [resumed.update(*bt) for bt in batches[k:]] == ref_out[k:]
    # load_state into a used monitor replaces its state completely
    other = IidMonitor(n, sizes, window=w)
    other.update(*batches[-1])
    other.load_state(saved)
    assert other.update(*batches[12]) == ref_out[12]
    with pytest.raises(ValueError, match="n_samples"):
        IidMonitor(n + 1, [*sizes[:-1], 501], window=w, state=saved)


def test_window_unique_matches_brute_force() -> None:
    n, w = 2_000, 100
    sizes = [2_000]
    mon = IidMonitor(n, sizes, window=w, normalise=False)
    rng = np.random.default_rng(3)
    ring: deque[np.ndarray] = deque(maxlen=w)
    for t in range(130):
        b = 8 + t % 5
        idx = rng.integers(0, n // 4, size=b)  # a small range: many repeats across the window
        ring.append(idx)
        m = mon.update(idx, np.zeros(b, dtype=np.int64))
        assert m[P + "window_unique"] == float(np.unique(np.concatenate(ring)).size)
        samples = sum(r.size for r in ring)
        assert m[P + "window_batches"] == float(len(ring))
        assert m[P + "window_unique_iid_expected"] == pytest.approx(
            n * (1 - (1 - 1 / n) ** samples), rel=1e-12
        )
    # one shard only: the shard histogram has a single cell, its lag-1 is 0 by definition
    assert m[P + "shard_lag1"] == 0.0 and m[P + "shard_chi2"] == 0.0


def test_rejects_bad_input() -> None:
    mon = IidMonitor(100, [50, 50], normalise=False)
    with pytest.raises(ValueError):
        mon.update(np.array([0, 100]), np.array([0, 1]))
    with pytest.raises(ValueError):
        mon.update(np.array([0, 1]), np.array([0, 2]))
    with pytest.raises(ValueError):
        mon.update(np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    with pytest.raises(ValueError):
        IidMonitor(100, [50, 49])


@pytest.mark.parametrize(("b_prev", "b", "n"), [(2, 2, 3), (3, 2, 2), (3, 3, 3), (1, 4, 1)])
def test_the_iid_overlap_of_two_batches_is_the_mean_over_every_pair_of_batches(
    b_prev: int, b: int, n: int
) -> None:
    # B_prev · B / N exceeded the batch itself as B neared N (3 · 3 / 3 = 3 of a batch of 3 that repeats
    # indices). The mean overlap over every pair of ordered batches drawn with replacement, enumerated.
    import itertools
    from collections import Counter

    from birdjepa.diagnostics.iid import iid_overlap

    def overlap(x: tuple[int, ...], y: tuple[int, ...]) -> int:
        cx, cy = Counter(x), Counter(y)
        return sum(min(cx[i], cy[i]) for i in cx)

    pairs = list(
        itertools.product(itertools.product(range(n), repeat=b_prev), itertools.product(range(n), repeat=b))
    )
    mean = sum(overlap(x, y) for x, y in pairs) / len(pairs)
    assert iid_overlap(b_prev, b, n) == pytest.approx(mean, rel=1e-12) and mean <= min(b_prev, b)


def test_the_iid_references_are_not_what_compare_tells_two_runs_apart_by() -> None:
    # Computed from the batch size and N alone: a run resumed across the exact overlap formula differed
    # from its straight twin in that reference only, and compare said the runs differ.
    from birdjepa.rundir.metrics_log import compared

    assert not compared(P + "overlap_prev_iid_expected") and not compared(P + "window_unique_iid_expected")
    assert compared(P + "overlap_prev") and compared(P + "window_unique")
