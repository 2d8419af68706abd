"""Parity of the Rust audio DSP (``birdjepa._rs``) with independent numpy / scipy / soundfile code.

Tolerances (stated here, asserted below):

- log-mel: max |rust - reference| <= 1e-3 (natural-log units) on every entry whose reference energy is
  well above the floor, meaning at least e^1 above it and within e^-18 (~1.5e-8) of its frame's strongest
  mel bin: the Rust side computes in float32, whose FFT round-off is relative to the frame's peak, so
  weaker bins are only held to <= 0.05 (all entries, including those near the floor; observed < 0.02).
  Frames of digital silence must equal ln(float32 eps) to 1e-6.
- resample 44.1 kHz -> 32 kHz, unit-amplitude tones at 1, 5 and 12 kHz, 300 output samples away from
  either edge: max |rust - exact sine| <= 2e-4 (observed 4e-5) and max |rust - scipy.signal.resample_poly|
  <= 2e-3 (scipy's default Kaiser(5.0) design itself ripples by ~1e-3); the spectral peak stays in the
  right FFT bin. A 20 kHz tone resampled 48 -> 32 kHz stays below 1e-3 (-60 dB).
- decode: 16-bit WAV and FLAC written by soundfile decode to exactly the float32 PCM
  ``soundfile.read(dtype="float32")`` returns (channels averaged); OGG Vorbis and MP3 within 1e-4 of
  libsndfile's decode, sample-aligned and of its length (an MP3's delay and padding trimmed as its
  LAME tag says, a Vorbis stream ended at its last granule position).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
from reference_fbank import FLOAT32_EPS
from reference_fbank import log_mel as ref_log_mel

from birdjepa import _rs

SR = 32000
LOG_FLOOR = float(np.log(FLOAT32_EPS))


def chirp(seconds: float, f0: float, f1: float, rate: int = SR, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * (f0 * t + 0.5 * (f1 - f0) / seconds * t**2)
    return (amp * np.sin(phase)).astype(np.float32)


def assert_log_mel_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    assert got.dtype == np.float32
    peak = want.max(axis=1, keepdims=True)
    well_above = (want >= peak - 18.0) & (want >= LOG_FLOOR + 1.0)
    assert well_above.sum() >= 500, "too few entries checked tightly"
    diff = np.abs(got.astype(np.float64) - want)
    assert diff[well_above].max() <= 1e-3, diff[well_above].max()
    assert diff.max() <= 0.05, diff.max()
    silent = peak[:, 0] == LOG_FLOOR
    np.testing.assert_allclose(got[silent], LOG_FLOOR, atol=1e-6)


@pytest.mark.parametrize(
    "name",
    ["chirp_up", "chirp_down_loud", "noise", "tone_and_silence"],
)
def test_log_mel_matches_reference_default_config(name: str) -> None:
    rng = np.random.default_rng(12345)
    x = {
        "chirp_up": lambda: chirp(3.0, 100.0, 15000.0),
        "chirp_down_loud": lambda: chirp(2.0, 12000.0, 300.0, amp=0.99),
        "noise": lambda: (0.1 * rng.standard_normal(SR * 2)).astype(np.float32),
        "tone_and_silence": lambda: np.concatenate(
            [np.zeros(SR // 2, np.float32), chirp(1.0, 2000.0, 2000.0), np.zeros(SR // 2, np.float32)]
        ),
    }[name]()
    got = _rs.log_mel(x)
    want = ref_log_mel(x)
    assert got.shape == (1 + (len(x) - 800) // 320, 128)
    assert_log_mel_close(got, want)


def test_silence_is_exactly_the_floor() -> None:
    got = _rs.log_mel(np.zeros(SR, np.float32))
    assert got.shape == (98, 128)
    np.testing.assert_allclose(got, LOG_FLOOR, atol=1e-6)
    np.testing.assert_allclose(ref_log_mel(np.zeros(SR)), LOG_FLOOR, atol=0)


def test_log_mel_matches_reference_other_config() -> None:
    """AudioMAE's 16 kHz setting (512-point FFT, 25/10 ms), no DC removal, no pre-emphasis, f_max set."""
    rng = np.random.default_rng(7)
    x = (chirp(2.0, 50.0, 7900.0, rate=16000) + 0.01 * rng.standard_normal(32000)).astype(np.float32)
    kw = dict(
        n_fft=512,
        win_length=400,
        hop_length=160,
        n_mels=80,
        sample_rate=16000,
        f_min=0.0,
        f_max=7600.0,
        preemphasis=0.0,
        remove_dc=False,
    )
    rs_kw = {("target_rate" if k == "sample_rate" else k): v for k, v in kw.items()}  # the loader's name
    got = _rs.log_mel(x, **rs_kw)
    want = ref_log_mel(x, **kw)
    assert got.shape == (1 + (32000 - 400) // 160, 80)
    assert_log_mel_close(got, want)


def test_short_input_has_no_frames_and_bad_config_raises() -> None:
    assert _rs.log_mel(np.zeros(799, np.float32)).shape == (0, 128)
    with pytest.raises(ValueError, match="n_fft"):
        _rs.log_mel(np.zeros(2000, np.float32), n_fft=512)
    # As the loader refuses them: the log floor made a NaN clip silence.
    for bad, why in [(np.nan, "not finite .NaN or inf. at frame 900"), (1e13, "magnitude 1e13 at frame 900")]:
        x = np.zeros(2000, np.float32)
        x[900] = bad
        with pytest.raises(ValueError, match=f"^log_mel: a sample (that is |of ){why}"):
            _rs.log_mel(x)


@pytest.mark.parametrize("freq", [1000.0, 5000.0, 12000.0])
def test_resample_keeps_frequency_and_matches_scipy(freq: float) -> None:
    from scipy.signal import resample_poly

    n = 44100
    x = np.sin(2 * np.pi * freq * np.arange(n) / 44100).astype(np.float32)
    y = _rs.resample(x, 44100, 32000)
    assert y.dtype == np.float32
    assert len(y) == 32000
    ref = resample_poly(x.astype(np.float64), 320, 441)
    exact = np.sin(2 * np.pi * freq * np.arange(len(y)) / 32000)
    inner = slice(300, len(y) - 300)
    assert np.abs(y[inner] - ref[inner]).max() <= 2e-3
    assert np.abs(y[inner] - exact[inner]).max() <= 2e-4
    spectrum = np.abs(np.fft.rfft(y * np.hanning(len(y))))
    assert np.argmax(spectrum) == round(freq * len(y) / 32000)


def test_resample_rejects_aliases_and_passes_identity() -> None:
    x = np.sin(2 * np.pi * 20000 * np.arange(48000) / 48000).astype(np.float32)
    y = _rs.resample(x, 48000, 32000)
    assert np.abs(y[300:-300]).max() < 1e-3  # 20 kHz is above the 16 kHz output Nyquist
    z = np.arange(100, dtype=np.float32)
    np.testing.assert_array_equal(_rs.resample(z, 32000, 32000), z)
    # A rate the resampler's filters cannot be sized for is refused (4294967295 Hz asked for 171 GB, and
    # the allocation failure aborted Python).
    with pytest.raises(ValueError, match=r"resample: unsupported sample rate 4294967295 Hz \(accepted 1000"):
        _rs.resample(z, 32000, 4294967295)


def _encode(x: np.ndarray, rate: int, fmt: str, subtype: str) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, x, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def _mono_f32(pcm: np.ndarray) -> np.ndarray:
    if pcm.ndim == 1:
        return pcm
    acc = pcm[:, 0].copy()
    for c in range(1, pcm.shape[1]):
        acc = acc + pcm[:, c]
    return acc / np.float32(pcm.shape[1])


@pytest.mark.parametrize(
    ("fmt", "subtype"),
    [("WAV", "PCM_16"), ("WAV", "PCM_24"), ("WAV", "FLOAT"), ("FLAC", "PCM_16"), ("FLAC", "PCM_24")],
)
@pytest.mark.parametrize("channels", [1, 2, 6])
def test_decode_lossless_equals_soundfile_pcm(fmt: str, subtype: str, channels: int) -> None:
    rng = np.random.default_rng(99 + channels)
    rate = 44100
    x = np.clip(0.3 * rng.standard_normal((rate, channels)), -1, 1)
    x[:, 0] += 0.2 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate)
    data = _encode(np.clip(x, -1, 1) if channels > 1 else np.clip(x[:, 0], -1, 1), rate, fmt, subtype)
    got, got_rate = _rs.decode_audio(data)
    want, want_rate = sf.read(io.BytesIO(data), dtype="float32")
    assert got_rate == want_rate == rate
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, _mono_f32(want))


