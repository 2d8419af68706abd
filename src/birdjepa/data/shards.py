"""Arrow IPC shard writer shared by `demo-data` and `prepare`.

Shard layout (read by the Rust loader; keep it exactly):

- files `<prefix>-<index:05d>.arrow` in one folder, Arrow IPC *file* format by default
  (`pyarrow.ipc.new_file`) or *stream* format (`pyarrow.ipc.new_stream`, the layout of HF `datasets`
  cache files);
- schema `audio: struct<bytes: binary, path: string>` (the HF `datasets` Audio layout),
  `<label_column>: int64` (nullable; null = no label; default column name `ebird_code`),
  `recording_id: string`;
- record batches of at most `batch_rows` (64) rows (fewer when they would pass 512 MiB), so a reader
  can reach a row without reading a whole shard;
- a shard is closed once the audio bytes in it reach `target_bytes` (each shard but the last is at
  least that big and exceeds it by less than one recording), or once it holds `max_rows` rows;
- `vocab.json` beside the shards: `{"label_column": "ebird_code", "names": [...sorted...]}`; an int
  label is an index into `names`.

Shards are written to hidden `.partial` files, renamed once the writer closes: a run killed while it
writes (SIGTERM, kill -9) leaves no `*.arrow` a loader would take for a whole data set, only hidden
files the next writer removes. The commands that write shards hold their folder while they do
(`only_writer`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from birdjepa import _rs

DEFAULT_LABEL_COLUMN: str = json.loads(_rs.loader_defaults())["label_column"]
"""The loader's default label column (its defaults live in the Rust core, once)."""
BATCH_ROWS = 64
BATCH_BYTES = 512 << 20  # a record batch is also cut here: `binary` offsets are int32 (< 2 GiB per batch)
MAX_ROW_BYTES = (1 << 31) - 1
"""The most one row may hold: a `binary` value's int32 offsets (an hour of 96 kHz audio is 691 MB)."""
SHARD_SUFFIX = ".arrow"
VOCAB_FILE: str = _rs.VOCAB_FILE

ShardFormat = Literal["file", "stream"]

AUDIO_TYPE = pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())])
RECORDING_ID = "recording_id"
"""The column naming each row's recording (`birdjepa prepare` and the demo sets write it)."""


def shard_schema(label_column: str = DEFAULT_LABEL_COLUMN) -> pa.Schema:
    """The shard schema with the label stored in `label_column`."""
    if label_column in ("audio", RECORDING_ID) or not label_column:
        raise ValueError(f"label column name {label_column!r} is empty or clashes with another column")
    return pa.schema(
        [
            pa.field("audio", AUDIO_TYPE),
            pa.field(label_column, pa.int64(), nullable=True),
            pa.field(RECORDING_ID, pa.string()),
        ]
    )


def shard_name(prefix: str, index: int) -> str:
    return f"{prefix}-{index:05d}{SHARD_SUFFIX}"


def partial_name(shard: Path) -> Path:
    """The hidden name ``shard`` is written under until it is whole."""
    return shard.with_name(f".{shard.name}.partial")


WRITING_LOCK = ".writing.lock"


class FolderBusy(FileExistsError):
    """Another process is writing shards into the folder."""


