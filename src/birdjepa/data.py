"""The data loader: Arrow shards of encoded audio -> batches of log-mel spectrograms.

The work happens in Rust (`birdjepa._rs`); this module gives it a Pythonic signature. The stream of
batches is a pure function of (data set, stream options, seed, position): ``n_workers`` changes only
the speed, and ``Loader(..., state=old.state())`` continues exactly where ``old`` stopped, in any
process.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from birdjepa import _rs

DataError = _rs.DataError
StateError = _rs.StateError
WorkerError = _rs.WorkerError

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Features:
    """How a recording becomes a [n_frames, n_mels] log-mel map (Kaldi-style fbank).

    Defaults: 5 s clips at 32 kHz, n_fft 1024, 25 ms window, 10 ms hop, 128 mel bins from 20 Hz to
    Nyquist, pre-emphasis 0.97, per-frame DC removal, natural log with a floor, 512 frames,
    normalised with AudioMAE's fbank statistics. Masks (train mode only) are off by default.
    """

    target_rate: int = 32_000
    clip_seconds: float = 5.0
    n_fft: int = 1024
    win_length: int = 800
    hop_length: int = 320
    n_mels: int = 128
    f_min: float = 20.0
    f_max: float | None = None
    preemphasis: float = 0.97
    remove_dc: bool = True
    log_floor: float = float(np.finfo(np.float32).eps)
    n_frames: int = 512
    mean: float = -4.2677393
    std: float = 4.5689974
    time_mask_count: int = 0
    time_mask_width: int = 0
    freq_mask_count: int = 0
    freq_mask_width: int = 0

    def options(self) -> dict[str, Any]:
        opts = dataclasses.asdict(self)
        opts["clip_samples"] = round(opts.pop("clip_seconds") * self.target_rate)
        return opts


def resolve_files(files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """Shard paths from a list, a glob pattern or a folder (every ``*.arrow`` in it), sorted."""
    items = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    out: list[str] = []
    for item in items:
        text = os.fspath(item)
        if os.path.isdir(text):
            found = sorted(glob.glob(os.path.join(text, "*.arrow")))
        elif glob.has_magic(text):
            found = sorted(glob.glob(text))
        else:
            found = [text]
        if not found:
            raise DataError(f"no shard files match {text!r}")
        out.extend(found)
    return sorted(out)


class Loader:
    """Deterministic, exactly resumable batches.

    Each batch is a dict of numpy arrays: ``spectrogram`` float32 [B, T, M] (or [B, V, T, M] when
    ``n_views > 1``), ``label`` int64 (-1 when missing), ``index`` int64 (global sample index),
    ``shard_id`` int64 and ``epoch`` int64.

    Train mode is infinite, shuffled (per-epoch shard permutation, ``interleave`` shards read
    round-robin, a ``shuffle_buffer`` of sample indices, filled before the first draw unless
    ``shuffle_initial`` is set) with random crops. Eval mode makes one
    ordered pass with centre crops; iterating it again starts a new pass.
    """

    def __init__(
        self,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        seed: int,
        batch_size: int,
        n_workers: int = 2,
        train: bool = True,
        n_views: int = 1,
        shuffle_buffer: int = 2048,
        shuffle_initial: int | None = None,
        interleave: int = 4,
        prefetch_batches: int = 2,
        drop_last: bool = False,
        augment: bool = True,
        audio_column: str = "audio",
        label_column: str = "ebird_code",
        features: Features | None = None,
        state: dict[str, Any] | None = None,
        debug_panic_index: int | None = None,
    ) -> None:
        self.files = resolve_files(files)
        self.train = train
        options = {
            "seed": seed,
            "batch_size": batch_size,
            "n_workers": n_workers,
            "train": train,
            "n_views": n_views,
            "shuffle_buffer": shuffle_buffer,
            "shuffle_initial": shuffle_initial,
            "interleave": interleave,
            "prefetch_batches": prefetch_batches,
            "drop_last": drop_last,
            "augment": augment,
            "audio_column": audio_column,
            "label_column": label_column,
            "debug_panic_index": debug_panic_index,
            **(features or Features()).options(),
        }
        state_json = None if state is None else json.dumps(state)
        self._rs = _rs.Loader(self.files, json.dumps(options), state_json)
        self._passes = 0

    def __iter__(self) -> Iterator[Batch]:
        # Eval: every iteration is a full pass from the start (or from the given state).
        if not self.train and self._passes > 0:
            self._rs.restart()
        self._passes += 1
        return self

    def __next__(self) -> Batch:
        batch = self._rs.next_batch()
        if batch is None:
            raise StopIteration
        return batch

    def __len__(self) -> int:
        """Number of samples in the data set."""
        return len(self._rs)

    @property
    def fingerprint(self) -> str:
        return self._rs.fingerprint()

    @property
    def shard_sizes(self) -> list[int]:
        """Samples per shard, indexed by the batches' ``shard_id``."""
        return list(self._rs.shard_rows())

    def state(self) -> dict[str, Any]:
        """JSON-able state after the last batch returned: counters and buffered sample indices."""
        return json.loads(self._rs.state_json())

    def diagnostics(self) -> dict[str, Any]:
        """Counters and the skipped records (index, shard, row, file, reason)."""
        return json.loads(self._rs.diagnostics_json())

    def close(self) -> None:
        """Stop and join the worker threads now (dropping the loader does the same)."""
        del self._rs

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def take(loader: Loader, n: int) -> list[Batch]:
    """The next ``n`` batches (fewer if an eval pass ends)."""
    out: list[Batch] = []
    while len(out) < n:
        try:
            out.append(next(loader))
        except StopIteration:
            break
    return out


__all__ = ["Batch", "DataError", "Features", "Loader", "StateError", "WorkerError", "resolve_files", "take"]
