"""Pack a folder of audio files into Arrow shards (`birdjepa prepare SRC OUT`).

Every file under SRC with an extension in `AUDIO_EXTENSIONS` becomes one row, in sorted order of its
path relative to SRC (posix form), with its encoded bytes stored unchanged. Labels come from the first
folder under SRC (`SRC/<label>/.../file.ogg`; files directly in SRC get none) or, with `labels_csv`,
from a CSV with columns `path,label` (paths relative to SRC; files it does not name, or names with an
empty label, get none). The vocabulary is the sorted set of labels; `vocab.json` maps the int labels
back to names.

Every file is checked before it is written (`check`), with the loader's decoder: "header" opens it and
decodes the first frames (and a seekable stream's last one), "full" decodes it all, "none" trusts it.
A file that fails stops the run with an error naming it (and the shards written so far are removed),
unless `skip_bad`, which skips it, counts it and lists it at the end.
"""

from __future__ import annotations

import csv
import errno
import glob
import math
import os
import resource
import sys
import time
import unicodedata
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

import tyro

from birdjepa import _rs
from birdjepa.data.parquet import ParquetError, convert, parquet_files
from birdjepa.data.shards import (
    DEFAULT_LABEL_COLUMN,
    MAX_ROW_BYTES,
    VOCAB_FILE,
    ShardFormat,
    ShardWriter,
    only_writer,
    read_vocab,
    relabelled,
    write_vocab,
)
from birdjepa.exit_codes import INTERRUPTED, IOERR, USAGE

AUDIO_EXTENSIONS = (".aif", ".aifc", ".aiff", ".flac", ".m4a", ".mp3", ".oga", ".ogg", ".wav")
#: Audio that the loader's decoder does not read: counted and named when prepare leaves such files out
#: (three files and a whole class of .aif, .opus and .m4a went without a word).
OTHER_AUDIO = (".3gp", ".aac", ".amr", ".ape", ".au", ".caf", ".mka", ".mp2", ".mp4", ".opus", ".webm",
               ".wma", ".wv")  # fmt: skip
"""Containers the Rust loader decodes (symphonia: ogg/vorbis, flac, wav/pcm, mp3; with gapless, which new
runs have, aiff/aifc and m4a of ALAC or AAC-LC: a run recorded without it refuses those, skips)."""
CHECK_FRAMES = 4096
READ_CHUNK = 64  # files read (and checked, in parallel) at a time
READ_BYTES = 1 << 30  # ... and at most this many of their bytes (or one file)

Check = Literal["header", "full", "none"]


class PrepareError(ValueError):
    """Bad input to `prepare`; the message names the file or CSV row."""


