//! One recording -> `n_views` normalised log-mel crops of shape `[n_frames, n_mels]`.
//!
//! [`ClipExtractor::extract`] runs, for each view `v` of sample `key = (seed, epoch, index)`:
//!
//! 1. **Decode** to mono ([`super::decode`]). Seekable codecs with a known length (FLAC, WAV, OGG
//!    Vorbis) decode only the source window the crop needs (views whose windows are close are decoded
//!    in one pass); MP3 and unknown-length streams are decoded whole. `N_src` is the container's frame
//!    count in the first case, the decoded length in the second.
//! 2. **Crop at the output rate**: `N_out = ceil(N_src * target_rate / src_rate)`
//!    ([`Resampler::output_len`]). If `N_out >= clip_samples` the offset is
//!    * `Random`: uniform in `[0, N_out - clip_samples]`, drawn from
//!      `rng::Stream::new(&[seed, Purpose::Crop, epoch, index, v])`;
//!    * `Center`: `(N_out - clip_samples) / 2`.
//!
//!    Otherwise the offset is 0 and the clip is the whole recording followed by zeros.
//!
//!    `Window { start, end }` (a row's own window, [`ClipExtractor::window`]) takes offset `start` at
//!    any length and keeps output samples `[start, min(end, N_out, start + clip))`; the rest of the
//!    clip is zeros, as for a short recording. A window starting at or past `N_out` is an error.
//!
//!    With `shift` (the loader's debug seam, `debug_hooks`, which plants a difference), every
//!    view's offset then moves one fbank hop forward, clamped to `N_out - clip_samples`; where that
//!    leaves it in place (the crop already ends the recording) it moves one hop backward, clamped to 0.
//!    A recording no longer than a clip keeps offset 0. `extract` returns each view's final offset.
//! 3. **Resample** only the crop's output samples `[offset, offset + clip)` (polyphase Kaiser-sinc,
//!    [`super::resample`]; one cached filter bank per source rate, built on first use). Output samples
//!    at or past `N_out` are 0.0 (zero padding, not filter ringing).
//! 4. **Log-mel** ([`super::fbank`], Kaldi-style): `n_fbank = 1 + (clip - win) / hop` frames (498 for
//!    the defaults).
//! 5. **Frames + normalisation**: the first `min(n_fbank, n_frames)` frames become `(x - mean) / std`;
//!    rows `n_fbank..n_frames` (if `n_frames > n_fbank`) are 0.0, which is the normalised mean.
//! 6. **Masks** (`Random` only; `Center` never masks): `time_mask.count` time masks, each with width
//!    `w` uniform in `[0, max_width]` and start uniform in `[0, n_frames - w]`, drawn in that order from
//!    `Stream::new(&[seed, Purpose::TimeMask, epoch, index, v])`, set whole frames (rows) to 0.0; then
//!    `freq_mask.count` frequency masks likewise over `n_mels` from the `FreqMask` stream set mel bins
//!    (columns) to 0.0. Masks may overlap; the time axis includes pad rows.
//!
//! The output (features and offsets) is a pure function of `(data, config, mode, key, n_views, shift)`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::decode::AudioReader;
use super::fbank::{Fbank, FbankConfig};
use super::resample::Resampler;
use super::AudioError;
use crate::options::LoaderOptions;
use crate::rng::{Purpose, Stream};

/// SpecAugment-style masks on one axis; `count = 0` disables them.
#[derive(Clone, Debug, PartialEq)]
pub struct MaskConfig {
    pub count: usize,
    pub max_width: usize,
}

impl MaskConfig {
    pub const OFF: MaskConfig = MaskConfig { count: 0, max_width: 0 };
}

/// Clip extraction settings; see the module docs for what each step does.
#[derive(Clone, Debug, PartialEq)]
pub struct ClipConfig {
    /// Output sample rate; must equal `fbank.sample_rate`. Default 32000.
    pub target_rate: u32,
    /// Crop length in samples at `target_rate`. Default 160_000 (5 s).
    pub clip_samples: usize,
    pub fbank: FbankConfig,
    /// Rows per feature map (fbank frames are cropped or zero-padded to this). Default 512.
    pub n_frames: usize,
    /// Normalisation `(x - mean) / std`; defaults are AudioMAE's Kaldi-fbank statistics.
    pub mean: f32,
    pub std: f32,
    pub time_mask: MaskConfig,
    pub freq_mask: MaskConfig,
}

impl ClipConfig {
    /// The feature options as one clip's settings (the crop length from seconds at `target_rate`).
    pub fn from_options(o: &LoaderOptions) -> Self {
        ClipConfig {
            target_rate: o.target_rate,
            clip_samples: (o.clip_seconds * o.target_rate as f64).round() as usize,
            fbank: FbankConfig::from_options(o),
            n_frames: o.n_frames,
            mean: o.mean as f32,
            std: o.std as f32,
            time_mask: MaskConfig { count: o.time_mask_count, max_width: o.time_mask_width },
            freq_mask: MaskConfig { count: o.freq_mask_count, max_width: o.freq_mask_width },
        }
    }
}