@contextlib.contextmanager
def only_writer(folder: Path) -> Iterator[None]:
    """Holds ``folder`` for this process's writes: two `prepare` or `demo-data` runs into one folder
    mixed their shards (and one set's vocab.json relabelled the other's rows), both exit 0. An flock on
    ``FOLDER/.writing.lock``, which the kernel releases however the process ends (a file system that
    ignores flock, as some NFS mounts do, lets a second writer in); the file is removed on release.
    Raises `FolderBusy` naming the holder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / WRITING_LOCK
    while True:
        f = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (closed below, or handed to the with)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise FolderBusy(f"{folder} is being written by {holder}: wait for it to end, or write "
                             "elsewhere") from None  # fmt: skip
        try:
            held = os.stat(path).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            held = False
        if held:
            break
        f.close()  # its holder removed it as this process opened it: lock the file there now
    with f:
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%H:%M:%S')}\n")
        f.flush()
        try:
            yield
        finally:
            path.unlink(missing_ok=True)  # before the lock goes: a waiter re-checks which file it locked


class ShardWriter:
    """Writes rows into size-bounded Arrow IPC shards in `out_dir`.

    Usage::

        w = ShardWriter(out_dir, "train", target_bytes=256 << 20)
        w.add(audio_bytes, "XC1234.ogg", label=3, recording_id="XC1234")
        paths = w.close()

    Refuses to start when `out_dir` already holds shards with the same prefix (stale shards from an
    earlier run would otherwise be read as part of this data set). Every shard keeps its hidden name
    until `close`.
    """

    def __init__(
        self,
        out_dir: Path,
        prefix: str,
        target_bytes: int,
        fmt: ShardFormat = "file",
        *,
        label_column: str = DEFAULT_LABEL_COLUMN,
        batch_rows: int = BATCH_ROWS,
        max_rows: int | None = None,
    ) -> None:
        if fmt not in ("file", "stream"):
            raise ValueError(f"shard format must be 'file' or 'stream', got {fmt!r}")
        if target_bytes <= 0:
            raise ValueError(f"target_bytes must be positive, got {target_bytes}")
        if not 1 <= batch_rows <= BATCH_ROWS:
            raise ValueError(f"batch_rows must be in [1, {BATCH_ROWS}], got {batch_rows}")
        if max_rows is not None and max_rows < 1:
            raise ValueError(f"max_rows must be positive, got {max_rows}")
        if not prefix or "/" in prefix:
            raise ValueError(f"bad shard prefix {prefix!r}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        stale = sorted(self.out_dir.glob(f"{prefix}-*{SHARD_SUFFIX}"))
        if stale:
            raise FileExistsError(
                f"{self.out_dir} already holds shards with prefix {prefix!r} (e.g. {stale[0].name}); "
                "remove them or write to an empty folder"
            )
        for left in self.out_dir.glob(f".{prefix}-*{SHARD_SUFFIX}.partial"):
            left.unlink()  # a killed writer's: a live one holds the folder (`only_writer`)
        self.prefix = prefix
        self.target_bytes = int(target_bytes)
        self.fmt: ShardFormat = fmt
        self.label_column = label_column
        self.batch_rows = batch_rows
        self.max_rows = max_rows
        self.schema = shard_schema(label_column)
        self.paths: list[Path] = []
        self.rows_per_shard: list[int] = []
        self.n_rows = 0
        self._closed = False
        self._writer: pa.ipc.RecordBatchFileWriter | pa.ipc.RecordBatchStreamWriter | None = None
        self._partial: Path | None = None
        self._sink: pa.NativeFile | None = None
        self._shard_bytes = 0
        self._shard_rows = 0
        self._pending_bytes = 0
        self._pending: dict[str, list] = {"bytes": [], "path": [], "label": [], "rid": []}

    def add(self, audio_bytes: bytes, path: str, label: int | None, recording_id: str) -> None:
        """Append one recording. `label` is an index into the vocab, or None for no label."""
        if self._closed:
            raise RuntimeError("ShardWriter.add() after close()")
        if not isinstance(audio_bytes, bytes | bytearray | memoryview):
            raise TypeError(f"audio bytes of {recording_id!r} must be bytes, got {type(audio_bytes)}")
        if len(audio_bytes) > MAX_ROW_BYTES:
            raise ValueError(
                f"{path}: {len(audio_bytes)} bytes is over the {MAX_ROW_BYTES} bytes a row may hold"
            )
        if not isinstance(path, str) or not isinstance(recording_id, str):
            raise TypeError(f"path and recording_id must be str, got {path!r}, {recording_id!r}")
        if self._pending_bytes + len(audio_bytes) > MAX_ROW_BYTES:  # one batch's offsets are int32 too
            self._flush_batch()
        if label is not None and (isinstance(label, bool) or int(label) != label or label < 0):
            raise ValueError(f"label of {recording_id!r} must be a non-negative int or None, got {label!r}")
        p = self._pending
        p["bytes"].append(bytes(audio_bytes))
        p["path"].append(path)
        p["label"].append(None if label is None else int(label))
        p["rid"].append(recording_id)
        self._shard_bytes += len(audio_bytes)
        self._pending_bytes += len(audio_bytes)
        self._shard_rows += 1
        self.n_rows += 1
        shard_full = self._shard_bytes >= self.target_bytes or (
            self.max_rows is not None and self._shard_rows >= self.max_rows
        )
        if shard_full or len(p["rid"]) >= self.batch_rows or self._pending_bytes >= BATCH_BYTES:
            self._flush_batch()
        if shard_full:
            self._close_shard()

    def end_shard(self) -> None:
        """Close the current shard now (if it holds rows), so that the caller sets each shard's rows."""
        if self._shard_rows:
            self._flush_batch()
            self._close_shard()

    def close(self) -> list[Path]:
        """Finish the last shard and give every shard its name; returns their paths, in order."""
        if not self._closed:
            self.end_shard()
            self._closed = True
            for final in self.paths:
                partial_name(final).rename(final)
        return list(self.paths)

    def __enter__(self) -> ShardWriter:
        return self

    def abort(self) -> None:
        """Stops writing and deletes every file this writer made (finished shards too): a failed run
        leaves no partial data set that a loader could mistake for a whole one."""
        self._closed = True
        with contextlib.suppress(Exception):
            if self._writer is not None:
                self._writer.close()
        with contextlib.suppress(Exception):
            if self._sink is not None:
                self._sink.close()
        self._writer = self._sink = None
        if self._partial is not None:
            self._partial.unlink(missing_ok=True)
            self._partial = None
        for p in self.paths:
            p.unlink(missing_ok=True)
            partial_name(p).unlink(missing_ok=True)
        self.paths.clear()
        self.rows_per_shard.clear()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _flush_batch(self) -> None:
        p = self._pending
        if not p["rid"]:
            return
        audio = pa.StructArray.from_arrays(
            [pa.array(p["bytes"], pa.binary()), pa.array(p["path"], pa.string())],
            fields=list(AUDIO_TYPE),
        )
        batch = pa.RecordBatch.from_arrays(
            [audio, pa.array(p["label"], pa.int64()), pa.array(p["rid"], pa.string())],
            schema=self.schema,
        )
        if self._writer is None:
            self._partial = partial_name(self.out_dir / shard_name(self.prefix, len(self.paths)))
            sink = pa.OSFile(str(self._partial), "wb")
            if self.fmt == "file":
                self._writer = pa.ipc.new_file(sink, self.schema)
            else:
                self._writer = pa.ipc.new_stream(sink, self.schema)
            self._sink = sink
        self._writer.write_batch(batch)
        for v in p.values():
            v.clear()
        self._pending_bytes = 0

    def _close_shard(self) -> None:
        assert self._writer is not None and self._partial is not None and self._sink is not None
        self._writer.close()
        self._sink.close()
        self.paths.append(self.out_dir / shard_name(self.prefix, len(self.paths)))  # its name at `close`
        self.rows_per_shard.append(self._shard_rows)
        self._writer = None
        self._partial = None
        self._shard_bytes = 0
        self._shard_rows = 0


