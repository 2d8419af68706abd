"""The BirdSet stand-in (`birdjepa demo-data OUT --birdset`): layout, HF-shaped columns, labels that
follow the placed calls, the UHH-like task's test-only classes, windows, decodable audio, determinism
whatever the worker count, and the loader's multi-hot and window crop on its test_5s split."""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf
from datasets import Audio, ClassLabel, Features, List, Value

import birdjepa.synthetic.demo_data as demo_data
from birdjepa._rs import decode_audio
from birdjepa.cli import main
from birdjepa.data import Loader
from birdjepa.data.loader import DEFAULTS
from birdjepa.data.shards import list_shards, read_shard, read_vocab
from birdjepa.synthetic.birdset_standin import (
    BIRDSET_SMALL,
    SPLITS,
    BirdsetConfig,
    birdset_schema,
    species_table,
)
from birdjepa.synthetic.config import DemoConfig
from birdjepa.synthetic.demo import ensure_birdset_data
from birdjepa.synthetic.songs import Species, make_species
from birdjepa.synthetic.soundscape import SAMPLE_RATE, WINDOW_SECONDS


def rows(folder: Path) -> list[dict]:
    return [r for path in list_shards(folder) for r in read_shard(path).to_pylist()]


def digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith(".")  # not the loader's hidden index files
    }


@pytest.fixture(scope="module")
def manifest(birdset_dir: Path) -> dict:
    return json.loads((birdset_dir / "manifest.json").read_text())


def test_layout_vocab_and_manifest(birdset_dir: Path, manifest: dict) -> None:
    assert sorted(p.name for p in birdset_dir.iterdir()) == ["SYN1", "SYN2", "manifest.json"]
    assert manifest["generator"] == "birdjepa.birdset_standin"
    assert manifest["config"]["n_tasks"] == BIRDSET_SMALL.n_tasks == 2
    classes = {}
    for name, task in manifest["tasks"].items():
        assert len(task["classes"]) == BIRDSET_SMALL.species_per_task
        for split in SPLITS:
            assert read_vocab(birdset_dir / name / split)[1] == task["classes"]  # same list for both splits
            shards = list_shards(birdset_dir / name / split)
            assert [p.name for p in shards] == [s["file"] for s in task[split]["shards"]]
            assert all(p.read_bytes()[:6] == b"ARROW1" for p in shards)  # IPC file format
        classes[name] = set(task["classes"])
        assert all(len(code) == 6 and code.isalpha() for code in task["classes"])
    assert classes["SYN1"] & classes["SYN2"]  # tasks draw from one species table: they overlap
    assert classes["SYN1"] != classes["SYN2"]


def test_columns_are_typed_as_hf_datasets_writes_birdset(birdset_dir: Path, manifest: dict) -> None:
    for name, task in manifest["tasks"].items():
        label = ClassLabel(names=task["classes"])
        hf = Features({"audio": Audio(sampling_rate=SAMPLE_RATE, decode=False), "filepath": Value("string"),
                       "start_time": Value("float64"), "end_time": Value("float64"), "ebird_code": label,
                       "ebird_code_multilabel": List(label),
                       "detected_events": List(List(Value("float64")))})  # fmt: skip
        for split in SPLITS:
            for path in list_shards(birdset_dir / name / split):
                schema = read_shard(path).schema
                assert schema == birdset_schema(task["classes"])
                assert schema.remove_metadata() == pa.schema(hf.type)  # the Arrow types HF writes
                assert Features.from_arrow_schema(schema) == hf  # and HF reads the features back