@dataclass
class PrepareResult:
    shards: list[Path]
    vocab: list[str]
    n_files: int
    """Rows written."""
    n_unlabelled: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path relative to SRC, reason) of files skipped with `skip_bad`."""


def find_audio_files(src: Path, extensions: tuple[str, ...] = AUDIO_EXTENSIONS) -> list[str]:
    """Audio files under `src` (by ``extensions``) as sorted posix paths relative to it (hidden files and
    folders skipped). Folders that are links are followed (a label folder on another disk was left out
    without a word), each real folder once: a link back to a folder it is in, or to one walked already
    (folders linked to each other made the walk grow without end, or packed one recording many times
    under two labels), is left out. A FIFO or device under an audio name is no file (reading it hung
    prepare); a link to nowhere is kept, for the reader to name. `PrepareError` for a name that is not
    UTF-8 (a shard stores names as strings: a traceback once a batch was read)."""
    found = []
    walked: set[str] = set()
    for root, dirs, files in os.walk(src, followlinks=True):
        here = os.path.realpath(root)
        walked.add(here)
        # Plain folders first, in name order: each real folder is walked where it is, not through a link.
        dirs.sort(key=lambda d: (os.path.islink(Path(root) / d), d))
        kept = []
        for d in dirs:
            there = os.path.realpath(Path(root) / d)
            if d.startswith(".") or there in walked:  # a link back to a folder it is in: walked already
                continue
            walked.add(there)
            kept.append(d)
        dirs[:] = kept
        rel_root = Path(root).relative_to(src)
        for name in files:
            if name.startswith(".") or not name.lower().endswith(extensions):
                continue
            path = Path(root) / name
            if os.path.exists(path) and not os.path.isfile(path):
                continue
            try:
                (rel_root / name).as_posix().encode("utf-8")
            except UnicodeEncodeError:
                raise PrepareError(f"{os.fsencode(path)!r}: a file name that is not UTF-8 (unpacked from an "
                                   "old archive?): rename it") from None  # fmt: skip
            found.append((rel_root / name).as_posix())
    return sorted(found)


def say_left_out(src: Path, files: Sequence[str], *, by_folder: bool) -> None:
    """A WARNING for the audio files under ``src`` of a format the loader does not read (`OTHER_AUDIO`),
    counted by extension, and (``by_folder``: labels from sub-folders) for the label folders that held
    only those, which are no class."""
    others = find_audio_files(src, OTHER_AUDIO)
    if not others:
        return
    count = Counter(PurePosixPath(f).suffix.lower() for f in others)
    kinds = ", ".join(f"{n} {ext}" for ext, n in sorted(count.items()))
    print(f"WARNING {len(others)} audio file(s) under {src} left out ({kinds}; e.g. {others[0]}): the loader "
          f"reads {', '.join(AUDIO_EXTENSIONS)}; convert them to FLAC to keep them", flush=True)  # fmt: skip
    folders = {f.split("/")[0] for f in others if "/" in f} - {f.split("/")[0] for f in files if "/" in f}
    if by_folder and folders:
        print(f"WARNING label folder(s) {', '.join(sorted(folders))} held only those: no class of "
              "theirs", flush=True)  # fmt: skip


def recording_ids(files: Sequence[str]) -> dict[str, str]:
    """Each file's ``recording_id``: its path without the extension (``amecro/XC001``), or with it where
    another file has the same one (``a.wav`` and ``a.flac`` named one recording)."""
    stems = [str(PurePosixPath(f).with_suffix("")) for f in files]
    seen = Counter(stems)
    return {f: f if seen[s] > 1 else s for f, s in zip(files, stems, strict=True)}


def folder_labels(files: Sequence[str]) -> dict[str, str | None]:
    """Label = first folder of the relative path, in Unicode's composed form (NFC: a folder macOS stored
    decomposed and one typed composed were two classes of one name); None for files directly in SRC."""
    return {
        f: (_label(PurePosixPath(f).parts[0]) if len(PurePosixPath(f).parts) > 1 else None) for f in files
    }


def _label(text: str) -> str | None:
    """A label as it is written everywhere: its composed form, without its ends' spaces (None if empty)."""
    return unicodedata.normalize("NFC", text.strip()) or None


