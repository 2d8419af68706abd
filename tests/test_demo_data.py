"""The synthetic demo set: layout, determinism, codec/rate mix, labels, durations, band-sharing species,
per-recording nuisance, learnability from the time pattern."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from birdjepa.cli import main
from birdjepa.data import DataError
from birdjepa.data.shards import list_shards, read_shard, read_vocab, shard_schema
from birdjepa.synthetic.channel import draw_nuisance, render_recording
from birdjepa.synthetic.codecs import CODECS, canonical_ogg, canonical_wav, encode_audio
from birdjepa.synthetic.config import DemoConfig
from birdjepa.synthetic.demo import DEFAULT, SMALL, ensure_demo_data, generate_demo_data, plan_recordings
from birdjepa.synthetic.songs import make_species

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
    assert manifest["generator_version"] == 2
    names = [s["code"] for s in manifest["species"]]
    assert len(names) == SMALL.n_species == len(set(names))
    groups = Counter(s["band_group"] for s in manifest["species"])
    assert sorted(groups) == list(range(6)) and set(groups.values()) == {2}  # 12 species, 2 per band
    recordings = manifest["recordings"]
    assert len(recordings) == SMALL.n_species * (SMALL.per_species_train + SMALL.per_species_eval)
    assert {r["id"] for r in recordings} == {r["recording_id"] for split in ("train", "eval")
                                             for r in rows(demo_dir / split)}  # fmt: skip
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
            assert np.isfinite(x).all() and 10 ** (-37 / 20) < np.abs(x).max() <= 1.0  # -35..-1 dBFS
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


def spectrogram_db(x: np.ndarray, sr: int) -> tuple[np.ndarray, np.ndarray]:
    """[frames, bins] power in dB (23 ms Hann window, 10 ms hop) and the bins' frequencies."""
    win, hop = int(0.023 * sr) // 2 * 2, int(0.01 * sr)
    frames = np.lib.stride_tricks.sliding_window_view(x, win)[::hop] * np.hanning(win)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    return 10 * np.log10(power + 1e-20), np.fft.rfftfreq(win, 1 / sr)


def band_envelope_features(demo_dir: Path, split: str) -> list[dict]:
    """Per recording, from its decoded audio and its species' band (from the manifest): the band
    with the most prominent song (98th percentile over the median), the mean log spectrum over time in
    40 bands, and the autocorrelation over 10 ms-1 s of the energy envelope in the species' band."""
    species = json.loads((demo_dir / "manifest.json").read_text())["species"]
    edges = np.geomspace(1000.0, 10500.0, 41)
    out = []
    for r in rows(demo_dir / split):
        x, sr = sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32", always_2d=True)
        db, f = spectrogram_db(x.mean(1), sr)
        label = r["ebird_code"]
        lo, hi = species[label]["band_hz"]
        bands = np.stack(
            [db[:, (f >= a) & (f < b)].mean(1) for a, b in zip(edges[:-1], edges[1:], strict=True)], 1
        )
        prominence = np.percentile(bands, 98, axis=0) - np.median(bands, axis=0)
        env = 10 * np.log10(np.mean(10 ** (db[:, (f >= lo) & (f <= hi)] / 10), axis=1))
        env = np.maximum(env - np.median(env), 0.0)  # dB above the noise floor
        env -= env.mean()
        ac = np.correlate(env, env, "full")[len(env) : len(env) + 100]
        out.append(
            {
                "label": label,
                "band": (lo, hi),
                "peak_hz": float(np.sqrt(edges[:-1] * edges[1:])[np.argmax(prominence)]),
                "spectrum": bands.mean(0),
                "time": ac / (np.dot(env, env) + 1e-9),
            }
        )
    return out


def test_the_song_stands_out_in_its_band(demo_dir: Path) -> None:
    """Through the noise, EQ and background species, the most prominent band of most recordings lies
    in the species' own band."""
    recs = band_envelope_features(demo_dir, "train") + band_envelope_features(demo_dir, "eval")
    inside = [r["band"][0] * 0.9 <= r["peak_hz"] <= r["band"][1] * 1.1 for r in recs]
    assert np.mean(inside) >= 0.8, np.mean(inside)


