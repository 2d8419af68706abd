"""`birdjepa export RUN --out DIR` and `birdjepa embed SOURCE --encoder DIR_OR_RUN --out FILE.parquet`."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import tyro

from birdjepa.data import DEFAULTS, DataError, resolve_files
from birdjepa.data.loader import loader_refusal
from birdjepa.data.prepare import AUDIO_EXTENSIONS, PrepareError, find_audio_files
from birdjepa.data.row_columns import SAME_LENGTH_S, row_windows
from birdjepa.data.shards import read_shard, shard_recording_ids, split_labels
from birdjepa.exit_codes import IOERR, USAGE
from birdjepa.export.encoder import (
    CARD,
    FORMAT,
    FORMAT_VERSION,
    WEIGHTS,
    Encoder,
    ExportError,
    checkpoint_identity,
    flatten,
    load_encoder,
    read_card,
)
from birdjepa.outputs import WriteError, in_place, unwritable, write_whole


def export(run: Path, out: Path, step: int | None = None) -> Path:
    """Writes checkpoint ``step`` (default: the newest) of ``run``'s encoder to ``out``: the weights in
    safetensors, and a card with the model config, the feature options, the batch size embeddings are
    computed in and the checkpoint's identity."""
    from safetensors.numpy import save

    from birdjepa.evaluation.cli import EvaluateError, restore_checkpoint
    from birdjepa.rundir.checkpoint import CheckpointError

    why = unwritable(out, folder=True)  # before the restore, which is the slow part
    if why is not None:
        raise ExportError(why)
    try:
        r = restore_checkpoint(run, step)
    except (EvaluateError, CheckpointError) as e:  # CheckpointError: a damaged one, as `evaluate` says
        raise ExportError(str(e)) from e
    identity = checkpoint_identity(run, r.step, r.meta)
    held_out(out, identity)
    card = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "identity": identity,
        "checkpoint": {
            "run": str(run.resolve()),
            "step": r.step,
            "git": r.meta.get("git"),
            "machine": r.meta.get("machine"),
        },  # fmt: skip
        "model": dataclasses.asdict(r.model_cfg),
        "features": dataclasses.asdict(r.cfg.data.features),
        "batch_size": r.cfg.data.batch_size,
        "embedding_dim": r.model_cfg.dim,
        "input": "log-mel spectrogram float32 [B, n_frames, n_mels] as birdjepa.data.Loader makes it "
        "with these features",
    }
    out.mkdir(parents=True, exist_ok=True)
    # Written as any file is (safetensors' own writer made it 0600: unreadable by the colleague the
    # export is for, on a shared cluster), each whole or not at all; the card last, so a folder with a
    # card holds its weights.
    write_whole(out / WEIGHTS, save(flatten({"encoder": r.params["encoder"]})))
    write_whole(out / CARD, (json.dumps(card, indent=2, default=str) + "\n").encode())
    return out


def held_out(out: Path, identity: str) -> None:
    """`ExportError` where ``out`` holds what an export of ``identity`` must not replace: another
    encoder's export, or files no export wrote (a run directory: its `embed` then read the stray card's
    step, not the run's newest). A card that cannot be read is replaced (it came from a write cut short,
    and refusing it refused the export that mends it)."""
    if (out / CARD).is_file():
        try:
            there = read_card(out).get("identity")
        except ExportError as e:
            print(f"WARNING {e}: replaced by this export", flush=True)
            return
        if there != identity:
            raise ExportError(f"{out} holds the export of {there}: give another --out, or remove it first")
    ours = {CARD, WEIGHTS, f".{CARD}.partial", f".{WEIGHTS}.partial"}
    if out.is_dir() and (others := sorted(p.name for p in out.iterdir() if p.name not in ours)):
        raise ExportError(f"{out} holds files no export wrote ({', '.join(others[:3])}): give an empty or a "
                          "new folder as --out")  # fmt: skip


def export_cli(
    run: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN")],
    out: Path,
    step: int | None = None,
) -> None:
    """Write a run's encoder out of the harness: OUT/model.safetensors and OUT/encoder.json (model config,
    feature options, the checkpoint's identity). birdjepa.load_encoder(OUT) reads it back.

    Args:
        run: Run directory.
        out: Folder to write.
        step: Checkpoint step (default: the newest).
    """
    try:
        folder = export(run, out, step)
    except ExportError as e:
        print(f"birdjepa export: error: {e}", file=sys.stderr)
        raise SystemExit(USAGE) from None
    except WriteError as e:
        print(f"birdjepa export: error: {e}", file=sys.stderr)
        raise SystemExit(IOERR) from None
    card = json.loads((folder / CARD).read_text())
    print(f"exported {card['identity']} ({card['embedding_dim']}-d embeddings) to {folder}")


