"""Parquet as it comes from the hub (BirdSet's Parquet conversion, `datasets`' ``to_parquet``): each file
becomes one Arrow IPC shard the loader reads (`birdjepa prepare SRC OUT` where SRC holds ``*.parquet``).

Every column is kept as it is (a dictionary label column, pandas' ``Categorical``, is written out as its
strings), with the schema's metadata (HF's ``huggingface`` features): the audio
(HF's ``Audio`` struct of bytes and path, a binary column, or a column of paths) is copied, never
re-encoded; labels, the multi-label lists and BirdSet's other columns stay beside it. A file is read
one row group at a time, ``workers`` files at once, so memory holds that many row groups.
``vocab.json`` is written beside the shards from where the data keeps its class names: the label
column's ``ClassLabel`` names in the schema metadata (in their own order: label ``i`` is ``names[i]``),
or the sorted distinct values of a string label column. A file that cannot be read stops the
conversion with one line naming it and the row group; the shards already written are removed, and
each shard appears only whole (written to a hidden ``.partial`` file, then renamed).
"""

from __future__ import annotations

import glob
import os
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from birdjepa import _rs
from birdjepa.data.shards import (
    BATCH_ROWS,
    DEFAULT_LABEL_COLUMN,
    bad_names,
    class_names,
    list_shards,
    only_writer,
    partial_name,
    relabelled,
    shard_name,
    write_vocab,
)


class ParquetError(ValueError):
    """A Parquet file that cannot be converted; the message names the file (and the row group)."""


@dataclass(frozen=True)
class Converted:
    shards: list[Path]
    rows: int
    bytes_read: int
    """Bytes of the Parquet files read."""
    names: list[str]
    """The vocabulary written (empty: none was found)."""


def parquet_files(src: Path | str) -> list[Path]:
    """The ``*.parquet`` files of a folder (not recursive), a glob or one file, sorted; [] where none."""
    text = os.fspath(src)
    if os.path.isdir(text):  # regular files: a FIFO of that name hung the conversion
        return sorted(p for p in Path(text).glob("*.parquet") if p.is_file())
    found = glob.glob(text) if glob.has_magic(text) else [text]
    return sorted(Path(p) for p in found if p.endswith(".parquet") and os.path.isfile(p))


def convert(
    files: list[Path],
    out: Path,
    *,
    label_column: str,
    prefix: str = "data",
    audio_column: str = "audio",
    workers: int = 4,
) -> Converted:
    """Each of ``files`` as shard ``out/<prefix>-NNNNN.arrow`` (in order, ``workers`` files at a time),
    and ``out/vocab.json``."""
    if not files:
        raise ParquetError("no Parquet files given")
    out = Path(out)
    with only_writer(out):
        return _convert(files, out, label_column, prefix, audio_column, workers)


