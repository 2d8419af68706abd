"""How far is the loader's sample stream from IID? Cheap per-step metrics from ``index`` and ``shard_id``.

A pure module: ``IidMonitor.update(index, shard_id)`` takes one batch's int64 ``index`` (global sample
index in ``[0, N)``) and ``shard_id`` (int64, shard ``s`` holding ``shard_sizes[s]`` samples) and
returns a flat ``dict[str, float]``. Its state is a JSON-able dict (about ``window · B`` ints), so a run
restored from a checkpoint gives on its first step exactly (``==``) the values the uninterrupted run
would have.

Metrics (``B`` = this batch's size, ``N`` = number of samples; IID = every index drawn uniformly with
replacement from ``[0, N)``):

``dataloader/batch_size``
    ``B``.
``dataloader/unique_in_batch``
    Distinct indices in the batch. IID expectation ``N·(1-(1-1/N)^B)`` (about ``B`` when ``B² << N``).
``dataloader/bucket_chi2/{mod,div,hash}``
    Pearson chi-squared of the batch over 256 buckets: ``Σ (count - e)² / e`` with
    ``e = B · (number of the N indices in the bucket) / N`` (exact shares, so ``N`` need not be a
    multiple of 256; buckets no index falls in are left out). Bucketings: ``mod`` = ``index % 256``
    (catches strided reads), ``div`` = ``index * 256 // N`` (catches contiguous, i.e. unshuffled or
    shard-local, reads), ``hash`` = top 8 bits of ``index * 0x9E3779B97F4A7C15`` in wrapping uint64
    (Fibonacci hashing; insensitive to any arithmetic structure, so only catches non-uniform mass).
    IID: chi-squared with ``k - 1 = 255`` degrees of freedom, mean ~255 (for ``B`` large enough).
``dataloader/bucket_lag1/{mod,div,hash}``
    Pearson correlation between this batch's 256-bucket histogram and the previous batch's:
    consecutive batches drawing from the same region. IID: about 0. Defined as 0.0 when there is no
    previous batch (first step of a fresh monitor) or either histogram is constant (zero variance).
``dataloader/shard_chi2``, ``dataloader/shard_lag1``
    The same two statistics over shards, with ``e = B · shard_size / N`` (empty shards left out).
    IID: chi-squared with (non-empty shards - 1) degrees of freedom; lag-1 about 0.
``dataloader/overlap_prev``
    Exact multiset overlap with the previous batch, ``Σ_i min(count_prev(i), count_now(i))``.
``dataloader/overlap_prev_iid_expected``
    Its IID expectation, ``N · Σ_k P(X ≥ k) P(Y ≥ k)`` with ``X ~ Bin(B_prev, 1/N)`` and
    ``Y ~ Bin(B, 1/N)`` (about ``B_prev · B / N`` while that is small; ``B² / N`` exceeded the batch
    itself as ``B`` neared ``N``; 0 with no previous batch). Not normalised (a reference, not a
    measurement).
``dataloader/hash_overlap_prev``
    The same multiset overlap on 4096 hash buckets (top 12 bits of the hash above): coarse overlap,
    non-zero for IID as soon as ``B² / 4096`` is not small, so it reacts to mild locality too.
``dataloader/window_unique``
    Distinct indices over the last ``W`` batches (this one included; ``W = window``, 100 by default).
``dataloader/window_unique_iid_expected``
    ``N·(1-(1-1/N)^(S))`` with ``S`` = samples in the window (``W'·B`` with ``W'`` batches in the
    window at a constant batch size). Not normalised.
``dataloader/window_batches``
    ``W'``, batches currently in the window (``min(steps, W)``). Not normalised.

Normalised copies: every measurement above except ``batch_size`` (always 1 against a null drawn at the
same batch size) and the three reference keys is also logged as ``<key>/vs_iid95 = value / p95``, with
``p95`` the 95th percentile of that metric over simulated IID batches of the same ``N``, ``B`` and shard
sizes (`iid_null`). For "high is bad" metrics (chi2, lag1, overlaps) IID exceeds 1 one step in 20, and a
value well above 1 on most steps means a non-IID stream; for the unique counts (where low is bad) IID
sits just below 1 and a repetitive stream well below. The null describes a full window (see `iid_null`),
so during the first ``W`` steps ``window_unique/vs_iid95`` is below 1 by construction: compare
``window_unique`` with ``window_unique_iid_expected`` there. A non-positive ``p95`` (e.g. the exact
overlap when ``B² << N``, which IID almost never hits) is replaced by 1.0 so ratios stay finite.

Cost: O(B log B) per step (one sort of the batch, one ``bincount`` for all bucketings, one
``searchsorted`` for the overlap; the three bucketings are one [3, 256] array so numpy's per-call
overhead, which dominates at these sizes, is paid once). The window count is incremental: a dense int32
count per sample (4 MB per million samples; chosen over a dict, which would cost a Python loop per step;
past ~10^8 samples a sparse structure would be worth its slowness) gets the entering batch added and the
leaving batch subtracted, and the number of non-zero counts is kept alongside, so the window costs O(B)
per step and not O(W·B log). Construction costs O(N) once (the exact hash-bucket shares, cached per
``N``, and the count array); the first ``update`` at a new batch size also simulates its IID null
(`iid_null`, ~0.1-0.3 s at N = 1M; call it beforehand to move that out of the first step).
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

PREFIX = "dataloader/"
N_BUCKETS = 256
N_HASH_OVERLAP_BUCKETS = 4096
HASH_MULT = np.uint64(0x9E3779B97F4A7C15)  # 2^64 / golden ratio, odd: a bijection on uint64
_SHIFT_256 = np.uint64(64 - 8)
_SHIFT_4096 = np.uint64(64 - 12)
BUCKETINGS = ("mod", "div", "hash")
STATE_VERSION = 1
# Reference values: logged as they are, never divided by a simulated percentile.
_NOT_NORMALISED = frozenset(
    PREFIX + k
    for k in ("batch_size", "overlap_prev_iid_expected", "window_unique_iid_expected", "window_batches")
)


def _hash64(index: np.ndarray) -> np.ndarray:
    """``index * 0x9E3779B97F4A7C15`` mod 2^64 (numpy uint64 array multiply wraps without warning)."""
    return index.astype(np.uint64) * HASH_MULT


@functools.lru_cache(maxsize=64)
def iid_overlap(b_prev: int, b: int, n: int) -> float:
    """The expected multiset overlap ``Σ_i min(X_i, Y_i)`` of two batches of ``b_prev`` and ``b`` indices
    drawn uniformly with replacement from ``n``: ``n · Σ_k P(X_i ≥ k) P(Y_i ≥ k)``, each count binomial."""
    k = min(b_prev, b)
    if k == 0:
        return 0.0
    return n * float(np.dot(_at_least(b_prev, n)[1 : k + 1], _at_least(b, n)[1 : k + 1]))


def _at_least(m: int, n: int) -> np.ndarray:
    """``P(X ≥ k)`` for ``k = 0..m``, ``X ~ Bin(m, 1/n)``: summed from the smallest term up."""
    if n == 1:
        return np.ones(m + 1)
    k = np.arange(m + 1)
    log_choose = np.array([math.lgamma(m + 1) - math.lgamma(j + 1) - math.lgamma(m - j + 1) for j in k])
    pmf = np.exp(log_choose - k * math.log(n) + (m - k) * math.log1p(-1 / n))
    return np.cumsum(pmf[::-1])[::-1]


@functools.lru_cache(maxsize=8)
def _bucket_shares(n_samples: int) -> np.ndarray:
    """How many of the N indices fall in each of the 256 buckets: int64 [3, 256], rows as BUCKETINGS."""
    b = np.arange(N_BUCKETS + 1, dtype=np.int64)
    # index i is in mod bucket b for i = b, b + 256, ... < N
    mod = n_samples // N_BUCKETS + (b[:-1] < n_samples % N_BUCKETS)
    # i * 256 // N == b  <=>  ceil(b N / 256) <= i < ceil((b + 1) N / 256)
    div = np.diff(-((-b * n_samples) // N_BUCKETS))
    # The hash has no closed form: count all N indices once, in chunks to bound memory.
    hsh = np.zeros(N_BUCKETS, dtype=np.int64)
    chunk = 1 << 21
    for start in range(0, n_samples, chunk):
        idx = np.arange(start, min(start + chunk, n_samples), dtype=np.uint64)
        hsh += np.bincount((idx * HASH_MULT) >> _SHIFT_256, minlength=N_BUCKETS)
    shares = np.stack([mod, div, hsh]).astype(np.int64)
    shares.setflags(write=False)
    return shares


class _Cells:
    """Chi-squared and lag-1 correlation over the rows of [k, m] histograms with fixed cell shares.

    Vectorised over rows (the three bucketings are one [3, 256] array) because at these sizes the
    per-call overhead of numpy, not arithmetic, is the cost.
    """

    def __init__(self, shares: np.ndarray, n_samples: int) -> None:
        self.frac = shares / n_samples  # e / B
        # (c - e)² / e = (c - e)² · (N / share) / B; empty cells (share 0) can only hold c = e = 0
        self.inv = np.divide(n_samples, shares, out=np.zeros(shares.shape), where=shares > 0)

    def chi2(self, hist: np.ndarray, bsz: int) -> np.ndarray:
        d = hist - bsz * self.frac
        return (d * d * self.inv).sum(axis=1) / bsz

    @staticmethod
    def centred(hist: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows minus their means, and the rows' sums of squares (kept for the next step's lag-1)."""
        a = hist - hist.mean(axis=1, keepdims=True)
        return a, np.einsum("ij,ij->i", a, a)

    @staticmethod
    def lag1(now: tuple[np.ndarray, np.ndarray], prev: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        """Pearson correlation per row; 0.0 with no previous histogram or a zero-variance row."""
        a, saa = now
        if prev is None:
            return np.zeros(saa.shape)
        b, sbb = prev
        den = np.sqrt(saa * sbb)
        r = np.divide(np.einsum("ij,ij->i", a, b), den, out=np.zeros(den.shape), where=den > 0)
        return np.clip(r, -1.0, 1.0)


def _multiset_overlap(u1: np.ndarray, c1: np.ndarray, u2: np.ndarray, c2: np.ndarray) -> int:
    """``Σ min(c1, c2)`` over values present in both sorted-unique arrays ``u1`` and ``u2``."""
    pos = np.minimum(np.searchsorted(u1, u2), u1.size - 1)
    hit = u1[pos] == u2
    return int(np.minimum(c1[pos[hit]], c2[hit]).sum())


def _unique_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct values and their counts (np.unique's work without its generic overhead)."""
    s = np.sort(values)
    first = np.empty(s.size, dtype=bool)
    first[:1] = True
    np.not_equal(s[1:], s[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    counts = np.diff(np.append(starts, s.size))
    return s[starts], counts


def _as_index(a: Any, name: str) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    return arr.astype(np.int64, copy=False)


class _Hists(NamedTuple):
    """One batch's histograms, as kept for the next step's lag-1 and overlap metrics."""

    buckets: np.ndarray  # int64 [3, 256], rows as BUCKETINGS
    buckets_c: tuple[np.ndarray, np.ndarray]  # centred rows and their sums of squares
    shards: np.ndarray  # int64 [1, n_shards]
    shards_c: tuple[np.ndarray, np.ndarray]
    hash4096: np.ndarray  # int64 [4096]


class IidMonitor:
    """Per-step IID diagnostics of the loader's sample stream (see the module docstring for metrics).

    ``update`` once per training step with the batch's ``index`` and ``shard_id``; save ``state()``
    with the checkpoint and pass it back as ``state=`` (or to ``load_state``) on restore, so the
    first restored step still has its previous batch and its window. ``normalise=False`` skips the
    ``/vs_iid95`` keys (and the IID simulation they need).
    """

    def __init__(
        self,
        n_samples: int,
        shard_sizes: Sequence[int],
        window: int = 100,
        *,
        normalise: bool = True,
        state: dict[str, Any] | None = None,
    ) -> None:
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        sizes = np.asarray([int(s) for s in shard_sizes], dtype=np.int64)
        if sizes.size == 0 or (sizes < 0).any() or int(sizes.sum()) != n_samples:
            raise ValueError(f"shard sizes must be >= 0 and sum to n_samples={n_samples}")
        self.n_samples = int(n_samples)
        self.shard_sizes = tuple(int(s) for s in sizes)
        self.window = int(window)
        self.normalise = normalise
        self._buckets = _Cells(_bucket_shares(self.n_samples), self.n_samples)
        self._shards = _Cells(sizes[None, :], self.n_samples)
        self._null: dict[int, dict[str, float]] = {}  # p95 per batch size (a short last batch differs)
        self._reset()
        if state is not None:
            self.load_state(state)

    def _reset(self) -> None:
        self._steps = 0
        # ring of the last `window` batches as (sorted distinct indices, counts); the last one is the
        # previous batch, whose histograms are also kept (`_prev`) for the lag-1 and overlap metrics
        self._ring: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._ring_samples = 0
        self._win_counts = np.zeros(self.n_samples, dtype=np.int32)
        self._win_unique = 0
        self._prev: _Hists | None = None

    def _histograms(self, index: np.ndarray, shard_hist: np.ndarray) -> _Hists:
        """Histograms of one batch (its indices in any order): all bucketings in one bincount."""
        h = _hash64(index)
        keys = np.concatenate(
            [
                index % N_BUCKETS,
                N_BUCKETS + index * N_BUCKETS // self.n_samples,
                (2 * N_BUCKETS + (h >> _SHIFT_256)).astype(np.int64),
                (3 * N_BUCKETS + (h >> _SHIFT_4096)).astype(np.int64),
            ]
        )
        counts = np.bincount(keys, minlength=3 * N_BUCKETS + N_HASH_OVERLAP_BUCKETS)
        buckets = counts[: 3 * N_BUCKETS].reshape(3, N_BUCKETS)
        shards = shard_hist[None, :]
        return _Hists(
            buckets, _Cells.centred(buckets), shards, _Cells.centred(shards), counts[3 * N_BUCKETS :]
        )

    def _push(self, uniq: np.ndarray, counts: np.ndarray) -> None:
        """Add a batch to the window, dropping the oldest first when the ring is full."""
        if len(self._ring) == self.window:
            old_u, old_c = self._ring.popleft()
            after = self._win_counts[old_u] - old_c
            self._win_counts[old_u] = after
            self._win_unique -= int(np.count_nonzero(after == 0))
            self._ring_samples -= int(old_c.sum())
        before = self._win_counts[uniq]
        self._win_unique += int(np.count_nonzero(before == 0))
        self._win_counts[uniq] = before + counts
        self._ring.append((uniq, counts))
        self._ring_samples += int(counts.sum())

    def update(self, index: Any, shard_id: Any) -> dict[str, float]:
        """Metrics of one batch (int arrays of equal length B >= 1), advancing the monitor's state."""
        index = _as_index(index, "index")
        shard_id = _as_index(shard_id, "shard_id")
        bsz = int(index.size)
        if bsz == 0 or shard_id.size != bsz:
            raise ValueError(
                f"need a non-empty batch with len(index) == len(shard_id), got {bsz}, {shard_id.size}"
            )
        if int(index.min()) < 0 or int(index.max()) >= self.n_samples:
            raise ValueError(f"index outside [0, {self.n_samples})")
        if int(shard_id.min()) < 0 or int(shard_id.max()) >= len(self.shard_sizes):
            raise ValueError(f"shard_id outside [0, {len(self.shard_sizes)})")

        uniq, counts = _unique_counts(index)
        shard_hist = np.bincount(shard_id, minlength=len(self.shard_sizes))
        hist = self._histograms(index, shard_hist)
        prev = self._prev
        prev_bsz = int(self._ring[-1][1].sum()) if self._ring else 0

        m: dict[str, float] = {
            PREFIX + "batch_size": float(bsz),
            PREFIX + "unique_in_batch": float(uniq.size),
        }
        chi2 = self._buckets.chi2(hist.buckets, bsz).tolist()
        lag1 = _Cells.lag1(hist.buckets_c, None if prev is None else prev.buckets_c).tolist()
        for k, v in zip(BUCKETINGS, chi2, strict=True):
            m[f"{PREFIX}bucket_chi2/{k}"] = v
        for k, v in zip(BUCKETINGS, lag1, strict=True):
            m[f"{PREFIX}bucket_lag1/{k}"] = v
        m[PREFIX + "shard_chi2"] = float(self._shards.chi2(hist.shards, bsz)[0])
        m[PREFIX + "shard_lag1"] = float(
            _Cells.lag1(hist.shards_c, None if prev is None else prev.shards_c)[0]
        )
        if self._ring:
            pu, pc = self._ring[-1]
            m[PREFIX + "overlap_prev"] = float(_multiset_overlap(pu, pc, uniq, counts))
        else:
            m[PREFIX + "overlap_prev"] = 0.0
        m[PREFIX + "overlap_prev_iid_expected"] = iid_overlap(prev_bsz, bsz, self.n_samples)
        m[PREFIX + "hash_overlap_prev"] = (
            0.0 if prev is None else float(np.minimum(prev.hash4096, hist.hash4096).sum())
        )

        self._push(uniq, counts)
        self._prev = hist
        self._steps += 1
        m[PREFIX + "window_unique"] = float(self._win_unique)
        # N (1 - (1 - 1/N)^S) without cancellation for large N
        m[PREFIX + "window_unique_iid_expected"] = -self.n_samples * math.expm1(
            self._ring_samples * math.log1p(-1.0 / self.n_samples) if self.n_samples > 1 else -math.inf
        )
        m[PREFIX + "window_batches"] = float(len(self._ring))

        if self.normalise:
            null = self._null.get(bsz)
            if null is None:
                null = self._null[bsz] = iid_null(self.n_samples, bsz, self.shard_sizes, self.window)
            for key in [k for k in m if k not in _NOT_NORMALISED]:
                p95 = null[key]
                m[key + "/vs_iid95"] = m[key] / (p95 if p95 > 0 else 1.0)
        return m

    def state(self) -> dict[str, Any]:
        """JSON-able state: the configuration, the step count, the window's batches (oldest first,
        each as its sorted indices; the last is the previous batch) and the previous shard histogram.
        Size ~ ``window · B`` ints. The bucket histograms and window counts are rebuilt from these."""
        prev_shard = None if self._prev is None else self._prev.shards[0].tolist()
        return {
            "version": STATE_VERSION,
            "n_samples": self.n_samples,
            "shard_sizes": list(self.shard_sizes),
            "window": self.window,
            "steps": self._steps,
            "ring": [np.repeat(u, c).tolist() for u, c in self._ring],
            "prev_shard_hist": prev_shard,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore a ``state()`` (e.g. after ``json.loads``); the configuration must match."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unknown IidMonitor state version {state.get('version')!r}")
        cfg = (state["n_samples"], tuple(state["shard_sizes"]), state["window"])
        if cfg != (self.n_samples, self.shard_sizes, self.window):
            raise ValueError(
                f"state is for (n_samples, shard_sizes, window) = {cfg}, "
                f"this monitor has {(self.n_samples, self.shard_sizes, self.window)}"
            )
        ring = state["ring"]
        if len(ring) > self.window or (state["prev_shard_hist"] is None) != (len(ring) == 0):
            raise ValueError("inconsistent IidMonitor state")
        self._reset()
        for batch in ring:
            self._push(*_unique_counts(np.asarray(batch, dtype=np.int64)))
        if ring:
            shard_hist = np.asarray(state["prev_shard_hist"], dtype=np.int64)
            prev_index = np.repeat(*self._ring[-1])
            self._prev = self._histograms(prev_index, shard_hist)
        self._steps = int(state["steps"])


def shard_of(index: np.ndarray, shard_sizes: Sequence[int]) -> np.ndarray:
    """Shard id of each global index when shards hold contiguous index ranges in order."""
    return np.searchsorted(np.cumsum(np.asarray(shard_sizes, dtype=np.int64)), index, side="right")


def iid_null(
    n_samples: int,
    batch_size: int,
    shard_sizes: Sequence[int],
    window: int = 100,
    steps: int = 200,
    seed: int = 0,
) -> dict[str, float]:
    """95th percentile of each metric over simulated IID batches of the same N, B and shard sizes.

    Indices are drawn uniformly with replacement from ``[0, N)`` (``np.random.default_rng(seed)``),
    shard ids from contiguous shards of the given sizes. ``window`` warm-up batches fill the window
    first, then ``steps`` batches are measured: the null is the steady state of a long run.
    Deterministic and cached in memory per argument tuple (~``(window + steps)`` updates, tens of ms).
    """
    return dict(
        _iid_null(int(n_samples), int(batch_size), tuple(int(s) for s in shard_sizes), window, steps, seed)
    )


@functools.lru_cache(maxsize=32)
def _iid_null(
    n_samples: int, batch_size: int, shard_sizes: tuple[int, ...], window: int, steps: int, seed: int
) -> tuple[tuple[str, float], ...]:
    if batch_size < 1 or steps < 1:
        raise ValueError(f"batch_size and steps must be >= 1, got {batch_size}, {steps}")
    rng = np.random.default_rng(seed)
    mon = IidMonitor(n_samples, shard_sizes, window, normalise=False)
    rows: list[dict[str, float]] = []
    for t in range(window + steps):
        index = rng.integers(0, n_samples, size=batch_size, dtype=np.int64)
        m = mon.update(index, shard_of(index, shard_sizes))
        if t >= window:
            rows.append(m)
    return tuple((k, float(np.percentile([r[k] for r in rows], 95))) for k in rows[0])
