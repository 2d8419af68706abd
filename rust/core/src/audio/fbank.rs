//! Kaldi-style log-mel filter bank ("fbank"), the features AudioMAE-style encoders are trained on.
//!
//! For a signal of `N` samples (already at `sample_rate`, no dither: the features are deterministic):
//!
//! 1. **Framing** (Kaldi `snip_edges = true`): frame `t` is samples `[t * hop, t * hop + win)`;
//!    `n_frames = 1 + (N - win) / hop` when `N >= win`, else 0. No padding at either end.
//! 2. **DC removal** (`remove_dc`): subtract the frame's mean.
//! 3. **Pre-emphasis** (Kaldi's form): `x[i] -= p * x[i-1]` for `i = win-1 .. 1` (going backwards, so
//!    each uses the original previous sample), then `x[0] -= p * x[0]`.
//! 4. **Window**: symmetric Hann, Kaldi's `"hanning"`: `w[i] = 0.5 - 0.5 cos(2 pi i / (win - 1))`.
//!    This is the window AudioMAE (and torchaudio's `kaldi.fbank(window_type="hanning")`) uses; Kaldi's
//!    default `"povey"` window (Hann to the power 0.85) is not used.
//! 5. **Power spectrum**: zero-pad to `n_fft`, real FFT, `|X[k]|^2`.
//! 6. **Mel filters**: `n_mels` triangles equally spaced on the Kaldi mel scale
//!    `mel(f) = 1127 ln(1 + f / 700)` between `f_min` and `f_max` (default Nyquist): filter `m` has
//!    left/centre/right edges at `mel_lo + (m, m+1, m+2) * (mel_hi - mel_lo) / (n_mels + 1)`. FFT bin `k`
//!    (frequency `k * sample_rate / n_fft`, for `k < n_fft / 2`, i.e. the Nyquist bin is excluded as in
//!    Kaldi) gets weight `(mel - left) / (centre - left)` on the rising side and
//!    `(right - mel) / (right - centre)` on the falling side, strictly inside `(left, right)`. Each
//!    filter is stored sparsely as its contiguous non-zero bin range.
//! 7. **Log**: `ln(max(energy, log_floor))`, Kaldi's floor being `f32::EPSILON`. The log is
//!    [`ln_f32`], a libm-free polynomial (a few ulps from `f32::ln`) so that it vectorises.
//!
//! Output is time-major `[n_frames, n_mels]`, natural-log energies, not normalised. Arithmetic is f32
//! (the FFT is realfft/rustfft); the parity test against a float64 numpy reference is in
//! `tests/test_fbank_parity.py`.

use std::sync::Arc;

use realfft::num_complex::Complex;
use realfft::{RealFftPlanner, RealToComplex};

use crate::options::LoaderOptions;

/// Log-mel configuration. Defaults: 32 kHz, 1024-point FFT, 25 ms window (800), 10 ms hop (320),
/// 128 mels from 20 Hz to Nyquist, pre-emphasis 0.97, DC removal, floor `f32::EPSILON`.
#[derive(Clone, Debug, PartialEq)]
pub struct FbankConfig {
    pub sample_rate: u32,
    pub n_fft: usize,
    pub win_length: usize,
    pub hop_length: usize,
    pub n_mels: usize,
    pub f_min: f32,
    /// `None` = Nyquist (`sample_rate / 2`).
    pub f_max: Option<f32>,
    pub preemphasis: f32,
    pub remove_dc: bool,
    pub log_floor: f32,
}

impl FbankConfig {
    /// The feature options' log-mel part; the options keep `f64`s, narrowed here.
    pub fn from_options(o: &LoaderOptions) -> Self {
        FbankConfig {
            sample_rate: o.target_rate,
            n_fft: o.n_fft,
            win_length: o.win_length,
            hop_length: o.hop_length,
            n_mels: o.n_mels,
            f_min: o.f_min as f32,
            f_max: o.f_max.map(|f| f as f32),
            preemphasis: o.preemphasis as f32,
            remove_dc: o.remove_dc,
            log_floor: o.log_floor as f32,
        }
    }
}