def _normalise_csv_path(raw: str) -> str | None:
    p = PurePosixPath(raw.strip().replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or not p.parts:
        return None
    return p.as_posix()


def csv_labels(csv_path: Path, src: Path, files: Sequence[str]) -> dict[str, str | None]:
    """Labels from a CSV with columns `path,label` (paths relative to `src`). Errors name the CSV row. A
    path is matched in Unicode's composed form (NFC): a name typed as ``ñ`` names the file macOS stored
    as ``n`` + combining tilde."""
    by_form = {unicodedata.normalize("NFC", f): f for f in files}
    labels: dict[str, str | None] = dict.fromkeys(files)
    try:
        fh = open(csv_path, newline="", encoding="utf-8-sig")
    except OSError as e:
        raise PrepareError(f"cannot read labels CSV {csv_path}: {e}") from e
    with fh:
        reader = csv.DictReader(fh)
        try:
            _read_csv_labels(reader, csv_path, src, by_form, labels)
        except UnicodeDecodeError as e:  # a traceback: saved as cp1252 by a spreadsheet
            why = f"{e.reason} at byte {e.start}"
            raise PrepareError(f"{csv_path}: not UTF-8 text ({why}): save it as UTF-8") from None
        except csv.Error as e:  # a quote never closed, past the field limit: a traceback
            raise PrepareError(
                f"{csv_path}, past line {reader.line_num}: {e} (a quote never closed?)"
            ) from None
    return labels


def _read_csv_labels(
    reader: csv.DictReader,
    csv_path: Path,
    src: Path,
    by_form: dict[str, str],
    labels: dict[str, str | None],
) -> None:
    """`csv_labels`' rows into ``labels`` (``by_form``: each file by its NFC name)."""
    first_row: dict[str, int] = {}
    header = [h.strip() for h in (reader.fieldnames or [])]
    if "path" not in header or "label" not in header:
        raise PrepareError(f"{csv_path}: needs a header with columns 'path' and 'label', got {header}")
    reader.fieldnames = header
    for row in reader:
        line = reader.line_num
        raw_path, raw_label = row.get("path"), row.get("label")
        if raw_path is None or raw_label is None:
            raise PrepareError(f"{csv_path} row {line}: missing 'path' or 'label' value: {row}")
        if None in row:  # "Crow, American" unquoted: the label cut to "Crow", the rest dropped
            raise PrepareError(f"{csv_path} row {line}: more fields than the header's ({row[None]!r} left "
                               "over): quote a label or path that holds a comma")  # fmt: skip
        if "\n" in raw_path or "\n" in raw_label:  # a quote never closed took the rows after it in
            raise PrepareError(f"{csv_path} row {line}: a line break inside a path or label (a quote never "
                               "closed?)")  # fmt: skip
        rel = _normalise_csv_path(raw_path)
        if rel is None:
            raise PrepareError(f"{csv_path} row {line}: path {raw_path!r} must be relative to {src}")
        rel = by_form.get(unicodedata.normalize("NFC", rel), rel)
        if rel in first_row:
            raise PrepareError(
                f"{csv_path} row {line}: path {rel!r} already labelled in row {first_row[rel]}"
            )
        if rel not in labels:
            if not (src / rel).exists():
                raise PrepareError(f"{csv_path} row {line}: file {rel!r} not found in {src}")
            raise PrepareError(
                f"{csv_path} row {line}: {rel!r} is not an audio file prepare reads "
                f"(extensions {', '.join(AUDIO_EXTENSIONS)}; hidden files and folders are skipped)"
            )
        first_row[rel] = line
        labels[rel] = _label(raw_label)


def given_vocabulary(path: Path, src: Path, labels: dict[str, str | None]) -> list[str]:
    """The names of the `vocab.json` at ``path`` (the file or its folder), which must hold every label of
    ``labels``: a held-out split prepared with its train split's vocabulary indexes each class as the train
    split does, even where it lacks some. Raises `PrepareError` naming a file whose label it lacks."""
    path = Path(path)
    if not path.is_dir() and path.name != VOCAB_FILE:
        raise PrepareError(f"--vocab {path}: not a {VOCAB_FILE} or a folder holding one")
    folder = path if path.is_dir() else path.parent
    try:
        _, names = read_vocab(folder)  # names a missing file
    except _rs.DataError as e:
        raise PrepareError(f"--vocab {path}: {e}") from None
    known = set(names)
    for rel, label in labels.items():  # before anything is written
        if label is not None and label not in known:
            raise PrepareError(
                f"{src / rel}: label {label!r} is not one of the {len(names)} of {folder / VOCAB_FILE}"
            )
    return names


def check_audio(data: bytes, check: Check) -> str | None:
    """None if `data` decodes (as far as `check` looks) as the loader will decode it, else the reason
    the loader would skip it: one decoder for both (`birdjepa._rs.check_audio`)."""
    if check == "none":
        return None
    if not data:
        return "empty file"
    try:
        _rs.check_audio(data, check == "full", CHECK_FRAMES)
    except ValueError as e:
        return f"cannot decode: {e}"
    return None


def _load(args: tuple[Path, str, Check, int]) -> tuple[bytes, str | None]:
    src, rel, check, size = args
    if size > MAX_ROW_BYTES:  # a ValueError's traceback from the writer
        return b"", f"{size} bytes, over the {MAX_ROW_BYTES} a shard row holds"
    try:
        data = (src / rel).read_bytes()
    except OSError as e:
        if e.errno in RESOURCE_ERRNOS:  # the process's limit, not the file: --skip-bad dropped good files
            files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            limit = f" (ulimit -n: {files})" if e.errno in (errno.EMFILE, errno.ENFILE) else ""
            raise PrepareError(f"{src / rel}: cannot read: {e.strerror}: a limit of this process{limit}, not "
                               "the file; fewer --workers, or a higher limit") from None  # fmt: skip
        return b"", f"cannot read: {e.strerror or e}"
    return data, check_audio(data, check)


#: What a read fails with for want of the process's resources (descriptors, memory, threads), whatever
#: the file: never a bad file to skip.
RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN)