def write_vocab(
    out_dir: Path, names: Sequence[str], label_column: str = DEFAULT_LABEL_COLUMN, *, ordered: bool = True
) -> Path:
    """Write `vocab.json`; `names` must be unique and, where ``ordered``, sorted (an int label indexes
    it; a ``ClassLabel``'s names keep their own order: ``ordered=False``)."""
    names = list(names)
    why = bad_names(names, ordered=ordered)
    if why is not None:
        raise ValueError(why)
    path = Path(out_dir) / VOCAB_FILE
    text = json.dumps({"label_column": label_column, "names": names}, indent=1) + "\n"
    path.write_text(text, encoding="utf-8")
    return path


def bad_names(names: Sequence[Any], *, ordered: bool = True) -> str | None:
    """Why ``names`` cannot be a vocab.json's (None: they can): unique, non-empty strings, sorted where
    ``ordered``."""
    if len(set(names)) != len(names) or (ordered and list(names) != sorted(names)):
        return f"vocab names must be {'sorted and ' if ordered else ''}unique, got {list(names)[:10]}..."
    empty = next((n for n in names if not isinstance(n, str) or not n), None)
    return None if empty is None and all(names) else f"vocab name {empty!r} must be a non-empty string"


def vocab_names(folder: Path) -> list[str] | None:
    """The label names of `folder/vocab.json`, or None where there is none: read by the loader's own
    reader (Rust), so every command reads a vocabulary one way; `DataError` names a bad file."""
    return _rs.vocab_names(str(Path(folder) / VOCAB_FILE))


