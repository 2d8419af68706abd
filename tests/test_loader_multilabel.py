"""BirdSet-shaped data written by HF `datasets`: the multilabel column as a multi-hot, and rows cropped
to their own (start_time, end_time) window in eval mode."""

from __future__ import annotations

import io
import json
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.ipc as ipc
import pytest
from datasets import Audio, ClassLabel, Dataset, Sequence, Value
from datasets import Features as HFFeatures

from birdjepa import _rs
from birdjepa.data import DataError, Loader, StateError, take

RATE = 32_000
AUDIO = {"bytes": Value("binary"), "path": Value("string")}


@pytest.fixture(scope="module")
def demo(demo_dir: Path) -> tuple[list[dict], list[str]]:
    """The demo eval split's first 6 audio structs (real encoded audio, several codecs and rates) and
    its species names."""
    (first, *_) = sorted((demo_dir / "eval").glob("*.arrow"))
    with ipc.open_file(first) as f:
        audio = f.read_all().column("audio").to_pylist()[:6]
    names = json.loads((demo_dir / "eval" / "vocab.json").read_text())["names"]
    return audio, names


def save_hf(
    columns: dict[str, list], features: dict[str, Any], out: Path, vocab: list[str] | None = None
) -> Path:
    """``columns`` saved by HF `datasets` (a stream-format cache file, as BirdSet's); the audio struct
    becomes HF's Audio by a cast (encoding raw bytes needs torchcodec, casting the struct does not)."""
    ds = Dataset.from_dict(columns, features=HFFeatures({"audio": AUDIO, **features}))
    ds.cast_column("audio", Audio(decode=False)).save_to_disk(str(out))
    if vocab is not None:
        (out / "vocab.json").write_text(json.dumps({"names": vocab}))
    (arrow,) = out.glob("*.arrow")
    return arrow


def eval_batches(files: object, **kw: Any) -> list[dict]:
    return list(Loader(files, seed=0, batch_size=4, n_workers=2, train=False, **kw))


def stacked(batches: list[dict], key: str) -> np.ndarray:
    return np.concatenate([b[key] for b in batches])


LISTS = [[0, 3], [], [5], [1, 2, 7], [], [4]]


def test_multi_hot_rows_equal_the_lists_written(demo: tuple, tmp_path: Path) -> None:
    audio, names = demo
    labels = [None if not x else x[0] for x in LISTS]  # soundscape rows: ebird_code may be null
    features = {
        "ebird_code": ClassLabel(names=names),
        "ebird_code_multilabel": Sequence(ClassLabel(names=names)),
    }
    columns = {"audio": audio, "ebird_code": labels, "ebird_code_multilabel": LISTS}
    arrow = save_hf(columns, features, tmp_path / "hf", vocab=names)
    want = np.zeros((len(LISTS), len(names)), np.uint8)
    for row, classes in enumerate(LISTS):
        want[row, classes] = 1
    plain = eval_batches(arrow)
    assert all("multilabel" not in b for b in plain)
    for kw in ({}, {"n_classes": len(names)}):  # C from vocab.json, then given
        batches = eval_batches(arrow, multilabel_column="ebird_code_multilabel", **kw)
        assert all(
            b["multilabel"].dtype == np.uint8 and b["multilabel"].shape == (len(b["index"]), len(names))
            for b in batches
        )
        assert np.array_equal(stacked(batches, "multilabel"), want)
        assert stacked(batches, "label").tolist() == [-1 if x is None else x for x in labels]
        assert np.array_equal(stacked(batches, "spectrogram"), stacked(plain, "spectrogram"))
    # Wider than the vocabulary: the extra classes are zeros.
    wide = stacked(eval_batches(arrow, multilabel_column="ebird_code_multilabel", n_classes=40), "multilabel")
    assert np.array_equal(wide[:, : len(names)], want) and not wide[:, len(names) :].any()


def test_string_lists_map_through_the_vocabulary(demo: tuple, tmp_path: Path) -> None:
    audio, names = demo
    as_text = [[names[k] for k in x] for x in LISTS]
    columns = {"audio": audio, "ebird_code": [names[0]] * len(audio), "ebird_code_multilabel": as_text}
    features = {"ebird_code": Value("string"), "ebird_code_multilabel": Sequence(Value("string"))}
    arrow = save_hf(columns, features, tmp_path / "hf", vocab=names)
    got = stacked(eval_batches(arrow, multilabel_column="ebird_code_multilabel"), "multilabel")
    assert [np.flatnonzero(r).tolist() for r in got] == [sorted(x) for x in LISTS]