def _loaded(
    src: Path, files: Sequence[str], check: Check, workers: int
) -> Iterator[tuple[bytes, str | None]]:
    """Each file's bytes and problem, in order, read ``workers`` at a time, and at most `READ_CHUNK`
    files or `READ_BYTES` (or one file) held at once: 64 hour-long recordings held ~20 GB."""
    sizes = [_size(src / rel) for rel in files]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        i = 0
        while i < len(files):
            j, held = i + 1, sizes[i]
            while j < len(files) and j - i < READ_CHUNK and held + sizes[j] <= READ_BYTES:
                held, j = held + sizes[j], j + 1
            yield from pool.map(_load, [(src, files[k], check, sizes[k]) for k in range(i, j)])
            i = j


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:  # said by `_load`
        return 0


def prepare(
    src: Path,
    out: Path,
    *,
    labels_csv: Path | None = None,
    shard_mb: float = 256.0,
    fmt: ShardFormat = "file",
    label_column: str = DEFAULT_LABEL_COLUMN,
    prefix: str = "data",
    check: Check = "header",
    skip_bad: bool = False,
    workers: int = 4,
    vocab_file: Path | None = None,
    verbose: bool = False,
) -> PrepareResult:
    """Packs the audio files under `src` into shards `out/<prefix>-NNNNN.arrow` plus `out/vocab.json`;
    ``vocab_file``: index the labels by that `vocab.json`'s names (another split's) instead of their own."""
    src, out = Path(src), Path(out)
    if not src.is_dir():
        magic = glob.has_magic(str(src))
        matched = glob.glob(str(src)) if magic else []
        audio = (f"matches {len(matched)} files, not Parquet ones: audio files are read from their folder "
                 "(labels from its sub-folders), not a glob")  # fmt: skip
        what = "does not exist or is not a folder" if not magic else audio if matched else "matches no file"
        raise PrepareError(f"source {src} {what} (a folder of audio files, or Parquet files)")
    if not (shard_mb > 0 and math.isfinite(shard_mb) and int(shard_mb * 2**20) > 0):  # NaN, inf, 1e-9 too
        raise PrepareError(f"--shard-mb {shard_mb}: must be a finite number of MiB, at least one byte's")
    # Empty or with a '/': a ValueError's traceback, from the shard writer; with a '.' first, hidden
    # shards, which a folder's shards leave out (the loader found none).
    if not prefix or "/" in prefix or prefix.startswith("."):
        raise PrepareError(f"--prefix {prefix!r}: must be a file name's start, not empty, without '/' and "
                           "not hidden ('.' first)")  # fmt: skip
    if label_column in ("", "audio", "recording_id"):
        raise PrepareError(
            f"--label-column {label_column!r}: must be a name other than 'audio' and 'recording_id'"
        )
    files = find_audio_files(src)
    if not files:
        hub = next((d for d in sorted(src.iterdir()) if d.is_dir() and parquet_files(d)), None)
        hint = f"; {hub} holds Parquet files: birdjepa prepare {hub} OUT" if hub is not None else ""
        if others := find_audio_files(src, OTHER_AUDIO):
            hint += f"; {len(others)} of other formats (e.g. {others[0]}): convert them to FLAC"
        raise PrepareError(f"no audio files ({', '.join(AUDIO_EXTENSIONS)}) under {src}{hint}")
    labels = csv_labels(Path(labels_csv), src, files) if labels_csv is not None else folder_labels(files)
    if vocab_file is not None:
        vocab = given_vocabulary(vocab_file, src, labels)
    else:
        vocab = sorted({lab for lab in labels.values() if lab is not None})
    with only_writer(out):  # from the vocabulary's check to the shards put in place
        index = {name: i for i, name in enumerate(vocab)}
        clash = relabelled(out, vocab, label_column)
        if clash is not None:  # before any file is read or written
            raise PrepareError(clash)
        if verbose:
            print(f"{len(files)} audio files under {src}, {len(vocab)} labels", flush=True)
            say_left_out(src, files, by_folder=labels_csv is None)

        skipped: list[tuple[str, str]] = []
        n_unlabelled = 0
        ids = recording_ids(files)
        # On any error the writer deletes what it wrote: no half data set is left behind. The vocab.json
        # goes in before the shards are renamed into place (after, a failure to write it left shards
        # read as bare class ids, where the error said OUT held what it held before), and is taken out
        # again where they fail.
        vocab_path, had_vocab = out / VOCAB_FILE, (out / VOCAB_FILE).exists()
        try:
            with ShardWriter(out, prefix, int(shard_mb * 2**20), fmt, label_column=label_column) as writer:
                for rel, (data, problem) in zip(files, _loaded(src, files, check, workers), strict=True):
                    if problem is not None:
                        if not skip_bad:
                            raise PrepareError(f"{src / rel}: {problem} (use --skip-bad to skip such files)")
                        skipped.append((rel, problem))
                        continue
                    label = labels[rel]
                    n_unlabelled += label is None
                    writer.add(data, rel, None if label is None else index[label], ids[rel])
                if writer.n_rows == 0:
                    raise PrepareError(f"none of the {len(files)} audio files under {src} could be read")
                # Another split's vocabulary keeps its order (the hub's ClassLabel names need not be sorted).
                write_vocab(out, vocab, label_column, ordered=vocab_file is None)
        except BaseException:
            if not had_vocab:
                vocab_path.unlink(missing_ok=True)
            raise
        shards = list(writer.paths)
    result = PrepareResult(shards, vocab, writer.n_rows, n_unlabelled, skipped)
    if verbose:
        print(
            f"wrote {result.n_files} rows ({result.n_unlabelled} without label) in {len(shards)} shard(s) "
            f"and vocab.json ({len(vocab)} labels) to {out}"
        )
        if skipped:
            print(f"skipped {len(skipped)} bad file(s):")
            for rel, why in skipped:
                print(f"  {rel}: {why}")
            # Their labels stay in vocab.json (rows written index it): every probe's chance level counts them.
            gone = {rel for rel, _ in skipped}
            written = {labels[rel] for rel in files if rel not in gone}
            empty = [name for name in vocab if name not in written]
            if empty and vocab_file is None:
                print(f"WARNING {len(empty)} label(s) have no row, every file of theirs skipped: "
                      f"{', '.join(empty)}; they stay in {out / VOCAB_FILE}")  # fmt: skip
    return result