def test_train_rows_are_focal_recordings(birdset_dir: Path, manifest: dict) -> None:
    for name, task in manifest["tasks"].items():
        rs = rows(birdset_dir / name / "train")
        assert len(rs) == task["train"]["recordings"] == len({r["filepath"] for r in rs})
        for r in rs:
            assert r["ebird_code_multilabel"] == [r["ebird_code"]] and r["start_time"] == 0.0
            assert r["audio"]["path"] == r["filepath"]
            samples, sr = decode_audio(r["audio"]["bytes"])
            assert abs(len(samples) / sr - r["end_time"]) < 0.1  # end_time = duration (mp3 pads a little)
            assert BIRDSET_SMALL.train_seconds[0] <= r["end_time"] <= BIRDSET_SMALL.train_seconds[1]
            # Where the song sounds, as a detector marks it: ordered, apart, inside the recording.
            events = r["detected_events"]
            assert events and all(0 <= s < e <= r["end_time"] + 0.02 for s, e in events)
            assert all(a[1] < b[0] for a, b in zip(events, events[1:], strict=False))
        per_class = Counter(task["classes"][r["ebird_code"]] for r in rs)
        assert per_class == task["train"]["per_class"]
        assert set(per_class.values()) == {BIRDSET_SMALL.per_species_train}


def test_test_windows_cover_their_soundscape(birdset_dir: Path, manifest: dict) -> None:
    for name, task in manifest["tasks"].items():
        rs = rows(birdset_dir / name / "test_5s")
        assert len(rs) == task["test_5s"]["segments"]
        by_file: dict[str, list[dict]] = {}
        for r in rs:
            by_file.setdefault(r["filepath"], []).append(r)
        assert len(by_file) == task["test_5s"]["soundscapes"] == BIRDSET_SMALL.soundscapes
        for windows in by_file.values():
            assert len({w["audio"]["bytes"] for w in windows}) == 1  # each row carries the whole file
            data = windows[0]["audio"]["bytes"]
            info = sf.info(io.BytesIO(data))
            assert (info.format, info.samplerate, info.channels) == ("OGG", SAMPLE_RATE, 1)
            seconds = info.frames / info.samplerate
            assert seconds == BIRDSET_SMALL.soundscape_seconds
            samples, sr = decode_audio(data)
            # the loader's decoder keeps up to one Vorbis block (<= 30 ms) of end padding on some files
            assert sr == SAMPLE_RATE and samples.ndim == 1 and 0 <= len(samples) / sr - seconds < 0.05
            starts = [w["start_time"] for w in windows]
            assert starts == [WINDOW_SECONDS * k for k in range(len(windows))]
            assert all(w["end_time"] - w["start_time"] == WINDOW_SECONDS for w in windows)
            assert windows[-1]["end_time"] <= seconds + 1e-6


def test_labels_follow_the_placed_calls(birdset_dir: Path, manifest: dict) -> None:
    empty = total = 0
    for name, task in manifest["tasks"].items():
        rs = rows(birdset_dir / name / "test_5s")
        n = len(task["classes"])
        counts = Counter(len(r["ebird_code_multilabel"]) for r in rs)
        assert {str(k): counts[k] for k in range(4)} == task["test_5s"]["species_per_segment"]
        assert max(counts) <= 3
        for r in rs:
            ls = r["ebird_code_multilabel"]
            assert ls == sorted(set(ls)) and all(0 <= c < n for c in ls)  # within the vocabulary
            assert r["ebird_code"] == (ls[0] if ls else None)
        for scape in task["test_5s"]["soundscapes_list"]:
            for w, labels in enumerate(scape["labels"]):
                lo, hi = w * WINDOW_SECONDS, (w + 1) * WINDOW_SECONDS
                near = {
                    c["class"] for c in scape["calls"] if c["start"] < hi and c["start"] + c["seconds"] > lo
                }
                assert set(labels) <= near  # a label needs a call placed in the window
                if not near:
                    assert labels == []
            heard = {c for labels in scape["labels"] for c in labels}
            assert heard <= {c["class"] for c in scape["calls"]}
        empty += counts[0]
        total += len(rs)
    assert 0.15 <= empty / total <= 0.45  # "no call" windows: planned 25 %