@pytest.mark.parametrize(
    ("bad", "feature", "why"),
    [
        ([7, 11], Value("int64"), "class 11 (element 1) is outside [0, 10)"),  # in the vocabulary, past n
        (None, Value("int64"), "the list is null"),
        ([1, None], Value("int64"), "element 1 is null"),
        (["aaa", "nosuch"], Value("string"), "label 'nosuch' is not in"),
    ],
)
def test_a_bad_list_is_one_error_naming_the_shard_and_row(
    demo: tuple, tmp_path: Path, bad: list | None, feature: Value, why: str
) -> None:
    audio, _ = demo
    good = [0, 1] if feature.dtype == "int64" else ["aaa"]
    lists = [good, good, bad, good]
    columns = {"audio": audio[:4], "ebird_code": [0] * 4, "ebird_code_multilabel": lists}
    features = {"ebird_code": Value("int64"), "ebird_code_multilabel": Sequence(feature)}
    arrow = save_hf(columns, features, tmp_path / "hf", vocab=["aaa", "bbb", *(f"c{i}" for i in range(10))])
    with pytest.raises(DataError) as e:
        eval_batches(arrow, multilabel_column="ebird_code_multilabel", n_classes=10)
    message = str(e.value)
    assert message.startswith(f"{arrow}: row 2: multilabel column 'ebird_code_multilabel': "), message
    assert why in message and "\n" not in message


def test_a_nested_list_or_a_missing_width_fails_at_open_naming_the_file(demo: tuple, tmp_path: Path) -> None:
    audio, _ = demo
    label = {"ebird_code": Value("int64")}
    nested = {**label, "ebird_code_multilabel": Sequence(Sequence(Value("int64")))}
    columns = {"audio": audio[:2], "ebird_code": [0, 1], "ebird_code_multilabel": [[[0]], [[1]]]}
    arrow = save_hf(columns, nested, tmp_path / "nested")
    with pytest.raises(DataError, match=r"multilabel column 'ebird_code_multilabel' has type") as e:
        Loader(arrow, multilabel_column="ebird_code_multilabel", n_classes=3)
    assert str(e.value).startswith(f"{arrow}: ") and "List" in str(e.value)
    ints = {**label, "ebird_code_multilabel": Sequence(Value("int64"))}
    columns = {"audio": audio[:2], "ebird_code": [0, 1], "ebird_code_multilabel": [[0], [1]]}
    arrow = save_hf(columns, ints, tmp_path / "novocab")
    with pytest.raises(DataError, match=r"vocab\.json cannot be read .*pass n_classes"):
        Loader(arrow, multilabel_column="ebird_code_multilabel")


def wav_bytes(samples: np.ndarray) -> bytes:
    """16-bit mono WAV at 32 kHz: a cut of the same int16 samples decodes to exactly the same floats."""
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(samples.astype("<i2").tobytes())
    return out.getvalue()


def windowed(audio: list[dict], windows: list[tuple[float | None, float | None]], out: Path) -> Path:
    starts, ends = zip(*windows, strict=True)
    columns = {
        "audio": audio,
        "ebird_code": [0] * len(audio),
        "start_time": list(starts),
        "end_time": list(ends),
    }
    features = {"ebird_code": Value("int64"), "start_time": Value("float64"), "end_time": Value("float64")}
    return save_hf(columns, features, out)


def without_windows(audio: list[dict], out: Path) -> Path:
    return save_hf({"audio": audio, "ebird_code": [0] * len(audio)}, {"ebird_code": Value("int64")}, out)