def class_names(schema: pa.Schema, label_column: str) -> list[str] | None:
    """The ``ClassLabel`` names HF's metadata (a file `datasets` wrote) gives ``label_column`` (or the
    class list of a sequence of them), in their order, or None where it has none."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return None
    try:
        feature = json.loads(raw)["info"]["features"][label_column]
    except (ValueError, KeyError, TypeError):
        return None
    while isinstance(feature, dict) and feature.get("_type") in ("Sequence", "List"):
        feature = feature.get("feature")
    if isinstance(feature, dict) and feature.get("_type") == "ClassLabel":
        return [str(n) for n in feature["names"]]
    return None


def read_vocab(folder: Path) -> tuple[str, list[str]]:
    """Returns (label_column, names) of `folder/vocab.json` (the label column `birdjepa prepare` wrote
    beside the names; the default where a plain list has none)."""
    names = vocab_names(folder)
    if names is None:
        raise _rs.DataError(f"{Path(folder) / VOCAB_FILE}: no such vocabulary")
    data = json.loads((Path(folder) / VOCAB_FILE).read_text(encoding="utf-8"))
    return str(
        data.get("label_column", DEFAULT_LABEL_COLUMN) if isinstance(data, dict) else DEFAULT_LABEL_COLUMN
    ), names


def label_column(files: Sequence[str]) -> str:
    """The label column of a split's shards: the one the first folder's `vocab.json` names (what
    `birdjepa prepare --label-column` wrote), else the default."""
    folder = split_folders(files)[0]
    return read_vocab(folder)[0] if vocab_names(folder) is not None else DEFAULT_LABEL_COLUMN


def split_labels(files: Sequence[str]) -> tuple[list[str] | None, str | None]:
    """The names a split's labels index, and where the loader must read them by name, why.

    The names: every folder's `vocab.json` names, each folder's after those of the folders before it (path
    order), once; None where no folder has one. A split of one vocabulary keeps its own. Where a folder's
    names are not the start of them (folders that index different vocabularies), the second item is one
    line naming the first such pair: the loader then reads each label by its name (``label_names``), so a
    label means one class whichever folder it came from. `DataError` where some folders have a vocabulary
    and others not (their integer labels name nothing)."""
    folders = split_folders(files)
    vocabs = [vocab_names(folder) for folder in folders]
    if all(v is None for v in vocabs):
        return None, None
    if None in vocabs:
        bare = folders[vocabs.index(None)]
        named, listed = next((f, v) for f, v in zip(folders, vocabs, strict=True) if v is not None)
        why = f"the second's labels name no class, so the split has no label space; give it a {VOCAB_FILE}"
        raise _rs.DataError(f"{vocabulary_mismatch([named], listed, [bare], None)}: {why}")
    lists = [v for v in vocabs if v is not None]  # every folder's, after the check above
    names = list(dict.fromkeys(n for v in lists for n in v))
    for folder, v in zip(folders, lists, strict=True):
        if v != names[: len(v)]:
            return names, vocabulary_mismatch(folders[:1], lists[0], [folder], v)
    return names, None


def split_folders(files: Sequence[str]) -> list[Path]:
    """The folders of a split's files, each once, in path order."""
    return list(dict.fromkeys(Path(f).parent for f in files))