def cli(
    src: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="SRC")],
    out: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="OUT")],
    labels_csv: Path | None = None,
    shard_mb: float = 256.0,
    format: ShardFormat = "file",
    label_column: str = DEFAULT_LABEL_COLUMN,
    prefix: str = "data",
    check: Check = "header",
    skip_bad: bool = False,
    workers: int = 4,
    vocab: Path | None = None,
) -> None:
    """Pack a folder of audio files (.aif .aifc .aiff .flac .m4a .mp3 .oga .ogg .wav) into Arrow shards +
    vocab.json, bytes unchanged; or convert Parquet files (the hub's, e.g. BirdSet's): each one shard, every
    column kept.

    Labels come from the sub-folder (SRC/<label>/...) or from --labels-csv (columns path,label); a
    Parquet set keeps its own, and its vocab.json comes from the label column's ClassLabel names.

    Args:
        src: Folder of audio files; or Parquet files: a folder of *.parquet, a glob or one file.
        out: Output folder for the shards and vocab.json.
        labels_csv: CSV with columns path,label (paths relative to SRC); unnamed files get no label.
        shard_mb: Target shard size in MiB.
        format: Arrow IPC file or stream format.
        label_column: Name of the int64 label column (and of vocab.json's label_column).
        prefix: Shard file names are PREFIX-NNNNN.arrow.
        check: How far to decode each file, with the loader's decoder, before packing it: header (container,
            codec, rate, first frames, the last frame where it seeks), full (every frame), none.
        skip_bad: Skip files that fail the check (and list them) instead of stopping.
        workers: Threads reading and checking files.
        vocab: Index the labels by this vocab.json (or its folder): another split's, so that this one's
            labels name the same classes, even where it lacks some (a held-out split: --data.eval).
    """
    try:
        if workers < 1:  # taken as one thread without a word
            raise PrepareError(f"--workers {workers}: must be >= 1")
        if out.resolve() == (src.resolve() if src.is_dir() else src.resolve().parent):
            raise PrepareError(f"OUT {out} is where SRC's files are: the shards would sit among them "
                               "(and be read as the source next time): give another folder")  # fmt: skip
        if files := parquet_files(src):
            audio = find_audio_files(src) if src.is_dir() else []
            if audio:  # the audio was left out without a word (HF's audiofolder: metadata.parquet)
                raise PrepareError(f"{src} holds Parquet files and {len(audio)} audio file(s) (e.g. "
                                   f"{audio[0]}): give the Parquet files as '{src}/*.parquet', or the audio "
                                   "files in a folder of their own")  # fmt: skip
            if vocab is not None:
                raise PrepareError(f"--vocab {vocab}: a Parquet set keeps its own ClassLabel names")
            # Each Parquet file becomes one shard as it is: these were ignored without a word.
            for flag, given, default in (("--labels-csv", labels_csv, None), ("--shard-mb", shard_mb, 256.0),
                                         ("--format", format, "file"), ("--check", check, "header"),
                                         ("--skip-bad", skip_bad, False)):  # fmt: skip
                if given != default:
                    raise PrepareError(f"{flag} {given}: a folder of audio files' option; a Parquet set is "
                                       "converted file for file, as it is")  # fmt: skip
            t0 = time.perf_counter()
            done = convert(files, out, label_column=label_column, prefix=prefix, workers=workers)
            mib, took = done.bytes_read / 2**20, time.perf_counter() - t0
            vocab_said = (f"and vocab.json ({len(done.names)} labels)" if done.names else
                          "(no vocab.json: its integer labels have no ClassLabel names)")  # fmt: skip
            print(f"wrote {done.rows} rows in {len(done.shards)} shard(s) from {len(files)} Parquet file(s) "
                  f"({mib:.0f} MiB in {took:.1f} s, {mib / max(took, 1e-9):.0f} MiB/s) {vocab_said} "
                  f"to {out}")  # fmt: skip
            return
        prepare(
            src,
            out,
            labels_csv=labels_csv,
            shard_mb=shard_mb,
            fmt=format,
            label_column=label_column,
            prefix=prefix,
            check=check,
            skip_bad=skip_bad,
            workers=workers,
            vocab_file=vocab,
            verbose=True,
        )
    except (
        PrepareError,
        ParquetError,
        FileExistsError,
    ) as e:  # input it cannot use: exit 2, as every command
        print(f"birdjepa prepare: error: {e}", file=sys.stderr)
        raise SystemExit(USAGE) from None
    except OSError as e:  # OUT under a file, a folder it may not write, a full disk: a traceback
        print(f"birdjepa prepare: error: cannot write {e.filename or out}: {e.strerror or e}; {out} holds "
              "what it held before", file=sys.stderr)  # fmt: skip
        raise SystemExit(IOERR) from None
    except KeyboardInterrupt:  # a 40-line traceback, for a stop asked for
        print(f"birdjepa prepare: interrupted; {out} holds what it held before", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
