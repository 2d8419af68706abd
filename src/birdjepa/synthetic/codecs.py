"""How recordings are stored: the codecs, the mixes of codecs, sample rates and channel counts and
their stratified draws (`draw_formats`), and deterministic encoding (`encode_audio`, with the Ogg and
WAV bytes made canonical). The waveforms come from `channel`; `writer` encodes them in parallel.

Source formats are mixed like real Xeno-Canto dumps: sample rates 44.1/48/32/22.05 kHz
(45/20/25/10 %), ~15 % stereo, codecs OGG Vorbis (~75 %), FLAC, WAV (PCM_16, PCM_24, FLOAT) and MP3.
The mixes are stratified per split (exact counts, then shuffled), so even a small split holds every
codec and rate.
"""

from __future__ import annotations

import io
import math
import zlib
from collections.abc import Mapping

import numpy as np
import soundfile as sf

from birdjepa.synthetic.config import stratified

# codec name -> (soundfile format, subtype, file extension)
CODECS: dict[str, tuple[str, str, str]] = {
    "ogg_vorbis": ("OGG", "VORBIS", "ogg"),
    "flac_pcm16": ("FLAC", "PCM_16", "flac"),
    "wav_pcm16": ("WAV", "PCM_16", "wav"),
    "wav_pcm24": ("WAV", "PCM_24", "wav"),
    "wav_float": ("WAV", "FLOAT", "wav"),
    "mp3": ("MP3", "MPEG_LAYER_III", "mp3"),
}
CODEC_ALIASES = {"ogg": "ogg_vorbis", "vorbis": "ogg_vorbis", "flac": "flac_pcm16", "wav": "wav_pcm16"}
CODEC_MIX: dict[str, float] = {
    "ogg_vorbis": 0.75,
    "flac_pcm16": 0.11,
    "wav_pcm16": 0.03,
    "wav_pcm24": 0.03,
    "wav_float": 0.03,
    "mp3": 0.05,
}
RATE_MIX: dict[int, float] = {44100: 0.45, 48000: 0.20, 32000: 0.25, 22050: 0.10}
CHANNEL_MIX: dict[int, float] = {1: 0.85, 2: 0.15}


def draw_formats(
    n: int, codec_mix: Mapping[str, float], min_seconds: float, max_seconds: float, rng: np.random.Generator
) -> tuple[list, list, list, np.ndarray]:
    """How `n` recordings were stored: codecs (from `codec_mix`), sample rates and channel counts in
    exact stratified counts, and durations log-uniform in [min_seconds, max_seconds], in that order."""
    codecs = stratified(n, codec_mix, rng)
    rates = stratified(n, RATE_MIX, rng)
    channels = stratified(n, CHANNEL_MIX, rng)
    seconds = np.round(np.exp(rng.uniform(math.log(min_seconds), math.log(max_seconds), size=n)), 3)
    return codecs, rates, channels, seconds


# ---------------------------------------------------------------- deterministic encoding

_BITREV = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def _ogg_crc(page: bytes) -> int:
    """Ogg's CRC-32 (poly 0x04C11DB7, unreflected, init 0) via zlib's reflected CRC on bit-reversed
    bytes (runs in C)."""
    raw = zlib.crc32(page.translate(_BITREV), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{raw:032b}"[::-1], 2)


def canonical_ogg(data: bytes, serial: int) -> bytes:
    """Rewrites the stream serial number of every Ogg page (libsndfile draws it from the clock) and
    fixes the page checksums."""
    out = bytearray(data)
    pos = 0
    serial_bytes = (serial & 0xFFFFFFFF).to_bytes(4, "little")
    while pos < len(out):
        if out[pos : pos + 4] != b"OggS" or pos + 27 > len(out):
            raise ValueError(f"bad Ogg page at byte {pos} of {len(out)}")
        n_seg = out[pos + 26]
        end = pos + 27 + n_seg + sum(out[pos + 27 : pos + 27 + n_seg])
        out[pos + 14 : pos + 18] = serial_bytes
        out[pos + 22 : pos + 26] = b"\0\0\0\0"
        out[pos + 22 : pos + 26] = _ogg_crc(bytes(out[pos:end])).to_bytes(4, "little")
        pos = end
    return bytes(out)


def canonical_wav(data: bytes) -> bytes:
    """Zeroes the wall-clock timestamp libsndfile writes into the PEAK chunk of float WAVs."""
    out = bytearray(data)
    if out[:4] != b"RIFF" or out[8:12] != b"WAVE":
        raise ValueError("not a RIFF/WAVE file")
    pos = 12
    while pos + 8 <= len(out):
        chunk, size = bytes(out[pos : pos + 4]), int.from_bytes(out[pos + 4 : pos + 8], "little")
        if chunk == b"PEAK" and size >= 8:
            out[pos + 12 : pos + 16] = b"\0\0\0\0"  # after the 4-byte version
        pos += 8 + size + (size & 1)
    return bytes(out)


def encode_audio(samples: np.ndarray, sample_rate: int, codec: str, *, ogg_serial: int = 0) -> bytes:
    """Encodes float samples (frames[, channels]) with one of `CODECS` (or `CODEC_ALIASES`); same input
    -> same bytes."""
    codec = CODEC_ALIASES.get(codec, codec)
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}; choose from {sorted(CODECS)} or {sorted(CODEC_ALIASES)}")
    fmt, subtype, _ = CODECS[codec]
    buf = io.BytesIO()
    sf.write(buf, samples, sample_rate, format=fmt, subtype=subtype)
    data = buf.getvalue()
    if fmt == "OGG":
        data = canonical_ogg(data, ogg_serial)
    elif fmt == "WAV":
        data = canonical_wav(data)
    return data
