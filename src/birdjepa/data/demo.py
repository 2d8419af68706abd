"""Deterministic synthetic bird-song data set (`birdjepa demo-data OUT`), generator version 2.

**Species share bands and differ in time.** The species come in band groups of `SPECIES_PER_BAND`
(2): the groups' bands are spread log-uniformly over 1.5-12 kHz (each 0.43-0.68 octave wide, so
neighbouring groups touch), and the species of one group sing in the same band, with the same two
notes (a group draws two of `SYLLABLE_KINDS`: up/down chirps, chevrons, whistled glides; one length
class of 30-200 ms; each note sweeps the whole band, linear in log-frequency, under a symmetric
envelope, in the group's voice: pure or with 2-3 harmonics). What tells them apart is how they
arrange the notes in time: every species of a group has a different `PATTERNS` arrangement (a slow
series, a fast trill, "tee-tu" doublets, galloping triplets, an accelerando, an irregular run), with
its own rate, gaps and motif length; gaps are at least 30 ms, longer than the loader's 25 ms window.
The pauses between renditions are set so that the species of a group sound for the same expected
share of the time (a recording's activity then varies it, see below).

Why so strict: the raw baseline (per mel bin, the mean and std of the log-mel over time) sees each
bin's distribution of energies but not their order. A note kind or length, or a share of time
sounding, that only one species of a group has would change that distribution and give the species
away; the same notes in a different order do not. So the spectrum finds the band group and time tells
the species of a group apart, which needs a model of the time-frequency pattern. Two species per group
(not four) keep the band a strong cue, as in real recordings: a perfect spectrum-only classifier
gets about half the species right.

**Every recording is recorded differently** (all drawn from the recording's own generator, see
`Nuisance`): the singer's pitch (+-4 %), tempo (+-10 %) and activity (pauses x0.5-2);
background noise with a power-law colour 1/f**alpha, alpha in [0, 2] (white to brown), at an
in-band (1-12 kHz) SNR of -10..25 dB; sometimes (35 %) a band-limited noise source (insects: a narrow
band at 2-10 kHz, inside the bird bands; or a stream: a broad hump at 0.3-3 kHz); wind-like rumble
(40 %) and clicks (35 %); 1-2 other species of the table singing faintly behind (45 %: -25..-8 dB
under the main song, from any other species, the band partner included); a microphone response
applied to the whole mix: a high-pass (40-800 Hz) and a low-pass (5-18 kHz) of random order (6-24
dB/octave) and a smooth random EQ of a few dB; and an overall level (peak -35..-1 dBFS).

Source formats are mixed like real Xeno-Canto dumps: sample rates 44.1/48/32/22.05 kHz
(45/20/25/10 %), ~15 % stereo, codecs OGG Vorbis (~75 %), FLAC, WAV (PCM_16, PCM_24, FLOAT) and MP3.
The mixes are stratified per split (exact counts, then shuffled), so even a small split holds every
codec and rate.

Same config -> byte-identical files, whatever the number of worker processes: every recording draws
from its own generators seeded by (seed, split, species, index, purpose), and the encoded bytes are
made canonical (libsndfile puts a time-seeded serial number in every Ogg page and a wall-clock
timestamp in the PEAK chunk of float WAVs; both are rewritten).

Output::

    OUT/train/train-00000.arrow ...  OUT/train/vocab.json
    OUT/eval/eval-00000.arrow ...    OUT/eval/vocab.json
    OUT/manifest.json                counts, seed, generator version, species table (band groups,
                                     patterns), every recording's nuisance parameters
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import soundfile as sf
import tyro

from birdjepa.data.shards import DEFAULT_LABEL_COLUMN, ShardWriter, remove_shards, write_vocab

GENERATOR = "birdjepa.demo_data"
GENERATOR_VERSION = 2
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
SPECIES_PER_BAND = 2
"""Species per band group (the last group takes the remainder when it does not divide n_species)."""
PATTERNS = ("series", "trill", "doublets", "triplets", "accelerando", "irregular")
"""How a species arranges its notes in time; the species of one band group all have different ones."""
SYLLABLE_KINDS = ("chirp_up", "chirp_down", "chevron", "whistle")
SNR_DB = (-10.0, 25.0)
"""Song power over the background noise's power in 1-12 kHz (v1: 0-30 dB over the whole band)."""
PEAK_DBFS = (-35.0, -1.0)
BACKGROUND_DB = (-25.0, -8.0)
"""Level of a background species' song relative to the main song."""
MAX_CYCLE_SECONDS = 2.5
"""Longest rendition cycle (motif and pause) before the recording's activity scales the pause."""


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
    """Start frequency of the sweep (the low end of a chevron), Hz."""
    f_b: float
    """End frequency of the sweep (the high end of a chevron), Hz."""
    seconds: float
    rate_hz: float
    """Vibrato rate of a whistle (0 for the others)."""
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
    band_group: int
    """Species with the same band group sing in (nearly) the same band."""
    pattern: str
    """Temporal archetype (one of `PATTERNS`), different for every species of a band group."""
    syllables: tuple[Syllable, ...]
    motif: tuple[int, ...]
    """Indices into `syllables`: one rendition of the song."""
    gaps: tuple[float, ...]
    """Silence after each syllable of the motif, seconds."""
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