def embed(
    source: str,
    encoder: Encoder,
    out: Path,
    *,
    n_workers: int = DEFAULTS["n_workers"],
    audio_root: str | None = DEFAULTS["audio_root"],
) -> int:
    """Embeds ``source`` (shards: a glob, folder or file of .arrow; or a folder or list of audio files)
    into ``out`` (Parquet, one row per clip); returns the row count. ``audio_root``: see `embed_cli`."""
    audio, files = checked(source, out)
    return embed_sources(audio, files, encoder, out, n_workers=n_workers, audio_root=audio_root)


def checked(source: str, out: Path) -> tuple[list[Path], list[str]]:
    """What can fail before an encoder loads: ``source``'s files (`sources`), and ``out`` writable."""
    audio, files = sources(source)
    why = unwritable(out)
    if why is None and in_place(out):  # Parquet seeks: "lseek failed" once every embedding was computed
        why = f"{out}: is no regular file (a pipe, a device): embeddings are a Parquet file, written whole"
    if why is not None:
        raise ExportError(why)
    return audio, files


def embed_sources(
    audio: list[Path],
    files: list[str],
    encoder: Encoder,
    out: Path,
    *,
    n_workers: int,
    audio_root: str | None = DEFAULTS["audio_root"],
) -> int:
    """`embed` of the files `checked` found (a folder is listed once: it may hold 100,000 recordings)."""
    if out.is_file():  # another encoder's embeddings were replaced without a word (export refuses it)
        try:
            there = (pq.read_schema(out).metadata or {}).get(b"encoder", b"").decode() or None
        except (OSError, pa.ArrowException):
            there = None
        if there is None:  # the input shard itself, a text file: replaced by a Parquet file, exit 0
            raise ExportError(f"{out} exists and holds no embeddings birdjepa wrote: give another --out, or "
                              "remove it")  # fmt: skip
        if there != encoder.identity:
            raise ExportError(f"{out} holds the embeddings of {there}: give another --out, or remove it")
    if audio:
        columns = encoder.embed_audio(audio, n_workers=n_workers)
        n = len(columns["source"])
        columns["row"] = columns["label"] = np.full(n, -1)  # a file of audio: no shard row, no label
        columns["label_name"] = columns["recording_id"] = [None] * n
    else:
        parts: dict[str, list] = {"source": [], "row": [], "recording_id": [], "label": [], "label_name": [],
                                  "start_s": [], "end_s": [], "embedding": []}  # fmt: skip
        rate, clip = encoder.features.target_rate, encoder.features.clip_seconds
        names, _ = split_labels(files)  # what the loader's labels index, whichever folder a shard is in
        ids = [shard_recording_ids(Path(f)) for f in files]
        windows = [row_windows(read_shard(Path(f))) for f in files]  # a clip past its row's window: zeros
        for batch in encoder.embed_files(files, n_workers=n_workers, audio_root=audio_root):
            starts = batch["crop_offset"] / rate
            parts["source"] += [files[int(s)] for s in batch["shard_id"]]
            parts["row"].append(batch["row"])
            parts["recording_id"] += [
                ids[s][r] if ids[s] else None for s, r in zip(batch["shard_id"], batch["row"], strict=True)
            ]
            parts["label"].append(batch["label"])
            parts["label_name"] += [names[x] if names and x >= 0 else None for x in batch["label"]]
            parts["start_s"].append(starts)
            ends = [windows[s][r, 1] if windows[s] is not None else np.nan
                    for s, r in zip(batch["shard_id"], batch["row"], strict=True)]  # fmt: skip
            parts["end_s"].append(np.fmin(starts + clip, np.asarray(ends, np.float64)))
            parts["embedding"].append(batch["embedding"])
        if not parts["embedding"]:  # every row skipped (the loader's WARNING line named them)
            raise DataError(f"no row of the {len(files)} shard file(s) could be read: nothing to embed")
        keep = ("source", "recording_id", "label_name")
        columns = {k: v if k in keep else np.concatenate(v) for k, v in parts.items()}
        short = int((columns["end_s"] - columns["start_s"] < clip - SAME_LENGTH_S).sum())
        if short:  # the rows' windows ended before the encoder's clip did: it saw zeros past them
            print(f"WARNING {short} rows' windows are shorter than the encoder's {clip:g} s clip: past each "
                  "window's end its clip is zeros (end_s is the window's end)", flush=True)  # fmt: skip
    dim = encoder.model.dim
    labels = np.asarray(columns["label"], np.int64)
    table = pa.table({
        "source": pa.array(list(columns["source"]), pa.string()),
        "row": pa.array(columns["row"], pa.int64()),
        "recording_id": pa.array(columns["recording_id"], pa.string()),
        "label": pa.array(labels, pa.int64(), mask=labels < 0),
        "label_name": pa.array(columns["label_name"], pa.string()),
        "start_s": pa.array(columns["start_s"], pa.float64()),
        "end_s": pa.array(columns["end_s"], pa.float64()),
        "embedding": pa.FixedSizeListArray.from_arrays(
            pa.array(np.asarray(columns["embedding"], np.float32).reshape(-1)), dim),
    })  # fmt: skip
    table = table.replace_schema_metadata({"encoder": encoder.identity})
    write_whole(out, lambda p: pq.write_table(table, p))
    return len(table)


