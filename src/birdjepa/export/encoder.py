"""`load_encoder(DIR or RUN)`: a trained encoder as a plain callable, spectrogram -> embedding.

The callable runs the same jitted encoder on the same batches as `birdjepa evaluate` (chunks of the
run's batch size, the last one padded with zeros), so fed the loader's batches it gives evaluate's
embeddings bit for bit. The loader itself (eval mode, the run's features) makes the spectrograms of
`Encoder.embed_files` (shards: one row per shard row), `embed_audio` (audio files: every clip-long
window) and `embed_waveform` (samples in memory), so no second feature pipeline exists.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc  # noqa: F401 (pa.ipc)

from birdjepa.data import DEFAULTS, DataError, Features, Loader
from birdjepa.model.config import ModelConfig
from birdjepa.rundir import layout

CARD = "encoder.json"
WEIGHTS = "model.safetensors"
FORMAT = "birdjepa-encoder"
FORMAT_VERSION = 1


class ExportError(ValueError):
    """Not an export or a run, or an export this version cannot read."""


def checkpoint_identity(run_dir: Path, step: int, meta: dict[str, Any]) -> str:
    """``run:NAME@STEP#CRC``: the CRC-32 of the checkpoint's per-leaf CRC-32s names its exact bytes."""
    crc = zlib.crc32(json.dumps(list(meta["hashes"])).encode())
    return f"run:{run_dir.resolve().name}@{step}#{crc:08x}"  # resolved: `export .` named it "run:@3"