impl Default for FbankConfig {
    /// What the default [`LoaderOptions`] build (the defaults are written there only).
    fn default() -> Self {
        Self::from_options(&LoaderOptions::default())
    }
}

/// Kaldi mel scale.
pub fn mel_scale(f: f64) -> f64 {
    1127.0 * (1.0 + f / 700.0).ln()
}

/// A planned log-mel transform: window, sparse mel matrix and FFT plan, built once (`Send + Sync`).
pub struct Fbank {
    cfg: FbankConfig,
    window: Vec<f32>,
    /// First FFT bin of each filter.
    filter_start: Vec<usize>,
    /// Offsets into `weights`: filter `m` has weights `weights[filter_off[m]..filter_off[m + 1]]`.
    filter_off: Vec<usize>,
    weights: Vec<f32>,
    fft: Arc<dyn RealToComplex<f32>>,
}

impl std::fmt::Debug for Fbank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fbank").field("cfg", &self.cfg).finish_non_exhaustive()
    }
}

/// The longest FFT: 2 s at 32 kHz, 16x the default's.
pub const MAX_N_FFT: usize = 1 << 16;

impl Fbank {
    /// Validate the configuration and precompute window, filters and FFT plan.
    pub fn new(cfg: FbankConfig) -> Result<Self, String> {
        let nyquist = cfg.sample_rate as f32 / 2.0;
        let f_max = cfg.f_max.unwrap_or(nyquist);
        if cfg.sample_rate == 0 {
            return Err("fbank: target_rate must be > 0".into());
        }
        if cfg.win_length < 2 {
            return Err(format!("fbank: win_length must be >= 2 (got {})", cfg.win_length));
        }
        if cfg.n_fft > MAX_N_FFT {
            // 2^28 built its FFT plan for minutes, deaf to Ctrl-C; 2^40 aborted the process.
            return Err(format!("fbank: n_fft must be at most {MAX_N_FFT} (got {})", cfg.n_fft));
        }
        if cfg.n_fft < cfg.win_length || !cfg.n_fft.is_multiple_of(2) {
            return Err(format!(
                "fbank: n_fft must be even and >= win_length (got n_fft={}, win_length={})",
                cfg.n_fft, cfg.win_length
            ));
        }
        if cfg.hop_length == 0 {
            return Err("fbank: hop_length must be > 0".into());
        }
        if cfg.n_mels == 0 {
            return Err("fbank: n_mels must be > 0".into());
        }
        if cfg.n_mels > cfg.n_fft / 2 + 1 {
            // More filters than the spectrum has bins: an n_mels x bins filter bank of empty rows.
            let bins = cfg.n_fft / 2 + 1;
            return Err(format!("fbank: n_mels ({}) must be at most n_fft / 2 + 1 ({bins})", cfg.n_mels));
        }
        // Each message starts with the option to change (the CLI names it): f_max where it was given.
        if !(f_max > cfg.f_min && f_max <= nyquist) && cfg.f_max.is_some() {
            return Err(format!("fbank: f_max ({f_max} Hz) must be above f_min ({} Hz) and at most Nyquist ({nyquist} Hz)", cfg.f_min));
        }
        if !(cfg.f_min >= 0.0 && cfg.f_min < f_max) {
            return Err(format!("fbank: f_min ({} Hz) must be in [0, f_max ({f_max} Hz))", cfg.f_min));
        }
        if !(0.0..=1.0).contains(&cfg.preemphasis) {
            return Err(format!("fbank: preemphasis must be in [0, 1] (got {})", cfg.preemphasis));
        }
        if !(cfg.log_floor > 0.0 && cfg.log_floor.is_finite()) {
            return Err(format!("fbank: log_floor must be finite and > 0 (got {})", cfg.log_floor));
        }

        let win = cfg.win_length;
        let a = 2.0 * std::f64::consts::PI / (win - 1) as f64;
        let window = (0..win).map(|i| (0.5 - 0.5 * (a * i as f64).cos()) as f32).collect();

        let mel_lo = mel_scale(cfg.f_min as f64);
        let mel_hi = mel_scale(f_max as f64);
        let delta = (mel_hi - mel_lo) / (cfg.n_mels + 1) as f64;
        let bin_hz = cfg.sample_rate as f64 / cfg.n_fft as f64;
        let n_bins = cfg.n_fft / 2; // Kaldi: the Nyquist bin is not used.
        let mut filter_start = Vec::with_capacity(cfg.n_mels);
        let mut filter_off = vec![0usize];
        let mut weights = Vec::new();
        for m in 0..cfg.n_mels {
            let left = mel_lo + m as f64 * delta;
            let centre = left + delta;
            let right = centre + delta;
            let mut start = None;
            for k in 0..n_bins {
                let mel = mel_scale(k as f64 * bin_hz);
                if mel > left && mel < right {
                    let w =
                        if mel <= centre { (mel - left) / (centre - left) } else { (right - mel) / (right - centre) };
                    if start.is_none() {
                        start = Some(k);
                    }
                    weights.push(w as f32);
                }
            }
            // Empty filters (possible with many mels and a short FFT, as in Kaldi) output the floor.
            filter_start.push(start.unwrap_or(0));
            filter_off.push(weights.len());
        }

        let fft = RealFftPlanner::<f32>::new().plan_fft_forward(cfg.n_fft);
        Ok(Fbank { cfg, window, filter_start, filter_off, weights, fft })
    }