@dataclass(frozen=True)
class Nuisance:
    """How one recording was recorded (drawn by `draw_nuisance` from the recording's own generator)."""

    pitch: float
    """The singer's pitch relative to its species."""
    tempo: float
    activity: float
    """Multiplies the pauses between renditions."""
    noise_alpha: float
    """Background noise power ~ 1/f**alpha: 0 white, 1 pink, 2 brown."""
    snr_db: float
    """Song power (while singing) over the background noise's power in 1-12 kHz."""
    band_noise: tuple[str, float, float, float] | None
    """(kind, centre Hz, width in octaves (Gaussian sigma), song-to-source dB): insects or a stream."""
    rumble_db: float | None
    """Wind-like rumble relative to the background noise, or none."""
    clicks: bool
    background: tuple[tuple[int, float], ...]
    """(species index, dB relative to the main song) of other species singing behind."""
    highpass: tuple[float, int]
    """Microphone high-pass: (cut-off Hz, order: 6 dB/octave each)."""
    lowpass: tuple[float, int]
    eq_db: tuple[float, ...]
    """Smooth EQ: dB coefficients of cos(pi j x), j = 1, 2, ..., x the log-frequency from 50 Hz (0) to
    20 kHz (1)."""
    peak_dbfs: float


# ---------------------------------------------------------------- randomness


def rng_for(*key: int) -> np.random.Generator:
    """A generator for one purpose, derived from integer keys (never global state)."""
    return np.random.Generator(np.random.Philox(np.random.SeedSequence(list(key))))


_SPLIT_KEY = {"species": 1, "train": 2, "eval": 3, "order": 4}


def largest_remainder(n: int, weights: np.ndarray) -> np.ndarray:
    """`n` split in proportion to `weights` into whole counts that sum to `n` (largest remainder)."""
    exact = n * weights / weights.sum()
    counts = np.floor(exact).astype(np.int64)
    for i in np.argsort(-(exact - counts), kind="stable")[: n - int(counts.sum())]:
        counts[i] += 1
    return counts


