"""The synthetic demo set: layout, determinism, codec/rate mix, labels, durations, learnability."""

from __future__ import annotations

import dataclasses
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from birdjepa.cli import main
from birdjepa.demo_data import (
    CODECS,
    SMALL,
    DemoConfig,
    canonical_ogg,
    canonical_wav,
    encode_audio,
    ensure_demo_data,
    generate_demo_data,
    make_species,
)
from birdjepa.shards import list_shards, read_shard, read_vocab, shard_schema

TINY = DemoConfig(
    n_species=4, per_species_train=2, per_species_eval=1, min_seconds=1.0, max_seconds=2.0, shard_mb=0.05
)
SUBTYPE_OF_EXT = {
    "ogg": {"VORBIS"},
    "flac": {"PCM_16"},
    "wav": {"PCM_16", "PCM_24", "FLOAT"},
    "mp3": {"MPEG_LAYER_III"},
}


def rows(folder: Path) -> list[dict]:
    out = []
    for path in list_shards(folder):
        table = read_shard(path)
        for i, r in enumerate(table.to_pylist()):
            out.append({**r, "shard": path.name, "row": i})
    return out


def all_files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_layout_vocab_and_manifest(demo_dir: Path) -> None:
    manifest = json.loads((demo_dir / "manifest.json").read_text())
    assert manifest["generator"] == "birdjepa.demo_data" and manifest["seed"] == SMALL.seed
    names = [s["code"] for s in manifest["species"]]
    assert len(names) == SMALL.n_species == len(set(names))
    for split, per_species in (("train", SMALL.per_species_train), ("eval", SMALL.per_species_eval)):
        folder = demo_dir / split
        label_column, vocab = read_vocab(folder)
        assert label_column == "ebird_code"
        assert vocab == sorted(vocab) == names
        assert all(len(n) == 6 and n.isalpha() and n.islower() for n in vocab)
        shards = list_shards(folder)
        info = manifest["splits"][split]
        assert [s["file"] for s in info["shards"]] == [p.name for p in shards]
        assert info["recordings"] == SMALL.n_species * per_species
        assert info["per_species"] == dict.fromkeys(names, per_species)
    assert len(list_shards(demo_dir / "train")) >= 3  # several shards, so loaders interleave
    assert 1 <= len(list_shards(demo_dir / "eval")) <= 2


def test_shard_schema_batches_and_labels(demo_dir: Path) -> None:
    ids = set()
    for split, per_species in (("train", SMALL.per_species_train), ("eval", SMALL.per_species_eval)):
        for path in list_shards(demo_dir / split):
            with pa.memory_map(str(path)) as src:
                reader = pa.ipc.open_file(src)
                assert reader.schema.equals(shard_schema())
                sizes = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
            assert sizes and max(sizes) <= 64
        rs = rows(demo_dir / split)
        labels = Counter(r["ebird_code"] for r in rs)
        assert labels == dict.fromkeys(range(SMALL.n_species), per_species)  # every species, no nulls
        split_ids = {r["recording_id"] for r in rs}
        assert len(split_ids) == len(rs) and not split_ids & ids  # unique, held out across splits
        ids |= split_ids
        for r in rs:
            stem, ext = r["audio"]["path"].rsplit(".", 1)
            assert stem == r["recording_id"] and ext in SUBTYPE_OF_EXT


def test_codecs_rates_channels_durations(demo_dir: Path) -> None:
    manifest = json.loads((demo_dir / "manifest.json").read_text())
    for split in ("train", "eval"):
        seen = Counter()
        rates, channels = Counter(), Counter()
        for r in rows(demo_dir / split):
            data = r["audio"]["bytes"]
            info = sf.info(io.BytesIO(data))
            ext = r["audio"]["path"].rsplit(".", 1)[1]
            assert info.format == CODECS_BY_EXT_FORMAT[ext]
            assert info.subtype in SUBTYPE_OF_EXT[ext]
            x, sr = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
            assert sr == info.samplerate
            # MP3 adds encoder delay/padding (< 0.1 s); everything else is exact to the sample
            assert SMALL.min_seconds - 0.01 <= len(x) / sr <= SMALL.max_seconds + 0.1, r["recording_id"]
            assert np.isfinite(x).all() and 0.05 < np.abs(x).max() <= 1.0
            seen[(info.format, info.subtype)] += 1
            rates[sr] += 1
            channels[x.shape[1]] += 1
        info = manifest["splits"][split]
        assert {f"{k[0]}/{k[1]}" for k in seen} == {f"{f}/{s}" for f, s, _ in CODECS.values()}
        assert seen[("OGG", "VORBIS")] / sum(seen.values()) == pytest.approx(0.75, abs=0.05)
        assert set(rates) == {22050, 32000, 44100, 48000}
        assert {str(k): v for k, v in rates.items()} == info["sample_rates"]
        assert set(channels) == {1, 2} and channels[2] < channels[1]