def test_band_partners_differ_in_time_not_in_spectrum(demo_dir: Path) -> None:
    """The two species of a band group: nearest centroid (fit on train) between the two tells them
    apart on eval from the autocorrelation of the band's energy envelope, not from the mean spectrum."""
    group = [s["band_group"] for s in json.loads((demo_dir / "manifest.json").read_text())["species"]]
    train, evals = band_envelope_features(demo_dir, "train"), band_envelope_features(demo_dir, "eval")

    def pair_accuracy(feature: str) -> float:
        correct = []
        for r in evals:
            partners = [c for c in range(SMALL.n_species) if group[c] == group[r["label"]]]
            centroids = {c: np.mean([t[feature] for t in train if t["label"] == c], axis=0) for c in partners}
            guess = min(partners, key=lambda c: float(np.sum((r[feature] - centroids[c]) ** 2)))
            correct.append(guess == r["label"])
        assert len(correct) == 24  # 12 species x 2 eval recordings, each against its partner
        return float(np.mean(correct))

    assert pair_accuracy("time") >= 0.85
    assert pair_accuracy("spectrum") <= 0.7  # chance is 0.5 (sd 0.1 over 24)


def test_species_share_bands_and_notes_and_differ_in_arrangement() -> None:
    species = make_species(DEFAULT)
    by_group: dict[int, list] = {}
    for s in species:
        by_group.setdefault(s.band_group, []).append(s)
    assert sorted(by_group) == list(range(8)) and all(len(g) == 2 for g in by_group.values())
    centres = []
    for a, b in by_group.values():
        assert a.band_hz == b.band_hz and a.syllables == b.syllables  # same band, same two notes
        assert a.pattern != b.pattern and (a.motif, a.gaps) != (b.motif, b.gaps)
        assert b.band_hz[1] / b.band_hz[0] >= 1.3  # a band of ~half an octave

        def share_sounding(s) -> float:  # expected share of the time the species sounds
            sounding = sum(s.syllables[m].seconds for m in s.motif)
            return sounding / (sounding + sum(s.gaps) + s.pause_seconds)

        assert share_sounding(a) == pytest.approx(share_sounding(b), rel=1e-9)
        assert all(g > 0.03 - 1e-9 for g in a.gaps + b.gaps)
        centres.append(math.sqrt(a.band_hz[0] * a.band_hz[1]))
    # the groups' bands spread over 1.5-12 kHz: 3 octaves, 8 groups
    assert min(centres) < 2000.0 and max(centres) > 9000.0
    assert min(np.diff(np.log2(sorted(centres)))) > 0.1


def quiet_nuisance(plan, n_species: int, **changes):
    """The recording's own nuisance with the extras off (no band noise, rumble, clicks, background
    species), a flat microphone and a quiet background, then `changes`."""
    base = draw_nuisance(plan, n_species)
    flat = {"band_noise": None, "rumble_db": None, "clicks": False, "background": (), "eq_db": (0.0,) * 4}
    flat |= {"highpass": (1.0, 1), "lowpass": (1e6, 1), "snr_db": 40.0}
    return dataclasses.replace(base, **(flat | changes))


def welch_db(x: np.ndarray, sr: int, at: list[float], width: float = 0.05) -> np.ndarray:
    """Mean power (dB) of x in +-width (relative) around each frequency of `at` (Welch: 8192-sample
    Hann windows, half overlap)."""
    frames = np.lib.stride_tricks.sliding_window_view(x, 8192)[::4096] * np.hanning(8192)
    power = np.mean(np.abs(np.fft.rfft(frames, axis=1)) ** 2, axis=0)
    f = np.fft.rfftfreq(8192, 1 / sr)
    return np.array([10 * np.log10(power[(f > c * (1 - width)) & (f < c * (1 + width))].mean()) for c in at])


