"""What a benchmark scores, and their embeddings of a split, computed once and cached.

A backbone is named on the command line as one of:
- ``RUN`` or ``RUN@STEP``: a run directory at its newest checkpoint (or that step), restored and
  verified as the trainer restores it; or an export folder (``birdjepa export``);
- ``random:RUN``: the same architecture at the run's random init (the baseline of every claim);
- ``raw``: per clip, the mean and std over time of every log-mel bin (nothing learned); as tokens,
  every log-mel patch of the ViT's patch grid (the first run's, else the model's default: 16 frames by
  every mel bin), flattened: the spectrum's own patches, beside the encoder's tokens;
- ``raw:input``: the same of the log-mel as that model's encoder receives it (its ``input_norm``: by
  default each bin's noise floor subtracted and the clip standardised; fixed, not learned), the
  baseline that separates what an encoder learned from what its front end gives every encoder, random
  ones included (docs/issues/006-token-probes, "Where the lead goes");
- ``module:function``: an external encoder, imported and called with a spectrogram batch
  ``float32 [B, T, M]`` (the loader's log-mel, the features of the first run named, else the
  loader's defaults) and returning ``[B, D]`` embeddings or ``[B, N, D]`` tokens (their mean is its
  embedding): a published model or a colleague's export, scored on the same clips;
- ``waveform:module:function``: the same, called with ``(waveform float32 [B, S], rate)`` instead: each
  clip's samples at the features' rate, the window the loader cropped (its ``crop_offset``), decoded
  and resampled by the loader's own functions (`birdjepa._rs`), zero-padded to the clip length.

Its identity (the store's key) holds what makes its embeddings what they are: a run's name, step and a
CRC-32 of its checkpoint's leaf CRC-32s (an export keeps its run's); random init's name and a CRC of
the init, the model config and the features; raw's patch grid (and ``raw:input``'s normalisation); an
external encoder's import path and a CRC-32 of its output on a fixed probe batch (a function changed under
the same path is another encoder; one whose output is not a function of its input is embedded again at
every call); for raw and external ones, the features they embed where those are not the defaults.

Every backbone gives patch tokens beside its embedding, but an external one that returns ``[B, D]``:
the token probes (`token_probes`) skip it, and say so. Tokens are computed and cached (float16:
``N x D x 2`` bytes a clip) only where a token probe asks for them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import os
import time
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from birdjepa.config import before_it_existed
from birdjepa.data import DataError, Features, Loader
from birdjepa.evaluation.embed import raw_features
from birdjepa.model.config import ModelConfig
from birdjepa.outputs import write_whole

#: ``(*inputs, tokens) -> (embedding [B, D], tokens [B, N, D] or None)``.
Encode = Callable[..., tuple[np.ndarray, np.ndarray | None]]


class BackboneError(ValueError):
    """A backbone that cannot be used: no such run or checkpoint, an import that fails."""


@dataclasses.dataclass
class Backbone:
    spec: str
    identity: str
    encode: Encode
    features: Features | None
    """The log-mel a run was trained on (None: whichever the benchmark uses)."""
    waveform: bool = False
    """``encode`` takes ``(waveform [B, S], rate)``, not a spectrogram."""
    tokens: bool | None = True
    """It gives patch tokens (None: an external one, known once it has been called)."""
    model: ModelConfig | None = None
    """A run's architecture (its patch grid is raw's token grid)."""


def _run(spec: str) -> Backbone:
    from birdjepa.export.encoder import ExportError, load_encoder

    path, at, step = spec.partition("@")
    if at and not step.isdigit():  # int() said only "invalid literal for int() with base 10"; "RUN@" was
        raise BackboneError(f"{spec}: the step after '@' is a number (RUN@STEP), not {step!r}")  # the newest
    try:
        encoder = load_encoder(Path(path), int(step) if step else None)
    except ExportError as e:
        raise BackboneError(str(e)) from e
    return Backbone(spec, encoder.identity, _encoder_call(encoder), encoder.features, model=encoder.model)


def _encoder_call(encoder: Any) -> Encode:
    def encode(x: np.ndarray, *, tokens: bool) -> tuple[np.ndarray, np.ndarray | None]:
        return encoder.with_tokens(x) if tokens else (encoder(x), None)

    return encode


RAW_INPUT = "raw:input"


def _raw(model: ModelConfig, *, as_input: bool = False) -> Backbone:
    """Log-mel mean and std per bin; as tokens, the log-mel cut into ``model``'s patches. ``as_input``:
    of the log-mel as ``model``'s encoder receives it (`normalised_input`) instead."""
    from birdjepa.model.vit import normalised_input, patchify

    m = model.resolved()

    def encode(x: np.ndarray, *, tokens: bool) -> tuple[np.ndarray, np.ndarray | None]:
        x = np.asarray(normalised_input(m, x)) if as_input else np.asarray(x, np.float32)
        patches = np.asarray(patchify(x, m.patch, m.patch_mels)) if tokens else None
        return raw_features(x), patches

    grid = f"{m.patch}x{m.patch_mels}"
    if as_input:
        return Backbone(RAW_INPUT, f"raw:input-{m.input_norm}-mean-std+patches{grid}", encode, None, model=m)
    return Backbone("raw", f"raw:logmel-mean-std+patches{grid}", encode, None, model=m)