def _convert(files: list[Path], out: Path, label_column: str, prefix: str, audio_column: str,
             workers: int) -> Converted:  # fmt: skip
    stale = [p for p in list_shards(out) if p.name.startswith(f"{prefix}-")]
    if stale:
        raise FileExistsError(f"{out} already holds shards with prefix {prefix!r} (e.g. {stale[0].name}); "
                              "remove them or write to an empty folder")  # fmt: skip
    schemas = [_check_schema(file, audio_column, label_column) for file in files]  # all, before writing
    names = _one_vocabulary(files, schemas, label_column)
    # Only a vocab.json records the column a reader takes: without one, every reader took ebird_code.
    bare = all(pa.types.is_integer(s.field(label_column).type) for s in schemas)
    if names is None and label_column != DEFAULT_LABEL_COLUMN and bare:
        raise ParquetError(f"{files[0]}: --label-column {label_column}: its integer labels have no "
                           "ClassLabel names, so no vocab.json records the column and every reader would "
                           f"read {DEFAULT_LABEL_COLUMN!r}: give the column its ClassLabel names, or its "
                           "labels as strings")  # fmt: skip
    clash = None if names is None else relabelled(out, names, label_column)
    if clash is not None:  # ClassLabel names: known before any row is copied
        raise ParquetError(clash)
    shards = [out / shard_name(prefix, i) for i in range(len(files))]
    # One file per thread: Arrow reads, decompresses and writes without the GIL.
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(files)))) as pool:
        n_names = None if names is None else len(names)
        jobs = [
            pool.submit(_copy, *job, label_column, n_names)
            for job in zip(files, schemas, shards, strict=True)
        ]
        try:
            done = [job.result() for job in jobs]
        except BaseException:
            for job in jobs:
                job.cancel()
            wait(jobs)
            for p in shards:
                partial_name(p).unlink(missing_ok=True)
            raise
    rows, size = sum(n for _, n, _ in done), sum(f.stat().st_size for f in files)
    strings = set().union(*(labels for _, _, labels in done))
    vocab = names if names is not None else sorted(strings)
    # String labels: known once every row was read. Checked before a shard is named: a vocabulary that
    # cannot be written left named shards without one, which a second run then refused to replace.
    clash = None if names is not None or not vocab else relabelled(out, vocab, label_column)
    clash = clash or (bad_names(vocab, ordered=names is None) if vocab else None)
    if names is None and vocab:  # checked against the ClassLabel's names before any row was read
        said = f"{label_column!r}'s string labels, sorted"
        clash = clash or _multilabel_clash(files, schemas, label_column, vocab, said)
    if rows == 0 or clash is not None:  # 0 rows: it said "wrote 0 rows" and exit 0, for a set every
        for p in shards:  # command then refused
            partial_name(p).unlink()
        if clash is not None:
            raise ParquetError(clash)
        raise ParquetError(f"{files[0]}{f' and {len(files) - 1} more' if len(files) > 1 else ''}: no rows")
    for p in shards:  # whole: named, each shard, then the vocabulary
        partial_name(p).rename(p)
    if vocab:
        write_vocab(out, vocab, label_column, ordered=names is None)
    return Converted(shards, rows, size, vocab)


def one_line(e: BaseException) -> str:
    """An error's text on one printable line (Arrow's Parquet errors span lines and quote raw bytes)."""
    return " ".join("".join(c if c.isprintable() else " " for c in str(e)).split())


def _one_vocabulary(files: list[Path], schemas: list[pa.Schema], label_column: str) -> list[str] | None:
    """The ClassLabel names the files' labels index (None: none named), where every file's labels
    mean the same classes: a file naming them in another order had its ids read as the first file's
    names, and bare ids beside named or string labels as positions in that vocabulary, without a word."""
    named = [(f, class_names(s, label_column)) for f, s in zip(files, schemas, strict=True)]
    first = next(((f, n) for f, n in named if n is not None), None)
    for f, n in named:
        if first is not None and n is not None and n != first[1]:
            raise ParquetError(f"{f}: its ClassLabel names of {label_column!r} are not {first[0]}'s (or not "
                               "in their order): its ids would be read as that file's classes; convert the "
                               "two apart")  # fmt: skip
    bare = [f for (f, n), s in zip(named, schemas, strict=True)
            if n is None and pa.types.is_integer(s.field(label_column).type)]  # fmt: skip
    other = next((f for f, n in named if f not in bare), None)
    if bare and other is not None:
        raise ParquetError(f"{bare[0]}: integer labels without ClassLabel names beside {other}'s named "
                           "ones: its ids would be read as positions in that vocabulary; convert the two "
                           "apart")  # fmt: skip
    text = next((f for f, s in zip(files, schemas, strict=True) if _names(s.field(label_column).type)), None)
    if first is not None and text is not None:  # prepare passed, and the first string missing from the
        raise ParquetError(f"{text}: string labels beside {first[0]}'s ClassLabel ids: the vocabulary "
                           "would be the ClassLabel's names alone, and a training run stops at the first "
                           "string outside them; convert the two apart")  # fmt: skip
    if first is None:
        return None
    why = bad_names(first[1], ordered=False)
    if why is not None:
        raise ParquetError(f"{first[0]}: its ClassLabel names cannot be a vocabulary: {why}")
    clash = _multilabel_clash(files, schemas, label_column, first[1], f"those of {label_column!r}")
    if clash is not None:
        raise ParquetError(clash)
    return first[1]


def _multilabel_clash(
    files: list[Path], schemas: list[pa.Schema], label_column: str, vocab: list[str], said: str
) -> str | None:
    """Why a list column's ClassLabel ids would name other classes than ``vocab``'s (``said``: where the
    vocabulary comes from), or None: a multilabel column reads its ids as vocab.json's names."""
    for f, schema in zip(files, schemas, strict=True):
        for column in schema.names:
            names = class_names(schema, column) if pa.types.is_list(schema.field(column).type) else None
            if column != label_column and names is not None and names != vocab:
                return (f"{f}: the ClassLabel names of {column!r} are not {said} (or not in their order), "
                        "which vocab.json will hold: read as a multilabel column, its ids would name other "
                        "classes; remap it to them first")  # fmt: skip
    return None