    pub fn config(&self) -> &FbankConfig {
        &self.cfg
    }

    pub fn n_mels(&self) -> usize {
        self.cfg.n_mels
    }

    /// Mel filters no FFT bin falls inside (too many mels for the FFT's resolution at the low end, or
    /// a band narrower than a bin): each is the log floor in every frame. Kaldi refuses such a bank.
    pub fn empty_filters(&self) -> usize {
        self.filter_off.windows(2).filter(|w| w[0] == w[1]).count()
    }

    /// `1 + (n_samples - win) / hop` when `n_samples >= win`, else 0 (Kaldi `snip_edges`).
    pub fn n_frames_for(&self, n_samples: usize) -> usize {
        if n_samples < self.cfg.win_length {
            0
        } else {
            1 + (n_samples - self.cfg.win_length) / self.cfg.hop_length
        }
    }

    /// Sparse filter `m`: `(first FFT bin, weights)`.
    pub fn filter(&self, m: usize) -> (usize, &[f32]) {
        (self.filter_start[m], &self.weights[self.filter_off[m]..self.filter_off[m + 1]])
    }

    /// Log-mel energies of `samples` into `out` (`n_frames_for(samples.len()) * n_mels`, time-major).
    pub fn compute(&self, samples: &[f32], out: &mut [f32]) {
        let n_frames = self.n_frames_for(samples.len());
        let n_mels = self.cfg.n_mels;
        assert_eq!(out.len(), n_frames * n_mels, "Fbank::compute: out has the wrong length");
        if n_frames == 0 {
            return;
        }
        let (win, hop, p) = (self.cfg.win_length, self.cfg.hop_length, self.cfg.preemphasis);
        let mut frame = self.fft.make_input_vec();
        let mut spec: Vec<Complex<f32>> = self.fft.make_output_vec();
        let mut scratch = self.fft.make_scratch_vec();
        let mut power = vec![0f32; spec.len()];
        let floor = self.cfg.log_floor;
        for (t, row) in out.chunks_exact_mut(n_mels).enumerate() {
            let x = &samples[t * hop..t * hop + win];
            let mean = if self.cfg.remove_dc { sum8(x) / win as f32 } else { 0.0 };
            // DC removal, Kaldi pre-emphasis and window in one pass reading only `x`:
            // frame[i] = ((x[i] - mean) - p * (x[i-1] - mean)) * w[i], and x[-1] := x[0].
            let d0 = x[0] - mean;
            frame[0] = (d0 - p * d0) * self.window[0];
            for i in 1..win {
                frame[i] = ((x[i] - mean) - p * (x[i - 1] - mean)) * self.window[i];
            }
            frame[win..].fill(0.0);
            self.fft
                .process_with_scratch(&mut frame, &mut spec, &mut scratch)
                .expect("realfft: buffer lengths are from the plan");
            for (pw, c) in power.iter_mut().zip(&spec) {
                *pw = c.re * c.re + c.im * c.im;
            }
            for (m, o) in row.iter_mut().enumerate() {
                let (start, w) = self.filter(m);
                let e = dot4(w, &power[start..start + w.len()]);
                *o = e.max(floor);
            }
            for o in row.iter_mut() {
                *o = ln_f32(*o);
            }
        }
    }