def _random_init(run_dir: Path) -> Backbone:
    """The run's architecture at its own init (the params its step 0 started from)."""
    import jax

    from birdjepa.evaluation.cli import EvaluateError, restore_checkpoint
    from birdjepa.export.encoder import Encoder
    from birdjepa.rundir.checkpoint.integrity import leaf_hash

    try:
        r = restore_checkpoint(run_dir)
    except EvaluateError as e:
        raise BackboneError(str(e)) from e
    leaves = [leaf_hash(np.asarray(x)) for x in jax.tree_util.tree_leaves(r.random_init["encoder"])]
    # With the options that change its embeddings but add no weight (input norm, dtype, the features):
    # two runs of one name in two runs folders were one key, and the second was given the first's scores.
    config = [dataclasses.asdict(r.model_cfg), dataclasses.asdict(r.cfg.data.features)]
    crc = zlib.crc32(json.dumps([leaves, config], sort_keys=True, default=str).encode())
    identity = f"random:{run_dir.name}#{crc:08x}"
    encoder = Encoder(r.model_cfg, r.cfg.data.features, r.cfg.data.batch_size, identity,
                      {"encoder": r.random_init["encoder"]})  # fmt: skip
    spec = f"random:{run_dir}"
    return Backbone(spec, identity, _encoder_call(encoder), encoder.features, model=encoder.model)


def _external(spec: str) -> Backbone:
    waveform = spec.startswith("waveform:")
    path = spec.removeprefix("waveform:")
    module, _, attr = path.partition(":")
    try:
        function = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise BackboneError(f"external backbone {spec!r} cannot be imported: {type(e).__name__}: {e}") from e
    if not callable(function):
        raise BackboneError(f"external backbone {spec!r} is not callable")

    first: list[tuple[int, ...]] = []  # the shape of its first output, less the batch

    def encode(*x: Any, tokens: bool) -> tuple[np.ndarray, np.ndarray | None]:
        try:
            y = np.asarray(function(*x), np.float32)
        except Exception as e:  # its own error: a traceback, exit 1
            raise BackboneError(f"external backbone {spec!r} raised {type(e).__name__}: {e}") from e
        if y.ndim not in (2, 3) or len(y) != len(x[0]):
            raise BackboneError(f"external backbone {spec!r} returned shape {y.shape} for {len(x[0])} clips; "
                                "expected [B, D] embeddings or [B, N, D] tokens")  # fmt: skip
        if first and y.shape[1:] != first[0]:  # else numpy's concatenate error, naming no backbone
            raise BackboneError(f"external backbone {spec!r} returned shape {y.shape} after "
                                f"{(len(x[0]), *first[0])}: one shape for every clip")  # fmt: skip
        first[:] = [y.shape[1:]]
        if not np.isfinite(y).all():  # else a probe's error far from here, naming no backbone
            clip = int(np.flatnonzero(~np.isfinite(y.reshape(len(y), -1)).all(axis=1))[0])
            raise BackboneError(f"external backbone {spec!r} returned a value that is not finite "
                                f"(clip {clip} of a batch of {len(y)})")  # fmt: skip
        if y.ndim == 2:
            return y, None
        pooled = y.astype(np.float64).mean(axis=1).astype(np.float32)
        return pooled, (y if tokens else None)

    return Backbone(spec, f"ext:{spec}", encode, None, waveform, tokens=None)