def _check_schema(file: Path, audio_column: str, label_column: str) -> pa.Schema:
    try:
        schema = pq.read_schema(file)
    except (OSError, pa.ArrowException) as e:
        raise ParquetError(f"{file}: not a readable Parquet file: {one_line(e)}") from None
    for column in (audio_column, label_column):
        if column not in schema.names:
            raise ParquetError(f"{file}: no column {column!r} (columns: {', '.join(schema.names)})")
    try:  # the loader's own check: decoded audio or a dictionary of paths converted, exit 0, then no reader
        _rs.check_audio_column(schema.serialize().to_pybytes(), audio_column, str(file))  # took them
    except _rs.DataError as e:
        raise ParquetError(str(e)) from None
    kind = schema.field(label_column).type
    if not (pa.types.is_integer(kind) or _names(kind)):
        # Converted, it was refused by every command that reads it ("has type double").
        raise ParquetError(f"{file}: label column {label_column!r} has type {kind}: class ids (integers) or "
                           "names (strings) are read; a float column of ids with missing values: cast it "
                           "to an integer type (pandas: Int64)")  # fmt: skip
    return schema


SOURCE_KEY = b"birdjepa.source"
"""A converted shard's schema metadata key: the Parquet file whose rows it holds, in their order."""


def _text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _names(kind: pa.DataType) -> bool:
    """Labels as class names: strings, or pandas' Categorical of them (a dictionary)."""
    return _text(kind) or (pa.types.is_dictionary(kind) and _text(kind.value_type))


def _copy(
    file: Path, schema: pa.Schema, shard: Path, label_column: str, n_names: int | None
) -> tuple[Path, int, set[str]]:
    """``file`` row group by row group into ``shard``'s hidden name (`partial_name`): (the shard, its
    rows, the string labels seen). An integer label outside its ``n_names`` ClassLabel names is an error
    naming the row group (it passed, and the run's probe loss was NaN, blamed on the learning rate)."""
    partial = partial_name(shard)
    labels: set[str] = set()
    at, kind = schema.get_field_index(label_column), schema.field(label_column).type
    names = pa.types.is_dictionary(kind)  # pandas' Categorical: its names written out as strings
    if names:
        schema = schema.set(at, schema.field(at).with_type(pa.string()))
    text_labels = names or _text(kind)  # the vocabulary's source
    # The file it came from: a loader's "data-00001.arrow row 3" could be traced back by sort order only.
    schema = schema.with_metadata({**(schema.metadata or {}), SOURCE_KEY: str(file).encode()})
    rows = 0
    try:
        reader = pq.ParquetFile(file, memory_map=True)
        with pa.OSFile(str(partial), "wb") as sink, ipc.new_file(sink, schema) as writer:
            for group in range(reader.num_row_groups):
                try:
                    table = reader.read_row_group(group)
                except (OSError, pa.ArrowException) as e:
                    raise ParquetError(f"{file}: row group {group}: {one_line(e)}") from None
                if names:
                    table = table.set_column(at, schema.field(at), pc.cast(table.column(at), pa.string()))
                elif n_names is not None and table.num_rows and pa.types.is_integer(schema.field(at).type):
                    low, high = pc.min_max(table.column(at)).values()
                    if low.is_valid and (low.as_py() < -1 or high.as_py() >= n_names):
                        bad = low.as_py() if low.as_py() < -1 else high.as_py()
                        row = rows + pc.index(table.column(at), bad).as_py()  # in the file: groups hold 100s
                        raise ParquetError(f"{file}: row group {group} (row {row}): label {bad} is outside "
                                           f"its {n_names} ClassLabel names")  # fmt: skip
                if text_labels:
                    labels |= {x for x in pc.unique(table.column(label_column)).to_pylist() if x is not None}
                for batch in table.to_batches(max_chunksize=BATCH_ROWS):
                    writer.write_batch(batch)
                rows += table.num_rows
    except (OSError, pa.ArrowException) as e:
        partial.unlink(missing_ok=True)
        raise ParquetError(f"{file}: {one_line(e)}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return shard, rows, labels
