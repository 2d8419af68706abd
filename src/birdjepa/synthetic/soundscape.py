"""Soundscapes: a site's background with calls of several species mixed in at known times, and the
labels of each 5 s window, decided from where the calls were placed (the BirdSet stand-in's test_5s
split, `birdjepa.synthetic.birdset_standin`).

Built on `songs` (the species sing as in the focal recordings) and `channel` (the site's recorder is
a `Nuisance`: noise colour, insects or a stream, wind, clicks, microphone; its noise, rumble and clicks
are made by the same functions as a focal recording's); a soundscape is stored as Ogg (`codecs`).

**How a task's windows are planned** (`assign_species`, `place_calls`): each window first gets a
number of species (0-3, exact shares over the task), then species from a shuffled deck of the task's
classes (so every class is heard once there are as many calls as classes), then one bout (1.5-4 s of
song) per species. A bout lies inside its window, or (`STRADDLE_P`) crosses into a neighbour that
is not a "no call" window and would not hold more than `MAX_SPECIES` species: a "no call" window never
holds call energy, and no window can be labelled with more than three species.

**Labels come from the rendered calls** (`window_labels`): a bout's sounding intervals are the 10 ms
frames within 20 dB of its loudest frame, with gaps up to `MERGE_GAP_SECONDS` (the pauses inside a
motif) closed. A species belongs to a window when at least `min_overlap` seconds of those intervals
lie inside it, or the larger part of a shorter call does: a call straddling two windows belongs to both
when enough of it lies in each.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from birdjepa.synthetic.channel import (
    Nuisance,
    _active_power,
    _clicks,
    _fast_len,
    _noise_spectrum,
    _on_bins,
    _rumble,
    mic_response,
)
from birdjepa.synthetic.codecs import encode_audio
from birdjepa.synthetic.config import rng_for, stratified
from birdjepa.synthetic.songs import Species, render_song

SAMPLE_RATE = 32000
"""BirdSet's soundscapes are stored at 32 kHz, mono, as Ogg Vorbis."""
CODEC = "ogg_vorbis"
WINDOW_SECONDS = 5.0
MAX_SPECIES = 3
BOUT_SECONDS = (1.5, 4.0)
STRADDLE_P = 0.3
"""Share of bouts that try to cross into a neighbouring window."""
FRAME_SECONDS = 0.01
ACTIVE_DB = -20.0
"""A frame of a bout sounds when its peak is within this of the bout's loudest frame."""
MERGE_GAP_SECONDS = 0.35
"""Silences up to this long inside a bout belong to the call (the gaps of a motif are <= 0.45 s)."""


@dataclass(frozen=True)
class Site:
    """Where one task's soundscapes were recorded: one recorder at one place, so every soundscape of
    the task shares its noise colour and sources, microphone and background level."""

    channel: Nuisance
    """The recorder (`noise_alpha`, `band_noise`, `rumble_db`, `clicks`, `highpass`, `lowpass`,
    `eq_db`); its song fields are unused (pitch = tempo = activity = 1, snr_db = 0, no background)."""
    noise_dbfs: float
    """RMS of the background noise in the file, dBFS."""


@dataclass(frozen=True)
class CallEvent:
    """One bout of song in a soundscape."""

    species: int
    """Index into the task's class list (its vocabulary)."""
    start: float
    """Seconds from the start of the soundscape."""
    seconds: float
    snr_db: float
    """The bout's power while sounding over the site noise's power in 1-12 kHz."""
    pitch: float
    tempo: float
    activity: float


@dataclass(frozen=True)
class SoundscapePlan:
    """One soundscape to render: its id, site, calls, length and the key of its own generators."""

    soundscape_id: str
    site: Site
    events: tuple[CallEvent, ...]
    seconds: float
    entropy: tuple[int, ...]