def resolve(specs: Sequence[str], step: int | None = None) -> list[Backbone]:
    """The backbones named by ``specs``, in order (a run named without ``@STEP`` at ``step``, or its
    newest checkpoint)."""
    out: list[Backbone | str] = []
    for spec in specs:
        if spec in ("raw", RAW_INPUT):
            out.append(spec)  # once the runs' patch grid (and input normalisation) is known
        elif spec.startswith("random:"):
            if "@" in spec:  # "random:RUN@9: not a run directory"
                raise BackboneError(f"{spec}: random init is a run's step 0, whatever its checkpoints: "
                                    f"{spec.partition('@')[0]}, without @STEP")  # fmt: skip
            out.append(_random_init(Path(spec.removeprefix("random:"))))
        elif spec.startswith("raw:"):  # "raw:foo" was tried as an import: "No module named 'raw'"
            raise BackboneError(f"{spec}: the raw baselines are raw and {RAW_INPUT}")
        elif _looks_external(spec):
            out.append(_external(spec))
        else:
            out.append(_run(spec if "@" in spec or step is None else f"{spec}@{step}"))
    model = next((b.model for b in out if isinstance(b, Backbone) and b.model is not None), ModelConfig())
    resolved = [b if isinstance(b, Backbone) else _raw(model, as_input=b == RAW_INPUT) for b in out]
    by_identity: dict[str, str] = {}
    for b in resolved:  # two names of one checkpoint (RUN and RUN@STEP, a run and its export)
        if b.identity in by_identity:
            raise BackboneError(f"{by_identity[b.identity]} and {b.spec} are one encoder ({b.identity}): "
                                "name it once")  # fmt: skip
        by_identity[b.identity] = b.spec
    return resolved


def identified(backbones: Sequence[Backbone], features: Features) -> list[Backbone]:
    """The backbones, each with all of its identity once ``features`` (the first run's) are known.

    Those without log-mel of their own (raw, raw:input, external ones) embed ``features``: other than
    the defaults, those are in their identity, or another run's features read their scores from the
    store. An external one's import path says nothing of its code: its output on a fixed probe batch
    is in its identity, or a function edited under the same name was given the old one's scores."""
    # An identity written before an option of `BEFORE_IT_EXISTED` embedded its old value: the option is
    # named where it holds another (`+gapless=true`, today's default decode), or the store gave the old
    # decode's scores (cmAP 0.666 for 0.672), and the rest is hashed as then.
    then = before_it_existed("data.features.")
    rest = dataclasses.replace(features, **then)
    tag = ""
    if rest != dataclasses.replace(Features(), **then):
        hashed = {k: v for k, v in dataclasses.asdict(rest).items() if k not in then}
        text = json.dumps(hashed, sort_keys=True, default=str)
        tag = f"+features#{zlib.crc32(text.encode()):08x}"
    for k, v in then.items():
        tag += f"+{k}={json.dumps(getattr(features, k))}" if getattr(features, k) != v else ""
    out = []
    for b in backbones:
        own = b.features is not None
        out.append(b if own else dataclasses.replace(b, identity=b.identity + _probed(b, features) + tag))
    return out


def _probed(b: Backbone, features: Features) -> str:
    """An external backbone's CRC-32 of its embedding of a fixed probe batch of two clips ("" for the
    others); it raises `BackboneError` where the backbone does, or gives a wrong shape or a non-finite
    value."""
    if not b.identity.startswith("ext:"):
        return ""
    rng = np.random.default_rng(0)
    if b.waveform:
        length = int(round(features.clip_seconds * features.target_rate))
        x: tuple = (0.1 * rng.standard_normal((2, length), np.float32), features.target_rate)
    else:
        x = (rng.standard_normal((2, features.n_frames, features.n_mels), np.float32),)
    pooled, _ = b.encode(*x, tokens=False)
    return f"#{zlib.crc32(np.ascontiguousarray(pooled, np.float32).tobytes()):08x}"


def _looks_external(spec: str) -> bool:
    """``[waveform:]module:function`` (not a path that exists)."""
    module, sep, attr = spec.removeprefix("waveform:").partition(":")
    return (
        bool(sep)
        and not Path(spec).exists()
        and module.replace(".", "").replace("_", "").isalnum()
        and attr.isidentifier()
    )


@dataclasses.dataclass(frozen=True)
class Embedded:
    features: np.ndarray
    """[N, D] float32, one row per clip in loader order."""
    label: np.ndarray
    """[N] int64: the single label (-1: none)."""
    targets: np.ndarray
    """[N, C] uint8 multi-hot."""
    seconds: float
    """Spent in this backbone's encoder."""
    pass_seconds: float
    """The whole pass over the split that computed it (decoding, log-mel and every backbone's encoder)."""
    cached: bool
    tokens: np.ndarray | None = None
    """[N, T, D] float16 patch tokens, where asked for and the backbone gives them."""