def test_noise_colour_follows_alpha() -> None:
    """With the song 40 dB under the noise and a flat microphone, the measured spectral slope of a
    recording is -alpha (power ~ 1/f**alpha): white, pink, brown."""
    table = make_species(SMALL)
    plan = plan_recordings(SMALL)["train"][0]
    freqs = [300.0, 600.0, 1200.0, 2400.0, 4800.0, 9600.0]
    for alpha in (0.0, 1.0, 2.0):
        x = render_recording(plan, table, quiet_nuisance(plan, len(table), noise_alpha=alpha, snr_db=-40.0))
        slope = np.polyfit(np.log10(freqs), welch_db(x[:, 0], plan.sample_rate, freqs), 1)[0] / 10
        assert slope == pytest.approx(-alpha, abs=0.15), (alpha, slope)


def test_microphone_band_limits() -> None:
    """A 2nd-order high-pass at 800 Hz and low-pass at 5 kHz (Butterworth magnitudes) on white noise:
    -24 dB two octaves under the high-pass, -12 dB an octave over the low-pass, relative to 2 kHz."""
    table = make_species(SMALL)
    plan = next(p for p in plan_recordings(SMALL)["train"] if p.sample_rate >= 44100)
    mic = {"highpass": (800.0, 2), "lowpass": (5000.0, 2)}
    x = render_recording(plan, table, quiet_nuisance(plan, len(table), noise_alpha=0.0, snr_db=-60.0, **mic))
    low, mid, high = welch_db(x[:, 0], plan.sample_rate, [200.0, 2000.0, 10000.0], width=0.03)
    assert low - mid == pytest.approx(-10 * math.log10(1 + 4.0**4), abs=2.0)
    assert high - mid == pytest.approx(-10 * math.log10(1 + 2.0**4), abs=2.0)


def test_background_species_is_mixed_in() -> None:
    """A background species adds its song in its own band (here one away from the main species'),
    and leaves the rest of the recording as it was."""
    table = make_species(SMALL)
    plan = next(p for p in plan_recordings(SMALL)["train"] if p.channels == 1 and p.seconds > 9)
    main = table[plan.species]
    other = next(
        s for s in table if s.band_hz[0] > main.band_hz[1] * 1.2 or s.band_hz[1] < main.band_hz[0] / 1.2
    )
    quiet = quiet_nuisance(plan, len(table), peak_dbfs=-6.0)
    without = render_recording(plan, table, quiet)[:, 0]
    with_bg = render_recording(plan, table, dataclasses.replace(quiet, background=((other.index, -8.0),)))[
        :, 0
    ]
    centre_main, centre_other = (math.sqrt(s.band_hz[0] * s.band_hz[1]) for s in (main, other))
    before = welch_db(without, plan.sample_rate, [centre_main, centre_other], width=0.1)
    after = welch_db(with_bg, plan.sample_rate, [centre_main, centre_other], width=0.1)
    # normalised to the main song's band: the other band gains > 15 dB (it held only the quiet noise)
    assert (after[1] - after[0]) - (before[1] - before[0]) > 15.0