def draw_site(rng: np.random.Generator) -> Site:
    """A site's recorder: any noise colour, insects or a stream half of the time, a microphone that
    keeps the birds' 1.5-12 kHz (high-pass 40-300 Hz, low-pass >= 13 kHz, gentle EQ), so a call's label
    never names a call the microphone took away."""

    def log_u(a: float, b: float) -> float:
        return float(np.exp(rng.uniform(math.log(a), math.log(b))))

    band_noise = None
    if rng.random() < 0.5:  # insects (a narrow band inside the birds' bands) or a stream (a low hump)
        insects = rng.random() < 0.6
        centre = log_u(2000.0, 10000.0) if insects else log_u(300.0, 3000.0)
        width = float(rng.uniform(0.03, 0.12) if insects else rng.uniform(0.6, 1.2))
        level = float(rng.uniform(0.0, 15.0) if insects else rng.uniform(-5.0, 10.0))
        band_noise = ("insects" if insects else "stream", centre, width, level)
    channel = Nuisance(
        pitch=1.0, tempo=1.0, activity=1.0,
        noise_alpha=float(rng.uniform(0.0, 2.0)),
        snr_db=0.0,
        band_noise=band_noise,
        rumble_db=float(rng.uniform(-6.0, 6.0)) if rng.random() < 0.4 else None,
        clicks=bool(rng.random() < 0.35),
        background=(),
        highpass=(log_u(40.0, 300.0), int(rng.integers(1, 5))),
        lowpass=(log_u(13000.0, 16000.0), int(rng.integers(1, 3))),
        eq_db=tuple(float(c) for c in rng.uniform(-2.5, 2.5, size=4)),
        peak_dbfs=0.0,
    )  # fmt: skip
    return Site(channel=channel, noise_dbfs=float(rng.uniform(-55.0, -35.0)))


def assign_species(
    counts: Sequence[int], classes: Sequence[int], rng: np.random.Generator
) -> list[tuple[int, ...]]:
    """The species of each window (`counts[w]` distinct ones, sorted), dealt from a deck of `classes`
    reshuffled whenever it runs out: every class is used before any is used twice."""
    if max(counts, default=0) > min(MAX_SPECIES, len(classes)):
        raise ValueError(
            f"a window holds at most {min(MAX_SPECIES, len(classes))} species, got {max(counts)}"
        )
    deck: list[int] = []
    out = []
    for k in counts:
        picked: list[int] = []
        while len(picked) < k:
            if not deck:
                deck = [classes[int(i)] for i in rng.permutation(len(classes))]
            i = next((j for j, c in enumerate(deck) if c not in picked), None)
            if i is None:  # the deck's rest is all in this window already: fresh deck
                deck = []
                continue
            picked.append(deck.pop(i))
        out.append(tuple(sorted(picked)))
    return out


def plan_soundscapes(
    name: str,
    n: int,
    seconds: float,
    n_classes: int,
    mix: Sequence[float],
    snr_db: tuple[float, float],
    site: Site,
    rng: np.random.Generator,
    entropy: tuple[int, ...],
) -> tuple[SoundscapePlan, ...]:
    """`n` soundscapes `{name}_SSnnn` of one site: exact shares `mix[k]` of windows with k = 0..3
    species over all of them (`assign_species`), then the calls of each (`place_calls`)."""
    nw = int(round(seconds / WINDOW_SECONDS))
    counts = stratified(n * nw, {k: float(w) for k, w in enumerate(mix)}, rng)
    species = assign_species([min(int(k), n_classes) for k in counts], range(n_classes), rng)
    return tuple(
        SoundscapePlan(
            f"{name}_SS{j:03d}",
            site,
            place_calls(species[j * nw : (j + 1) * nw], snr_db, rng),
            seconds,
            (*entropy, j),
        )
        for j in range(n)
    )


def place_calls(
    species: Sequence[tuple[int, ...]],
    snr_db: tuple[float, float],
    rng: np.random.Generator,
) -> tuple[CallEvent, ...]:
    """One bout per (window, species) of one soundscape (`species[w]`: window w's species); see the
    module docstring for where a bout may lie."""
    allowed = [set(s) for s in species]
    events = []
    for w, present in enumerate(species):
        for s in present:
            length = float(rng.uniform(*BOUT_SECONDS))
            start = w * WINDOW_SECONDS + float(rng.uniform(0.0, WINDOW_SECONDS - length))
            side = int(rng.choice((-1, 1)))
            n = w + side
            if rng.random() < STRADDLE_P and 0 <= n < len(species) and species[n]:
                if s in allowed[n] or len(allowed[n]) < MAX_SPECIES:
                    allowed[n].add(s)
                    boundary = (w + (side > 0)) * WINDOW_SECONDS
                    start = boundary - length * float(rng.uniform(0.25, 0.75))
            events.append(
                CallEvent(
                    species=s,
                    start=round(start, 3),
                    seconds=round(length, 3),
                    snr_db=float(rng.uniform(*snr_db)),
                    pitch=1.0 + float(rng.uniform(-0.04, 0.04)),
                    tempo=1.0 + float(rng.uniform(-0.10, 0.10)),
                    activity=float(np.exp(rng.uniform(math.log(0.5), math.log(2.0)))),
                )
            )
    return tuple(events)