def files_stamp(files: Sequence[str]) -> str:
    """The files as they are now: their names, sizes and modification times (a shard rewritten in place,
    relabelled at the same size, got the old one's embeddings and scores); not their bytes, which would
    read the whole data set at every call."""
    stats = [(f, st.st_size, st.st_mtime_ns) for f in files for st in [Path(f).stat()]]
    return hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]


def audio_stamp(files: Sequence[str], loader_options: dict[str, Any]) -> str | None:
    """Where rows of ``files`` name their audio by path (a hub's cache of BirdSet), the loader's
    fingerprint of the data read with ``loader_options`` (``audio_root``): it holds the sizes and times
    of the files those rows name, which `files_stamp` does not (replaced behind the shards, or read
    under another ``--audio-root``, they got the old embeddings and scores). None where every row holds
    its bytes: the stamps of such data, and the stores and caches keyed by them, are as they were."""
    where = {k: loader_options[k] for k in ("audio_root", "audio_column") if k in loader_options}
    with Loader(list(files), train=False, batch_size=1, n_workers=1, prefetch_batches=1, **where) as ld:
        return ld.fingerprint if ld.reads_audio_by_path else None


def split_key(files: Sequence[str], features: Features, loader_options: dict[str, Any]) -> str:
    """What a split's clips are: the files as they are now (`files_stamp`, and `audio_stamp` where rows
    name their audio by path), the features and the loader's options."""
    stamps = [files_stamp(files), *filter(None, [audio_stamp(files, loader_options)])]
    text = json.dumps([*stamps, dataclasses.asdict(features), loader_options], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


TOKEN_DTYPE = np.float16
"""Tokens in the cache and in memory: half a float32's bytes; the probes compute in float32."""

#: Where float16 moves a batch's tokens by more, on average, than this fraction of their typical spread
#: (the median over dimensions of each one's standard deviation), they are kept in float32. An encoder's
#: normalised tokens move by ~1e-4 of it.
HALF_TOLERANCE = 1e-2


def cached_tokens(tokens: Any) -> np.ndarray:
    """A batch's tokens as the cache keeps them: `TOKEN_DTYPE`, unless that would change them (an
    external encoder's past float16's range became inf, "tokens hold NaN or inf (a diverged
    encoder?)"; ones on an offset of 3000 lost their signal to its rounding, a prototypical probe's cmAP
    0.24 against 0.37): then float32."""
    full = np.asarray(tokens, np.float32)
    finite = np.isfinite(full)
    with np.errstate(over="ignore", invalid="ignore"):  # past float16's range: inf, and kept in float32
        half = full.astype(TOKEN_DTYPE)
        moved = np.abs(half.astype(np.float32)[finite] - full[finite])
        spread = np.median(full.reshape(-1, full.shape[-1]).std(axis=0)) if full.size else 0.0
    return full if moved.size and not moved.mean() <= HALF_TOLERANCE * spread else half


def _cached(path: Path, b: Backbone, tokens: bool) -> Embedded | None:
    """The cached embedding at ``path``, or None where there is none, or where it lacks the tokens asked
    for and ``b`` gives them (a file written before tokens were asked for)."""
    if not path.is_file():
        return None
    try:
        z = np.load(path)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):  # cut short (a full disk): a miss, not a
        return None  # traceback at every later call on the store
    with z:
        if len(z["features"]) != len(z["label"]):  # written by a call that named one encoder twice
            return None
        has = "tokens" in z.files
        gives = bool(z["gives_tokens"]) if "gives_tokens" in z.files else None
        if tokens and not has and gives is not False:
            return None
        if b.tokens is None and gives is not None:
            b.tokens = gives
        return Embedded(z["features"], z["label"], z["targets"], float(z["seconds"]),
                        float(z["pass_seconds"]), True, z["tokens"] if tokens and has else None)  # fmt: skip