def test_the_demo_s_species_recur_in_the_stand_in_transposed() -> None:
    # What a run pretrained on the demo set has heard of the stand-in's species, at the default sizes
    # (docs/issues/006-token-probes, "Labels"): the same songs in other bands, under other codes.
    def song(s: Species) -> tuple:
        notes = tuple((n.kind, n.seconds, n.rate_hz, n.n_harmonics) for n in s.syllables)
        return s.pattern, notes, s.motif, s.gaps, s.pause_seconds

    demo = make_species(DemoConfig())  # as the demo set draws them (synthetic.demo)
    table = {song(s): s for s in species_table(BirdsetConfig())}
    assert (len(demo), len(table)) == (16, 24)
    for s in demo:
        twin = table[song(s)]
        assert twin.code != s.code and twin.band_hz != s.band_hz
    # A bigger demo set (`demo-data --n-species 64`) holds every stand-in song, each in another band.
    bigger = {song(s): s for s in make_species(DemoConfig(n_species=64))}
    for s in table.values():
        assert bigger[song(s)].band_hz != s.band_hz
    # Drawn with another seed, it holds none of them: a pretraining set apart from the test's species.
    assert not {song(s) for s in make_species(DemoConfig(n_species=64, seed=1))} & set(table)


def test_uhh_like_task_has_test_only_classes(birdset_dir: Path, manifest: dict) -> None:
    first, last = manifest["tasks"]["SYN1"], manifest["tasks"]["SYN2"]
    assert first["test_only_classes"] == []
    assert len(last["test_only_classes"]) == BIRDSET_SMALL.unseen_classes == 1
    for name, task in manifest["tasks"].items():
        train = {task["classes"][r["ebird_code"]] for r in rows(birdset_dir / name / "train")}
        test = {
            task["classes"][c]
            for r in rows(birdset_dir / name / "test_5s")
            for c in r["ebird_code_multilabel"]
        }
        assert train == set(task["classes"]) - set(task["test_only_classes"])
        assert test == set(task["classes"])  # every class is heard in the soundscapes, test-only ones too
        assert not set(task["test_only_classes"]) & train


def test_loader_reads_multilabel_rows_and_windows(birdset_dir: Path, manifest: dict) -> None:
    folder = birdset_dir / "SYN2" / "test_5s"
    expected = rows(folder)
    n = len(manifest["tasks"]["SYN2"]["classes"])
    loader = Loader(list_shards(folder), train=False, multilabel_column="ebird_code_multilabel",
                    batch_size=4, n_workers=1, seed=0)  # fmt: skip
    hot, offsets = [], []
    for batch in loader:
        hot.append(batch["multilabel"])
        offsets.append(batch["crop_offset"])
    hot_rows = np.concatenate(hot)
    assert hot_rows.shape == (len(expected), n)
    for r, row in zip(expected, hot_rows, strict=True):
        assert np.flatnonzero(row).tolist() == r["ebird_code_multilabel"]
    rate = DEFAULTS["target_rate"]  # the window's start, at the loader's rate
    assert np.concatenate(offsets).tolist() == [round(r["start_time"] * rate) for r in expected]


def test_deterministic_whatever_the_worker_count_and_cli(
    birdset_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The session's set (built with all cores) and the command line's with one worker: the same bytes."""
    monkeypatch.setattr(demo_data, "DEFAULT_BIRDSET", BIRDSET_SMALL)
    out = tmp_path / "cli"
    main(["demo-data", str(out), "--birdset", "--workers", "1"])
    assert digests(out) == digests(birdset_dir)
    printed = capsys.readouterr().out
    assert "SYN2/test_5s: 12 rows" in printed and "wrote the BirdSet stand-in (2 tasks" in printed
    with pytest.raises(SystemExit) as e:
        main(["demo-data", str(out), "--birdset", "--workers", "1"])
    assert e.value.code == 2 and "use --overwrite" in capsys.readouterr().err
    (out / "SYN1" / "train" / "train-00007.arrow").write_bytes(b"stale")  # an earlier run's shard
    main(["demo-data", str(out), "--birdset", "--overwrite"])
    assert digests(out) == digests(birdset_dir)


def test_ensure_reuses_the_cache_and_config_is_checked(birdset_dir: Path) -> None:
    stamp = (birdset_dir / "manifest.json").stat().st_mtime_ns
    assert ensure_birdset_data(BIRDSET_SMALL, birdset_dir.parent, verbose=False) == birdset_dir
    assert (birdset_dir / "manifest.json").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="soundscape_seconds a multiple of 5"):
        BirdsetConfig(soundscape_seconds=12.0)
    with pytest.raises(ValueError, match="unseen_classes"):
        BirdsetConfig(species_per_task=3, unseen_classes=3)