def sounding_intervals(song: np.ndarray, sr: int, offset: float) -> list[tuple[float, float]]:
    """Where a bout sounds, in seconds from the start of the soundscape (see the module docstring)."""
    hop = int(FRAME_SECONDS * sr)
    n_frames = -(-len(song) // hop)
    frames = np.abs(np.pad(song, (0, n_frames * hop - len(song)))).reshape(n_frames, hop).max(axis=1)
    active = frames > frames.max() * 10 ** (ACTIVE_DB / 20) if frames.max() > 0 else frames > 1.0
    out: list[list[float]] = []
    for i in np.flatnonzero(active):
        a, b = offset + i * hop / sr, offset + min((i + 1) * hop, len(song)) / sr
        if out and a - out[-1][1] <= MERGE_GAP_SECONDS:
            out[-1][1] = b
        else:
            out.append([a, b])
    return [(round(a, 4), round(b, 4)) for a, b in out]


def render_soundscape(
    plan: SoundscapePlan, table: Sequence[Species]
) -> tuple[np.ndarray, list[list[tuple[float, float]]]]:
    """The soundscape's waveform, float32 (frames, 1) at `SAMPLE_RATE`, and each event's sounding
    intervals. Each bout draws from its own generator, the noise, rumble and clicks from others."""
    sr, nz = SAMPLE_RATE, plan.site.channel
    n = int(round(plan.seconds * sr))
    calls = np.zeros(n, np.float32)
    intervals = []
    for j, ev in enumerate(plan.events):
        start = max(0, int(round(ev.start * sr)))
        length = min(int(round(ev.seconds * sr)), n - start)
        song = render_song(
            table[ev.species], sr, length, rng_for(*plan.entropy, 10 + j), ev.pitch, ev.tempo, ev.activity
        )
        # noise power in 1-12 kHz is 1 (below): the bout's power while sounding is its SNR
        calls[start : start + length] += song * np.float32(
            math.sqrt(10 ** (ev.snr_db / 10) / _active_power(song))
        )
        intervals.append(sounding_intervals(song, sr, start / sr))
    m = _fast_len(n + int(0.1 * sr))
    noise_spec, noise_rms = _noise_spectrum(m, sr, rng_for(*plan.entropy, 4), nz, 1.0)
    rng = rng_for(*plan.entropy, 3)
    if nz.rumble_db is not None:
        calls += _rumble(n, rng, sr) * np.float32(noise_rms * 10 ** (nz.rumble_db / 20))
    if nz.clicks:
        _clicks(calls, rng, sr, noise_rms)
    response = _on_bins(np.arange(m // 2 + 1) * (sr / m), lambda f: mic_response(f, nz))
    mix = np.fft.irfft((np.fft.rfft(calls, m) + noise_spec) * response, m)[:n]
    gain = min(10 ** (plan.site.noise_dbfs / 20) / noise_rms, 0.9 / (float(np.abs(mix).max()) + 1e-12))
    return (mix * gain).astype(np.float32)[:, None], intervals


def window_labels(
    events: Sequence[CallEvent],
    intervals: Sequence[Sequence[tuple[float, float]]],
    n_windows: int,
    min_overlap: float,
) -> list[list[int]]:
    """The species (sorted class indices) whose calls lie in each window (see the module docstring)."""
    labels: list[set[int]] = [set() for _ in range(n_windows)]
    for ev, spans in zip(events, intervals, strict=True):
        total = sum(b - a for a, b in spans)
        for w in range(n_windows):
            lo, hi = w * WINDOW_SECONDS, (w + 1) * WINDOW_SECONDS
            inside = sum(max(0.0, min(b, hi) - max(a, lo)) for a, b in spans)
            if inside > 0 and (inside >= min_overlap or inside > 0.5 * total):
                labels[w].add(ev.species)
    return [sorted(s) for s in labels]


def make_soundscape(
    plan: SoundscapePlan, table: Sequence[Species], min_overlap: float
) -> tuple[bytes, list[list[int]]]:
    """A soundscape's encoded bytes (same plan -> same bytes) and each window's labels."""
    audio, intervals = render_soundscape(plan, table)
    data = encode_audio(audio, SAMPLE_RATE, CODEC, ogg_serial=zlib.crc32(plan.soundscape_id.encode()))
    n_windows = int(round(plan.seconds / WINDOW_SECONDS))
    return data, window_labels(plan.events, intervals, n_windows, min_overlap)