def flatten(tree: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """``{"a": {"b": x}} -> {"a/b": x}`` (safetensors holds a flat name -> array map)."""
    out: dict[str, np.ndarray] = {}
    for k, v in tree.items():
        name = f"{prefix}/{k}" if prefix else str(k)
        out.update(flatten(v, name) if isinstance(v, dict) else {name: np.asarray(v)})
    return out


def unflatten(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for name, v in flat.items():
        *path, leaf = name.split("/")
        node = tree
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = v
    return tree


@dataclasses.dataclass
class Encoder:
    """A frozen encoder: ``encoder(spectrogram [B, T, M]) -> [B, D]`` float32."""

    model: ModelConfig
    features: Features
    batch_size: int
    identity: str
    params: dict[str, Any]
    """``{"encoder": ...}``: the encoder's weights alone."""

    def __post_init__(self) -> None:
        import jax

        from birdjepa.model.vit import encoder_apply

        self._apply = jax.jit(encoder_apply(self.model))
        self._apply_tokens = jax.jit(encoder_apply(self.model, tokens=True))

    def __call__(self, spectrogram: np.ndarray) -> np.ndarray:
        return self._chunks(self._apply, spectrogram)

    def with_tokens(self, spectrogram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(embedding [B, D], patch tokens [B, N, D])``: the embedding is ``encoder(spectrogram)``'s,
        bit for bit (the same program), and the mean of the tokens to the model dtype's rounding (its
        mean is taken in that dtype: bfloat16's ~3 significant digits, 0.4% apart at most measured)."""
        return self(spectrogram), self._chunks(self._apply_tokens, spectrogram)

    def _chunks(self, apply: Any, spectrogram: np.ndarray) -> np.ndarray:
        """``apply`` on chunks of the batch size, the last one padded with zeros (one compiled shape)."""
        x = np.asarray(spectrogram, np.float32)
        m = self.model.resolved()
        frames = x.shape[1] if x.ndim == 3 else 0
        # Else the model named the padded chunk's shape, not the caller's.
        if x.ndim != 3 or x.shape[2] != m.n_mels or not 0 < frames <= m.n_frames or frames % m.patch:
            raise ValueError(f"the encoder takes [B, T, M={m.n_mels}] spectrograms (T <= {m.n_frames}, a "
                             f"multiple of {m.patch}), got shape {x.shape}")  # fmt: skip
        parts: list[np.ndarray] = []
        for start in range(0, len(x), self.batch_size):
            chunk = x[start : start + self.batch_size]
            n = len(chunk)
            if n < self.batch_size:
                chunk = np.concatenate([chunk, np.zeros((self.batch_size - n, *chunk.shape[1:]), np.float32)])
            parts.append(np.asarray(apply(self.params, chunk), np.float32)[:n])
        if not parts:
            return np.zeros((0, m.dim) if apply is self._apply else (0, m.n_patches, m.dim), np.float32)
        return np.concatenate(parts)

    def embed_files(
        self,
        files: Sequence[str],
        *,
        n_workers: int = DEFAULTS["n_workers"],
        skipped: list[dict[str, Any]] | None = None,
        audio_root: str | None = DEFAULTS["audio_root"],
    ) -> Iterator[dict[str, np.ndarray]]:
        """Batches of shard rows through the eval-mode loader: ``index`` (over all shards), ``shard_id``,
        ``row`` (in its shard), ``label`` (-1: none), ``crop_offset`` (samples at the target rate) and
        ``embedding``. The rows the loader skipped are said in its WARNING line, or, given ``skipped``,
        appended to it (`Loader.diagnostics`' records) for the caller to say. ``audio_root``: where rows
        that name their audio by a relative path find it (default: each shard's folder)."""
        with Loader(list(files), batch_size=self.batch_size, n_workers=n_workers, train=False,
                    features=self.features, audio_root=audio_root) as loader:  # fmt: skip
            loader.say_skips = skipped is None
            first_index = np.r_[0, np.cumsum(loader.shard_sizes)]
            for batch in loader:
                yield {
                    "index": batch["index"],
                    "shard_id": batch["shard_id"],
                    "row": batch["index"] - first_index[batch["shard_id"]],
                    "label": batch["label"],
                    "crop_offset": batch["crop_offset"],
                    "embedding": self(batch["spectrogram"]),
                }
            if skipped is not None:
                skipped += loader.diagnostics()["skipped"]

    def embed_audio(
        self, files: Sequence[str | Path], *, n_workers: int = DEFAULTS["n_workers"]
    ) -> dict[str, Any]:
        """Every consecutive clip-long window of each audio file (the last one zero-padded):
        ``source``, ``start_s``, ``end_s`` (arrays, one entry per window) and ``embedding [W, D]``."""
        with tempfile.TemporaryDirectory() as tmp:
            return self._embed_windows([(str(f), Path(f)) for f in files], n_workers, Path(tmp))

    def embed_waveform(self, samples: np.ndarray, rate: int) -> np.ndarray:
        """``[W, D]``: each clip-long window of a float waveform at ``rate`` Hz, ``[samples]`` or ``[samples,
        channels]`` (averaged, as the loader mixes a file's channels), through the loader's resampling and
        log-mel (it is stored as a 32-bit float WAV, which decodes to the same samples)."""
        import soundfile

        samples = np.asarray(samples)
        if not np.issubdtype(samples.dtype, np.floating):  # int16 PCM read as floats of +-32767: no word
            raise DataError(f"the waveform is {samples.dtype}: give float samples in [-1, 1] (int16 / 32768)")
        if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate < 1:  # libsndfile's
            raise DataError(f"rate {rate!r}: give the waveform's sample rate in Hz, a positive integer")
        # torch's and librosa's [channels, samples] was written as one frame of N channels: libsndfile's
        # "Format not recognised", naming a temporary file.
        if samples.ndim not in (1, 2) or samples.ndim == 2 and samples.shape[1] > samples.shape[0]:
            raise DataError(f"the waveform's shape is {samples.shape}: give [samples] or [samples, channels] "
                            "(a [channels, samples] array transposed: samples.T)")  # fmt: skip
        with tempfile.TemporaryDirectory() as tmp:
            wav = Path(tmp) / "waveform.wav"
            soundfile.write(wav, samples.astype(np.float32), int(rate), format="WAV", subtype="FLOAT")
            windows = self._embed_windows([("<waveform>", wav)], 1, Path(tmp))
        if windows["left_out"]:  # [W, D] would not say which
            raise DataError("the waveform has windows the loader cannot read (see the WARNING)")
        return windows["embedding"]

    def _embed_windows(self, files: list[tuple[str, Path]], n_workers: int, tmp: Path) -> dict[str, Any]:
        """The windows the loader read; one it skipped (a NaN sample) is left out, said in a WARNING line
        naming its file, seconds and why (its embedding was zeros, exit 0; the loader's own line named
        the temporary shard's row)."""
        shard, where = window_shard(files, self.features, tmp)
        vectors = np.zeros((len(where), self.model.dim), np.float32)
        read = np.zeros(len(where), bool)
        skipped: list[dict[str, Any]] = []
        for batch in self.embed_files([shard], n_workers=n_workers, skipped=skipped):
            vectors[batch["index"]] = batch["embedding"]
            read[batch["index"]] = True
        why = {int(s["row"]): s["reason"] for s in skipped}
        gone = [f"{where[i][0]} {where[i][1]:g}-{where[i][2]:g} s ({why.get(int(i), 'not read')})"
                for i in np.flatnonzero(~read)]  # fmt: skip
        if not read.any():
            raise DataError(f"no window of {', '.join(sorted({w[0] for w in where}))} can be read: {gone[0]}")
        if gone:
            more = f"; {len(gone) - 3} more" if len(gone) > 3 else ""
            said = "; ".join(gone[:3])
            print(f"WARNING left out {len(gone)} window(s) the loader cannot read: {said}{more}", flush=True)
        keep = np.flatnonzero(read)
        return {
            "source": np.array([w[0] for w in where], dtype=object)[keep],
            "start_s": np.array([w[1] for w in where])[keep],
            "end_s": np.array([w[2] for w in where])[keep],
            "embedding": vectors[keep],
            "left_out": len(gone),
        }


def window_shard(files: list[tuple[str, Path]], features: Features, folder: Path) -> tuple[str, list[tuple]]:
    """Audio files as one Arrow shard whose rows are their consecutive clips' windows (each row
    names its file by path, as BirdSet's soundscape rows do, with its window's start and end: the loader
    seeks to each window); returns the shard and, per row, (name, start s, end s). A row holding the
    file's bytes made the shard an hour-long file's size times its 720 windows. A last window shorter
    than one log-mel frame (``win_length`` samples) is none: it held no frame, and was embedded as a
    map of padding (a 44.1 kHz file of 441001 samples) or refused as empty (its end rounded to its start)."""
    from birdjepa._rs import audio_length

    rows, where, clip, rate_out = [], [], features.clip_seconds, features.target_rate
    for name, path in files:
        try:
            frames, rate = audio_length(path, gapless=features.gapless)  # not decoded whole: an hour's 460 MB
        except OSError as e:  # a dangling link, a file removed since the folder was listed
            raise DataError(f"{name}: cannot read: {e.strerror or e}") from e
        except ValueError as e:
            raise DataError(f"{name}: cannot decode: {e}") from e
        seconds = frames / rate
        audio = {"bytes": None, "path": str(path.absolute())}
        for k in range(max(int(np.ceil(seconds / clip - 1e-9)), 1)):
            start, end = k * clip, min((k + 1) * clip, seconds)
            # The loader's window, rounded as it rounds it: one shorter than a frame holds none.
            if k and np.floor(end * rate_out + 0.5) - np.floor(start * rate_out + 0.5) < features.win_length:
                continue
            rows.append({"audio": audio, "ebird_code": None, "start_time": start, "end_time": end})
            where.append((name, start, end))
    audio_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    schema = pa.schema([("audio", audio_type), ("ebird_code", pa.int64()), ("start_time", pa.float64()),
                        ("end_time", pa.float64())])  # fmt: skip
    out = folder / "windows.arrow"
    with pa.OSFile(str(out), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(pa.Table.from_pylist(rows, schema=schema), max_chunksize=64)
    return str(out), where


def load_encoder(source: str | Path, step: int | None = None) -> Encoder:
    """The encoder of an export folder (``birdjepa export``) or of a run directory (its newest
    checkpoint, or ``step``). Sets XLA's flags as the ``birdjepa`` command does (`deterministic_xla_from`),
    so its embeddings equal `birdjepa embed`'s and `evaluate`'s bit for bit."""
    from birdjepa.train.determinism import deterministic_xla_from

    deterministic_xla_from("birdjepa.load_encoder")
    source = Path(source)
    if (source / CARD).is_file():
        held = card_field(read_card(source), source, "checkpoint", dict).get("step")
        if step is not None and step != held:  # else the export's step was embedded, exit 0
            raise ExportError(f"{source}: an export of step {held}, not of the step {step} asked for "
                              "(--step or @STEP is for a run directory)")  # fmt: skip
        return _from_export(source)
    if layout.has_checkpoints(source):
        from birdjepa.evaluation.cli import EvaluateError, restore_checkpoint
        from birdjepa.rundir.checkpoint import CheckpointError

        try:
            r = restore_checkpoint(source, step)
        except (EvaluateError, CheckpointError) as e:  # CheckpointError: a damaged one, as `evaluate` says
            raise ExportError(str(e)) from e
        identity = checkpoint_identity(source, r.step, r.meta)
        params = {"encoder": r.params["encoder"]}
        return Encoder(r.model_cfg, r.cfg.data.features, r.cfg.data.batch_size, identity, params)
    raise ExportError(f"{source}: neither an export (no {CARD}) nor a run directory (no checkpoints/)")


def read_card(folder: Path) -> dict[str, Any]:
    """An export's card; `ExportError` naming it where it cannot be read (a copy cut short)."""
    try:
        card = json.loads((folder / CARD).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ExportError(f"{folder / CARD}: not an export's card ({e}): export the run again") from None
    if not isinstance(card, dict):
        raise ExportError(f"{folder / CARD}: not an export's card (a JSON {type(card).__name__})")
    return card


def card_field(card: dict[str, Any], folder: Path, key: str, kind: type) -> Any:
    """``card[key]``, of type ``kind``; `ExportError` naming the card and the field where a hand edit
    removed it or gave it another type (a KeyError's or an AttributeError's traceback)."""
    value = card.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        got = "missing" if key not in card else json.dumps(value)[:40]
        kinds = {dict: "object", int: "integer", str: "string"}
        raise ExportError(f"{folder / CARD}: its {key!r} must be a JSON {kinds[kind]}, not {got}: export the "
                          "run again")  # fmt: skip
    return value


def _from_export(folder: Path) -> Encoder:
    import jax
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    from birdjepa.config import ConfigError, recorded, resolve
    from birdjepa.model.vit import encoder_apply
    from birdjepa.validation import OptionError, check_encoder

    card = read_card(folder)
    if card.get("format") != FORMAT or card.get("version") != FORMAT_VERSION:
        raise ExportError(f"{folder / CARD}: format {card.get('format')} version {card.get('version')}; "
                          f"this birdjepa reads {FORMAT} version {FORMAT_VERSION}")  # fmt: skip
    try:
        model = resolve(ModelConfig(), card_field(card, folder, "model", dict), str(folder / CARD))
        recorded_features = recorded(card_field(card, folder, "features", dict), "data.features.")
        features = resolve(Features(), recorded_features, str(folder / CARD))
    except ConfigError as e:
        raise ExportError(str(e)) from e
    batch_size = card_field(card, folder, "batch_size", int)
    identity = card_field(card, folder, "identity", str)
    try:  # the loader's or the model's traceback at the first batch, else
        check_encoder(model, features, batch_size)
    except OptionError as e:
        raise ExportError(f"{folder / CARD}: {e}") from None
    weights = folder / WEIGHTS
    try:
        params = unflatten(load_file(str(weights)))
    except (OSError, SafetensorError) as e:  # missing, or cut short: "invalid header length"
        raise ExportError(f"{weights}: cannot be read ({e}): export the run again") from None
    m = model.resolved()
    try:  # the weights of the card's model: a traceback of flax's at the first batch, else
        jax.eval_shape(
            encoder_apply(model), params, jax.ShapeDtypeStruct((1, m.n_frames, m.n_mels), np.float32)
        )
    except Exception as e:  # flax's ScopeParamShapeError, a missing name's KeyError, ...
        said = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExportError(f"{weights}: not the weights of the model {folder / CARD} describes ({said}): "
                          "export the run again") from None  # fmt: skip
    return Encoder(model, features, batch_size, identity, params)