def stratified(n: int, mix: Mapping, rng: np.random.Generator) -> list:
    """`n` draws from `mix` with exact (largest-remainder) counts, every category at least once when
    n >= len(mix), in random order."""
    keys = list(mix)
    counts = largest_remainder(n, np.array([mix[k] for k in keys], dtype=np.float64))
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
    """The species of a config, sorted by code; `Species.index` is the label (index into vocab).

    Species slot i (in a random order) joins band group i // SPECIES_PER_BAND. A group draws its band,
    voice (harmonics or none), two notes and one `PATTERNS` arrangement per species (all different),
    then the pauses that give its species the same expected fraction of time sounding."""
    rng = rng_for(config.seed, _SPLIT_KEY["species"])
    lo, hi = BAND_HZ
    n_groups = max(1, config.n_species // SPECIES_PER_BAND)
    members = []  # (group, band, syllables, pattern, motif, gaps, pause) per slot
    for g in range(n_groups):
        centre = lo * (hi / lo) ** ((g + rng.uniform(0.3, 0.7)) / n_groups)
        ratio = rng.uniform(1.35, 1.6)
        band = (max(lo, centre / math.sqrt(ratio)), min(hi, centre * math.sqrt(ratio)))
        size = SPECIES_PER_BAND if g < n_groups - 1 else config.n_species - SPECIES_PER_BAND * (n_groups - 1)
        notes = _make_notes(rng, band)
        picks = rng.permutation(len(PATTERNS))  # distinct within a group (wraps after len(PATTERNS))
        songs = [_arrange(rng, notes, PATTERNS[int(picks[j % len(PATTERNS)])]) for j in range(size)]
        # The same expected duty cycle (share of the time sounding) for every species of the group, so
        # it depends on the recording (activity), not on the species: the pause after a motif follows
        # from it. A species whose rendition cycle would exceed MAX_CYCLE_SECONDS sings fewer units.
        share = rng.uniform(0.55, 0.8)
        duty = share * min(_sounding(notes, units) / _span(notes, units) for _, units, _ in songs)
        for j, (pattern, units, min_units) in enumerate(songs):
            while len(units) > min_units and _sounding(notes, units) / duty > MAX_CYCLE_SECONDS:
                units = units[1:]  # from the start: an accelerando keeps its fast end
            songs[j] = (pattern, units, min_units)
        # shortening can lower an irregular run's own duty cycle: keep every pause positive
        duty = min(duty, share * min(_sounding(notes, units) / _span(notes, units) for _, units, _ in songs))
        for pattern, units, _ in songs:
            motif = tuple(note for unit in units for note, _ in unit)
            gaps = tuple(gap for unit in units for _, gap in unit)
            pause = _sounding(notes, units) / duty - _span(notes, units)
            members.append((g, band, notes, pattern, motif, gaps, pause))
    slots = rng.permutation(config.n_species)
    codes: set[str] = set()
    drafts = []
    for i in range(config.n_species):
        while True:  # invented "Adjective Birdname" -> eBird-style 3+3 letter code
            w1 = _word(rng, 2)
            w2 = _word(rng, 1) + _BIRDS[rng.integers(len(_BIRDS))]
            code = (w1[:3] + w2[:3]).lower()
            if code.isalpha() and len(code) == 6 and code not in codes:
                codes.add(code)
                break
        drafts.append((code, f"{w1.capitalize()} {w2.capitalize()}", members[slots[i]]))
    drafts.sort(key=lambda d: d[0])
    return [
        Species(
            index=i,
            code=code,
            name=name,
            band_hz=band,
            band_group=group,
            pattern=pattern,
            syllables=notes,
            motif=motif,
            gaps=gaps,
            pause_seconds=float(pause),
        )
        for i, (code, name, (group, band, notes, pattern, motif, gaps, pause)) in enumerate(drafts)
    ]


def _make_notes(rng: np.random.Generator, band: tuple[float, float]) -> tuple[Syllable, Syllable]:
    """The two notes of a band group: different kinds, one length class, each sweeping the whole band
    (linear in log-frequency) under a symmetric envelope, in the group's voice."""
    f_lo, f_hi = band
    seconds = float(np.exp(rng.uniform(math.log(0.03), math.log(0.2))))
    n_harm, h_decay = (
        (1, 1.0) if rng.random() < 0.7 else (int(rng.integers(2, 4)), float(rng.uniform(0.15, 0.45)))
    )
    kinds = rng.choice(len(SYLLABLE_KINDS), size=2, replace=False)
    notes = []
    for kind_i in kinds:
        kind = SYLLABLE_KINDS[int(kind_i)]
        a, b = (
            (f_hi, f_lo)
            if kind == "chirp_down" or (kind == "whistle" and rng.random() < 0.5)
            else (f_lo, f_hi)
        )
        shape = float(rng.uniform(0.4, 1.2))
        notes.append(
            Syllable(
                kind=kind,
                f_a=float(a),
                f_b=float(b),
                seconds=seconds * float(rng.uniform(0.9, 1.1)),
                rate_hz=float(rng.uniform(3.0, 9.0)) if kind == "whistle" else 0.0,
                n_harmonics=n_harm,
                harmonic_decay=h_decay,
                attack=shape,
                decay=shape,
            )
        )
    return notes[0], notes[1]


Unit = tuple[tuple[int, float], ...]
"""A unit of a motif (a note, a pair, a triplet): (note index, seconds of silence after it) per note."""


def _sounding(notes: Sequence[Syllable], units: Sequence[Unit]) -> float:
    return sum(notes[note].seconds for unit in units for note, _ in unit)


def _span(notes: Sequence[Syllable], units: Sequence[Unit]) -> float:
    return sum(notes[note].seconds + gap for unit in units for note, gap in unit)


def _arrange(
    rng: np.random.Generator, notes: tuple[Syllable, Syllable], pattern: str
) -> tuple[str, list[Unit], int]:
    """(pattern, units, fewest units) of one species: how it arranges its group's notes in time. Gaps
    are >= 30 ms (longer than the 25 ms analysis window), motifs at most ~1.6 s (several renditions
    fit in a 5 s clip)."""
    d = max(n.seconds for n in notes)

    def u(a: float, b: float) -> float:
        return float(rng.uniform(a, b))

    def fit(count: int, period: float) -> int:  # at most ~1.6 s of motif
        return max(2, min(count, int(1.6 / period)))

    if pattern == "series":  # one note at a steady, slow rate
        gap = u(0.12, 0.3)
        return pattern, [((0, gap),)] * fit(int(rng.integers(4, 9)), d + gap), 3
    if pattern == "trill":  # one note at a steady, fast rate
        gap = u(0.03, 0.05)
        return pattern, [((0, gap),)] * fit(int(rng.integers(8, 17)), d + gap), 4
    if pattern == "doublets":  # "tee-tu tee-tu": a short gap inside a pair, a long one after
        inner, outer = u(0.03, 0.06), u(0.18, 0.35)
        return pattern, [((0, inner), (1, outer))] * fit(int(rng.integers(3, 6)), 2 * d + inner + outer), 2
    if pattern == "triplets":  # galloping: short, short, long
        short, long = u(0.03, 0.06), u(0.2, 0.4)
        unit = ((0, short), (0, short), (1, long))
        return pattern, [unit] * fit(int(rng.integers(2, 5)), 3 * d + 2 * short + long), 2
    if pattern == "accelerando":  # a bouncing ball: the gaps shrink geometrically to a trill
        n = fit(int(rng.integers(7, 13)), d + 0.12)
        g0 = u(0.2, 0.35)
        return pattern, [((0, float(g0 * (0.03 / g0) ** (j / (n - 1)))),) for j in range(n)], min(n, 5)
    if pattern == "irregular":  # both notes in a fixed order with uneven gaps
        n = fit(int(rng.integers(4, 8)), d + 0.2)
        gaps = np.exp(rng.uniform(math.log(0.04), math.log(0.45), size=n))
        return pattern, [((int(rng.integers(0, 2)), float(gap)),) for gap in gaps], min(n, 3)
    raise ValueError(f"unknown pattern {pattern!r}")


# ---------------------------------------------------------------- synthesis


def _syllable(s: Syllable, sr: int, pitch: float, tempo: float) -> np.ndarray:
    """One syllable as float64 samples, peak ~1."""
    n = max(16, int(s.seconds / tempo * sr))
    t = np.arange(n) / sr
    u = (np.arange(n) + 0.5) / n
    env = u**s.attack * (1.0 - u) ** s.decay
    if s.kind == "chevron":
        pos = 1.0 - np.abs(2.0 * u - 1.0)
    else:  # chirps and whistles: one sweep
        pos = u
    f = s.f_a * (s.f_b / s.f_a) ** pos * pitch
    if s.kind == "whistle":
        f = f * (1.0 + 0.015 * np.sin(2 * np.pi * s.rate_hz * t))
    phase = (2 * np.pi / sr) * np.cumsum(f)
    nyq_fade = 0.05 * sr  # components fade out between 0.40 and 0.45 of the sample rate
    out = np.zeros(n)
    for k in range(1, s.n_harmonics + 1):
        gain = np.clip((0.45 * sr - k * f) / nyq_fade, 0.0, 1.0) * s.harmonic_decay ** (k - 1)
        if gain.max() > 0:
            out += gain * np.sin(k * phase)
    return out * (env / env.max())


def _render_song(
    species: Species, sr: int, n: int, rng: np.random.Generator, pitch: float, tempo: float, activity: float
) -> np.ndarray:
    """Renditions of the species' motif from a random start to the end (float32, n samples)."""
    # each syllable type is synthesised once per recording; renditions vary in amplitude and timing
    syllables = [_syllable(s, sr, pitch, tempo).astype(np.float32) for s in species.syllables]
    song = np.zeros(n, dtype=np.float32)
    seconds = n / sr
    t = rng.uniform(0.0, min(1.5, 0.3 * seconds))
    while t < seconds:
        motif = species.motif
        if rng.random() < 0.15 and len(motif) > 2:  # a truncated rendition now and then
            motif = motif[: int(rng.integers(2, len(motif)))]
        r_amp = 10 ** (rng.normal(0.0, 2.0) / 20)
        for si, gap in zip(motif, species.gaps, strict=False):
            syl = syllables[si]
            start = int(t * sr)
            if start >= n:
                break
            seg = syl[: n - start]
            song[start : start + len(seg)] += seg * np.float32(r_amp * 10 ** (rng.normal(0.0, 1.0) / 20))
            t += len(syl) / sr + gap / tempo * rng.uniform(0.85, 1.15)
        t += species.pause_seconds * activity / tempo * rng.uniform(0.6, 1.6)
    return song


def _active_power(x: np.ndarray) -> float:
    """Mean power of `x` where it is not silent (1.0 when it is silent throughout)."""
    active = np.abs(x) > 1e-3
    return float(np.mean(np.square(x[active], dtype=np.float64))) if active.any() else 1.0


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


def _on_bins(freqs: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """A smooth function of frequency at every FFT bin, evaluated on a fine log grid and interpolated
    (the full-resolution transcendental functions cost more than the FFTs)."""
    grid = np.geomspace(max(freqs[1], 1e-3) / 2, freqs[-1] * 1.001, 4096)
    return np.interp(freqs, grid, fn(grid)).astype(np.float32)


def _noise_spectrum(
    m: int, sr: int, rng: np.random.Generator, nz: Nuisance, song_power: float
) -> tuple[np.ndarray, float]:
    """The rfft (length m) of the background noise: power-law colour at `nz.snr_db` under the song in
    1-12 kHz, plus the band-limited source if any; and the noise's rms. Levels follow from the
    spectrum's expected power (Parseval), so no extra transform is needed."""
    k = m // 2 + 1
    # uniform (not Gaussian) real and imaginary parts: 3x cheaper to draw, and the inverse FFT sums so
    # many bins that the time-domain noise is Gaussian anyway
    spec = rng.random((k, 2), dtype=np.float32)
    spec -= np.float32(0.5)
    spec = spec.view(np.complex64)[:, 0]
    # expected mean power of irfft(M * R, m): sum over bins of 2 * M**2 * E|R|**2 / m**2 (DC, Nyquist 1x)
    unit = (2.0 / 6.0) / m**2
    freqs = np.arange(k) * (sr / m)
    colour = _on_bins(freqs, lambda f: np.maximum(f, 40.0) ** -nz.noise_alpha)  # power
    lo, hi = np.searchsorted(freqs, [1000.0, min(12000.0, 0.45 * sr)])
    power = colour * np.float32(song_power / 10 ** (nz.snr_db / 10) / (unit * float(colour[lo:hi].sum())))
    if nz.band_noise is not None:
        _, centre, width, level_db = nz.band_noise
        bump = _on_bins(freqs, lambda f: np.exp(-0.5 * (np.log2(f / centre) / width) ** 2))
        power += bump * np.float32(song_power / 10 ** (level_db / 10) / max(unit * float(bump.sum()), 1e-30))
    spec *= np.sqrt(power)
    return spec, math.sqrt(unit * float(power.sum(dtype=np.float64)))


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


def _clicks(out: np.ndarray, rng: np.random.Generator, sr: int, scale: float) -> None:
    n = len(out)
    for _ in range(int(rng.poisson(rng.uniform(0.05, 0.6) * n / sr))):
        length = int(rng.uniform(0.003, 0.03) * sr)
        start = int(rng.integers(0, max(1, n - length)))
        tau = rng.uniform(0.0005, 0.004) * sr
        burst = rng.standard_normal(length) * np.exp(-np.arange(length) / tau) * rng.uniform(3.0, 12.0)
        out[start : start + length] += (burst[: n - start] * scale).astype(np.float32)


def mic_response(freqs: np.ndarray, nz: Nuisance) -> np.ndarray:
    """The recording's microphone magnitude response at `freqs` (Hz): Butterworth-shaped high- and
    low-pass times the smooth EQ (zero phase)."""
    f = np.maximum(np.asarray(freqs, np.float64), 1e-3)
    (hp, hp_order), (lp, lp_order) = nz.highpass, nz.lowpass
    h = 1.0 / np.sqrt(1.0 + np.minimum(hp / f, 1e6) ** (2 * hp_order))
    h /= np.sqrt(1.0 + (f / lp) ** (2 * lp_order))
    x = np.clip(np.log(f / 50.0) / math.log(20000.0 / 50.0), 0.0, 1.0)
    eq_db = sum(c * np.cos(np.pi * (j + 1) * x) for j, c in enumerate(nz.eq_db))
    return h * 10 ** (eq_db / 20)


def draw_nuisance(plan: RecordingPlan, n_species: int) -> Nuisance:
    """How recording `plan` was recorded: a pure function of its entropy (see the module docstring)."""
    rng = rng_for(*plan.entropy, 1)

    def log_u(a: float, b: float) -> float:
        return float(np.exp(rng.uniform(math.log(a), math.log(b))))

    pitch = 1.0 + rng.uniform(-0.04, 0.04)
    tempo = 1.0 + rng.uniform(-0.10, 0.10)
    activity = log_u(0.5, 2.0)
    alpha = rng.uniform(0.0, 2.0)
    snr_db = rng.uniform(*SNR_DB)
    band_noise = None
    if rng.random() < 0.35:
        if rng.random() < 0.6:
            band_noise = (
                "insects",
                log_u(2000.0, 10000.0),
                float(rng.uniform(0.03, 0.12)),
                float(rng.uniform(-5, 15)),
            )
        else:
            band_noise = (
                "stream",
                log_u(300.0, 3000.0),
                float(rng.uniform(0.6, 1.2)),
                float(rng.uniform(-5, 10)),
            )
    rumble_db = float(rng.uniform(-6.0, 6.0)) if rng.random() < 0.4 else None
    clicks = bool(rng.random() < 0.35)
    background: tuple[tuple[int, float], ...] = ()
    if n_species > 1 and rng.random() < 0.45:
        n_bg = 1 if n_species < 3 or rng.random() < 0.7 else 2
        others = [i for i in range(n_species) if i != plan.species]
        picked = rng.choice(len(others), size=n_bg, replace=False)
        background = tuple((others[int(i)], float(rng.uniform(*BACKGROUND_DB))) for i in picked)
    highpass = (log_u(40.0, 800.0), int(rng.integers(1, 5)))
    lowpass = (log_u(5000.0, 18000.0), int(rng.integers(1, 5)))
    eq_db = tuple(float(c) for c in rng.uniform(-2.5, 2.5, size=4))
    return Nuisance(
        pitch=float(pitch),
        tempo=float(tempo),
        activity=activity,
        noise_alpha=float(alpha),
        snr_db=float(snr_db),
        band_noise=band_noise,
        rumble_db=rumble_db,
        clicks=clicks,
        background=background,
        highpass=highpass,
        lowpass=lowpass,
        eq_db=eq_db,
        peak_dbfs=float(rng.uniform(*PEAK_DBFS)),
    )


def render_recording(
    plan: RecordingPlan, table: Sequence[Species], nuisance: Nuisance | None = None
) -> np.ndarray:
    """The waveform of one recording, float32 (frames, channels), peak below 1: the song of
    `table[plan.species]`, recorded as `nuisance` says (default: `draw_nuisance(plan, len(table))`).

    Every part draws from its own generator (song, ambient, noise, stereo, each background species), so
    changing one nuisance parameter leaves the others' samples as they were."""
    nz = draw_nuisance(plan, len(table)) if nuisance is None else nuisance
    sr = plan.sample_rate
    n = int(round(plan.seconds * sr))
    song_rng = rng_for(*plan.entropy, 2)
    song = _render_song(table[plan.species], sr, n, song_rng, nz.pitch, nz.tempo, nz.activity)
    song_power = _active_power(song)
    fg = song
    for j, (other, rel_db) in enumerate(nz.background):
        rng = rng_for(*plan.entropy, 10 + j)
        pitch, tempo, activity = (
            1.0 + rng.uniform(-0.04, 0.04),
            1.0 + rng.uniform(-0.1, 0.1),
            rng.uniform(0.5, 2),
        )
        bg = _render_song(table[other], sr, n, rng, pitch, tempo, activity)
        fg = fg + bg * np.float32(math.sqrt(song_power / _active_power(bg)) * 10 ** (rel_db / 20))

    m = _fast_len(n + int(0.1 * sr))  # margin: the zero-phase filter's tails wrap around into it
    noise_spec, noise_rms = _noise_spectrum(m, sr, rng_for(*plan.entropy, 4), nz, song_power)
    rng = rng_for(*plan.entropy, 3)
    ambient = np.zeros(n, np.float32)
    if nz.rumble_db is not None:
        ambient += _rumble(n, rng, sr) * np.float32(noise_rms * 10 ** (nz.rumble_db / 20))
    if nz.clicks:
        _clicks(ambient, rng, sr, noise_rms)
    response = _on_bins(np.arange(m // 2 + 1) * (sr / m), lambda f: mic_response(f, nz))

    def record(x: np.ndarray, noise: np.ndarray) -> np.ndarray:
        return np.fft.irfft((np.fft.rfft(x, m) + noise) * response, m)[:n]

    channels = [record(fg + ambient, noise_spec)]
    if plan.channels == 2:  # second microphone: delayed, attenuated song, decorrelated (shifted) noise
        rng = rng_for(*plan.entropy, 5)
        delay = int(rng.integers(1, max(2, int(0.001 * sr))))
        right = np.zeros_like(fg)
        right[delay:] = fg[:-delay] * np.float32(rng.uniform(0.5, 1.0))
        shift = int(rng.integers(n // 4, max(n // 4 + 1, 3 * n // 4)))
        right += np.roll(ambient, shift)
        ramp = np.exp(np.arange(m // 2 + 1) * (-2j * np.pi * shift / m)).astype(np.complex64)
        channels.append(record(right, noise_spec * ramp))
    mix = np.stack(channels, axis=1)
    peak = float(np.abs(mix).max()) + 1e-12
    return (mix * np.float32(10 ** (nz.peak_dbfs / 20) / peak)).astype(np.float32)


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


def make_recording(task: tuple[RecordingPlan, Sequence[Species], Nuisance]) -> bytes:
    plan, table, nuisance = task
    serial = zlib.crc32(plan.recording_id.encode())
    audio = render_recording(plan, table, nuisance)
    return encode_audio(audio, plan.sample_rate, plan.codec, ogg_serial=serial)


# ---------------------------------------------------------------- planning and writing


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


def start_set(out: Path, overwrite: bool) -> None:
    """Make `out` ready for a new set: with `overwrite`, remove the shards, vocab.json and manifest an
    earlier run left there; without it, such a manifest is an error."""
    if overwrite:
        for split in SPLITS:
            if (out / split).is_dir():
                remove_shards(out / split)
        (out / MANIFEST_FILE).unlink(missing_ok=True)
    elif (out / MANIFEST_FILE).exists():
        raise FileExistsError(f"{out / MANIFEST_FILE} exists: {out} holds a demo set (use --overwrite)")


def plan_recordings(config: DemoConfig) -> dict[str, list[RecordingPlan]]:
    """Every recording of every split, in the order written to the shards (`config.order`)."""
    counts = {"train": config.per_species_train, "eval": config.per_species_eval}
    total = config.n_species * sum(counts.values())
    id_numbers = 100000 + rng_for(config.seed, _SPLIT_KEY["order"]).permutation(total)
    plans: dict[str, list[RecordingPlan]] = {}
    offset = 0
    for split in SPLITS:
        keys = [(s, k) for s in range(config.n_species) for k in range(counts[split])]
        rng = rng_for(config.seed, _SPLIT_KEY[split])
        n = len(keys)
        formats = draw_formats(n, CODEC_MIX, config.min_seconds, config.max_seconds, rng)
        codecs, rates, channels, seconds = formats
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


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def encoded(
    tasks: Sequence[tuple[RecordingPlan, Sequence[Species], Nuisance]], workers: int
) -> Iterator[bytes]:
    if workers <= 1 or len(tasks) < 2:
        yield from map(make_recording, tasks)
        return
    # spawn, not fork: the caller may hold threads (JAX, Arrow) that fork would copy in a locked state
    with multiprocessing.get_context("spawn").Pool(min(workers, len(tasks))) as pool:
        yield from pool.imap(make_recording, tasks, chunksize=1)


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
    start_set(out, overwrite)

    target = int(config.shard_mb * 2**20)
    tasks = [(p, species, draw_nuisance(p, len(species))) for split in SPLITS for p in plans[split]]
    n_workers = available_cores() if workers is None else workers
    stats: dict[str, Counter] = {split: Counter() for split in SPLITS}
    shards: dict[str, list[tuple[Path, int]]] = {}
    with contextlib.ExitStack() as stack:  # on error every writer deletes what it wrote
        writers = {
            split: stack.enter_context(ShardWriter(out / split, split, target))
            for split in SPLITS
            if plans[split]
        }
        for i, ((plan, _, _), data) in enumerate(zip(tasks, encoded(tasks, n_workers), strict=True)):
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
        "species": species_json(species),
        "recordings": [
            {
                "id": plan.recording_id,
                "split": plan.split,
                "species": names[plan.species],
                "codec": plan.codec,
                "sample_rate": plan.sample_rate,
                "channels": plan.channels,
                "seconds": plan.seconds,
                **nuisance_json(nz, names),
            }
            for plan, _, nz in tasks
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


def species_json(species: Sequence[Species]) -> list[dict]:
    """The species table as the manifest writes it."""
    return [
        {
            "index": s.index,
            "code": s.code,
            "name": s.name,
            "band_hz": [round(s.band_hz[0], 1), round(s.band_hz[1], 1)],
            "band_group": s.band_group,
            "pattern": s.pattern,
            "syllables": [
                {"kind": syl.kind, "seconds": round(syl.seconds, 3), "rate_hz": round(syl.rate_hz, 1)}
                for syl in s.syllables
            ],
            "motif": list(s.motif),
            "gaps": [round(g, 3) for g in s.gaps],
            "pause_seconds": round(s.pause_seconds, 3),
            "harmonics": s.syllables[0].n_harmonics,
        }
        for s in species
    ]


def nuisance_json(nz: Nuisance, names: Sequence[str]) -> dict:
    def r(x: float) -> float:
        return round(float(x), 3)

    return {
        "pitch": r(nz.pitch),
        "tempo": r(nz.tempo),
        "activity": r(nz.activity),
        "noise_alpha": r(nz.noise_alpha),
        "snr_db": r(nz.snr_db),
        "band_noise": None
        if nz.band_noise is None
        else {
            "kind": nz.band_noise[0],
            "centre_hz": r(nz.band_noise[1]),
            "width_octaves": r(nz.band_noise[2]),
            "snr_db": r(nz.band_noise[3]),
        },
        "rumble_db": None if nz.rumble_db is None else r(nz.rumble_db),
        "clicks": nz.clicks,
        "background": [{"species": names[i], "db": r(db)} for i, db in nz.background],
        "highpass": {"hz": r(nz.highpass[0]), "order": nz.highpass[1]},
        "lowpass": {"hz": r(nz.lowpass[0]), "order": nz.lowpass[1]},
        "eq_db": [r(c) for c in nz.eq_db],
        "peak_dbfs": r(nz.peak_dbfs),
    }


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
    recordings: int | None = None,
    shards: int = 500,
    pool: int = 2048,
    workers: int | None = None,
    overwrite: bool = False,
) -> None:
    """Generate a deterministic synthetic bird-song set: OUT/train, OUT/eval (Arrow shards + vocab.json)
    and OUT/manifest.json.

    Args:
        out: Output folder.
        config: Size and seed of the set.
        recordings: Write the scale set instead: this many train recordings of 5-30 s in --shards shards
            of unequal size, reusing the bytes of --pool distinct renders of the config's species and seed,
            and n_species x per_species_eval eval recordings (e.g. --recordings 100000 --shards 500:
            14 GB, 8 min on 2 cores).
        shards: Train shards of the scale set.
        pool: Distinct renders the scale set's train rows reuse.
        workers: Processes for synthesis and encoding (default: all cores); output does not depend on it.
        overwrite: Replace a data set already in OUT.
    """
    try:
        if recordings is None:
            generate_demo_data(out, config, workers=workers, overwrite=overwrite, verbose=True)
        else:
            from birdjepa.data.scale_set import ScaleConfig, generate_scale_set

            scale = ScaleConfig(recordings=recordings, shards=shards, pool=pool, n_species=config.n_species,
                                eval_recordings=config.n_species * config.per_species_eval,
                                seed=config.seed)  # fmt: skip
            generate_scale_set(out, scale, workers=workers, overwrite=overwrite, verbose=True)
    except (FileExistsError, ValueError) as e:
        print(f"birdjepa demo-data: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None