def test_recordings_differ_in_how_they_were_recorded(demo_dir: Path) -> None:
    """The recordings of one species are recorded differently: level (measured), noise colour, SNR,
    microphone (the manifest's record, checked against the audio for the level)."""
    manifest = json.loads((demo_dir / "manifest.json").read_text())
    by_id = {r["id"]: r for r in manifest["recordings"]}
    peaks: dict[int, list[float]] = {}
    lossless = 0
    for split in ("train", "eval"):
        for r in rows(demo_dir / split):
            x, _ = sf.read(io.BytesIO(r["audio"]["bytes"]), dtype="float32", always_2d=True)
            peak_db = 20 * math.log10(np.abs(x).max())
            if not r["audio"]["path"].endswith((".ogg", ".mp3")):  # lossy codecs move peaks by dBs
                assert peak_db == pytest.approx(by_id[r["recording_id"]]["peak_dbfs"], abs=0.05)
                lossless += 1
            peaks.setdefault(r["ebird_code"], []).append(peak_db)
    assert lossless >= 10
    assert max(max(p) - min(p) for p in peaks.values()) > 15.0  # v1: peak -12..-1 dBFS
    assert max(max(p) for p in peaks.values()) - min(min(p) for p in peaks.values()) > 25.0
    recs = manifest["recordings"]
    for species in {r["species"] for r in recs}:
        mine = [r for r in recs if r["species"] == species]
        assert len({r["noise_alpha"] for r in mine}) == len(mine) == 6
        assert len({r["highpass"]["hz"] for r in mine}) == 6 and len({r["snr_db"] for r in mine}) == 6
    alphas = [r["noise_alpha"] for r in recs]
    assert min(alphas) < 0.3 and max(alphas) > 1.7  # white to brown (v1: 0.7-1.3)
    assert min(r["snr_db"] for r in recs) < 0.0  # v1: 0-30 dB
    backgrounds = [(r["species"], b["species"]) for r in recs for b in r["background"]]
    assert len(backgrounds) >= 10 and all(main != other for main, other in backgrounds)
    assert sum(r["band_noise"] is not None for r in recs) >= 10


def test_nuisance_is_a_function_of_the_recording() -> None:
    table = make_species(SMALL)
    plans = plan_recordings(SMALL)["train"]
    assert draw_nuisance(plans[0], len(table)) == draw_nuisance(plans[0], len(table))
    assert draw_nuisance(plans[0], len(table)) != draw_nuisance(plans[1], len(table))
    a, b = render_recording(plans[3], table), render_recording(plans[3], table)
    assert a.dtype == np.float32 and np.array_equal(a, b)


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
    assert [s.band_group for s in make_species(dataclasses.replace(SMALL, n_species=5))].count(1) == 3
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


