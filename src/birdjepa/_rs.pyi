"""Type stubs of the Rust extension (rust/py). Most code uses it through `birdjepa.data`."""

import os
from typing import Any

import numpy as np
import numpy.typing as npt

class DataError(Exception):
    """A shard or record cannot be used; the message names the file."""

class StateError(Exception):
    """A loader state does not fit this data set or config."""

class WorkerError(Exception):
    """A loader worker thread failed."""

def loader_defaults() -> str:
    """Every loader option with its default, as a JSON object (the only place the defaults live)."""

def check_loader_options(options_json: str) -> tuple[int, int]:
    """Raises ValueError naming the first option (of a JSON object of them) out of its range, without
    opening a file; else returns the log-mel frames one clip gives (the first ``n_frames`` are kept)
    and the mel bands no FFT bin falls in (the log floor in every clip)."""

def check_audio_column(schema_ipc: bytes, column: str, file: str) -> None:
    """DataError naming ``file`` where no reader takes its audio ``column`` (``schema_ipc``: the file's
    ``pyarrow.Schema.serialize()``): decoded audio, a dictionary of paths, a list of bytes."""

def plan_indices(
    shard_rows: list[int], options_json: str, count: int
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """(global sample index, epoch) of output positions ``0..count`` that a loader with these options
    draws from shards of ``shard_rows`` rows: its planner alone, without reading a file."""

VOCAB_FILE: str
"""The vocabulary's file name, beside the shards whose labels it names."""

DECODE_REVISIONS: list[tuple[str, bool]]
"""The decoder's declared changes of the samples it gives some files, as ``(what, gapless_only)``
(revision ``i + 1`` is entry ``i``; the first is the decoder before revisions were recorded)."""

def vocab_names(shard: str | os.PathLike[str]) -> list[str] | None:
    """The label names of the ``vocab.json`` beside ``shard`` (``{"names": [...]}`` or a plain list), or
    None where there is none; DataError naming the file for one that cannot be read or parsed."""

def open_shards(files: list[str], options_json: str) -> tuple[str, int, bool]:
    """(fingerprint, rows, whether some row names its audio by path) of the shards a `Loader` with
    these options reads, opened and checked as it opens them (its DataError), with no thread started."""

class Loader:
    def __init__(self, files: list[str], options_json: str, state_json: str | None = None) -> None:
        """``options_json``: a JSON object of loader options (see `loader_defaults`); an unknown name
        or a wrong type raises ValueError naming it. ``state_json``: a `state_json()` to resume from."""
    def next_batch(self) -> dict[str, npt.NDArray[Any]] | None:
        """The next batch (``spectrogram``, ``crop_offset``, ``label``, ``index``, ``shard_id``,
        ``epoch``; ``multilabel`` too with a ``multilabel_column``), or None at the end of an eval pass.
        ``crop_offset`` (int64, ``[B]``, or ``[B, V]`` with ``n_views > 1``) is each view's crop start in
        samples at ``target_rate`` (a windowed row's window start). ``multilabel`` (uint8, ``[B, C]``)
        is the multi-hot of the multilabel column; absent without one."""
    def restart(self) -> None:
        """Start a new eval pass from the data set's beginning (WorkerError in a forked process)."""
    def state_json(self) -> str: ...
    def diagnostics_json(self) -> str: ...
    def __len__(self) -> int: ...
    def fingerprint(self) -> str: ...
    def reads_audio_by_path(self) -> bool:
        """Some row names its audio by path (the fingerprint holds those files' sizes and times)."""
    def shard_digests(self) -> list[tuple[str, str]]:
        """Each shard's file name and a digest of its content but the audio's bytes (and its vocab.json)."""
    def n_workers(self) -> int:
        """The decode threads it runs (``n_workers``; 0 asked for one per CPU this process may run on)."""
    def encoded_audio(self, index: int) -> bytes:
        """Sample ``index``'s encoded audio as the loader reads it (in the shard or by path)."""
    def shard_rows(self) -> list[int]:
        """Rows per shard, in shard-id order."""

def log_mel(samples: npt.NDArray[np.float32], **options: Any) -> npt.NDArray[np.float32]:
    """Kaldi-style log-mel of a mono signal -> ``[frames, n_mels]``; ``options`` are the loader's
    feature options (``target_rate``, ``n_fft``, ``win_length``, ...), with the same defaults. A sample
    the loader refuses (NaN, inf, past its largest magnitude) is a ValueError naming the first."""

def decode_audio(data: bytes, *, gapless: bool | None = None) -> tuple[npt.NDArray[np.float32], int]:
    """Encoded audio (OGG/Vorbis, FLAC, WAV, MP3) -> (mono float32 samples, native sample rate).
    ``gapless``: the loader's option of that name (None: its default, on)."""

def audio_length(path: str | os.PathLike[str], *, gapless: bool | None = None) -> tuple[int, int]:
    """An audio file -> (its length in frames, its native rate), as the loader's crops see it, without
    keeping its samples: the container's count where it seeks and its last frame decodes, else counted.
    ``gapless`` as `decode_audio`'s. OSError where it cannot be read, ValueError where it cannot be
    decoded."""

def check_audio(data: bytes, full: bool, frames: int) -> None:
    """Raises ValueError with the reason the loader would skip this recording: its container or codec,
    its sample rate, its first ``frames`` frames (every frame with ``full``) not decoding, or not finite."""

def resample(samples: npt.NDArray[np.float32], src: int, dst: int) -> npt.NDArray[np.float32]:
    """Polyphase Kaiser-sinc resampling from ``src`` Hz to ``dst`` Hz."""