def sources(source: str) -> tuple[list[Path], list[str]]:
    """``(audio files, shard files)`` of ``source``, one of them empty; `DataError` for a path that does
    not exist (as `evaluate` says it), so a typo fails before the encoder is loaded."""
    # the files `prepare` would pack, so a folder embeds the recordings a run on it trained on
    audio = [Path(source) / f for f in find_audio_files(Path(source))] if Path(source).is_dir() else []
    if Path(source).is_file() and source.lower().endswith(AUDIO_EXTENSIONS):  # read as a shard: "not Arrow"
        audio = [Path(source)]
    if audio:
        if shards := sorted(Path(source).glob("*.arrow")) if Path(source).is_dir() else []:
            print(f"WARNING {source} holds {len(shards)} shard(s) too ({shards[0].name}): its {len(audio)} "
                  "audio file(s) are embedded; name the shards to embed those", flush=True)  # fmt: skip
        return audio, []
    if Path(source).is_dir() and not any(Path(source).glob("*.arrow")):  # "no shard files match": half of it
        kinds = ", ".join(AUDIO_EXTENSIONS)
        raise DataError(f"{source}: a folder with neither audio files ({kinds}) under it nor shards in it")
    files = resolve_files(source)
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        raise DataError(f"{missing[0]}: no such shard file")
    return [], files


def embed_cli(
    source: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="SOURCE")],
    encoder: Path,
    out: Path,
    step: int | None = None,
    n_workers: int = DEFAULTS["n_workers"],
    audio_root: str | None = DEFAULTS["audio_root"],
) -> None:
    """Embed recordings with a trained encoder: one Parquet row per clip (source file or shard, row,
    recording id, label and its name for a shard row, window start and end in seconds, embedding).

    Args:
        source: An audio file or a folder of them (every clip-long window of each), or shards (a glob, a
            folder or a file of .arrow: one row per shard row, its centre crop or its start/end window).
        encoder: An export folder (birdjepa export) or a run directory.
        out: The Parquet file to write.
        step: With a run directory: the checkpoint step (default: the newest).
        n_workers: Loader decode threads; 0: one per CPU this process may run on (the result does not
            depend on it).
        audio_root: Where shard rows that name their audio by a relative path (a hub's cache of BirdSet)
            find it (default: each shard's folder).
    """
    t0 = time.perf_counter()
    if n_workers < 0:  # the loader's ValueError, a traceback
        print(f"birdjepa embed: error: --n-workers {n_workers}: must be >= 0", file=sys.stderr)
        raise SystemExit(USAGE)
    if (why := loader_refusal(None, n_workers, audio_root=audio_root)) is not None:
        print(f"birdjepa embed: error: {why}", file=sys.stderr)
        raise SystemExit(USAGE)
    try:
        audio, files = checked(source, out)  # what can fail at once does, before the encoder loads
        enc = load_encoder(encoder, step)
        n = embed_sources(audio, files, enc, out, n_workers=n_workers, audio_root=audio_root)
    except (ExportError, DataError, PrepareError) as e:  # PrepareError: a file name that is not UTF-8
        print(f"birdjepa embed: error: {e}", file=sys.stderr)
        raise SystemExit(USAGE) from None
    except WriteError as e:
        print(f"birdjepa embed: error: {e}", file=sys.stderr)
        raise SystemExit(IOERR) from None
    print(f"embedded {n} clips with {enc.identity} into {out} in {time.perf_counter() - t0:.1f} s")
