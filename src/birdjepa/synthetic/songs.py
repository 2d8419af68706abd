"""The invented species and their songs: the species table (`make_species`: band groups, notes,
temporal patterns) and a species' song as a waveform (`render_song`). What a recording adds to the
song (noise, other species, the microphone) is in `channel`; the config and seeded generators are in
`config`.

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
share of the time (a recording's activity then varies it, see `channel`).

Why so strict: the raw baseline (per mel bin, the mean and std of the log-mel over time) sees each
bin's distribution of energies but not their order. A note kind or length, or a share of time
sounding, that only one species of a group has would change that distribution and give the species
away; the same notes in a different order do not. So the spectrum finds the band group and time tells
the species of a group apart, which needs a model of the time-frequency pattern. Two species per group
(not four) keep the band a strong cue, as in real recordings: a perfect spectrum-only classifier
gets about half the species right.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from birdjepa.synthetic.config import SPLIT_KEY, DemoConfig, rng_for

BAND_HZ = (1500.0, 12000.0)
SPECIES_PER_BAND = 2
"""Species per band group (the last group takes the remainder when it does not divide n_species)."""
PATTERNS = ("series", "trill", "doublets", "triplets", "accelerando", "irregular")
"""How a species arranges its notes in time; the species of one band group all have different ones."""
SYLLABLE_KINDS = ("chirp_up", "chirp_down", "chevron", "whistle")
MAX_CYCLE_SECONDS = 2.5
"""Longest rendition cycle (motif and pause) before the recording's activity scales the pause."""


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
    rng = rng_for(config.seed, SPLIT_KEY["species"])
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


def render_song(
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