def test_ensure_demo_data_generates_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = DemoConfig(n_species=2, per_species_train=1, per_species_eval=1, min_seconds=1.0, max_seconds=1.0)
    monkeypatch.setenv("BIRDJEPA_CACHE", str(tmp_path / "cache"))
    first = ensure_demo_data(cfg, workers=1)
    assert first.parent == tmp_path / "cache" and (first / "train" / "vocab.json").is_file()
    # Its closing line names the cache's folder (it named the temporary one, gone by then).
    assert f" MiB of audio) to {first} in " in capsys.readouterr().out
    stamp = (first / "manifest.json").stat().st_mtime_ns
    assert ensure_demo_data(cfg, workers=1, verbose=False) == first
    assert (first / "manifest.json").stat().st_mtime_ns == stamp  # reused, not regenerated
    other = ensure_demo_data(dataclasses.replace(cfg, seed=5), workers=1, verbose=False)
    assert other != first
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted([first.name, other.name])
    # A cache that cannot be written (a file in its place; a read-only home) was a traceback, exit 1.
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("BIRDJEPA_CACHE", str(tmp_path / "a-file"))
    with pytest.raises(DataError, match=f"^{tmp_path / 'a-file'}: cannot write the synthetic set there"):
        ensure_demo_data(cfg, workers=1, verbose=False)


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
    assert (
        e.value.code == 2 and "holds a data set (manifest.json): use --overwrite" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as e:  # a file there: a NotADirectoryError's traceback
        main(["demo-data", str(out / "manifest.json" / "x"), *args.split(), "--workers", "1"])
    said = capsys.readouterr().err
    assert e.value.code == 2 and said.count("\n") == 1 and "cannot be written" in said, said


def test_a_script_without_a_main_guard_gets_its_recordings_in_one_process_not_a_hang(tmp_path: Path) -> None:
    # Each spawned worker re-runs the unguarded script and dies before it takes a task; a
    # multiprocessing.Pool waited on them forever (a user's script that trained on the demo set hung).
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from birdjepa.synthetic.writer import in_workers\nprint(list(in_workers(abs, [-1, -2, -3], 2)))\n"
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[1, 2, 3]"
    assert "worker processes could not start" in done.stderr


def test_a_demo_set_killed_as_it_is_written_leaves_the_set_before_it_and_nothing_a_loader_reads(
    tmp_path: Path,
) -> None:
    # Killed (SIGTERM, kill -9) it left shards without vocab.json or manifest, which pretrain trained on
    # without a word; with --overwrite it had removed the set that was there first.
    out = tmp_path / "set"
    args = "--n-species 3 --per-species-train 2 --per-species-eval 1 --min-seconds 1 --max-seconds 1.5"
    main(["demo-data", str(out), *args.split(), "--workers", "1"])
    (out / "mine").mkdir()  # another set a user keeps there: not demo-data's to replace
    shutil.copy(next((out / "train").glob("*.arrow")), out / "mine" / "data-00000.arrow")
    shutil.copy(out / "train" / "vocab.json", out / "mine" / "vocab.json")

    def visible() -> dict[Path, bytes]:
        files = (p.relative_to(out) for p in out.rglob("*") if p.is_file())
        return {p: (out / p).read_bytes() for p in files if not any(x.startswith(".") for x in p.parts)}

    before = visible()
    killed = (
        "import os, signal, sys\n"
        "from birdjepa.data import shards\n"
        "from birdjepa.cli import main\n"
        "close = shards.ShardWriter.close\n"
        "def close_and_die(self):\n"
        "    close(self)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)  # its first split written whole, the second not\n"
        "shards.ShardWriter.close = close_and_die\n"
        "main(sys.argv[1:])\n"
    )
    argv = [sys.executable, "-c", killed, "demo-data", str(out), *args.split(), "--seed", "9", "--overwrite",
            "--workers", "1"]  # fmt: skip
    assert subprocess.run(argv, capture_output=True, timeout=120).returncode == -9
    assert visible() == before
    left = sorted(p.name.split("-")[0] for p in out.iterdir() if p.name.startswith("."))
    assert left == [".partial", ".writing.lock"]  # the lock: no longer held, as the kernel freed it
    # The next run replaces the set, and removes what the killed one left.
    main(["demo-data", str(out), *args.split(), "--seed", "9", "--overwrite", "--workers", "1"])
    assert json.loads((out / "manifest.json").read_text())["seed"] == 9
    assert sorted(p.name for p in out.iterdir()) == ["eval", "manifest.json", "mine", "train"]
    assert {p: b for p, b in visible().items() if p.parts[0] == "mine"} == {
        p: b for p, b in before.items() if p.parts[0] == "mine"
    }


def test_a_second_writer_into_a_folder_being_written_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two demo-data (or prepare) runs into one folder both exit 0, one set's shards mixed with the
    # other's (or one's vocab.json relabelling the other's rows).
    from birdjepa.data.prepare import cli as prepare_cli
    from birdjepa.data.shards import only_writer

    out = tmp_path / "out"
    (tmp_path / "src" / "a").mkdir(parents=True)
    sf.write(tmp_path / "src" / "a" / "x.wav", np.zeros(16000, np.float32), 16000)
    with only_writer(out):  # another process's hold: an flock is per open file
        with pytest.raises(SystemExit) as e:
            main(["demo-data", str(out), "--n-species", "2", "--per-species-train", "1", "--workers", "1"])
        assert e.value.code == 2
        with pytest.raises(SystemExit) as e:
            prepare_cli(tmp_path / "src", out)
        assert e.value.code == 2
        said = capsys.readouterr().err.splitlines()
        assert len(said) == 2 and all(f"{out} is being written by pid {os.getpid()} on " in x for x in said)
    assert not any(out.iterdir())
    prepare_cli(tmp_path / "src", out)  # once it is free
    assert sorted(p.name for p in out.iterdir()) == ["data-00000.arrow", "vocab.json"]