def embed(
    backbones: Sequence[Backbone],
    files: Sequence[str],
    features: Features,
    *,
    cache: Path,
    n_classes: int,
    batch_size: int,
    n_workers: int,
    loader_options: dict[str, Any],
    tokens: bool = False,
) -> dict[str, Embedded]:
    """Every backbone's embedding of every clip of ``files`` (identity -> `Embedded`; with ``tokens``,
    its patch tokens too), from the cache where it is there, else from one ordered eval-mode pass that
    feeds every missing backbone."""
    # The batch size too: an external encoder computes on the loader's batches (ours chunk by their own
    # run's batch size), and its last bits may depend on it.
    key = split_key(files, features, {**loader_options, "n_classes": n_classes, "batch_size": batch_size})
    out: dict[str, Embedded] = {}
    missing = []
    for b in backbones:
        path = cache / f"{hashlib.sha256(b.identity.encode()).hexdigest()[:16]}-{key}.npz"
        hit = _cached(path, b, tokens)
        if hit is None:
            missing.append((b, path))
        else:
            out[b.identity] = hit
    if not missing:
        return out
    parts: dict[str, list[np.ndarray]] = {b.identity: [] for b, _ in missing}
    token_parts: dict[str, list[np.ndarray]] = {b.identity: [] for b, _ in missing}
    took = dict.fromkeys(parts, 0.0)
    labels, targets = [], []
    start = time.perf_counter()
    with Loader(
        list(files),
        batch_size=batch_size,
        n_workers=n_workers,
        train=False,
        features=features,
        **loader_options,
    ) as loader:
        clips = Clips(loader, features) if any(b.waveform for b, _ in missing) else None
        for batch in loader:
            for b, _ in missing:
                t0 = time.perf_counter()
                x = (clips.waveforms(batch), features.target_rate) if b.waveform else (batch["spectrogram"],)
                pooled, toks = b.encode(*x, tokens=tokens)
                parts[b.identity].append(np.asarray(pooled, np.float32))
                if toks is not None:
                    token_parts[b.identity].append(cached_tokens(toks))
                took[b.identity] += time.perf_counter() - t0
            labels.append(batch["label"])
            targets.append(
                batch["multilabel"] if "multilabel" in batch else _one_hot(batch["label"], n_classes)
            )
    pass_seconds = time.perf_counter() - start
    if not labels:  # every record skipped: numpy's "need at least one array to concatenate"
        more = f" and {len(files) - 1} more" if len(files) > 1 else ""
        raise DataError(f"{files[0]}{more}: the loader read no record of them (each skipped: its WARNING "
                        "above names them)")  # fmt: skip
    label = np.concatenate(labels).astype(np.int64)
    target = np.concatenate(targets).astype(np.uint8)
    cache.mkdir(parents=True, exist_ok=True)
    for b, path in missing:
        x = np.concatenate(parts[b.identity])
        t = np.concatenate(token_parts[b.identity]) if token_parts[b.identity] else None
        if tokens and b.tokens is None:  # an external backbone says what it gives by giving it
            b.tokens = t is not None
        extra: dict[str, Any] = {"tokens": t} if t is not None else {}
        if b.tokens is not None:
            extra["gives_tokens"] = b.tokens
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")  # two jobs embedding one key write apart
        arrays = dict(
            features=x, label=label, targets=target, seconds=took[b.identity], pass_seconds=pass_seconds
        )
        write_whole(path, functools.partial(np.savez, **arrays, **extra), partial=tmp)
        out[b.identity] = Embedded(x, label, target, took[b.identity], pass_seconds, False, t)
    return out


def _one_hot(label: np.ndarray, n_classes: int) -> np.ndarray:
    if len(label) and label.max() >= n_classes:  # an IndexError, naming nothing
        top = int(label.max())
        raise DataError(f"a clip's label is {top}, outside the task's {n_classes} classes (--n-classes, or "
                        "the ClassLabel names its files keep)")  # fmt: skip
    out = np.zeros((len(label), n_classes), np.uint8)
    has = label >= 0
    out[np.flatnonzero(has), label[has]] = 1
    return out


class Clips:
    """The samples of each clip the loader cropped, for waveform encoders: the row's audio as the loader
    reads it (`Loader.encoded_audio`), decoded and resampled by the loader's functions, cut at the
    batch's ``crop_offset``."""

    def __init__(self, loader: Loader, features: Features) -> None:
        self.loader = loader
        self.rate = features.target_rate
        self.length = int(round(features.clip_seconds * features.target_rate))
        self.gapless = features.gapless

    def waveforms(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        from birdjepa._rs import decode_audio, resample

        out = np.zeros((len(batch["index"]), self.length), np.float32)
        for i, (index, offset) in enumerate(zip(batch["index"], batch["crop_offset"], strict=True)):
            samples, rate = decode_audio(self.loader.encoded_audio(int(index)), gapless=self.gapless)
            if rate != self.rate:
                samples = resample(samples, rate, self.rate)
            window = samples[int(offset) : int(offset) + self.length]
            out[i, : len(window)] = window
        return out