    /// Convenience: allocate and return `[n_frames, n_mels]` log-mels.
    pub fn compute_vec(&self, samples: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; self.n_frames_for(samples.len()) * self.cfg.n_mels];
        self.compute(samples, &mut out);
        out
    }
}

/// Dot product in 4 fixed lanes, then the tail: a fixed order (so deterministic) whose four
/// independent chains run in parallel, unlike one serial float sum.
#[inline]
fn dot4(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 4];
    let (ca, cb) = (a.chunks_exact(4), b.chunks_exact(4));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..4 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = (acc[0] + acc[2]) + (acc[1] + acc[3]);
    for (x, y) in ta.iter().zip(tb) {
        s += x * y;
    }
    s
}

/// Sum in 8 fixed lanes (deterministic, vectorisable), then the tail.
#[inline]
fn sum8(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            acc[l] += c[l];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for &v in tail {
        s += v;
    }
    s
}

/// Natural log of a positive, finite, normal f32 (the energies are floored at `log_floor > 0`) without
/// libm: `x = m 2^e` with `m` in `[sqrt(1/2), sqrt(2))`, `ln m = 2 atanh(s)`, `s = (m - 1) / (m + 1)`,
/// by its odd series to `s^9` (truncation < 1e-9). Max error a few f32 ulps; branch-free so the per-row
/// loop vectorises, and the same bits on every platform.
#[inline]
pub fn ln_f32(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let bits = x.to_bits();
    let mut e = ((bits >> 23) & 0xff) as i32 - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    let big = m > std::f32::consts::SQRT_2;
    m = if big { m * 0.5 } else { m };
    e += big as i32;
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let poly = s2 * (2.0 / 3.0 + s2 * (2.0 / 5.0 + s2 * (2.0 / 7.0 + s2 * (2.0 / 9.0))));
    let ef = e as f32;
    ef * LN2_HI + (2.0 * s + (s * poly + ef * LN2_LO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(freq: f64, rate: u32, n: usize, amp: f64) -> Vec<f32> {
        (0..n).map(|i| (amp * (2.0 * std::f64::consts::PI * freq * i as f64 / rate as f64).sin()) as f32).collect()
    }

    #[test]
    fn fast_ln_matches_std_ln() {
        let mut x = f32::EPSILON;
        let mut worst = 0f64;
        while x < 1e12 {
            let err = (ln_f32(x) as f64 - (x as f64).ln()).abs();
            worst = worst.max(err);
            x *= 1.0001;
        }
        assert!(worst < 4e-6, "max abs error {worst}");
        assert_eq!(ln_f32(1.0), 0.0);
    }

    #[test]
    fn frame_count_follows_snip_edges() {
        let f = Fbank::new(FbankConfig::default()).unwrap();
        assert_eq!(f.n_frames_for(799), 0);
        assert_eq!(f.n_frames_for(800), 1);
        assert_eq!(f.n_frames_for(1119), 1);
        assert_eq!(f.n_frames_for(1120), 2);
        assert_eq!(f.n_frames_for(160_000), 498);
        assert!(f.compute_vec(&[0.0; 500]).is_empty());
    }

    #[test]
    fn pure_tone_peaks_in_the_filter_centred_on_it() {
        let cfg = FbankConfig::default();
        let f = Fbank::new(cfg.clone()).unwrap();
        let mel_lo = mel_scale(20.0);
        let delta = (mel_scale(16_000.0) - mel_lo) / 129.0;
        for &freq in &[440.0, 2000.0, 5000.0, 9000.0] {
            let x = tone(freq, 32_000, 32_000, 0.5);
            let out = f.compute_vec(&x);
            let n = f.n_frames_for(x.len());
            // Expected bin: the filter whose centre is nearest the tone on the mel scale.
            let want = ((mel_scale(freq) - mel_lo) / delta - 1.0).round() as usize;
            for t in [0, n / 2, n - 1] {
                let row = &out[t * 128..(t + 1) * 128];
                let arg = row.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0;
                assert!(arg.abs_diff(want) <= 1, "{freq} Hz frame {t}: peak in mel {arg}, expected ~{want}");
                // Far-away filters are much weaker (energy ratio > 1e4).
                assert!(row[arg] - row[(arg + 40) % 128] > 9.0, "{freq} Hz: {row:?}");
            }
        }
    }

    #[test]
    fn silence_hits_the_floor_and_dc_is_removed() {
        let f = Fbank::new(FbankConfig::default()).unwrap();
        let out = f.compute_vec(&[0.0; 4000]);
        assert!(out.iter().all(|&v| v == f32::EPSILON.ln()));
        // A constant signal is removed by per-frame DC removal.
        let out = f.compute_vec(&[0.3; 4000]);
        assert!(out.iter().all(|&v| v == f32::EPSILON.ln()), "{:?}", &out[..8]);
        // Without DC removal it is not (pre-emphasis leaves 0.03 * x at i=0 and the window leaks).
        let f2 = Fbank::new(FbankConfig { remove_dc: false, ..Default::default() }).unwrap();
        let out = f2.compute_vec(&[0.3; 4000]);
        assert!(out[0] > f32::EPSILON.ln() + 1.0);
    }

    #[test]
    fn energy_scales_as_amplitude_squared() {
        let f = Fbank::new(FbankConfig::default()).unwrap();
        let a = f.compute_vec(&tone(3000.0, 32_000, 8000, 0.1));
        let b = f.compute_vec(&tone(3000.0, 32_000, 8000, 0.2));
        // ln(4) = 1.386 everywhere the energy is well above the floor.
        for (x, y) in a.iter().zip(&b) {
            if *x > -5.0 {
                assert!((y - x - 4f32.ln()).abs() < 1e-3, "{x} {y}");
            }
        }
    }

    #[test]
    fn filters_are_sparse_triangles_covering_the_range() {
        let f = Fbank::new(FbankConfig::default()).unwrap();
        let mut prev_start = 0;
        for m in 0..128 {
            let (start, w) = f.filter(m);
            assert!(!w.is_empty(), "filter {m} empty");
            assert!(w.iter().all(|&v| v > 0.0 && v <= 1.0));
            assert!(start >= prev_start);
            assert!(start + w.len() <= 512);
            prev_start = start;
        }
        let (start, w) = f.filter(127);
        assert!(start + w.len() >= 500, "last filter ends near Nyquist");
        assert_eq!(f.empty_filters(), 0);
    }

    #[test]
    fn empty_filters_are_the_bands_that_are_the_floor_in_loud_noise() {
        // 128 mels up to 2 kHz at 31.25 Hz a bin: the lowest bands are narrower than a bin.
        let noise: Vec<f32> = (0..8000u32).map(|i| ((i.wrapping_mul(2_654_435_761) >> 8) as f32 / 8e6) - 1.0).collect();
        for (cfg, empty) in [
            (FbankConfig::default(), 0),
            (FbankConfig { f_max: Some(2000.0), ..Default::default() }, 21),
            (FbankConfig { f_min: 15_990.0, n_mels: 4, ..Default::default() }, 4),
        ] {
            let f = Fbank::new(cfg.clone()).unwrap();
            let out = f.compute_vec(&noise);
            let floor = cfg.log_floor.ln();
            let at_floor = (0..cfg.n_mels).filter(|&m| out.chunks(cfg.n_mels).all(|row| row[m] == floor)).count();
            assert_eq!((f.empty_filters(), at_floor), (empty, empty), "{cfg:?}");
        }
    }

    #[test]
    fn rejects_bad_configs() {
        for bad in [
            FbankConfig { n_fft: 512, ..Default::default() },
            FbankConfig { hop_length: 0, ..Default::default() },
            FbankConfig { n_mels: 0, ..Default::default() },
            FbankConfig { f_min: 20_000.0, ..Default::default() },
            FbankConfig { f_max: Some(17_000.0), ..Default::default() },
            FbankConfig { log_floor: 0.0, ..Default::default() },
        ] {
            assert!(Fbank::new(bad.clone()).is_err(), "{bad:?}");
        }
    }
}
