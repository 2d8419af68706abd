"""MP3 decodes to the samples written, where libsndfile, ffmpeg and librosa put them: its encoder's delay
and the decoder's (1105 frames for LAME), and its last frame's padding, are trimmed as its LAME/Info tag
says. Until then every MP3 read 1105 frames late (35 ms at 32 kHz, 25 ms at 44.1 kHz): a row's window
(``start_time``/``end_time``), an event crop and ``embed``'s times were late by that much for MP3 rows
only. A Vorbis stream ends at its last granule position (it ran up to a block past it).

Tolerances: the whole decode's cross-correlation lag against the signal written is 0 samples in every
codec (it was 1105 for MP3), and its length is the frames written (Vorbis: up to a block more); through
the loader's windowed, seeking path a 20 ms burst starts at the same log-mel frame in every codec as in
the WAV, within one 10 ms hop (MP3 was 2 to 5 hops late)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

from birdjepa._rs import decode_audio
from birdjepa.data import Features, Loader

RATES = [22050, 32000, 44100, 48000]
CODECS = [
    ("wav", "WAV", "PCM_16"),
    ("flac", "FLAC", "PCM_16"),
    ("ogg", "OGG", "VORBIS"),
    ("mp3", "MP3", "MPEG_LAYER_III"),
]


def encode(x: np.ndarray, rate: int, fmt: str, subtype: str) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


@pytest.mark.parametrize("rate", RATES)
def test_the_whole_decode_starts_at_the_first_sample_written_and_ends_at_the_last(rate: int) -> None:
    rng = np.random.default_rng(rate)
    x = np.convolve(0.3 * rng.standard_normal(3 * rate), np.ones(4) / 4, mode="same").astype(np.float32)
    ref = x[rate // 2 : rate]  # 0.5 s of the signal from 0.5 s on
    for ext, fmt, subtype in CODECS:
        data = encode(x, rate, fmt, subtype)
        got, got_rate = decode_audio(data)
        lag = int(np.argmax(np.correlate(got[: 2 * rate], ref, mode="valid"))) - rate // 2
        assert (got_rate, lag) == (rate, 0), ext
        want = sf.read(io.BytesIO(data), dtype="float32")[0]  # libsndfile's decode
        assert len(got) == len(want) == len(x), ext
        if ext in ("ogg", "mp3"):  # sample for sample, float rounding apart
            assert np.abs(got - want).max() <= 1e-4, ext


def burst_onsets(tmp_path: Path, rate: int, gapless: bool = True) -> dict[str, int]:
    """The first log-mel frame of a 20 ms 3 kHz burst at 3.0 s of an 8 s recording, in each codec, as
    the loader crops the row's window 2.0-4.0 s (a seek into the stream, not a whole decode)."""
    x = np.zeros(8 * rate, dtype=np.float32)
    t = np.arange(int(0.02 * rate)) / rate
    x[3 * rate : 3 * rate + len(t)] = 0.8 * np.sin(2 * np.pi * 3000 * t)
    audio = [{"bytes": encode(x, rate, fmt, subtype), "path": f"burst.{ext}"} for ext, fmt, subtype in CODECS]
    table = pa.table({
        "audio": pa.array(audio, pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "ebird_code": pa.array([0] * len(CODECS), pa.int64()),
        "start_time": [2.0] * len(CODECS),
        "end_time": [4.0] * len(CODECS),
    })  # fmt: skip
    (tmp_path / "s").mkdir(exist_ok=True)
    with pa.ipc.new_file(str(tmp_path / "s" / "data-00000.arrow"), table.schema) as w:
        w.write_table(table)
    onsets = {}
    features = Features(gapless=gapless)
    with Loader(
        tmp_path / "s", seed=0, batch_size=len(CODECS), n_workers=1, train=False, features=features
    ) as loader:
        batch = next(iter(loader))
    for (ext, _, _), offset, spec in zip(CODECS, batch["crop_offset"], batch["spectrogram"], strict=True):
        assert offset == 2 * 32_000, ext  # the window's start, at the loader's 32 kHz
        high = spec[:, 60:].mean(axis=1)  # the upper mel bins, where the burst is
        onsets[ext] = int(np.argmax(high > high.min() + 0.5 * (high.max() - high.min())))
    return onsets


@pytest.mark.parametrize("rate", RATES)
def test_a_window_s_content_lands_where_the_wav_s_does_in_every_codec(tmp_path: Path, rate: int) -> None:
    onsets = burst_onsets(tmp_path, rate)
    assert 90 <= onsets["wav"] <= 100, onsets  # 1.0 s into the window, 10 ms hops
    for ext in ("flac", "ogg", "mp3"):
        assert abs(onsets[ext] - onsets["wav"]) <= 1, (ext, onsets)


def test_without_gapless_an_mp3_reads_as_runs_recorded_before_the_option_read_it(tmp_path: Path) -> None:
    # What a run or an encoder recorded without the option keeps reading (birdjepa.config.recorded): the
    # MP3's burst 1105 samples (3 to 4 hops at 32 kHz) late, the other codecs where they were.
    on, off = burst_onsets(tmp_path, 32000), burst_onsets(tmp_path, 32000, gapless=False)
    assert {k: v for k, v in off.items() if k != "mp3"} == {k: v for k, v in on.items() if k != "mp3"}
    assert 3 <= off["mp3"] - on["mp3"] <= 4, (on, off)


def test_a_crc_protected_mp3_decodes_to_libsndfile_s_samples() -> None:
    # Its header frame's tag lies behind the CRC, which symphonia's demuxer did not read: that frame was
    # decoded as 1152 samples of audio and the encoder's delay kept (2257 samples late against libsndfile;
    # the loader's windows, numbered from the first audio frame, 1105). `lame -p`: make_codec_fixtures.py.
    data = (
        Path(__file__).parents[1] / "rust" / "core" / "tests" / "data" / "birds_32k_mono_crc.mp3"
    ).read_bytes()
    got, rate = decode_audio(data)
    want = sf.read(io.BytesIO(data), dtype="float32")[0]
    assert rate == 32000 and len(got) == len(want) == 4 * 32000
    assert np.abs(got - want).max() <= 1e-4