impl Default for ClipConfig {
    /// What the default [`LoaderOptions`] build (the defaults are written there only).
    fn default() -> Self {
        Self::from_options(&LoaderOptions::default())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CropMode {
    /// Random offset per view and random masks (training).
    Random,
    /// Training around a row's events (`[start, end)` output samples, [`ClipExtractor::events`]): each
    /// view draws one event, then a point inside it, and the clip is centred there (clamped to the
    /// recording); random masks as `Random`.
    Events(Arc<[(u64, u64)]>),
    /// Centred crop, no masks (evaluation); identical for every view and key.
    Center,
    /// Output samples `[start, end)` of the recording (evaluation of a row with its own window), cut to
    /// a clip and zero-padded after `end`; no masks.
    Window { start: u64, end: u64 },
}

/// Identifies one draw of one sample: all its randomness derives from these words and the view index.
#[derive(Clone, Copy, Debug)]
pub struct SampleKey {
    pub seed: u64,
    pub epoch: u64,
    pub index: u64,
}

/// The most samples (and feature values) one view may hold: 2^28 (1 GiB of f32; 140 min at 32 kHz). A
/// clip of 1e9 s asked for 128 TB and aborted the process.
const MAX_VIEW_VALUES: usize = 1 << 28;

/// Source sample rates accepted (guards filter sizes against corrupt headers).
const MIN_RATE: u32 = 1_000;
const MAX_RATE: u32 = 768_000;

/// `rate` is one the resampler takes (its filters are sized by the rates: 4294967295 Hz asked for 171 GB).
pub fn check_rate(rate: u32) -> Result<(), AudioError> {
    if (MIN_RATE..=MAX_RATE).contains(&rate) {
        return Ok(());
    }
    Err(AudioError(format!("unsupported sample rate {rate} Hz (accepted {MIN_RATE}..={MAX_RATE})")))
}

/// A recording as `birdjepa prepare --check` sees it, through the loader's own decoder: the container
/// opens, its rate is one [`ClipExtractor::extract`] takes, and its first `frames` frames (every frame,
/// with `full`: as many as the container reports, which the loader's crops trust) decode to finite
/// samples; without `full`, a seekable stream's last reported frame decodes too (a file cut short under
/// an intact header passed, and the loader skipped every crop past the cut). The error is the reason
/// the loader would skip it. (libsndfile passed IMA-ADPCM, GSM, W64 and RF64 files the loader cannot
/// read, and NaN samples, which became silence.)
pub fn check_recording(
    data: impl AsRef<[u8]> + Send + Sync + 'static,
    full: bool,
    frames: usize,
) -> Result<(), AudioError> {
    let mut reader = AudioReader::open(data)?;
    let (rate, _, n_frames) = reader.info();
    check_rate(rate)?;
    if full {
        // A packet at a time: the whole recording held was 4.6 GB for four one-hour FLACs checked at once.
        let mut not_finite = None;
        let got = reader.for_each_mono(|chunk, at| {
            if not_finite.is_none() {
                not_finite = finite(chunk, at).err();
            }
        })?;
        if let Some(n) = n_frames.filter(|&n| got < n) {
            // Fewer frames than the header's: cut short, or frames inside it the decoder passed over (a
            // MiB overwritten mid-file was "the stream ends at frame X", where it went on past the gap).
            let why = "cut short, or damaged data inside it";
            return Err(AudioError(format!("the stream ends at frame {got} but the container reports {n} ({why})")));
        }
        return not_finite.map_or(Ok(()), Err);
    }
    let n = n_frames.map_or(frames as u64, |n| n.min(frames as u64)) as usize;
    if n == 0 {
        return Err(AudioError("no audio frames".into()));
    }
    let mut first = vec![0.0; n];
    reader.read_window_mono(0, &mut first)?;
    if let Some(last) = n_frames.filter(|&last| last > n as u64 && reader.can_seek()) {
        reader.read_window_mono(last - 1, &mut [0.0])?; // one seek
    }
    finite(&first, 0)
}

/// The largest sample magnitude the filter bank takes: a frame's mel energy stays below ~1.3e9 x^2, and
/// past ~5e14 it overflows float32 (a float WAV of 1e30 read as 88.72 everywhere, one of 3e38 as silence).
/// Audio in any scale a file uses (+-1, +-32768) is far below it.
const MAX_SAMPLE: f32 = 1e12;

/// An error naming the first sample of `src` (frames from `first_frame` on) that is NaN, infinite, or
/// beyond [`MAX_SAMPLE`]: the filter bank's log floor turned such a recording into silence.
pub fn finite(src: &[f32], first_frame: u64) -> Result<(), AudioError> {
    match src.iter().position(|x| x.is_nan() || x.abs() > MAX_SAMPLE) {
        Some(k) if !src[k].is_finite() => {
            Err(AudioError(format!("a sample that is not finite (NaN or inf) at frame {}", first_frame + k as u64)))
        }
        Some(k) => Err(AudioError(format!(
            "a sample of magnitude {:e} at frame {} (past {MAX_SAMPLE:e}, where its spectrum overflows float32)",
            src[k].abs(),
            first_frame + k as u64
        ))),
        None => Ok(()),
    }
}

/// Decodes, resamples and featurises clips; immutable apart from the resampler cache, share via `Arc`.
pub struct ClipExtractor {
    cfg: ClipConfig,
    /// How recordings are decoded (`AudioReader::open_as`); kept apart from `cfg`, whose printed form
    /// is the stream signature's "clip", which states saved before the option hold.
    gapless: bool,
    fbank: Fbank,
    /// Fbank frames of one clip (`n_frames_for(clip_samples)`).
    n_fbank: usize,
    resamplers: RwLock<HashMap<u32, Arc<Resampler>>>,
}

impl std::fmt::Debug for ClipExtractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClipExtractor").field("cfg", &self.cfg).field("gapless", &self.gapless).finish_non_exhaustive()
    }
}

/// One view's crop: output samples `[offset, offset + len)` (the rest of the clip is zero) read from
/// source samples `[src_lo, src_hi)`.
#[derive(Clone, Copy, Debug)]
struct ViewPlan {
    view: usize,
    offset: u64,
    len: usize,
    src_lo: u64,
    src_hi: u64,
}

impl ClipExtractor {
    pub fn new(cfg: ClipConfig) -> Result<Self, String> {
        if cfg.target_rate == 0 {
            return Err("clip: target_rate must be > 0".into());
        }
        if cfg.fbank.sample_rate != cfg.target_rate {
            return Err(format!(
                "clip: fbank.sample_rate ({}) must equal target_rate ({})",
                cfg.fbank.sample_rate, cfg.target_rate
            ));
        }
        let fbank = Fbank::new(cfg.fbank.clone())?;
        // Each message starts with the option to change (the CLI names it by that word).
        if cfg.clip_samples < cfg.fbank.win_length {
            return Err(format!(
                "clip: clip_seconds gives {} samples, fewer than win_length ({}): not one frame",
                cfg.clip_samples, cfg.fbank.win_length
            ));
        }
        if cfg.clip_samples > MAX_VIEW_VALUES {
            return Err(format!(
                "clip: clip_seconds gives {} samples, more than {MAX_VIEW_VALUES} a view may hold",
                cfg.clip_samples
            ));
        }
        if cfg.n_frames == 0 {
            return Err("clip: n_frames must be > 0".into());
        }
        if cfg.n_frames.saturating_mul(cfg.fbank.n_mels) > MAX_VIEW_VALUES {
            return Err(format!(
                "clip: n_frames ({}) x n_mels ({}) is more than the {MAX_VIEW_VALUES} values a view may hold",
                cfg.n_frames, cfg.fbank.n_mels
            ));
        }
        if !cfg.mean.is_finite() {
            return Err(format!("clip: mean must be finite (got {})", cfg.mean));
        }
        if !(cfg.std.is_finite() && cfg.std > 0.0) {
            return Err(format!("clip: std must be finite and > 0 (got {})", cfg.std));
        }
        // A mask's width is drawn from [0, max_width]: at 0 every mask is empty, the option set for nothing.
        for (name, mask) in [("time", &cfg.time_mask), ("freq", &cfg.freq_mask)] {
            if mask.count > 0 && mask.max_width == 0 {
                return Err(format!(
                    "clip: {name}_mask_width must be >= 1 where {name}_mask_count is {} (a width of 0 masks nothing)",
                    mask.count
                ));
            }
        }
        // More masks than frames (bins) only masks them again: 2^40 masks took each sample for ever.
        if cfg.time_mask.count > cfg.n_frames {
            let (count, frames) = (cfg.time_mask.count, cfg.n_frames);
            return Err(format!("clip: time_mask_count ({count}) exceeds n_frames ({frames})"));
        }
        if cfg.freq_mask.count > cfg.fbank.n_mels {
            let (count, mels) = (cfg.freq_mask.count, cfg.fbank.n_mels);
            return Err(format!("clip: freq_mask_count ({count}) exceeds n_mels ({mels})"));
        }
        if cfg.time_mask.count > 0 && cfg.time_mask.max_width > cfg.n_frames {
            return Err(format!(
                "clip: time_mask_width ({}) exceeds n_frames ({})",
                cfg.time_mask.max_width, cfg.n_frames
            ));
        }
        if cfg.freq_mask.count > 0 && cfg.freq_mask.max_width > cfg.fbank.n_mels {
            return Err(format!(
                "clip: freq_mask_width ({}) exceeds n_mels ({})",
                cfg.freq_mask.max_width, cfg.fbank.n_mels
            ));
        }
        let n_fbank = fbank.n_frames_for(cfg.clip_samples);
        let gapless = LoaderOptions::default().gapless;
        Ok(ClipExtractor { cfg, gapless, fbank, n_fbank, resamplers: RwLock::new(HashMap::new()) })
    }

