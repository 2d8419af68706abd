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
import math
import os
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from birdjepa import _rs
from birdjepa.data.shards import label_column, split_labels

DataError = _rs.DataError
StateError = _rs.StateError
WorkerError = _rs.WorkerError

Batch = dict[str, np.ndarray]


#: Every loader option and its default, from the Rust core, where the defaults are written (once).
DEFAULTS: dict[str, Any] = json.loads(_rs.loader_defaults())


@dataclasses.dataclass(frozen=True)
class Features:
    """How a recording becomes a [n_frames, n_mels] log-mel map (Kaldi-style fbank).

    Defaults (the Rust core's): 5 s clips at 32 kHz, n_fft 1024, 25 ms window, 10 ms hop, 128 mel bins
    from 20 Hz to Nyquist, pre-emphasis 0.97, per-frame DC removal, natural log with a floor, 512
    frames, normalised with AudioMAE's fbank statistics. Masks (train mode only) are off by default.
    """

    target_rate: int = DEFAULTS["target_rate"]
    """Hz every recording is resampled to."""
    clip_seconds: float = DEFAULTS["clip_seconds"]
    """Seconds of audio a clip (a view) holds; a shorter recording is followed by zeros."""
    n_fft: int = DEFAULTS["n_fft"]
    """FFT length in samples: even, at least the window's (the frame zero-padded to it)."""
    win_length: int = DEFAULTS["win_length"]
    """Analysis window in samples (800: 25 ms at 32 kHz)."""
    hop_length: int = DEFAULTS["hop_length"]
    """Samples between frames (320: 10 ms at 32 kHz)."""
    n_mels: int = DEFAULTS["n_mels"]
    """Mel bins: the map's width."""
    f_min: float = DEFAULTS["f_min"]
    """Lowest mel filter edge, Hz."""
    f_max: float | None = DEFAULTS["f_max"]
    """Highest mel filter edge, Hz; None: Nyquist."""
    preemphasis: float = DEFAULTS["preemphasis"]
    """Pre-emphasis coefficient in [0, 1], applied to each frame after its DC removal (0: off)."""
    remove_dc: bool = DEFAULTS["remove_dc"]
    """Subtract each frame's mean first (Kaldi's)."""
    log_floor: float = DEFAULTS["log_floor"]
    """The log is ln(max(energy, log_floor)) (Kaldi's floor: float32 epsilon)."""
    n_frames: int = DEFAULTS["n_frames"]
    """Frames of the map: the clip's first ones, zeros (the normalised mean) past its end."""
    mean: float = DEFAULTS["mean"]
    """Normalisation: each value becomes (x - mean) / std (AudioMAE's fbank statistics)."""
    std: float = DEFAULTS["std"]
    """See ``mean``."""
    time_mask_count: int = DEFAULTS["time_mask_count"]
    """Train mode: time masks per view (whole frames set to 0), SpecAugment's; 0: off."""
    time_mask_width: int = DEFAULTS["time_mask_width"]
    """Each time mask's largest width in frames (its width drawn in [0, it])."""
    freq_mask_count: int = DEFAULTS["freq_mask_count"]
    """Train mode: frequency masks per view (whole mel bins set to 0); 0: off."""
    freq_mask_width: int = DEFAULTS["freq_mask_width"]
    """Each frequency mask's largest width in mel bins."""
    gapless: bool = DEFAULTS["gapless"]
    """Read an MP3 without its encoder's delay and padding, and a Vorbis stream without its last block's
    padding, as their headers say and as libsndfile, ffmpeg and librosa read them; and the decoder's fixes
    since (MP3s joined end to end, a FLAC's tag after its last frame, a WAV a recorder never finished,
    AIFF and M4A read: docs/data-loader.md). Off, an MP3's samples came 1105 late (25 ms at 44.1 kHz),
    and its windows, event crops and embed times with them: a run or an encoder recorded before this
    option reads as off, and keeps its data."""

    def options(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: The trainer's own choice, not the loader's default (one view): LeJEPA compares two views.
TRAIN_VIEWS = 2


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The data options of `birdjepa pretrain` (``--data.*``)."""

    train: str | None = None
    """Train shards: a folder, glob or file. Default: the embedded demo set (generated on first use)."""
    eval: str | None = None
    """Held-out shards for the probe evaluation, of the train shards' classes (`birdjepa prepare --vocab`).
    Default: the demo set's eval split with the demo's train split; none with your --data.train (then
    --eval-every 0)."""
    batch_size: int = DEFAULTS["batch_size"]
    """Global batch size (split over devices; one micro-batch when accumulating)."""
    n_workers: int = DEFAULTS["n_workers"]
    """Decode threads; 0 (default): one per CPU this process may run on (a Slurm job's
    --cpus-per-task). Changing it never changes the batches."""
    shuffle_buffer: int = DEFAULTS["shuffle_buffer"]
    """Sample indices a training epoch's draws are shuffled among (larger: closer to a full shuffle)."""
    shuffle_initial: int | None = DEFAULTS["shuffle_initial"]
    """Start drawing once the buffer holds this many samples, growing it by one per draw
    (webdataset's `initial`); None: fill the whole buffer first. Either way the stream resumes exactly."""
    interleave: int | None = DEFAULTS["interleave"]
    """Shards read round-robin at once; None (default): all of them, so every batch draws from every
    shard (near-IID at any data set size: see docs/data-loader.md, "Mixing at scale"). A number reads
    fewer shards at a time (more sequential I/O, less mixed batches)."""
    n_views: int = TRAIN_VIEWS
    """Views per recording (LeJEPA needs >= 2)."""
    crop_events: bool = DEFAULTS["crop_events"]
    """Crop each train view around one of the row's events (``event_column``: a list of [start, end]
    seconds, as BirdSet's event detector marks calls): a point drawn inside a drawn event centres the
    clip. Rows without events keep the uniform crop. Deterministic and exactly resumable as every crop."""
    event_column: str = DEFAULTS["event_column"]
    """The column --data.crop-events reads its events from (BirdSet's ``detected_events``)."""
    audio_root: str | None = DEFAULTS["audio_root"]
    """Where a row whose audio is a file path (HF's Audio with null bytes, as a loading script's cache
    holds BirdSet) finds a relative path: every split's shards (train and eval); None: each shard's
    own folder. The files' sizes and times are part of the data set's fingerprint."""
    features: Features = Features()

    def loader_options(self) -> dict[str, Any]:
        """The options of the train loader these settings open (the shard paths aside)."""
        d = dataclasses.asdict(self)
        for key in ("train", "eval", "features"):
            d.pop(key)
        return d


def skipped_line(n: int, lines: Sequence[str], what: str = "", where: str = "") -> str:
    """``n`` records the loader could not read, the first three of ``lines`` (`Loader.skipped_since`)
    named: "skipped 2 [what ]records the loader cannot read: FILE row R: REASON; ...; 1 more[where]"."""
    more = f"; {n - 3} more{where}" if n > 3 else ""
    kind = f"{what} " if what else ""
    return f"skipped {n} {kind}record{'s' * (n != 1)} the loader cannot read: {'; '.join(lines[:3])}{more}"


def resolve_files(
    files: str | bytes | os.PathLike[str] | Sequence[str | bytes | os.PathLike[str]],
) -> list[str]:
    """Shard paths from a list, a glob pattern or a folder (every ``*.arrow`` in it), sorted."""
    items = [files] if isinstance(files, (str, bytes, os.PathLike)) else list(files)
    out: list[str] = []
    for item in items:
        text = os.fsdecode(item)  # bytes as os.listdir(b".") gives them: a list of ints, a TypeError
        if not text:  # the core's ": cannot open"
            raise DataError("an empty path names no shard file")
        if os.path.isdir(text):
            try:  # glob finds nothing in a folder it may not list: "no shard files match" it
                names = os.listdir(text)
            except OSError as e:
                raise DataError(f"{text}: the folder cannot be listed ({e.strerror}): name its shard files, "
                                "or make it readable") from None  # fmt: skip
            # As glob's "*.arrow": hidden names left out.
            found = sorted(os.path.join(text, n) for n in names if n.endswith(".arrow") and n[0] != ".")
        elif glob.has_magic(text):
            found = sorted(glob.glob(text))
        else:  # a file not there: said here as a pattern's or a folder's, not "[Errno 2]" at its opening
            found = [text] if os.path.lexists(text) else []
        if not found:
            raise DataError(no_shards_match(text))
        out.extend(found)
    if not out:  # an IndexError, further on
        raise DataError("no shard files given")
    seen: dict[str, str] = {}
    for path in out:  # one file under two spellings (a link, a relative path) was read twice an epoch
        first = seen.setdefault(os.path.realpath(path), path)
        if first != path:
            raise DataError(f"{first} and {path} are one shard file: name it once")
    return sorted(out)


def options_json(options: dict[str, Any]) -> str:
    """The loader options as the Rust core reads them, numpy's scalars as Python's (``seed=np.int64(3)``
    was "Object of type int64 is not JSON serializable"); a ValueError naming one that is not a finite
    number (JSON has no NaN: the core's error named no option) or an integer past 64 bits (the core read
    it as a float)."""
    options = {k: v.item() if isinstance(v, np.generic) else v for k, v in options.items()}
    for name, value in options.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number (got {value})")
        if isinstance(value, int) and value >= 1 << 64:
            raise ValueError(f"{name} must be below 2**64 (got {value})")
    return json.dumps(options)


def loader_refusal(
    batch_size: int | None,
    n_workers: int,
    features: Features | None = None,
    audio_root: str | None = None,
    root_flag: str = "--audio-root",
) -> str | None:
    """Why the Rust core refuses a loader of ``batch_size`` clips a batch (None: not checked),
    ``n_workers`` decode threads and ``audio_root`` (None: not given; ``root_flag`` names it), with
    ``features`` (None: the defaults; a batch's bound is in values, so check it with the features that
    will read it), said with the commands' flags, or None: where only the lower bounds were checked,
    `evaluate` and `embed` restored an encoder to end in the loader's traceback."""
    from birdjepa import _rs

    options = {"n_workers": n_workers, **(features.options() if features is not None else {})}
    options |= {} if batch_size is None else {"batch_size": batch_size}
    options |= {} if audio_root is None else {"audio_root": audio_root}
    try:
        _rs.check_loader_options(options_json(options))
    except ValueError as e:
        named = (("n_workers", "--n-workers", n_workers), ("audio_root", root_flag, audio_root))
        flag, value = next(
            ((f, v) for p, f, v in named if str(e).startswith(p)), ("--batch-size", batch_size)
        )
        return f"{flag} {value}: {e}{read_from(audio_root) if flag == root_flag else ''}"
    return None


def read_from(path: str | None) -> str:
    """Where a relative ``path`` was read from, said after a refusal of it (a resume started in another
    folder said no more); nothing for an absolute one."""
    return "" if path is None or os.path.isabs(path) else f" (a relative path: read from {os.getcwd()})"


def no_shards_match(path: str) -> str:
    """Why ``path`` names no shard: what it holds instead, and where a relative one was read from."""
    return f"no shard files match {path!r}{read_from(path)}{_what_the_folder_holds(path)}"


def _what_the_folder_holds(path: str) -> str:
    """For a folder without shards: what `birdjepa prepare` would turn into shards, if it holds that."""
    from birdjepa.data.parquet import parquet_files  # on this error only: prepare imports soundfile
    from birdjepa.data.prepare import find_audio_files

    if not os.path.isdir(path):
        return ""
    # A data set's top folder (demo/ with train/ and eval/): said as a path that names nothing.
    splits = sorted(
        str(sub) for sub in pathlib.Path(path).iterdir() if sub.is_dir() and any(sub.glob("*.arrow"))
    )
    if splits:
        return f": it holds folders of shards, {', '.join(splits)}: give one of them"
    if parquet_files(path):
        return f": it holds Parquet files, which `birdjepa prepare {path} OUT` converts into shards"
    if find_audio_files(pathlib.Path(path)):
        return f": it holds audio files, which `birdjepa prepare {path} OUT` packs into shards"
    return ""


class Loader:
    """Deterministic, exactly resumable batches.

    Each batch is a dict of numpy arrays: ``spectrogram`` float32 [B, T, M] (or [B, V, T, M] when
    ``n_views > 1``), ``crop_offset`` int64 [B] (or [B, V]: where each view's crop starts, in samples
    at ``target_rate``; 0 for a recording shorter than a clip, the centre crop's in eval mode),
    ``label`` int64 (-1 when missing), ``index`` int64 (global sample index), ``shard_id`` int64 and
    ``epoch`` int64. With ``multilabel_column`` set, ``multilabel`` uint8 [B, C] is the multi-hot of
    that list column (1 where the row lists class c); without it the key is absent.

    BirdSet-shaped data: ``multilabel_column="ebird_code_multilabel"`` reads its ``list<int64>``
    (HF ``Sequence(ClassLabel)``) or a list of names mapped through ``vocab.json``; an empty list is an
    all-zero row, while a null list, a null element, or a class outside ``[0, C)`` or the vocabulary
    stops the loader with a DataError naming the shard and row. In eval mode a row whose shard has
    ``start_time`` and ``end_time`` (seconds) is cropped to that window: the clip starts at
    ``round(start_time * target_rate)`` (reported in ``crop_offset``), holds the window cut to a clip,
    and is zero after the window's end; rows with a null bound keep the centre crop, and a window
    outside the recording is a skipped record (``diagnostics()`` lists it with its reason).

    ``debug_crop_shift_index`` (default -1: off) plants a difference on purpose: the sample of that
    global index takes every view's crop one hop (``hop_length`` samples) later, or earlier where the
    crop already ends the recording; a recording no longer than a clip is unchanged. When on, it is
    part of the stream's signature (a state saved without it is refused).

    Train mode is infinite, shuffled (per-epoch shard permutation, ``interleave`` shards read
    round-robin, a ``shuffle_buffer`` of sample indices, filled before the first draw unless
    ``shuffle_initial`` is set) with random crops. Eval mode makes one
    ordered pass with centre crops; iterating it again starts a new pass.
    """

    def __init__(
        self,
        files: str | bytes | os.PathLike[str] | Sequence[str | bytes | os.PathLike[str]],
        *,
        features: Features | None = None,
        state: dict[str, Any] | None = None,
        multilabel_column: str | None = DEFAULTS["multilabel_column"],
        n_classes: int | None = DEFAULTS["n_classes"],
        window_start_column: str = DEFAULTS["window_start_column"],
        window_end_column: str = DEFAULTS["window_end_column"],
        **options: Any,
    ) -> None:
        """``options`` are the Rust core's loader options (`DEFAULTS` lists them with their defaults:
        ``seed``, ``batch_size``, ``train``, ``n_views``, ``shuffle_buffer``, ...; those of `Features`
        go in ``features``); an unknown name or a wrong type is a ValueError naming it.

        ``multilabel_column``: a list column of class ids or names (BirdSet's
        ``ebird_code_multilabel``) read as the batches' ``multilabel`` multi-hot; None (default): off.
        ``n_classes``: the multi-hot's width C; None (default): the number of names in ``vocab.json``
        beside the shards (then it must exist). ``window_start_column`` / ``window_end_column``
        (default ``start_time`` / ``end_time``): eval mode only, the seconds columns that crop a row to
        its own window where a shard has both. A saved state is refused (StateError) when any of them
        differs where it changes the batches.

        A split whose folders index different vocabularies (`split_labels`) is read with
        ``label_names``: every ``label`` is the position of its name among the split's names, whichever
        folder it came from; other splits' labels are as stored (their signature unchanged)."""
        self.files, core_options = _core_options(
            files, features, options, multilabel_column=multilabel_column, n_classes=n_classes,
            window_start_column=window_start_column, window_end_column=window_end_column,
        )  # fmt: skip
        self.say_skips = True
        """Whether an eval pass ends with its WARNING line of the records it skipped (False: the caller
        says them in its own terms, from `diagnostics`)."""
        self.train = bool(options.get("train", DEFAULTS["train"]))
        state_json = None if state is None else json.dumps(state)
        self._rs: Any = _rs.Loader(self.files, core_options, state_json)
        self._passes = 0
        self._skips_before_pass = 0
        self._closed: tuple[str, str] | None = None  # the state and diagnostics it closed with

    @property
    def _core(self) -> Any:
        """The Rust loader; a ValueError once closed (every method but `state` and `diagnostics`, which
        keep what it closed with, was a NoneType error)."""
        if self._closed is not None:
            raise ValueError("the loader is closed")
        return self._rs

    def __iter__(self) -> Iterator[Batch]:
        # Eval: every iteration is a full pass from the start (or from the given state).
        core = self._core
        if not self.train and self._passes > 0:
            core.restart()
        self._passes += 1
        self._skips_before_pass = self.diagnostics()["counters"]["skipped"]
        return self

    def __next__(self) -> Batch:
        core = self._core
        self._passes = max(self._passes, 1)  # a pass begun by next(): a later `for` starts a whole one
        batch = core.next_batch()
        if batch is None:
            self._say_skipped()
            raise StopIteration
        return batch

    def _say_skipped(self) -> None:
        """At the end of an eval pass, one line for the records it skipped: every command that reads a
        split (evaluate, embed, benchmark, the run's evaluation) then says it read fewer than the shards
        hold, and which (training says each as it happens: `diagnostics.callbacks`)."""
        count, lines = self.skipped_since(self._skips_before_pass)
        n, self._skips_before_pass = count - self._skips_before_pass, count  # said once
        if n and self.say_skips:
            print(f"WARNING {skipped_line(n, lines, where=' in Loader.diagnostics()')}", flush=True)

    def __len__(self) -> int:
        """Number of samples in the data set."""
        return len(self._core)

    @property
    def fingerprint(self) -> str:
        return self._core.fingerprint()

    @property
    def reads_audio_by_path(self) -> bool:
        """Some row names its audio by path rather than holding its bytes (a hub's cache): the
        fingerprint holds those files' sizes and times."""
        return self._core.reads_audio_by_path()

    def shard_digests(self) -> dict[str, str]:
        """Each shard's file name -> a digest of its content but the audio's bytes (labels, ids, events,
        windows, paths, each recording's size) and of the vocab.json beside it: what the fingerprint,
        which reads a shard's size and ends only, does not see (a shard relabelled at the same size).
        Reads every shard's non-audio columns: milliseconds a shard."""
        return dict(self._core.shard_digests())

    @property
    def n_workers(self) -> int:
        """The decode threads it runs (``n_workers=0``, the default: one per CPU this process may run on)."""
        return self._core.n_workers()

    def encoded_audio(self, index: int) -> bytes:
        """Global sample ``index``'s encoded audio as this loader reads it: its bytes in the shard, or
        the file its path names (under ``audio_root``); a `DataError` where the loader skips the row."""
        return self._core.encoded_audio(index)

    @property
    def shard_sizes(self) -> list[int]:
        """Samples per shard, indexed by the batches' ``shard_id``."""
        return list(self._core.shard_rows())

    def state(self) -> dict[str, Any]:
        """JSON-able state after the last batch returned: counters and buffered sample indices (once
        closed, the state it closed with: saved after a ``with`` block, it was an AttributeError)."""
        return json.loads(self._rs.state_json() if self._closed is None else self._closed[0])

    def diagnostics(self) -> dict[str, Any]:
        """Counters and the skipped records (index, shard, row, file, reason)."""
        return json.loads(self._rs.diagnostics_json() if self._closed is None else self._closed[1])

    def skipped_since(self, count: int) -> tuple[int, list[str]]:
        """The records skipped after the first ``count`` (the ``skipped`` counter, which a resumed loader
        continues): (the counter now, ``FILE row R: REASON`` for each of them the diagnostics still list,
        the newest 1000)."""
        d = self.diagnostics()
        now, listed = d["counters"]["skipped"], d["skipped"]
        new = listed[max(0, len(listed) - (now - count)) :] if now > count else []
        return now, [f"{s['file']} row {s['row']}: {s['reason']}" for s in new]

    def close(self) -> None:
        """Stop and join the worker threads now (dropping the loader does the same); again, nothing."""
        if self._closed is None:
            self._closed = (self._rs.state_json(), self._rs.diagnostics_json())
            self._rs = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _core_options(
    files: str | bytes | os.PathLike[str] | Sequence[str | bytes | os.PathLike[str]],
    features: Features | None,
    options: dict[str, Any],
    **columns: Any,
) -> tuple[list[str], str]:
    """The shard paths and the Rust core's options JSON of a `Loader(files, features=..., **options)`
    (``columns``: its keyword options named in its signature)."""
    features = Features() if features is None else features
    if not isinstance(features, Features):  # a dict: "'dict' object has no attribute 'options'"
        raise TypeError(f"features must be a birdjepa.data.Features, got {type(features).__name__}")
    if given := sorted(options.keys() & features.options().keys()):  # else the Features' values won
        raise TypeError(f"{', '.join(given)}: feature options go in features=Features(...)")
    paths = resolve_files(files)
    options = dict(options)
    if "label_names" not in options:
        names, mixed = split_labels(paths)
        options["label_names"] = names if mixed else None
    if "label_column" not in options:  # where `prepare --label-column` wrote them, its vocab.json says
        options["label_column"] = label_column(paths)
    return paths, options_json({**options, **features.options(), **columns})


class Shards(NamedTuple):
    """What `open_shards` found: the shards' `Loader.fingerprint`, rows and `reads_audio_by_path`."""

    fingerprint: str
    rows: int
    reads_audio_by_path: bool


def open_shards(
    files: str | bytes | os.PathLike[str] | Sequence[str | bytes | os.PathLike[str]],
    *,
    features: Features | None = None,
    multilabel_column: str | None = DEFAULTS["multilabel_column"],
    n_classes: int | None = DEFAULTS["n_classes"],
    window_start_column: str = DEFAULTS["window_start_column"],
    window_end_column: str = DEFAULTS["window_end_column"],
    **options: Any,
) -> Shards:
    """The shards a `Loader` with these arguments reads, opened and checked as it opens them (the same
    DataError for a truncated shard, a missing column, ...) without starting its threads or decoding a
    record: a check before minutes of compiling, and a fingerprint that costs no worker."""
    paths, core_options = _core_options(
        files, features, options, multilabel_column=multilabel_column, n_classes=n_classes,
        window_start_column=window_start_column, window_end_column=window_end_column,
    )  # fmt: skip
    return Shards(*_rs.open_shards(paths, core_options))


def open_train_loader(
    files: list[str],
    data: DataConfig,
    *,
    seed: int,
    augment: bool,
    state: dict[str, Any] | None,
    resumed: bool,
    **options: Any,
) -> tuple[Loader, str | None]:
    """The train loader at ``state``, and why it could not take that state (None when it did): a
    loader that refuses its state starts from the beginning, and the ``loader_state`` check says why.
    ``options``: further loader options (the debug ones)."""
    kw: dict[str, Any] = {
        **data.loader_options(),
        "seed": seed,
        "augment": augment,
        "features": data.features,
        **options,
    }
    if state is None:
        return Loader(files, **kw), ("not_restored" if resumed else None)
    try:
        return Loader(files, **kw, state=state), None
    except StateError as e:
        return Loader(files, **kw), f"refused: {e}"


def plan_indices(shard_sizes: Sequence[int], count: int, **options: Any) -> tuple[np.ndarray, np.ndarray]:
    """(global sample index, epoch) of the first ``count`` samples a train loader with these options
    would give over shards of ``shard_sizes`` rows: the loader's own planner, without opening a file,
    so a setting's mixing can be measured at any data set size in seconds."""
    index, epoch = _rs.plan_indices([int(s) for s in shard_sizes], json.dumps(options), int(count))
    return index.astype(np.int64), epoch.astype(np.int64)


def take(loader: Loader, n: int) -> list[Batch]:
    """The next ``n`` batches (fewer if an eval pass ends)."""
    out: list[Batch] = []
    while len(out) < n:
        try:
            out.append(next(loader))
        except StopIteration:
            break
    return out


__all__ = [
    "DEFAULTS", "Batch", "DataConfig", "DataError", "Features", "Loader", "StateError", "WorkerError",
    "open_train_loader", "plan_indices", "resolve_files", "take",
]  # fmt: skip
