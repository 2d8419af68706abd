"""Independent float64 numpy implementation of birdjepa's Kaldi-style log-mel filter bank.

Written from the definition in ``rust/core/src/audio/fbank.rs`` (not from the Rust code), to check
``birdjepa._rs.log_mel`` against:

1. frames of ``win_length`` samples every ``hop_length`` samples, Kaldi ``snip_edges``:
   ``1 + (N - win) // hop`` frames when ``N >= win``, else none;
2. per-frame DC removal (subtract the frame mean);
3. Kaldi pre-emphasis: ``y[i] = x[i] - p * x[i-1]`` for ``i >= 1`` and ``y[0] = x[0] - p * x[0]``;
4. symmetric Hann window (Kaldi "hanning"): ``0.5 - 0.5 cos(2 pi i / (win - 1))``;
5. zero-pad to ``n_fft``, power spectrum ``|rfft|^2``, Nyquist bin dropped (Kaldi uses ``n_fft / 2`` bins);
6. triangular filters on the Kaldi mel scale ``1127 ln(1 + f / 700)``, ``n_mels`` of them equally spaced
   between ``mel(f_min)`` and ``mel(f_max)`` (``f_max=None`` means Nyquist);
7. ``ln(max(energy, log_floor))`` with Kaldi's floor ``float32 eps``.
"""

from __future__ import annotations

import numpy as np

FLOAT32_EPS = float(np.finfo(np.float32).eps)


def mel_scale(f: np.ndarray | float) -> np.ndarray:
    """Kaldi's mel scale."""
    return 1127.0 * np.log1p(np.asarray(f, dtype=np.float64) / 700.0)


def mel_banks(n_mels: int, n_fft: int, sample_rate: int, f_min: float, f_max: float | None) -> np.ndarray:
    """Triangular filters as a dense ``[n_mels, n_fft // 2]`` float64 matrix."""
    f_hi = sample_rate / 2.0 if f_max is None else float(f_max)
    mel_lo, mel_hi = mel_scale(f_min), mel_scale(f_hi)
    delta = (mel_hi - mel_lo) / (n_mels + 1)
    bin_mel = mel_scale(np.arange(n_fft // 2) * sample_rate / n_fft)
    m = np.arange(n_mels)[:, None]
    left = mel_lo + m * delta
    centre = left + delta
    right = centre + delta
    up = (bin_mel[None, :] - left) / (centre - left)
    down = (right - bin_mel[None, :]) / (right - centre)
    return np.maximum(0.0, np.minimum(up, down))


def log_mel(
    samples: np.ndarray,
    n_fft: int = 1024,
    win_length: int = 800,
    hop_length: int = 320,
    n_mels: int = 128,
    sample_rate: int = 32000,
    f_min: float = 20.0,
    f_max: float | None = None,
    preemphasis: float = 0.97,
    remove_dc: bool = True,
    log_floor: float = FLOAT32_EPS,
) -> np.ndarray:
    """Log-mel energies ``[n_frames, n_mels]`` in float64."""
    x = np.asarray(samples, dtype=np.float64)
    if len(x) < win_length:
        return np.zeros((0, n_mels))
    n_frames = 1 + (len(x) - win_length) // hop_length
    idx = np.arange(n_frames)[:, None] * hop_length + np.arange(win_length)[None, :]
    frames = x[idx]
    if remove_dc:
        frames = frames - frames.mean(axis=1, keepdims=True)
    emph = frames.copy()
    emph[:, 1:] = frames[:, 1:] - preemphasis * frames[:, :-1]
    emph[:, 0] = frames[:, 0] - preemphasis * frames[:, 0]
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(win_length) / (win_length - 1))
    spec = np.fft.rfft(emph * window, n=n_fft, axis=1)
    power = (spec.real**2 + spec.imag**2)[:, : n_fft // 2]
    energies = power @ mel_banks(n_mels, n_fft, sample_rate, f_min, f_max).T
    return np.log(np.maximum(energies, log_floor))