    /// This extractor decoding recordings gapless or not (`LoaderOptions::gapless`; the default's when
    /// not set).
    pub fn with_gapless(self, gapless: bool) -> Self {
        ClipExtractor { gapless, ..self }
    }

    pub fn config(&self) -> &ClipConfig {
        &self.cfg
    }

    /// Mel bands that are the floor in every clip ([`Fbank::empty_filters`]).
    pub fn empty_mel_bands(&self) -> usize {
        self.fbank.empty_filters()
    }

    /// The log-mel frames of one clip, before the first `n_frames` are kept.
    pub fn clip_frames(&self) -> usize {
        self.n_fbank
    }

    /// Floats per view: `n_frames * n_mels`.
    pub fn frame_len(&self) -> usize {
        self.cfg.n_frames * self.cfg.fbank.n_mels
    }

    /// The cached resampler `rate -> target_rate` (built once per source rate).
    pub fn resampler(&self, rate: u32) -> Arc<Resampler> {
        if let Some(r) = self.resamplers.read().unwrap_or_else(|e| e.into_inner()).get(&rate) {
            return r.clone();
        }
        let built = Arc::new(Resampler::new(rate, self.cfg.target_rate));
        self.resamplers.write().unwrap_or_else(|e| e.into_inner()).entry(rate).or_insert(built).clone()
    }

    /// The crop of window `[start_s, end_s)` (seconds): output samples from `round(start_s * rate)` to
    /// `round(end_s * rate)`. A negative start, a non-finite bound or an empty window is an error.
    pub fn window(&self, start_s: f64, end_s: f64) -> Result<CropMode, AudioError> {
        if !(start_s.is_finite() && end_s.is_finite()) {
            return Err(AudioError(format!("window: start_time {start_s} s, end_time {end_s} s is not finite")));
        }
        if start_s < 0.0 {
            return Err(AudioError(format!("window: start_time {start_s} s is negative")));
        }
        let rate = self.cfg.target_rate as f64;
        if start_s * rate >= u64::MAX as f64 {  // the cast saturates: said "end_time is not after start_time"
            return Err(AudioError(format!("window: start_time {start_s} s is past the end of any recording")));
        }
        let (start, end) = ((start_s * rate).round() as u64, (end_s * rate).round() as u64);
        if end <= start {
            return Err(AudioError(format!("window: end_time {end_s} s is not after start_time {start_s} s")));
        }
        Ok(CropMode::Window { start, end })
    }

    /// Crop offset (in output samples) of view `view` for a recording of `n_out` output samples.
    pub fn crop_offset(&self, n_out: u64, mode: &CropMode, key: SampleKey, view: usize) -> u64 {
        let clip = self.cfg.clip_samples as u64;
        let draws = || Stream::new(&[key.seed, Purpose::Crop as u64, key.epoch, key.index, view as u64]);
        match mode {
            CropMode::Window { start, .. } => *start,
            _ if n_out <= clip => 0,
            CropMode::Center => (n_out - clip) / 2,
            CropMode::Random => draws().range_inclusive(0, n_out - clip),
            CropMode::Events(events) => {
                let mut s = draws();
                let (start, end) = events[s.below(events.len() as u64) as usize];
                let point = s.range_inclusive(start, end.max(start + 1) - 1);
                point.saturating_sub(clip / 2).min(n_out - clip)
            }
        }
    }

    /// The crop around `events` (`[start, end]` pairs in seconds): each must be finite, start >= 0 and
    /// end after start; an empty list is an error (the caller falls back to `Random` without events).
    pub fn events(&self, events: &[(f64, f64)]) -> Result<CropMode, AudioError> {
        let rate = self.cfg.target_rate as f64;
        let mut out = Vec::with_capacity(events.len());
        for (i, &(start_s, end_s)) in events.iter().enumerate() {
            if !(start_s.is_finite() && end_s.is_finite() && start_s >= 0.0 && end_s > start_s) {
                return Err(AudioError(format!("event {i}: [{start_s}, {end_s}] s is not a window (0 <= start < end)")));
            }
            out.push(((start_s * rate).round() as u64, (end_s * rate).round() as u64));
        }
        if out.is_empty() {
            return Err(AudioError("no events".into()));
        }
        Ok(CropMode::Events(out.into()))
    }

    /// Where a crop's audio ends (output samples): the window's end inside the recording, else its end.
    fn audio_end(&self, n_out: u64, mode: &CropMode) -> Result<u64, AudioError> {
        match *mode {
            CropMode::Window { start, .. } if start >= n_out => {
                let rate = self.cfg.target_rate as f64;
                Err(AudioError(format!(
                    "window: start_time {} s is at or past the recording's end ({} s)",
                    start as f64 / rate,
                    n_out as f64 / rate
                )))
            }
            CropMode::Window { end, .. } => Ok(end.min(n_out)),
            // An event past the end was clamped to the recording's last clip without a word: events in
            // milliseconds made every event crop an end-of-file crop. A skipped record, as a window's.
            CropMode::Events(ref events) => match events.iter().position(|&(start, _)| start >= n_out) {
                Some(i) => {
                    let rate = self.cfg.target_rate as f64;
                    Err(AudioError(format!(
                        "event {i}: starts at {} s, at or past the recording's end ({} s)",
                        events[i].0 as f64 / rate,
                        n_out as f64 / rate
                    )))
                }
                None => Ok(n_out),
            },
            _ => Ok(n_out),
        }
    }

    /// `offset` moved one hop (`fbank.hop_length` output samples) for a recording of `n_out` output
    /// samples: forward, clamped to the last valid offset; backward (clamped to 0) where forward would
    /// leave it in place. Unchanged only when the recording is no longer than a clip.
    pub fn shift_offset(&self, n_out: u64, offset: u64) -> u64 {
        let last = n_out.saturating_sub(self.cfg.clip_samples as u64);
        let hop = self.cfg.fbank.hop_length as u64;
        let forward = offset.saturating_add(hop).min(last);
        if forward != offset {
            forward
        } else {
            offset.saturating_sub(hop).min(last)
        }
    }