CODECS_BY_EXT_FORMAT = {ext: fmt for fmt, _, ext in CODECS.values()}


def test_species_are_distinguishable(demo_dir: Path) -> None:
    """Nearest-centroid on band-energy peaks, fit on train, must beat chance (1/12) by far on eval."""

    def features(folder: Path) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        edges = np.geomspace(1000.0, 10500.0, 33)
        for r in rows(folder):
            x, sr = sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32", always_2d=True)
            win = int(0.023 * sr) // 2 * 2
            frames = np.lib.stride_tricks.sliding_window_view(x.mean(1), win)[:: win // 2] * np.hanning(win)
            power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
            f = np.fft.rfftfreq(win, 1 / sr)
            bands = np.stack(
                [
                    power[:, (f >= lo) & (f < hi)].mean(1)
                    for lo, hi in zip(edges[:-1], edges[1:], strict=True)
                ],
                1,
            )
            log_bands = np.log(bands + 1e-10)
            log_bands -= np.median(log_bands, axis=0)  # remove the stationary noise floor
            xs.append(np.percentile(log_bands, 98, axis=0))
            ys.append(r["ebird_code"])
        return np.array(xs), np.array(ys)

    x_train, y_train = features(demo_dir / "train")
    x_eval, y_eval = features(demo_dir / "eval")
    centroids = np.stack([x_train[y_train == c].mean(0) for c in range(SMALL.n_species)])
    pred = np.argmin(((x_eval[:, None] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (pred == y_eval).mean() >= 0.5


def test_deterministic_whatever_the_worker_count(tmp_path: Path) -> None:
    a = all_files(generate_demo_data(tmp_path / "a", TINY, workers=1))
    b = all_files(generate_demo_data(tmp_path / "b", TINY, workers=2))
    assert a.keys() == b.keys() and any(k.endswith(".arrow") for k in a)
    for k in a:
        assert a[k] == b[k], f"{k} differs between runs"
    # the same recordings, read back, are every codec (so every encoder was checked for determinism)
    kinds = {sf.info(io.BytesIO(r["audio"]["bytes"])).subtype for r in rows(tmp_path / "a" / "train")}
    assert kinds == {s for _, s, _ in CODECS.values()}

    c = all_files(generate_demo_data(tmp_path / "c", dataclasses.replace(TINY, seed=1), workers=1))
    assert c["train/train-00000.arrow"] != a["train/train-00000.arrow"]
    assert read_vocab(tmp_path / "c" / "train")[1] != read_vocab(tmp_path / "a" / "train")[1]


def test_species_order_groups_the_same_recordings(tmp_path: Path) -> None:
    shuffled = rows(generate_demo_data(tmp_path / "a", TINY, workers=1) / "train")
    grouped = rows(generate_demo_data(tmp_path / "b", dataclasses.replace(TINY, order="species"), workers=1)
                   / "train")  # fmt: skip

    def runs(rs: list[dict]) -> int:  # contiguous runs of one label
        labels = [r["ebird_code"] for r in rs]
        return 1 + sum(a != b for a, b in zip(labels, labels[1:], strict=False))

    assert runs(grouped) == TINY.n_species
    assert runs(shuffled) > TINY.n_species  # the default order is not grouped (seed 0)
    by_id = {r["recording_id"]: r["audio"]["bytes"] for r in shuffled}
    assert {r["recording_id"]: r["audio"]["bytes"] for r in grouped} == by_id


def test_refuses_to_mix_with_an_existing_set(tmp_path: Path) -> None:
    cfg = DemoConfig(n_species=2, per_species_train=1, per_species_eval=0, min_seconds=1.0, max_seconds=1.0)
    out = generate_demo_data(tmp_path / "d", cfg, workers=1)
    with pytest.raises(FileExistsError, match="manifest.json"):
        generate_demo_data(out, cfg, workers=1)
    before = all_files(out)
    generate_demo_data(out, cfg, workers=1, overwrite=True)
    assert all_files(out) == before
    assert not (out / "eval").exists() or not list_shards(out / "eval")


def test_canonical_ogg_fixes_serial_and_checksums() -> None:
    x = (0.3 * np.sin(np.arange(32000) * 0.2)).astype(np.float32)
    buf = io.BytesIO()
    sf.write(buf, x, 32000, format="OGG", subtype="VORBIS")
    raw = buf.getvalue()
    fixed = canonical_ogg(raw, serial=0xABCDEF01)
    assert len(fixed) == len(raw) and fixed != raw
    pos, pages = 0, 0
    while pos < len(fixed):
        assert fixed[pos : pos + 4] == b"OggS"
        assert fixed[pos + 14 : pos + 18] == (0xABCDEF01).to_bytes(4, "little")
        n_seg = fixed[pos + 26]
        pos += 27 + n_seg + sum(fixed[pos + 27 : pos + 27 + n_seg])
        pages += 1
    assert pages >= 3
    # libogg drops pages with a bad checksum: identical decoded samples prove the CRCs are right
    np.testing.assert_array_equal(sf.read(io.BytesIO(fixed))[0], sf.read(io.BytesIO(raw))[0])
    with pytest.raises(ValueError, match="bad Ogg page"):
        canonical_ogg(raw[:-1] + b"\0" + b"junk", 1)


def test_canonical_wav_zeroes_peak_timestamp() -> None:
    x = (0.3 * np.sin(np.arange(8000) * 0.2)).astype(np.float32)
    data = encode_audio(x, 16000, "wav_float")
    peak = data.index(b"PEAK")
    assert data[peak + 12 : peak + 16] == b"\0\0\0\0"
    np.testing.assert_array_equal(sf.read(io.BytesIO(data), dtype="float32")[0], x)
    assert canonical_wav(data) == data


def test_species_and_config_validation() -> None:
    species = make_species(SMALL)
    assert [s.index for s in species] == list(range(SMALL.n_species))
    assert all(1500.0 <= s.band_hz[0] < s.band_hz[1] <= 12000.0 for s in species)
    assert make_species(SMALL) == species
    for bad in (
        {"n_species": 0},
        {"min_seconds": 0.5},
        {"min_seconds": 9.0, "max_seconds": 8.0},
        {"shard_mb": 0},
        {"order": "alphabetical"},
    ):
        with pytest.raises(ValueError):
            DemoConfig(**bad)
    with pytest.raises(ValueError, match="unknown codec"):
        encode_audio(np.zeros(100, np.float32), 16000, "aac")
    x = np.zeros(1000, np.float32)
    assert encode_audio(x, 16000, "ogg", ogg_serial=3) == encode_audio(x, 16000, "ogg_vorbis", ogg_serial=3)


def test_ensure_demo_data_generates_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = DemoConfig(n_species=2, per_species_train=1, per_species_eval=1, min_seconds=1.0, max_seconds=1.0)
    monkeypatch.setenv("BIRDJEPA_CACHE", str(tmp_path / "cache"))
    first = ensure_demo_data(cfg, workers=1, verbose=False)
    assert first.parent == tmp_path / "cache" and (first / "train" / "vocab.json").is_file()
    stamp = (first / "manifest.json").stat().st_mtime_ns
    assert ensure_demo_data(cfg, workers=1, verbose=False) == first
    assert (first / "manifest.json").stat().st_mtime_ns == stamp  # reused, not regenerated
    other = ensure_demo_data(dataclasses.replace(cfg, seed=5), workers=1, verbose=False)
    assert other != first
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([first.name, other.name])


def test_cli_demo_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    args = "--n-species 3 --per-species-train 2 --per-species-eval 1 --min-seconds 1 --max-seconds 1.5"
    main(["demo-data", str(out), *args.split(), "--seed", "7", "--workers", "1"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["seed"] == 7 and manifest["splits"]["train"]["recordings"] == 6
    assert len(rows(out / "eval")) == 3
    assert "wrote 9 recordings" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["demo-data", str(out), *args.split(), "--workers", "1"])
    assert e.value.code == 1 and "holds a demo set (use --overwrite)" in capsys.readouterr().err