def vocabulary_mismatch(
    a: Sequence[Path], names_a: list[str] | None, b: Sequence[Path], names_b: list[str] | None
) -> str:
    """One line saying how the labels of folders ``a`` and ``b`` differ (each one folder, or a split's
    folders, whose vocabularies together give its names)."""

    def said(folders: Sequence[Path], names: list[str] | None) -> str:
        if names is None:
            return f"{folders[0]} (no {VOCAB_FILE})"
        return f"{' + '.join(str(f / VOCAB_FILE) for f in folders)} ({len(names)} names)"

    where = f"{said(a, names_a)} and {said(b, names_b)} name different labels"
    if names_a is None or names_b is None:
        return where
    return f"{where} ({first_difference(names_a, names_b)})"


def first_difference(names_a: Sequence[str], names_b: Sequence[str]) -> str:
    """``label I: 'x' against 'y'``, the first index where two vocabularies differ (``none`` past the end
    of the shorter)."""
    pairs = zip(names_a, names_b, strict=False)
    i = next((i for i, (x, y) in enumerate(pairs) if x != y), min(len(names_a), len(names_b)))
    x, y = (repr(names[i]) if i < len(names) else "none" for names in (names_a, names_b))
    return f"label {i}: {x} against {y}"


def relabelled(out: Path, names: Sequence[str], label_column: str) -> str | None:
    """Why a set whose labels index ``names`` cannot be written into ``out`` beside the shards already
    there, in one line (None: it can): their integer labels index ``out``'s vocab.json, which the new
    set's would replace, so one folder holds one vocabulary."""
    there = list_shards(out)
    if not there:
        return None
    if vocab_names(out) is None:  # bare ids (the hub's, no ClassLabel names): a vocab.json would name them
        return (f"the shards already in {out} (e.g. {there[0].name}) have no {VOCAB_FILE}: their labels are "
                "bare class ids, which the vocabulary written with these would name; write these to a "
                "folder of their own (a split may name several folders)")  # fmt: skip
    column, have = read_vocab(out)
    names = list(names)
    if column != label_column:
        why = f"label column {column!r} against {label_column!r}"
    elif have != names:
        why = f"{len(have)} names against {len(names)}; {first_difference(have, names)}"
    else:
        return None
    return (f"{out / VOCAB_FILE} is the vocabulary of the shards already in {out} (e.g. {there[0].name}), "
            f"not of these ({why}): writing theirs would relabel those shards; write these to a folder "
            "of their own (a split may name several folders)")  # fmt: skip


def check_same_labels(train: Sequence[str], held_out: Sequence[str]) -> None:
    """A probe fitted on ``train``'s labels can score ``held_out`` only if both index the same names (each
    split's as `split_labels` reads them); raises `DataError` naming both vocabularies where they differ
    (`birdjepa prepare --vocab` writes a split with another's)."""
    (names_a, _), (names_b, _) = split_labels(train), split_labels(held_out)
    if names_a != names_b:
        a, b = split_folders(train), split_folders(held_out)
        raise _rs.DataError(f"{vocabulary_mismatch(a, names_a, b, names_b)}: a probe fitted on the first "
                            "would score the second's clips as other classes")  # fmt: skip


def label_count(files: Sequence[str]) -> int:
    """Classes of the probe: the number of names the split's labels index (`split_labels`); without a
    vocabulary (integer labels only) the largest label + 1. Raises `DataError` for string labels without
    a vocabulary."""
    folder = Path(files[0]).parent
    names, _ = split_labels(files)
    if names is not None:
        return len(names)
    largest = -1
    for f in files:
        table = read_shard(Path(f))
        if DEFAULT_LABEL_COLUMN not in table.column_names:
            raise _rs.DataError(f"{f}: no label column {DEFAULT_LABEL_COLUMN!r}")
        labels = table.column(DEFAULT_LABEL_COLUMN)
        if not pa.types.is_integer(labels.type):
            need = f"{DEFAULT_LABEL_COLUMN} labels of type {labels.type} need a vocabulary"
            raise _rs.DataError(f"{need}: no {folder / VOCAB_FILE}")
        if labels.null_count == len(labels):
            continue
        low, high = pc.min_max(labels).values()
        bad = low.as_py() if low.as_py() < -1 else high.as_py() if high.as_py() >= MAX_CLASSES else None
        if bad is not None:  # -5 read as unlabelled; 2**40 sized a probe head of 71 trillion parameters
            row = pc.index(labels, bad).as_py()
            raise _rs.DataError(f"{f}: row {row}: label {bad} is no class id (0 to {MAX_CLASSES - 1}; -1 or "
                                "null: unlabelled)")  # fmt: skip
        largest = max(largest, high.as_py())
    return largest + 1


