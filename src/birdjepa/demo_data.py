"""Deterministic synthetic bird-song data set (`birdjepa demo-data OUT`).

Each invented species has its own frequency band (spread log-uniformly over 1.5-12 kHz), tempo and a
song motif built from a small syllable inventory: FM chirps (up/down sweeps), trills (rapid AM/FM
repetition), harmonic stacks and whistles. A recording repeats the motif with per-recording jitter
(pitch +-3 %, tempo +-10 %, amplitude) and small per-rendition variation, over pinkish background
noise with occasional broadband clicks and wind-like low-frequency rumble, at a random SNR.

Source formats are mixed like real Xeno-Canto dumps: sample rates 44.1/48/32/22.05 kHz
(45/20/25/10 %), ~15 % stereo, codecs OGG Vorbis (~75 %), FLAC, WAV (PCM_16, PCM_24, FLOAT) and MP3.
The mixes are stratified per split (exact counts, then shuffled), so even a small split holds every
codec and rate.

Same config -> byte-identical files, whatever the number of worker processes: every recording draws
from its own generator seeded by (seed, split, species, index), and the encoded bytes are made
canonical (libsndfile puts a time-seeded serial number in every Ogg page and a wall-clock timestamp
in the PEAK chunk of float WAVs; both are rewritten).

Output::

    OUT/train/train-00000.arrow ...  OUT/train/vocab.json
    OUT/eval/eval-00000.arrow ...    OUT/eval/vocab.json
    OUT/manifest.json                counts, seed, generator version, species table
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import soundfile as sf
import tyro

from birdjepa.shards import DEFAULT_LABEL_COLUMN, ShardWriter, remove_shards, write_vocab

GENERATOR = "birdjepa.demo_data"
GENERATOR_VERSION = 1
SPLITS = ("train", "eval")
MANIFEST_FILE = "manifest.json"

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
BAND_HZ = (1500.0, 12000.0)
SYLLABLE_KINDS = ("chirp_up", "chirp_down", "trill", "stack", "whistle")


@dataclass(frozen=True)
class DemoConfig:
    """Size and randomness of the synthetic set."""

    n_species: int = 16
    """Number of invented species (labels)."""
    per_species_train: int = 24
    """Recordings per species in OUT/train."""
    per_species_eval: int = 4
    """Held-out recordings per species in OUT/eval."""
    min_seconds: float = 8.0
    """Shortest recording (durations are log-uniform in [min_seconds, max_seconds])."""
    max_seconds: float = 40.0
    """Longest recording."""
    seed: int = 0
    """Seed of everything: species, songs, noise, codec/rate assignment, order."""
    shard_mb: float = 36.0
    """Target shard size in MiB (a shard is closed once its audio bytes reach it)."""
    order: Literal["shuffled", "species"] = "shuffled"
    """Row order of each split. shuffled: random; species: grouped by species as a per-species download
    (e.g. Xeno-Canto queried species by species) writes them. The recordings are the same in both."""

    def __post_init__(self) -> None:
        if not 1 <= self.n_species <= 1000:
            raise ValueError(f"n_species must be in [1, 1000], got {self.n_species}")
        if self.per_species_train < 1 or self.per_species_eval < 0:
            raise ValueError(
                f"need per_species_train >= 1 and per_species_eval >= 0, "
                f"got {self.per_species_train}, {self.per_species_eval}"
            )
        if not 1.0 <= self.min_seconds <= self.max_seconds <= 600.0:
            raise ValueError(
                f"need 1 <= min_seconds <= max_seconds <= 600, got {self.min_seconds}, {self.max_seconds}"
            )
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {self.seed}")
        if self.shard_mb <= 0:
            raise ValueError(f"shard_mb must be positive, got {self.shard_mb}")
        if self.order not in ("shuffled", "species"):
            raise ValueError(f"order must be 'shuffled' or 'species', got {self.order!r}")


DEFAULT = DemoConfig()
"""16 species x (24 train + 4 eval), 8-40 s: ~450 recordings, ~6 train shards."""
SMALL = DemoConfig(
    n_species=12, per_species_train=4, per_species_eval=2, min_seconds=8.0, max_seconds=12.0, shard_mb=4.0
)
"""12 species x (4 train + 2 eval), 8-12 s: the preset for tests (a few seconds to generate)."""


@dataclass(frozen=True)
class Syllable:
    kind: str
    f_a: float
    """Start (chirp/whistle), centre (trill) or fundamental (stack) frequency, Hz."""
    f_b: float
    """End frequency (chirp/whistle) or FM depth fraction (trill) or vibrato depth fraction (stack)."""
    seconds: float
    rate_hz: float
    """Trill repetition rate or vibrato rate."""
    n_harmonics: int
    harmonic_decay: float
    attack: float
    """Envelope shape exponents: env = u**attack * (1-u)**decay."""
    decay: float


@dataclass(frozen=True)
class Species:
    index: int
    code: str
    name: str
    band_hz: tuple[float, float]
    syllables: tuple[Syllable, ...]
    motif: tuple[int, ...]
    """Indices into `syllables`: one rendition of the song."""
    gap_seconds: float
    """Silence between syllables of a motif."""
    pause_seconds: float
    """Mean silence between renditions."""


@dataclass(frozen=True)
class RecordingPlan:
    split: str
    species: int
    k: int
    recording_id: str
    codec: str
    sample_rate: int
    channels: int
    seconds: float
    entropy: tuple[int, ...]


# ---------------------------------------------------------------- randomness


def _rng(*key: int) -> np.random.Generator:
    """A generator for one purpose, derived from integer keys (never global state)."""
    return np.random.Generator(np.random.Philox(np.random.SeedSequence(list(key))))


_SPLIT_KEY = {"species": 1, "train": 2, "eval": 3, "order": 4}


def _stratified(n: int, mix: Mapping, rng: np.random.Generator) -> list:
    """`n` draws from `mix` with exact (largest-remainder) counts, every category at least once when
    n >= len(mix), in random order."""
    keys = list(mix)
    w = np.array([mix[k] for k in keys], dtype=np.float64)
    exact = n * w / w.sum()
    counts = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - counts), kind="stable")[: n - int(counts.sum())]:
        counts[i] += 1
    if n >= len(keys):
        for i in range(len(keys)):
            if counts[i] == 0:
                counts[int(np.argmax(counts))] -= 1
                counts[i] = 1
    out = [k for k, c in zip(keys, counts, strict=True) for _ in range(int(c))]
    return [out[i] for i in rng.permutation(n)]


# ---------------------------------------------------------------- species

_ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "k", "kl", "m", "n", "p", "pl", "qu", "r", "s", "sk", "t")
_ONSETS2 = ("v", "vr", "z", "zh", "th", "tr", "j", "x", "w", "l", "ch", "sh")
_VOWELS = ("a", "e", "i", "o", "u", "y", "ae", "ou")
_BIRDS = ("wit", "warbler", "chat", "lark", "finch", "thrush", "pipit", "tanager", "vireo", "kinglet")


def _word(rng: np.random.Generator, n_syll: int) -> str:
    parts = []
    for j in range(n_syll):
        onsets = _ONSETS if j == 0 else _ONSETS + _ONSETS2
        parts.append(onsets[rng.integers(len(onsets))] + _VOWELS[rng.integers(len(_VOWELS))])
    return "".join(parts) + ("", "n", "l", "r", "x", "z")[rng.integers(6)]


def make_species(config: DemoConfig) -> list[Species]:
    """The species of a config, sorted by code; `Species.index` is the label (index into vocab)."""
    rng = _rng(config.seed, _SPLIT_KEY["species"])
    codes: set[str] = set()
    drafts = []
    lo, hi = BAND_HZ
    band_slots = rng.permutation(config.n_species)
    for i in range(config.n_species):
        while True:  # invented "Adjective Birdname" -> eBird-style 3+3 letter code
            w1 = _word(rng, 2)
            w2 = _word(rng, 1) + _BIRDS[rng.integers(len(_BIRDS))]
            code = (w1[:3] + w2[:3]).lower()
            if code.isalpha() and len(code) == 6 and code not in codes:
                codes.add(code)
                break
        centre = lo * (hi / lo) ** ((band_slots[i] + rng.uniform(0.25, 0.75)) / config.n_species)
        ratio = rng.uniform(1.25, 1.7)
        band = (max(lo, centre / math.sqrt(ratio)), min(hi, centre * math.sqrt(ratio)))
        drafts.append((code, f"{w1.capitalize()} {w2.capitalize()}", band, _make_song(rng, band)))
    drafts.sort(key=lambda d: d[0])
    return [
        Species(index=i, code=code, name=name, band_hz=band, **song)
        for i, (code, name, band, song) in enumerate(drafts)
    ]


def _make_song(rng: np.random.Generator, band: tuple[float, float]) -> dict:
    f_lo, f_hi = band
    unit = float(np.exp(rng.uniform(np.log(0.04), np.log(0.22))))  # typical syllable length
    n_types = int(rng.integers(2, 5))
    kinds = rng.choice(len(SYLLABLE_KINDS), size=n_types, replace=n_types > len(SYLLABLE_KINDS))
    syllables = []
    for kind_i in kinds:
        kind = SYLLABLE_KINDS[int(kind_i)]
        a, b = np.sort(rng.uniform(f_lo, f_hi, size=2))
        if b / a < 1.15:
            a, b = f_lo, f_hi
        seconds = unit * rng.uniform(0.6, 1.6)
        rate, n_harm, decay = 0.0, 1, 1.0
        if kind == "chirp_down":
            a, b = b, a
        elif kind == "trill":
            a = rng.uniform(f_lo, f_hi)
            b = rng.uniform(0.03, 0.12)  # FM depth
            rate = rng.uniform(14.0, 45.0)
            seconds = rng.uniform(0.3, 1.1)
        elif kind == "stack":
            a = f_lo * rng.uniform(0.55, 0.9)  # fundamental below the band, harmonics in it
            b = rng.uniform(0.005, 0.03)  # vibrato depth
            rate = rng.uniform(4.0, 20.0)
            n_harm = int(rng.integers(3, 7))
            decay = rng.uniform(0.45, 0.85)
            seconds = unit * rng.uniform(1.0, 2.5)
        elif kind == "whistle":
            rate = rng.uniform(3.0, 9.0)
            seconds = unit * rng.uniform(1.5, 3.5)
            if rng.random() < 0.5:
                a, b = b, a
        syllables.append(
            Syllable(
                kind=kind,
                f_a=float(a),
                f_b=float(b),
                seconds=float(seconds),
                rate_hz=float(rate),
                n_harmonics=n_harm,
                harmonic_decay=float(decay),
                attack=float(rng.uniform(0.3, 1.5)),
                decay=float(rng.uniform(0.5, 2.0)),
            )
        )
    motif = [int(x) for x in rng.integers(0, n_types, size=int(rng.integers(3, 9)))]
    motif[0] = 0
    return {
        "syllables": tuple(syllables),
        "motif": tuple(motif),
        "gap_seconds": float(unit * rng.uniform(0.3, 1.5)),
        "pause_seconds": float(rng.uniform(0.8, 3.0)),
    }


# ---------------------------------------------------------------- synthesis


def _syllable(s: Syllable, sr: int, pitch: float, tempo: float) -> np.ndarray:
    """One syllable as float64 samples, peak ~1."""
    n = max(16, int(s.seconds / tempo * sr))
    t = np.arange(n) / sr
    u = (np.arange(n) + 0.5) / n
    env = u**s.attack * (1.0 - u) ** s.decay
    if s.kind in ("chirp_up", "chirp_down"):
        f = s.f_a * (s.f_b / s.f_a) ** u
    elif s.kind == "trill":
        phase_rate = 2 * np.pi * s.rate_hz * tempo * t
        f = s.f_a * (1.0 + s.f_b * np.sin(phase_rate))
        env = env * (0.5 - 0.5 * np.cos(phase_rate)) ** 2
    elif s.kind == "stack":
        f = s.f_a * (1.0 + s.f_b * np.sin(2 * np.pi * s.rate_hz * t))
    else:  # whistle: smooth glide with slow vibrato
        glide = 0.5 - 0.5 * np.cos(np.pi * u)
        f = (s.f_a + (s.f_b - s.f_a) * glide) * (1.0 + 0.01 * np.sin(2 * np.pi * s.rate_hz * t))
    f = f * pitch
    phase = (2 * np.pi / sr) * np.cumsum(f)
    nyq_fade = 0.05 * sr  # components fade out between 0.40 and 0.45 of the sample rate
    out = np.zeros(n)
    for k in range(1, s.n_harmonics + 1):
        gain = np.clip((0.45 * sr - k * f) / nyq_fade, 0.0, 1.0) * s.harmonic_decay ** (k - 1)
        if gain.max() > 0:
            out += gain * np.sin(k * phase)
    return out * (env / env.max())


def _fast_len(n: int) -> int:
    """Smallest 2**a * 3**b * 5**c >= n (an FFT length pocketfft handles quickly)."""
    best = 1 << max(0, (n - 1).bit_length())
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            m = p35
            while m < n:
                m *= 2
            best = min(best, m)
            p35 *= 3
        p5 *= 5
    return best


def _pink_noise(n: int, rng: np.random.Generator, sr: int) -> np.ndarray:
    """Noise with power ~ 1/f**alpha (alpha in 0.7-1.3), made as a random spectrum and one inverse FFT."""
    m = _fast_len(max(n, 16))
    k = m // 2 + 1
    # uniform (not Gaussian) real and imaginary parts: 3x cheaper to draw, and the inverse FFT sums so
    # many bins that the time-domain noise is Gaussian anyway
    spec = rng.random((k, 2), dtype=np.float32)
    spec -= np.float32(0.5)
    spec = spec.view(np.complex64)[:, 0]
    log_f = np.log(np.maximum(np.arange(k, dtype=np.float32) * np.float32(sr / m), np.float32(40.0)))
    spec *= np.exp(np.float32(-rng.uniform(0.7, 1.3) / 2) * log_f)
    x = np.fft.irfft(spec, m)[:n]
    return x * np.float32(1.0 / (np.sqrt(np.dot(x, x) / n) + 1e-12))


def _rumble(n: int, rng: np.random.Generator, sr: int) -> np.ndarray:
    """Wind-like: low-passed noise (< ~100 Hz) with slow gusts, synthesised at 500 Hz and interpolated."""
    low_sr = 500
    m = 1 << max(4, (int(n * low_sr / sr) + 2).bit_length())
    spec = np.fft.rfft(rng.standard_normal(m))
    f = np.fft.rfftfreq(m, 1.0 / low_sr)
    spec *= 1.0 / (1.0 + (f / rng.uniform(25.0, 100.0)) ** 4)
    x = np.fft.irfft(spec, m)
    gusts = np.fft.irfft(np.fft.rfft(rng.standard_normal(m)) / (1.0 + (f / 0.5) ** 2), m)
    x = x * np.exp(1.5 * gusts / (gusts.std() + 1e-12))
    y = np.interp(np.arange(n) * (low_sr / sr), np.arange(m), x).astype(np.float32)
    return y / (np.sqrt(np.mean(y**2)) + 1e-12)


def _clicks(noise: np.ndarray, rng: np.random.Generator, sr: int) -> None:
    n = len(noise)
    for _ in range(int(rng.poisson(rng.uniform(0.05, 0.6) * n / sr))):
        length = int(rng.uniform(0.003, 0.03) * sr)
        start = int(rng.integers(0, max(1, n - length)))
        tau = rng.uniform(0.0005, 0.004) * sr
        burst = rng.standard_normal(length) * np.exp(-np.arange(length) / tau) * rng.uniform(3.0, 12.0)
        noise[start : start + length] += burst[: n - start].astype(np.float32)


def render_recording(plan: RecordingPlan, species: Species) -> np.ndarray:
    """The waveform of one recording, float32 (frames, channels), peak below 1."""
    rng = _rng(*plan.entropy)
    sr = plan.sample_rate
    n = int(round(plan.seconds * sr))
    pitch = 1.0 + rng.uniform(-0.03, 0.03)
    tempo = 1.0 + rng.uniform(-0.10, 0.10)
    # each syllable type is synthesised once per recording; renditions vary in amplitude and timing
    syllables = [_syllable(s, sr, pitch, tempo).astype(np.float32) for s in species.syllables]
    song = np.zeros(n, dtype=np.float32)
    t = rng.uniform(0.0, 1.5)
    while t < plan.seconds:
        motif = species.motif
        if rng.random() < 0.15 and len(motif) > 2:  # a truncated rendition now and then
            motif = motif[: int(rng.integers(2, len(motif)))]
        r_amp = 10 ** (rng.normal(0.0, 2.0) / 20)
        for si in motif:
            syl = syllables[si]
            start = int(t * sr)
            if start >= n:
                break
            seg = syl[: n - start]
            song[start : start + len(seg)] += seg * np.float32(r_amp * 10 ** (rng.normal(0.0, 1.0) / 20))
            t += len(syl) / sr + species.gap_seconds / tempo * rng.uniform(0.8, 1.2)
        t += species.pause_seconds / tempo * rng.uniform(0.6, 1.6)

    noise = _pink_noise(n, rng, sr)
    if rng.random() < 0.4:
        noise += _rumble(n, rng, sr) * np.float32(10 ** (rng.uniform(-6.0, 6.0) / 20))
    if rng.random() < 0.35:
        _clicks(noise, rng, sr)
    active = np.abs(song) > 1e-3
    sig_rms = float(np.sqrt(np.mean(song[active] ** 2))) if active.any() else 1.0
    snr_db = rng.uniform(0.0, 30.0)
    noise *= np.float32(sig_rms / 10 ** (snr_db / 20) / (np.sqrt(np.mean(noise**2)) + 1e-12))

    if plan.channels == 1:
        mix = (song + noise)[:, None]
    else:  # second microphone: delayed, attenuated song, decorrelated (shifted) noise
        delay = int(rng.integers(1, max(2, int(0.001 * sr))))
        right = np.zeros_like(song)
        right[delay:] = song[:-delay] * np.float32(rng.uniform(0.5, 1.0))
        right += np.roll(noise, int(rng.integers(n // 4, max(n // 4 + 1, 3 * n // 4))))
        mix = np.stack([song + noise, right], axis=1)
    peak = float(np.abs(mix).max()) + 1e-12
    return (mix * np.float32(10 ** (rng.uniform(-12.0, -1.0) / 20) / peak)).astype(np.float32)


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


def _make_recording(task: tuple[RecordingPlan, Species]) -> bytes:
    plan, species = task
    serial = zlib.crc32(plan.recording_id.encode())
    return encode_audio(render_recording(plan, species), plan.sample_rate, plan.codec, ogg_serial=serial)


# ---------------------------------------------------------------- planning and writing


def plan_recordings(config: DemoConfig) -> dict[str, list[RecordingPlan]]:
    """Every recording of every split, in the order written to the shards (`config.order`)."""
    counts = {"train": config.per_species_train, "eval": config.per_species_eval}
    total = config.n_species * sum(counts.values())
    id_numbers = 100000 + _rng(config.seed, _SPLIT_KEY["order"]).permutation(total)
    plans: dict[str, list[RecordingPlan]] = {}
    offset = 0
    for split in SPLITS:
        keys = [(s, k) for s in range(config.n_species) for k in range(counts[split])]
        rng = _rng(config.seed, _SPLIT_KEY[split])
        n = len(keys)
        codecs = _stratified(n, CODEC_MIX, rng)
        rates = _stratified(n, RATE_MIX, rng)
        channels = _stratified(n, CHANNEL_MIX, rng)
        lo, hi = math.log(config.min_seconds), math.log(config.max_seconds)
        seconds = np.round(np.exp(rng.uniform(lo, hi, size=n)), 3)
        shuffled = rng.permutation(n)  # drawn in both orders, so the recordings do not depend on it
        order = shuffled if config.order == "shuffled" else range(n)
        plans[split] = [
            RecordingPlan(
                split=split,
                species=keys[i][0],
                k=keys[i][1],
                recording_id=f"XD{id_numbers[offset + i]}",
                codec=codecs[i],
                sample_rate=int(rates[i]),
                channels=int(channels[i]),
                seconds=float(seconds[i]),
                entropy=(config.seed, _SPLIT_KEY[split], keys[i][0], keys[i][1]),
            )
            for i in (int(j) for j in order)
        ]
        offset += n
    return plans


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _encoded(tasks: Sequence[tuple[RecordingPlan, Species]], workers: int) -> Iterator[bytes]:
    if workers <= 1 or len(tasks) < 2:
        yield from map(_make_recording, tasks)
        return
    # spawn, not fork: the caller may hold threads (JAX, Arrow) that fork would copy in a locked state
    with multiprocessing.get_context("spawn").Pool(min(workers, len(tasks))) as pool:
        yield from pool.imap(_make_recording, tasks, chunksize=1)


def generate_demo_data(
    out: Path,
    config: DemoConfig = DEFAULT,
    *,
    workers: int | None = None,
    overwrite: bool = False,
    verbose: bool = False,
) -> Path:
    """Writes the demo set into `out` (see the module docstring) and returns `out`.

    `workers` processes render and encode recordings (default: all available cores); the bytes written
    do not depend on it. `overwrite` first removes shards, vocab.json and manifest.json left in `out`
    by an earlier run; otherwise such leftovers are an error.
    """
    out = Path(out)
    t0 = time.perf_counter()
    species = make_species(config)
    plans = plan_recordings(config)
    names = [s.code for s in species]
    for split in SPLITS:
        if overwrite and (out / split).is_dir():
            remove_shards(out / split)
    if overwrite:
        (out / MANIFEST_FILE).unlink(missing_ok=True)
    elif (out / MANIFEST_FILE).exists():
        raise FileExistsError(f"{out / MANIFEST_FILE} exists: {out} holds a demo set (use --overwrite)")

    target = int(config.shard_mb * 2**20)
    tasks = [(p, species[p.species]) for split in SPLITS for p in plans[split]]
    n_workers = _available_cores() if workers is None else workers
    stats: dict[str, Counter] = {split: Counter() for split in SPLITS}
    shards: dict[str, list[tuple[Path, int]]] = {}
    with contextlib.ExitStack() as stack:  # on error every writer deletes what it wrote
        writers = {
            split: stack.enter_context(ShardWriter(out / split, split, target))
            for split in SPLITS
            if plans[split]
        }
        for i, ((plan, _), data) in enumerate(zip(tasks, _encoded(tasks, n_workers), strict=True)):
            ext = CODECS[plan.codec][2]
            writers[plan.split].add(data, f"{plan.recording_id}.{ext}", plan.species, plan.recording_id)
            st = stats[plan.split]
            st["bytes"] += len(data)
            st["seconds"] += plan.seconds
            if verbose and (i + 1) % 50 == 0:
                print(f"  {i + 1}/{len(tasks)} recordings, {time.perf_counter() - t0:.1f} s", flush=True)
        for split, writer in writers.items():
            shards[split] = list(zip(writer.close(), writer.rows_per_shard, strict=True))
            write_vocab(out / split, names)

    manifest: dict = {
        "generator": GENERATOR,
        "generator_version": GENERATOR_VERSION,
        "seed": config.seed,
        "config": dataclasses.asdict(config),
        "label_column": DEFAULT_LABEL_COLUMN,
        "n_species": len(species),
        "splits": {},
        "species": [
            {
                "index": s.index,
                "code": s.code,
                "name": s.name,
                "band_hz": [round(s.band_hz[0], 1), round(s.band_hz[1], 1)],
                "syllables": [syl.kind for syl in s.syllables],
                "motif": list(s.motif),
            }
            for s in species
        ],
        "note": "Synthetic bird song from birdjepa demo-data; species and codes are invented.",
    }
    for split, split_shards in shards.items():
        ps = plans[split]
        manifest["splits"][split] = {
            "recordings": len(ps),
            "seconds": round(stats[split]["seconds"], 3),
            "audio_bytes": stats[split]["bytes"],
            "shards": [{"file": p.name, "rows": r, "bytes": p.stat().st_size} for p, r in split_shards],
            "per_species": dict(sorted(Counter(names[p.species] for p in ps).items())),
            "codecs": dict(sorted(Counter(p.codec for p in ps).items())),
            "sample_rates": {str(k): v for k, v in sorted(Counter(p.sample_rate for p in ps).items())},
            "channels": {str(k): v for k, v in sorted(Counter(p.channels for p in ps).items())},
        }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    if verbose:
        total = sum(s["bytes"] for s in stats.values())
        print(
            f"wrote {len(tasks)} recordings ({total / 2**20:.1f} MiB of audio) to {out} "
            f"in {time.perf_counter() - t0:.1f} s with {n_workers} worker(s)"
        )
    return out


def default_cache_dir() -> Path:
    """`$BIRDJEPA_CACHE`, else `$XDG_CACHE_HOME/birdjepa`, else `~/.cache/birdjepa`."""
    if os.environ.get("BIRDJEPA_CACHE"):
        return Path(os.environ["BIRDJEPA_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "birdjepa"


def ensure_demo_data(
    config: DemoConfig = DEFAULT,
    cache_dir: Path | None = None,
    *,
    workers: int | None = None,
    verbose: bool = True,
) -> Path:
    """The demo set of `config` in the cache (`cache_dir` or `default_cache_dir()`), generated on first
    use. The folder name holds the generator version and a hash of the config, so a changed generator
    or config never reuses stale data. Generation goes to a temporary folder renamed into place, so
    concurrent callers (e.g. several Slurm tasks) never see a half-written set."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = hashlib.sha256(json.dumps(dataclasses.asdict(config), sort_keys=True).encode()).hexdigest()[:12]
    final = root / f"demo-v{GENERATOR_VERSION}-{key}"
    if (final / MANIFEST_FILE).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
    try:
        if verbose:
            print(f"generating the demo set into {final} (once)", flush=True)
        generate_demo_data(tmp, config, workers=workers, verbose=verbose)
        try:
            tmp.rename(final)
        except OSError:
            if not (final / MANIFEST_FILE).is_file():  # not a concurrent winner: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def cli(
    out: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="OUT")],
    config: Annotated[DemoConfig, tyro.conf.OmitArgPrefixes] = DEFAULT,
    workers: int | None = None,
    overwrite: bool = False,
) -> None:
    """Generate a deterministic synthetic bird-song set: OUT/train, OUT/eval (Arrow shards + vocab.json)
    and OUT/manifest.json.

    Args:
        out: Output folder.
        config: Size and seed of the set.
        workers: Processes for synthesis and encoding (default: all cores); output does not depend on it.
        overwrite: Replace a demo set already in OUT.
    """
    try:
        generate_demo_data(out, config, workers=workers, overwrite=overwrite, verbose=True)
    except FileExistsError as e:
        print(f"birdjepa demo-data: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