def test_decode_ogg_vorbis_is_aligned_with_libsndfile() -> None:
    rate = 48000
    x = np.stack([chirp(3.0, 300.0, 9000.0, rate=rate), chirp(3.0, 500.0, 4000.0, rate=rate)], axis=1)
    data = _encode(x, rate, "OGG", "VORBIS")
    got, got_rate = _rs.decode_audio(data)
    want = _mono_f32(sf.read(io.BytesIO(data), dtype="float32")[0])
    assert got_rate == rate
    # The final block's padding past the last granule position is trimmed, as libvorbisfile does.
    assert len(got) == len(want) == len(x)
    assert np.abs(got - want).max() <= 1e-4


def test_decode_mp3_is_close_to_libsndfile() -> None:
    rate = 32000
    x = chirp(3.0, 800.0, 6000.0, rate=rate)
    data = _encode(x, rate, "MP3", "MPEG_LAYER_III")
    got, got_rate = _rs.decode_audio(data)
    want = sf.read(io.BytesIO(data), dtype="float32")[0]
    assert got_rate == rate
    # The encoder's delay and the decoder's (1105 samples here) and the last frame's padding are trimmed
    # as the LAME tag says, as libsndfile trims them (they were kept: the decode ran 1105 samples late):
    # the two decoders agree sample for sample, to float rounding (1.4e-6 measured).
    lag = int(np.argmax(np.correlate(got[:8000], want[:4000], mode="valid")))
    assert lag == 0 and len(got) == len(want) == len(x)
    assert np.abs(got - want).max() <= 1e-4


def test_decode_garbage_raises() -> None:
    with pytest.raises(ValueError, match="decode"):
        _rs.decode_audio(b"definitely not audio" * 100)
