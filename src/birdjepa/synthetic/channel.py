"""How each recording was recorded: the nuisance draws (`Nuisance`, `draw_nuisance`), background
noise, rumble, clicks, other species singing behind, the microphone response, and `render_recording`,
which puts them together with the song from `songs`. Encoding the waveform is in `codecs`.

**Every recording is recorded differently** (all drawn from the recording's own generator, see
`Nuisance`): the singer's pitch (+-4 %), tempo (+-10 %) and activity (pauses x0.5-2);
background noise with a power-law colour 1/f**alpha, alpha in [0, 2] (white to brown), at an
in-band (1-12 kHz) SNR of -10..25 dB; sometimes (35 %) a band-limited noise source (insects: a narrow
band at 2-10 kHz, inside the bird bands; or a stream: a broad hump at 0.3-3 kHz); wind-like rumble
(40 %) and clicks (35 %); 1-2 other species of the table singing faintly behind (45 %: -25..-8 dB
under the main song, from any other species, the band partner included); a microphone response
applied to the whole mix: a high-pass (40-800 Hz) and a low-pass (5-18 kHz) of random order (6-24
dB/octave) and a smooth random EQ of a few dB; and an overall level (peak -35..-1 dBFS).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from birdjepa.synthetic.config import RecordingPlan, rng_for
from birdjepa.synthetic.songs import Species, render_song

SNR_DB = (-10.0, 25.0)
"""Song power over the background noise's power in 1-12 kHz (v1: 0-30 dB over the whole band)."""
PEAK_DBFS = (-35.0, -1.0)
BACKGROUND_DB = (-25.0, -8.0)
"""Level of a background species' song relative to the main song."""


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


def _song(plan: RecordingPlan, table: Sequence[Species], nz: Nuisance) -> np.ndarray:
    """The focal species' song of a recording, before anything records it (its own generator)."""
    n = int(round(plan.seconds * plan.sample_rate))
    song_rng = rng_for(*plan.entropy, 2)
    return render_song(table[plan.species], plan.sample_rate, n, song_rng, nz.pitch, nz.tempo, nz.activity)


EVENT_FRAME_SECONDS, EVENT_FLOOR_DB, EVENT_GAP_SECONDS = 0.02, -20.0, 0.3
"""`song_events`' detector: 20 ms frames, active within 20 dB of the loudest, gaps under 0.3 s bridged."""


def song_events(plan: RecordingPlan, table: Sequence[Species], nuisance: Nuisance | None = None) -> list:
    """Where the focal song sounds, as an event detector marks it (BirdSet's ``detected_events``):
    ``[start, end]`` seconds (millisecond precision) of each run of 20 ms frames whose song RMS is
    within 20 dB of the loudest frame's, runs less than 0.3 s apart merged. The song alone, not the
    recording, so the events are where the generator put the calls."""
    nz = draw_nuisance(plan, len(table)) if nuisance is None else nuisance
    song = _song(plan, table, nz).astype(np.float64)
    hop = max(1, int(EVENT_FRAME_SECONDS * plan.sample_rate))
    frames = song[: len(song) // hop * hop].reshape(-1, hop)
    rms = np.sqrt((frames**2).mean(axis=1))
    if len(rms) == 0 or rms.max() <= 0:
        return []
    active = rms >= rms.max() * 10 ** (EVENT_FLOOR_DB / 20)
    events: list[list[float]] = []
    for i in np.flatnonzero(active):
        start, end = i * EVENT_FRAME_SECONDS, (i + 1) * EVENT_FRAME_SECONDS
        if events and start - events[-1][1] < EVENT_GAP_SECONDS:
            events[-1][1] = end
        else:
            events.append([start, end])
    return [[round(s, 3), round(e, 3)] for s, e in events]


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
    song = _song(plan, table, nz)
    song_power = _active_power(song)
    fg = song
    for j, (other, rel_db) in enumerate(nz.background):
        rng = rng_for(*plan.entropy, 10 + j)
        pitch, tempo, activity = (
            1.0 + rng.uniform(-0.04, 0.04),
            1.0 + rng.uniform(-0.1, 0.1),
            rng.uniform(0.5, 2),
        )
        bg = render_song(table[other], sr, n, rng, pitch, tempo, activity)
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