    /// Decode one encoded recording and write `n_views` feature maps `[n_frames, n_mels]` into `out`
    /// (`n_views * frame_len()` floats); returns each view's crop offset in output samples. `shift`
    /// moves every view's crop by one hop ([`Self::shift_offset`]): a debug hook that plants a
    /// difference on purpose. On error `out` is unspecified.
    pub fn extract<B: AsRef<[u8]> + Send + Sync + 'static>(
        &self,
        data: B,
        mode: CropMode,
        key: SampleKey,
        n_views: usize,
        shift: bool,
        out: &mut [f32],
    ) -> Result<Vec<u64>, AudioError> {
        let fl = self.frame_len();
        if out.len() != n_views * fl {
            return Err(AudioError(format!("extract: out has {} floats, expected {n_views} views x {fl}", out.len())));
        }
        let mut reader = AudioReader::open_as(data, self.gapless)?;
        let (rate, _, n_frames) = reader.info();
        check_rate(rate).map_err(|e| AudioError(format!("extract: {}", e.0)))?;
        if n_views == 0 {
            return Ok(Vec::new());
        }
        let rs = self.resampler(rate);

        // Whole decode when the reader cannot seek; otherwise trust the container's length.
        let (full, n_src) = if reader.can_seek() {
            (None, n_frames.unwrap_or(0))
        } else {
            let v = reader.read_all_mono()?;
            let n = v.len() as u64;
            (Some(v), n)
        };
        let n_out = rs.output_len(n_src);
        let audio_end = self.audio_end(n_out, &mode)?;
        let clip = self.cfg.clip_samples;

        let mut plans: Vec<ViewPlan> = (0..n_views)
            .map(|view| {
                let offset = self.crop_offset(n_out, &mode, key, view);
                let offset = if shift { self.shift_offset(n_out, offset) } else { offset };
                let len = (audio_end.saturating_sub(offset)).min(clip as u64) as usize;
                let (lo, hi) = rs.support(offset, len);
                ViewPlan { view, offset, len, src_lo: lo.min(n_src), src_hi: hi.min(n_src) }
            })
            .collect();

        SCRATCH.with(|cell| {
            let mut guard = cell.borrow_mut();
            let scratch = &mut *guard;
            scratch.samples.resize(clip, 0.0);
            scratch.feats.resize(self.n_fbank * self.cfg.fbank.n_mels, 0.0);
            let result = self.render_all(&mut reader, full.as_deref(), &rs, rate, &mut plans, &mode, key, scratch, out);
            scratch.shrink();
            result
        })?;
        // `render_all` reorders the plans by source position; the offsets go back in view order.
        plans.sort_by_key(|p| p.view);
        Ok(plans.iter().map(|p| p.offset).collect())
    }

    #[allow(clippy::too_many_arguments)]
    fn render_all(
        &self,
        reader: &mut AudioReader,
        full: Option<&[f32]>,
        rs: &Resampler,
        rate: u32,
        plans: &mut [ViewPlan],
        mode: &CropMode,
        key: SampleKey,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) -> Result<(), AudioError> {
        let Scratch { samples, feats, src: src_buf } = scratch;
        if let Some(full) = full {
            for p in plans.iter() {
                let src = &full[p.src_lo as usize..p.src_hi as usize];
                finite(src, p.src_lo)?;
                self.render_view(rs, src, p, mode, key, samples, feats, out);
            }
            return Ok(());
        }

        // Seek path: decode groups of nearby windows once each, in source order.
        plans.sort_by_key(|p| (p.src_lo, p.view));
        let gap = rate as u64 / 2;
        let mut i = 0;
        while i < plans.len() {
            let (lo, mut hi) = (plans[i].src_lo, plans[i].src_hi);
            let mut j = i + 1;
            while j < plans.len() && plans[j].src_lo <= hi + gap {
                hi = hi.max(plans[j].src_hi);
                j += 1;
            }
            src_buf.clear();
            src_buf.resize((hi - lo) as usize, 0.0);
            if hi > lo {
                reader.read_window_mono(lo, src_buf)?;
            }
            for p in &plans[i..j] {
                let src = &src_buf[(p.src_lo - lo) as usize..(p.src_hi - lo) as usize];
                finite(src, p.src_lo)?;
                self.render_view(rs, src, p, mode, key, samples, feats, out);
            }
            i = j;
        }
        Ok(())
    }

    /// Resample, featurise, normalise and mask one view into its slot of `out`.
    #[allow(clippy::too_many_arguments)]
    fn render_view(
        &self,
        rs: &Resampler,
        src: &[f32],
        p: &ViewPlan,
        mode: &CropMode,
        key: SampleKey,
        samples: &mut [f32],
        feats: &mut [f32],
        out: &mut [f32],
    ) {
        let n_mels = self.cfg.fbank.n_mels;
        rs.process_window(src, p.src_lo, p.offset, &mut samples[..p.len]);
        samples[p.len..].fill(0.0);
        self.fbank.compute(samples, feats);

        let fl = self.frame_len();
        let view = &mut out[p.view * fl..(p.view + 1) * fl];
        let keep = self.n_fbank.min(self.cfg.n_frames) * n_mels;
        let (mean, std) = (self.cfg.mean, self.cfg.std);
        for (o, &x) in view[..keep].iter_mut().zip(&feats[..keep]) {
            *o = (x - mean) / std;
        }
        view[keep..].fill(0.0);

        if matches!(mode, CropMode::Random | CropMode::Events(_)) {
            let v = p.view as u64;
            let tm = &self.cfg.time_mask;
            if tm.count > 0 {
                let mut s = Stream::new(&[key.seed, Purpose::TimeMask as u64, key.epoch, key.index, v]);
                for _ in 0..tm.count {
                    let (start, w) = draw_mask(&mut s, tm.max_width, self.cfg.n_frames);
                    view[start * n_mels..(start + w) * n_mels].fill(0.0);
                }
            }
            let fm = &self.cfg.freq_mask;
            if fm.count > 0 {
                let mut s = Stream::new(&[key.seed, Purpose::FreqMask as u64, key.epoch, key.index, v]);
                for _ in 0..fm.count {
                    let (start, w) = draw_mask(&mut s, fm.max_width, n_mels);
                    for row in view.chunks_exact_mut(n_mels) {
                        row[start..start + w].fill(0.0);
                    }
                }
            }
        }
    }
}

/// Per-thread buffers reused across samples (contents never carry over: each is overwritten).
#[derive(Default)]
struct Scratch {
    samples: Vec<f32>,
    feats: Vec<f32>,
    src: Vec<f32>,
}