def test_a_window_is_the_same_audio_cut_by_hand(demo: tuple, tmp_path: Path) -> None:
    audio, _ = demo
    # A real recording at the loader's 32 kHz in WAV (no resampling, so a cut is exact).
    samples, rate = _rs.decode_audio(audio[0]["bytes"])
    pcm = np.round(np.clip(_rs.resample(samples, rate, RATE), -1, 1) * 32767).astype(np.int16)
    seconds = len(pcm) / RATE
    assert seconds > 7.5
    windows = [(1.5, 4.0), (2.0, 7.0), (seconds - 1.25, seconds + 20.0), (None, None), (3.0, None)]
    full = {"bytes": wav_bytes(pcm), "path": "full.wav"}
    arrow = windowed([full] * len(windows), windows, tmp_path / "windows")
    cuts = [pcm[round(s * RATE) : round(e * RATE)] for s, e in windows[:3]]
    # Each cut as its own row, and the full recording, in shards without window columns.
    control = without_windows([{"bytes": wav_bytes(c), "path": "cut.wav"} for c in cuts], tmp_path / "cuts")
    plain = without_windows([full], tmp_path / "plain")

    got = eval_batches(arrow)
    offsets = stacked(got, "crop_offset")
    centre = (len(pcm) - 5 * RATE) // 2
    assert offsets.tolist() == [round(s * RATE) for s, _ in windows[:3]] + [centre, centre]
    spec = stacked(got, "spectrogram")
    cut_spec = stacked(eval_batches(control), "spectrogram")
    assert len(cut_spec) == len(cuts)
    for row, want in enumerate(cut_spec):
        assert np.array_equal(spec[row], want), f"window {windows[row]}"
    # A null bound keeps the centre crop, as a shard without the columns (or without those named) does.
    (centred,) = stacked(eval_batches(plain), "spectrogram")
    assert np.array_equal(spec[3], centred) and np.array_equal(spec[4], centred)
    assert eval_batches(arrow, window_start_column="nosuch")[0]["crop_offset"].tolist() == [centre] * 4


def test_windows_of_resampled_codecs_start_where_they_say(demo: tuple, tmp_path: Path) -> None:
    audio, _ = demo
    starts = [0.25 + 0.5 * i for i in range(len(audio))]
    arrow = windowed(audio, [(s, s + 2.0) for s in starts], tmp_path / "hf")
    assert stacked(eval_batches(arrow), "crop_offset").tolist() == [round(s * RATE) for s in starts]


def test_a_window_outside_the_recording_is_a_counted_skip(demo: tuple, tmp_path: Path) -> None:
    audio, _ = demo
    windows = [(1.0, 3.0), (500.0, 505.0), (3.0, 2.0), (-1.0, 2.0), (2.0, 4.0)]
    arrow = windowed(audio[: len(windows)], windows, tmp_path / "hf")
    loader = Loader(arrow, seed=0, batch_size=4, n_workers=2, train=False)
    assert stacked(list(loader), "index").tolist() == [0, 4]
    diag = loader.diagnostics()
    assert diag["counters"]["skipped"] == 3
    skipped = [(s["shard"], s["row"], s["file"], s["reason"].split(" ")[0]) for s in diag["skipped"]]
    assert skipped == [(0, r, str(arrow), "window:") for r in (1, 2, 3)]
    reasons = [s["reason"] for s in diag["skipped"]]
    assert "past the recording's end" in reasons[0] and "not after" in reasons[1] and "negative" in reasons[2]


def test_a_state_restored_with_other_multilabel_or_window_options_is_refused(
    demo: tuple, tmp_path: Path
) -> None:
    audio, names = demo
    columns = {
        "audio": audio,
        "ebird_code": [0] * 6,
        "ebird_code_multilabel": LISTS,
        "start_time": [0.0] * 6,
        "end_time": [5.0] * 6,
    }
    features = {
        "ebird_code": ClassLabel(names=names),
        "ebird_code_multilabel": Sequence(ClassLabel(names=names)),
        "start_time": Value("float64"),
        "end_time": Value("float64"),
    }
    arrow = save_hf(columns, features, tmp_path / "hf", vocab=names)
    opts: dict[str, Any] = {"seed": 0, "batch_size": 2, "n_workers": 2, "train": False}
    loader = Loader(arrow, multilabel_column="ebird_code_multilabel", **opts)
    first, second = take(loader, 2)
    state = loader.state()
    resumed = take(Loader(arrow, multilabel_column="ebird_code_multilabel", state=state, **opts), 1)[0]
    assert np.array_equal(resumed["multilabel"], take(loader, 1)[0]["multilabel"])
    for changed, name in [
        ({}, "multilabel_column"),
        ({"multilabel_column": "ebird_code_multilabel", "n_classes": 30}, "n_classes"),
        ({"multilabel_column": "ebird_code_multilabel", "window_start_column": "t0"}, "window_start_column"),
    ]:
        with pytest.raises(StateError, match=name):
            Loader(arrow, state=state, **changed, **opts)