def labelled_classes(files: Sequence[str], enough: int) -> int:
    """How many classes the rows of ``files`` are labelled with, counted up to ``enough`` (the shards
    read in order until then; a class is its name where the folder has a vocabulary). Before a run
    evaluates its probes on them: a split with none, or a train split of one, is nothing to score."""
    seen: set[object] = set()
    folder_names: dict[Path, list[str] | None] = {}
    column = label_column(files)  # the loader's: `prepare --label-column species` names it in vocab.json
    for f in files:
        table = read_shard(Path(f))
        if column not in table.column_names:
            continue
        labels = table.column(column)
        if not (pa.types.is_integer(labels.type) or pa.types.is_string(labels.type)
                or pa.types.is_large_string(labels.type)):  # fmt: skip
            return enough  # a type the loader refuses, in its own words, as it opens the split
        labels = pc.filter(labels, pc.is_valid(labels))
        if pa.types.is_integer(labels.type):
            labels = pc.filter(labels, pc.greater_equal(labels, 0))
        folder = Path(f).parent
        if folder not in folder_names:  # read once a folder, not once a shard
            folder_names[folder] = vocab_names(folder)
        names = folder_names[folder]
        for label in pc.unique(labels).to_pylist():
            seen.add(names[label] if names is not None and isinstance(label, int) and label < len(names)
                     else label)  # fmt: skip
        if len(seen) >= enough:
            break
    return len(seen)


MAX_CLASSES = 1 << 20
"""The most classes integer labels without a vocabulary may index (BirdSet's largest task has 9,736)."""


def list_shards(folder: Path) -> list[Path]:
    """The `*.arrow` shards of a folder, sorted by name."""
    return sorted(p for p in Path(folder).glob(f"*{SHARD_SUFFIX}") if not p.name.startswith("."))


def read_shard(path: Path) -> pa.Table:
    """Reads a whole shard, file or stream format (detected from the magic bytes). Raises `DataError`
    naming the file where it is neither (a Parquet file given as a shard, a truncated one)."""
    with open(path, "rb") as f:
        magic = f.read(6)
    try:
        with pa.memory_map(str(path), "r") as source:
            if magic == b"ARROW1":
                return pa.ipc.open_file(source).read_all()
            return pa.ipc.open_stream(source).read_all()
    except pa.ArrowException as e:
        why = "a Parquet file: `birdjepa prepare` converts it" if magic[:4] == b"PAR1" else str(e)
        raise _rs.DataError(f"{path}: not an Arrow IPC shard ({why})") from None
    except OSError as e:  # a header whose buffer runs past the file: pyarrow's "Read out of bounds"
        raise _rs.DataError(f"{path}: a damaged Arrow IPC shard ({e})") from None


def shard_recording_ids(shard: Path) -> list[str | None] | None:
    """A shard's ``recording_id`` column (what `birdjepa prepare` writes), or None where it has none (a
    hub's cache file: its own columns name the recording)."""
    table = read_shard(shard)
    return table.column(RECORDING_ID).to_pylist() if RECORDING_ID in table.schema.names else None


def remove_shards(folder: Path) -> list[Path]:
    """Deletes the `*.arrow` shards, leftover `.partial` files and `vocab.json` of a folder (for
    `--overwrite`); touches nothing else. Returns what was removed."""
    folder = Path(folder)
    removed = list_shards(folder) + sorted(folder.glob(f".*{SHARD_SUFFIX}.partial"))
    vocab = folder / VOCAB_FILE
    if vocab.exists():
        removed.append(vocab)
    for p in removed:
        p.unlink()
    return removed