impl Scratch {
    /// Keep at most ~32 MB of source buffer alive per thread after a very long multi-view window.
    fn shrink(&mut self) {
        const KEEP: usize = 8 << 20;
        if self.src.capacity() > KEEP {
            self.src = Vec::new();
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
}

/// Width uniform in `[0, max_width]`, then start uniform in `[0, size - width]`.
fn draw_mask(s: &mut Stream, max_width: usize, size: usize) -> (usize, usize) {
    let w = s.range_inclusive(0, max_width.min(size) as u64) as usize;
    let start = s.range_inclusive(0, (size - w) as u64) as usize;
    (start, w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::decode::decode_mono;
    use crate::audio::decode::tests::{fixture, wav_i16};
    use crate::audio::resample::resample;

    fn key(index: u64) -> SampleKey {
        SampleKey { seed: 17, epoch: 3, index }
    }

    #[test]
    fn check_recording_finds_a_file_cut_short_under_its_header_and_passes_every_fixture() {
        let flac = fixture("birds_44k_stereo.flac");
        let n = AudioReader::open(flac.clone()).unwrap().info().2.unwrap();
        let cut = flac[..flac.len() / 2].to_vec(); // STREAMINFO still claims n frames
        for full in [false, true] {
            let e = check_recording(cut.clone(), full, 1_000).unwrap_err();
            assert!(e.0.contains(&format!("but the container reports {n}")), "{e}");
            assert!(!full || e.0.ends_with("(cut short, or damaged data inside it)"), "{e}"); // not only cut
        }
        // A WAV cut short is read as ffmpeg reads it (the decoder's revision 4): its whole frames, the
        // length its crops are drawn in.
        let wav = sweep_wav(3.0, 16_000);
        let cut = wav[..44 + 2 * 30_000].to_vec(); // the header still claims 48_000 frames
        for full in [false, true] {
            check_recording(wav.clone(), full, 1_000).unwrap();
            check_recording(cut.clone(), full, 1_000).unwrap();
        }
        assert_eq!(AudioReader::open(cut).unwrap().info().2, Some(30_000));
        // Written to a pipe (ffmpeg): the RIFF and data sizes 0xFFFFFFFF, a length not known. It was
        // refused ("the container reports 2147483647"); it decodes to the same samples as the file.
        let mut streamed = wav.clone();
        streamed[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        streamed[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        for full in [false, true] {
            check_recording(streamed.clone(), full, 1_000).unwrap();
        }
        assert_eq!(decode_mono(streamed).unwrap(), decode_mono(wav.clone()).unwrap());
        for name in ["birds_22k_mono_short.flac", "birds_32k_mono.mp3", "birds_32k_mono_cbr.mp3",
                     "birds_44k_stereo.flac", "birds_44k_stereo_30s.ogg", "birds_48k_stereo.ogg"] {
            for full in [false, true] {
                check_recording(fixture(name), full, 1_000).unwrap_or_else(|e| panic!("{name} {full}: {e}"));
            }
        }
    }

    #[test]
    fn the_full_check_decodes_a_packet_at_a_time_and_names_a_nan_past_the_first_packet() {
        let mut x: Vec<f32> = (0..48_000).map(|i| (i as f32 * 0.01).sin() * 0.5).collect();
        x[40_000] = f32::NAN;
        let (rate, data_len) = (16_000u32, (x.len() * 4) as u32);
        let mut wav = b"RIFF".to_vec();
        wav.extend_from_slice(&(36 + data_len).to_le_bytes());
        wav.extend_from_slice(b"WAVEfmt ");
        for field in [16u32.to_le_bytes().to_vec(), 3u16.to_le_bytes().to_vec(), 1u16.to_le_bytes().to_vec(),
                      rate.to_le_bytes().to_vec(), (rate * 4).to_le_bytes().to_vec(), 4u16.to_le_bytes().to_vec(),
                      32u16.to_le_bytes().to_vec(), b"data".to_vec(), data_len.to_le_bytes().to_vec()] {
            wav.extend_from_slice(&field);
        }
        wav.extend(x.iter().flat_map(|s| s.to_le_bytes()));
        let e = check_recording(wav.clone(), true, 1_000).unwrap_err();
        assert!(e.0.ends_with("a sample that is not finite (NaN or inf) at frame 40000"), "{e}");
        // Finite, and past what float32 spectra hold: read as silence, or as 88.72 everywhere.
        let huge: Vec<u8> = wav[..44].iter().copied().chain(x.iter().enumerate().flat_map(|(i, s)| {
            (if i == 40_000 { 3e38f32 } else { *s }).to_le_bytes()
        })).collect();
        let e = check_recording(huge, true, 1_000).unwrap_err();
        assert!(e.0.ends_with("a sample of magnitude 3e38 at frame 40000 (past 1e12, where its spectrum overflows float32)"), "{e}");
        check_recording(wav, false, 1_000).unwrap(); // the header check reads the first clip only
        // A packet at a time, the same samples as the whole recording decoded at once.
        for name in ["birds_22k_mono_short.flac", "birds_32k_mono.mp3", "birds_44k_stereo_30s.ogg"] {
            let mut reader = AudioReader::open(fixture(name)).unwrap();
            let mut joined = Vec::new();
            let n = reader
                .for_each_mono(|chunk, at| {
                    assert_eq!(at as usize, joined.len());
                    joined.extend_from_slice(chunk);
                })
                .unwrap();
            assert_eq!((n as usize, &joined), (joined.len(), &reader.read_all_mono().unwrap()), "{name}");
        }
    }

    /// Mono 16-bit WAV with a slow frequency sweep plus a little noise (every offset looks different).
    fn sweep_wav(seconds: f64, rate: u32) -> Vec<u8> {
        let n = (seconds * rate as f64) as usize;
        let mut s = Stream::new(&[rate as u64]);
        let mut phase = 0.0f64;
        let pcm: Vec<i16> = (0..n)
            .map(|i| {
                let f = 500.0 + 6000.0 * i as f64 / n as f64;
                phase += 2.0 * std::f64::consts::PI * f / rate as f64;
                let x = 0.5 * phase.sin() + 0.01 * (s.unit_f64() - 0.5);
                (x * 32767.0) as i16
            })
            .collect();
        wav_i16(&pcm, 1, rate)
    }

    /// The pipeline spelled out on the full decode: resample everything, slice, fbank, normalise.
    fn reference(ex: &ClipExtractor, full: &[f32], rate: u32, offset: u64) -> Vec<f32> {
        reference_to(ex, full, rate, offset, u64::MAX)
    }

    /// [`reference`] with the output samples from `end` on zeroed (a window's end).
    fn reference_to(ex: &ClipExtractor, full: &[f32], rate: u32, offset: u64, end: u64) -> Vec<f32> {
        let cfg = ex.config();
        let y = resample(full, rate, cfg.target_rate);
        let mut clip = vec![0f32; cfg.clip_samples];
        let o = offset as usize;
        let take = y.len().min(end as usize).saturating_sub(o).min(cfg.clip_samples);
        clip[..take].copy_from_slice(&y[o..o + take]);
        let fb = Fbank::new(cfg.fbank.clone()).unwrap();
        let f = fb.compute_vec(&clip);
        let mut out = vec![0f32; ex.frame_len()];
        let keep = fb.n_frames_for(clip.len()).min(cfg.n_frames) * cfg.fbank.n_mels;
        for (o, x) in out[..keep].iter_mut().zip(&f) {
            *o = (x - cfg.mean) / cfg.std;
        }
        out
    }

    fn run(ex: &ClipExtractor, data: Vec<u8>, mode: CropMode, k: SampleKey, n_views: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; n_views * ex.frame_len()];
        ex.extract(data, mode, k, n_views, false, &mut out).unwrap();
        out
    }

    fn assert_bits_eq(a: &[f32], b: &[f32], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        let bad = a.iter().zip(b).position(|(x, y)| x.to_bits() != y.to_bits());
        assert!(
            bad.is_none(),
            "{what}: first difference at {}: {} vs {}",
            bad.unwrap(),
            a[bad.unwrap()],
            b[bad.unwrap()]
        );
    }

    #[test]
    fn extractor_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<ClipExtractor>();
        check::<Fbank>();
        check::<Resampler>();
    }

    #[test]
    fn defaults_and_validation() {
        let ex = ClipExtractor::new(ClipConfig::default()).unwrap();
        assert_eq!(ex.frame_len(), 512 * 128);
        assert_eq!(ex.n_fbank, 498);
        let bad = [
            ClipConfig { target_rate: 16_000, ..Default::default() },
            ClipConfig { clip_samples: 10, ..Default::default() },
            ClipConfig { n_frames: 0, ..Default::default() },
            ClipConfig { std: 0.0, ..Default::default() },
            ClipConfig { time_mask: MaskConfig { count: 1, max_width: 600 }, ..Default::default() },
            ClipConfig { freq_mask: MaskConfig { count: 2, max_width: 129 }, ..Default::default() },
        ];
        for cfg in bad {
            let e = ClipExtractor::new(cfg.clone()).unwrap_err();
            assert!(e.starts_with("clip:") || e.starts_with("fbank:"), "{e}");
        }
    }

    #[test]
    fn random_and_center_crops_match_the_spelled_out_pipeline() {
        let ex = ClipExtractor::new(ClipConfig::default()).unwrap();
        for &rate in &[32_000u32, 44_100, 48_000, 22_050] {
            let wav = sweep_wav(8.3, rate);
            let (full, r) = decode_mono(wav.clone()).unwrap();
            assert_eq!(r, rate);
            let n_out = ex.resampler(rate).output_len(full.len() as u64);
            for v in 0..3u64 {
                let k = key(v * 11 + rate as u64);
                let got = run(&ex, wav.clone(), CropMode::Random, k, 1);
                let off = Stream::new(&[17, Purpose::Crop as u64, 3, k.index, 0]).range_inclusive(0, n_out - 160_000);
                assert_bits_eq(&got, &reference(&ex, &full, rate, off), &format!("random {rate} {v}"));
            }
            let got = run(&ex, wav.clone(), CropMode::Center, key(0), 1);
            assert_bits_eq(&got, &reference(&ex, &full, rate, (n_out - 160_000) / 2), &format!("center {rate}"));
            // Pad rows 498..512 are exactly zero.
            assert!(got[498 * 128..].iter().all(|&x| x == 0.0));
            assert!(got[..498 * 128].iter().all(|&x| x != 0.0 && x.is_finite()));
        }
    }

    #[test]
    fn event_crops_centre_each_view_on_a_point_inside_one_of_the_events() {
        let ex = ClipExtractor::new(ClipConfig::default()).unwrap();
        let (clip, rate) = (160_000u64, 32_000.0);
        let n_out = (60.0 * rate) as u64; // a minute
        let events = [(3.0, 4.5), (40.0, 41.0)];
        let mode = ex.events(&events).unwrap();
        let mut seen = [false; 2];
        for i in 0..200 {
            for v in 0..2 {
                let off = ex.crop_offset(n_out, &mode, key(i), v);
                assert_eq!(off, ex.crop_offset(n_out, &mode, key(i), v), "a pure function of key and view");
                let centre = (off + clip / 2) as f64 / rate;
                // The centre is inside an event, or the clip was clamped to the recording's start.
                let inside = events.iter().position(|&(s, e)| (s..e).contains(&centre));
                assert!(inside.is_some() || off == 0, "view {v} of {i}: centre {centre} s");
                seen[inside.unwrap_or(0)] = true;
            }
        }
        assert_eq!(seen, [true, true], "both events are drawn");
        // Bad events are errors naming the event; a recording shorter than a clip starts at 0.
        assert!(ex.events(&[(1.0, 1.0)]).unwrap_err().0.contains("event 0: [1, 1] s is not a window"));
        assert!(ex.events(&[]).is_err());
        assert_eq!(ex.crop_offset(clip - 1, &mode, key(0), 0), 0);
        // An event past the recording's end (milliseconds read as seconds) is an error, not a clamp.
        let past = ex.events(&[(3.0, 4.5), (70.0, 71.0)]).unwrap();
        let e = ex.audio_end(n_out, &past).unwrap_err().0;
        assert_eq!(e, "event 1: starts at 70 s, at or past the recording's end (60 s)");
        assert_eq!(ex.audio_end(n_out, &mode).unwrap(), n_out);
    }

    #[test]
    fn seekable_codecs_match_the_full_decode_pipeline() {
        let ex = ClipExtractor::new(ClipConfig::default()).unwrap();
        for (name, rate) in [("birds_48k_stereo.ogg", 48_000u32), ("birds_44k_stereo_30s.ogg", 44_100)] {
            let bytes = fixture(name);
            let (full, _) = decode_mono(bytes.clone()).unwrap();
            let n_src = crate::audio::decode::AudioReader::open(bytes.clone()).unwrap().info().2.unwrap();
            let n_out = ex.resampler(rate).output_len(n_src);
            let views = 3;
            let got = run(&ex, bytes.clone(), CropMode::Random, key(5), views);
            for v in 0..views {
                let off = ex.crop_offset(n_out, &CropMode::Random, key(5), v);
                let want = reference(&ex, &full[..(n_src as usize).min(full.len())], rate, off);
                assert_bits_eq(&got[v * ex.frame_len()..(v + 1) * ex.frame_len()], &want, &format!("{name} view {v}"));
            }
            let got = run(&ex, bytes, CropMode::Center, key(5), 1);
            let want = reference(&ex, &full[..(n_src as usize).min(full.len())], rate, (n_out - 160_000) / 2);
            assert_bits_eq(&got, &want, &format!("{name} center"));
        }
    }

    #[test]
    fn short_recordings_start_at_zero_and_are_zero_padded() {
        let ex = ClipExtractor::new(ClipConfig::default()).unwrap();
        let bytes = fixture("birds_22k_mono_short.flac");
        let (full, rate) = decode_mono(bytes.clone()).unwrap();
        assert_eq!(rate, 22_050);
        let a = run(&ex, bytes.clone(), CropMode::Random, key(1), 2);
        let b = run(&ex, bytes.clone(), CropMode::Center, key(2), 1);
        let want = reference(&ex, &full, rate, 0);
        assert_bits_eq(&a[..ex.frame_len()], &want, "view 0");
        assert_bits_eq(&a[ex.frame_len()..], &want, "view 1");
        assert_bits_eq(&b, &want, "center");
        // 1.5 s of audio = 150 frames; later frames see only zero padding -> the log floor, normalised.
        let floor = (f32::EPSILON.ln() - ex.config().mean) / ex.config().std;
        assert!(want[160 * 128..498 * 128].iter().all(|&x| x == floor));
        // MP3 (whole decode path) also matches.
        let mp3 = fixture("birds_32k_mono.mp3");
        let (full, rate) = decode_mono(mp3.clone()).unwrap();
        let got = run(&ex, mp3, CropMode::Center, key(0), 1);
        let n_out = full.len() as u64;
        assert_bits_eq(&got, &reference(&ex, &full, rate, n_out.saturating_sub(160_000) / 2), "mp3");
    }

    #[test]
    fn shift_offset_moves_one_hop_forward_else_backward_within_the_valid_range() {
        let ex = ClipExtractor::new(ClipConfig::default()).unwrap();
        let clip = 160_000u64;
        assert_eq!(ex.config().fbank.hop_length, 320);
        for (n_out, offset, want) in [
            (clip + 1000, 0, 320),
            (clip + 1000, 500, 820),
            (clip + 1000, 900, 1000), // clamped forward
            (clip + 1000, 1000, 680), // at the end: one hop backward
            (clip + 100, 100, 0),     // backward, clamped at 0
            (clip, 0, 0),             // one valid offset: nothing moves
            (clip - 5, 0, 0),         // shorter than a clip: nothing moves
        ] {
            assert_eq!(ex.shift_offset(n_out, offset), want, "n_out {n_out} offset {offset}");
        }
    }

    #[test]
    fn extract_returns_each_views_offset_and_shift_moves_every_view_one_hop() {
        let ex = ClipExtractor::new(ClipConfig::default()).unwrap();
        let fl = ex.frame_len();
        for (name, bytes) in [("ogg", fixture("birds_44k_stereo_30s.ogg")), ("wav", sweep_wav(9.0, 32_000))] {
            let (full, rate) = decode_mono(bytes.clone()).unwrap();
            let n_src = AudioReader::open(bytes.clone()).unwrap().info().2.unwrap();
            let full = &full[..(n_src as usize).min(full.len())];
            let n_out = ex.resampler(rate).output_len(n_src);
            let last = n_out - 160_000;
            for mode in [CropMode::Random, CropMode::Center] {
                let views = 3;
                let (mut plain, mut moved) = (vec![0f32; views * fl], vec![0f32; views * fl]);
                let offsets = ex.extract(bytes.clone(), mode.clone(), key(4), views, false, &mut plain).unwrap();
                let shifted = ex.extract(bytes.clone(), mode.clone(), key(4), views, true, &mut moved).unwrap();
                let want: Vec<u64> = (0..views).map(|v| ex.crop_offset(n_out, &mode, key(4), v)).collect();
                assert_eq!(offsets, want, "{name} {mode:?}");
                let want: Vec<u64> = want.iter().map(|&o| ex.shift_offset(n_out, o)).collect();
                assert_eq!(shifted, want, "{name} {mode:?} shifted");
                for v in 0..views {
                    let what = format!("{name} {mode:?} view {v}");
                    if offsets[v] + 320 <= last {
                        assert_eq!(shifted[v], offsets[v] + 320, "{what}");
                    }
                    let (got, before) = (&moved[v * fl..(v + 1) * fl], &plain[v * fl..(v + 1) * fl]);
                    assert_bits_eq(got, &reference(&ex, full, rate, shifted[v]), &what);
                    assert_ne!(got, before, "{what}");
                }
            }
        }
        // No longer than a clip (FLAC on the seek path, MP3 decoded whole): every offset is 0, shifted
        // or not, and the features do not change.
        for name in ["birds_22k_mono_short.flac", "birds_32k_mono.mp3"] {
            let (mut a, mut b) = (vec![0f32; 2 * fl], vec![0f32; 2 * fl]);
            assert_eq!(ex.extract(fixture(name), CropMode::Random, key(1), 2, false, &mut a).unwrap(), vec![0, 0]);
            assert_eq!(ex.extract(fixture(name), CropMode::Random, key(1), 2, true, &mut b).unwrap(), vec![0, 0]);
            assert_bits_eq(&a, &b, name);
        }
    }

    #[test]
    fn windows_start_at_their_start_and_end_in_zeros() {
        let ex = ClipExtractor::new(ClipConfig::default()).unwrap();
        assert!(matches!(ex.window(1.25, 4.0), Ok(CropMode::Window { start: 40_000, end: 128_000 })));
        for (start, end, why) in [
            (-0.5, 2.0, "is negative"),
            (3.0, 3.0, "is not after start_time"),
            (3.0, 2.0, "is not after start_time"),
            (f64::NAN, 2.0, "not finite"),
            (1e20, 2e20, "start_time 100000000000000000000 s is past the end of any recording"),
        ] {
            let e = ex.window(start, end).unwrap_err();
            assert!(e.0.starts_with("window: ") && e.0.contains(why), "{start} {end}: {e}");
        }
        // WAV at 32 kHz (no resampling, seek path), OGG at 44.1 kHz (resampled), MP3 (decoded whole).
        for (name, bytes) in [
            ("wav", sweep_wav(9.0, 32_000)),
            ("ogg", fixture("birds_44k_stereo_30s.ogg")),
            ("mp3", fixture("birds_32k_mono.mp3")),
        ] {
            let (full, rate) = decode_mono(bytes.clone()).unwrap();
            let reader = AudioReader::open(bytes.clone()).unwrap();
            let n_src = if reader.can_seek() { reader.info().2.unwrap() } else { full.len() as u64 };
            let full = &full[..(n_src as usize).min(full.len())];
            let n_out = ex.resampler(rate).output_len(n_src);
            // Shorter than a clip, a whole clip, and past the recording's end.
            for (start_s, end_s) in [(0.5, 2.0), (1.0, 6.0), (n_out as f64 / 32_000.0 - 1.0, 1e6)] {
                let mode = ex.window(start_s, end_s).unwrap();
                let CropMode::Window { start, end } = mode else { unreachable!() };
                let mut out = vec![f32::NAN; 2 * ex.frame_len()];
                assert_eq!(ex.extract(bytes.clone(), mode, key(3), 2, false, &mut out).unwrap(), vec![start, start]);
                let want = reference_to(&ex, full, rate, start, end);
                assert_bits_eq(&out[..ex.frame_len()], &want, &format!("{name} [{start_s}, {end_s})"));
                assert_bits_eq(&out[ex.frame_len()..], &want, &format!("{name} [{start_s}, {end_s}) view 1"));
            }
            let past = ex.window(n_out as f64 / 32_000.0, 1e6).unwrap();
            let mut out = vec![0f32; ex.frame_len()];
            let e = ex.extract(bytes.clone(), past, key(3), 1, false, &mut out).unwrap_err();
            assert!(e.0.contains("at or past the recording's end"), "{name}: {e}");
        }
    }

    #[test]
    fn deterministic_across_threads_history_and_view_batching() {
        let ex = Arc::new(
            ClipExtractor::new(ClipConfig {
                time_mask: MaskConfig { count: 2, max_width: 60 },
                freq_mask: MaskConfig { count: 2, max_width: 20 },
                ..Default::default()
            })
            .unwrap(),
        );
        let ogg = fixture("birds_44k_stereo_30s.ogg");
        let first = run(&ex, ogg.clone(), CropMode::Random, key(9), 4);
        // Other work in between (different rate, codec, path) changes nothing.
        run(&ex, fixture("birds_48k_stereo.ogg"), CropMode::Random, key(1), 2);
        run(&ex, fixture("birds_32k_mono.mp3"), CropMode::Random, key(1), 1);
        assert_bits_eq(&first, &run(&ex, ogg.clone(), CropMode::Random, key(9), 4), "repeat");
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let (ex, ogg) = (ex.clone(), ogg.clone());
                std::thread::spawn(move || run(&ex, ogg, CropMode::Random, key(9), 4))
            })
            .collect();
        for h in handles {
            assert_bits_eq(&first, &h.join().unwrap(), "thread");
        }
        // Views are independent of how many views were asked for.
        assert_bits_eq(&first[..2 * ex.frame_len()], &run(&ex, ogg.clone(), CropMode::Random, key(9), 2), "prefix");
        // Views, epochs and indices differ; Center ignores the key.
        let fl = ex.frame_len();
        assert_ne!(first[..fl], first[fl..2 * fl]);
        assert_ne!(first, run(&ex, ogg.clone(), CropMode::Random, SampleKey { epoch: 4, ..key(9) }, 4));
        let c1 = run(&ex, ogg.clone(), CropMode::Center, key(9), 2);
        assert_bits_eq(&c1[..fl], &c1[fl..], "center views");
        assert_bits_eq(&c1[..fl], &run(&ex, ogg, CropMode::Center, key(123), 1), "center key");
    }

    #[test]
    fn masks_zero_whole_frames_and_whole_mel_bins() {
        let base = ClipConfig::default();
        let plain = ClipExtractor::new(base.clone()).unwrap();
        let masked = ClipExtractor::new(ClipConfig {
            time_mask: MaskConfig { count: 2, max_width: 40 },
            freq_mask: MaskConfig { count: 2, max_width: 15 },
            ..base
        })
        .unwrap();
        let wav = sweep_wav(9.0, 44_100);
        let (t_len, m_len) = (512, 128);
        let mut saw_time = false;
        let mut saw_freq = false;
        for i in 0..8 {
            let a = run(&plain, wav.clone(), CropMode::Random, key(i), 1);
            let b = run(&masked, wav.clone(), CropMode::Random, key(i), 1);
            // Same crop: unmasked entries are identical, masked ones are 0.0.
            let changed = |t: usize, m: usize| b[t * m_len + m] != a[t * m_len + m];
            assert!(a.iter().zip(&b).all(|(x, y)| y == x || *y == 0.0));
            let zero_row = |t: usize| (0..m_len).all(|m| b[t * m_len + m] == 0.0);
            let zero_col = |m: usize| (0..t_len).all(|t| b[t * m_len + m] == 0.0);
            let mut rows = 0;
            let mut cols = 0;
            for t in 0..498 {
                if zero_row(t) {
                    rows += 1;
                }
            }
            for m in 0..m_len {
                if zero_col(m) {
                    cols += 1;
                }
            }
            for t in 0..498 {
                for m in 0..m_len {
                    if changed(t, m) {
                        assert!(zero_row(t) || zero_col(m), "key {i}: ({t},{m}) zeroed outside a mask");
                    }
                }
            }
            assert!(rows <= 80 && cols <= 30, "key {i}: {rows} rows {cols} cols");
            saw_time |= rows > 0;
            saw_freq |= cols > 0;
            // Center mode never masks.
            assert_bits_eq(
                &run(&plain, wav.clone(), CropMode::Center, key(i), 1),
                &run(&masked, wav.clone(), CropMode::Center, key(i), 1),
                "center unmasked",
            );
        }
        assert!(saw_time && saw_freq);
    }

    #[test]
    fn errors_are_reported() {
        let ex = ClipExtractor::new(ClipConfig::default()).unwrap();
        let mut out = vec![0f32; ex.frame_len()];
        let e = ex.extract(vec![1u8, 2, 3], CropMode::Random, key(0), 1, false, &mut out).unwrap_err();
        assert!(e.0.contains("decode"), "{e}");
        let e = ex.extract(sweep_wav(1.0, 16_000), CropMode::Random, key(0), 2, false, &mut out).unwrap_err();
        assert!(e.0.contains("expected 2 views"), "{e}");
        let e = ex.extract(sweep_wav(0.1, 500), CropMode::Random, key(0), 1, false, &mut out).unwrap_err();
        assert!(e.0.contains("sample rate"), "{e}");
    }

    /// `cargo test --release -p birdjepa-core clip_throughput -- --ignored --nocapture`
    /// Extra inputs: BIRDJEPA_BENCH_DIR=/tmp/birdjepa-bench (scripts/make_codec_fixtures.py --bench-dir).
    #[test]
    #[ignore]
    fn clip_throughput() {
        let ex = ClipExtractor::new(ClipConfig::default()).unwrap();
        let mut inputs: Vec<(String, Vec<u8>)> =
            vec![("birds_44k_stereo_30s.ogg (fixture)".into(), fixture("birds_44k_stereo_30s.ogg"))];
        if let Ok(dir) = std::env::var("BIRDJEPA_BENCH_DIR") {
            let mut paths: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
            paths.sort();
            for p in paths {
                inputs.push((p.display().to_string(), std::fs::read(&p).unwrap()));
            }
        }
        // On-CPU time of this thread (Linux schedstat, ns): robust to other processes on the machine.
        fn cpu_ns() -> Option<u64> {
            std::fs::read_to_string("/proc/thread-self/schedstat").ok()?.split_whitespace().next()?.parse().ok()
        }
        let mut out = vec![0f32; ex.frame_len()];
        for (name, bytes) in inputs {
            let bytes: Arc<[u8]> = bytes.into();
            ex.extract(bytes.clone(), CropMode::Random, key(0), 1, false, &mut out).unwrap();
            let n = 300;
            let mut best_wall = f64::MAX;
            let mut best_cpu = f64::MAX;
            for rep in 0..3u64 {
                let (t0, c0) = (std::time::Instant::now(), cpu_ns());
                for i in 0..n {
                    ex.extract(bytes.clone(), CropMode::Random, key(rep * n + i), 1, false, &mut out).unwrap();
                }
                best_wall = best_wall.min(t0.elapsed().as_secs_f64());
                if let (Some(a), Some(b)) = (c0, cpu_ns()) {
                    best_cpu = best_cpu.min((b - a) as f64 * 1e-9);
                }
            }
            let t = std::time::Instant::now();
            decode_mono(bytes.clone()).unwrap();
            let full_ms = 1e3 * t.elapsed().as_secs_f64();
            println!(
                "{name}: {:.1} clips/s wall, {:.1} clips/s per CPU-second ({:.2} ms CPU/clip); full decode {full_ms:.1} ms",
                n as f64 / best_wall,
                n as f64 / best_cpu,
                1e3 * best_cpu / n as f64,
            );
        }
    }
}
