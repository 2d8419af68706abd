//! Audio DSP: encoded bytes -> mono PCM -> resampled clip -> Kaldi-style log-mel feature maps.
//!
//! The pipeline run for every sample by [`ClipExtractor::extract`] (details in each module):
//!
//! 1. **Decode** ([`decode`]): symphonia 0.5 (OGG/Vorbis, FLAC, WAV/PCM, MP3; gapless, AIFF / AIFF-C
//!    and M4A of ALAC or AAC-LC: [`formats`]). Channels are averaged to
//!    mono (`sum / n_channels`, in channel order). Where the container can seek and reports its length
//!    (FLAC, WAV, AIFF, OGG Vorbis, ALAC) only the source window that the crop needs is decoded; MP3 and streams of
//!    unknown length are decoded completely. A windowed decode is bit-identical to the same samples
//!    of a full decode (tested per codec).
//! 2. **Resample** ([`resample`]): rational polyphase windowed-sinc (Kaiser) to `target_rate`, one filter
//!    bank per source rate, built once and cached. Only the output samples of the crop are computed.
//! 3. **Crop** ([`clip`]): `clip_samples` at the output rate; `Random` draws the offset uniformly in
//!    `[0, N_out - clip]` from a counter-based stream keyed by `(seed, Crop, epoch, index, view)`;
//!    `Center` takes `(N_out - clip) / 2`; shorter recordings start at 0 and are zero-padded; `Window`
//!    starts at a row's own window and is zero-padded after the window's end.
//! 4. **Log-mel** ([`fbank`]): Kaldi-compatible fbank (snip_edges framing, per-frame DC removal,
//!    pre-emphasis, symmetric Hann window, power spectrum, Kaldi-mel triangular filters, floor, ln).
//! 5. **Frames, normalisation, masks** ([`clip`]): pad/crop to `n_frames` rows, `(x - mean) / std`,
//!    pad rows are 0.0; `Random` mode then applies SpecAugment-style time and frequency masks
//!    (masked values are 0.0, the normalised mean).
//!
//! Everything is deterministic: the output is a pure function of `(data, config, mode, key, n_views)`
//! on a given machine and build, regardless of thread or of what was decoded before (no dither, no
//! global RNG, no state carried between samples except immutable caches and per-thread scratch buffers
//! that are fully overwritten). Across machines, bits can differ only where a library picks a
//! CPU-specific kernel (rustfft: AVX vs SSE for the feature FFT) or the platform libm rounds the sin/cos
//! used to build the window and filter tables differently; the per-sample arithmetic is plain f32 code.
//!
//! Errors ([`AudioError`]) name the step: `decode: unrecognised container ...`, `decode (vorbis): ...`,
//! `decode (flac): no audio frames ...`, `extract: unsupported sample rate ...`, and so on.

use std::fmt;

pub mod clip;
pub mod decode;
pub mod fbank;
pub mod joined;
mod aiff;
mod formats;
pub mod mp3_frames;
pub mod mp4_edits;
pub mod resample;
pub mod tags;

pub use clip::{ClipConfig, ClipExtractor, CropMode, MaskConfig, SampleKey};
pub use fbank::FbankConfig;

/// The decoder's revisions: each a declared change of the samples it gives some files, with the same
/// options, as `(what, gapless_only)` (the change is of gapless decodes alone: a run recorded without
/// the option reads as it did). Revision `i + 1` is entry `i`; the first is the decoder before they were
/// recorded. Every checkpoint records the revision that wrote it, and a resume by another names those
/// between: the loader's checks see the next batch only, and a file of a changed kind may come at any
/// later step.
pub const DECODE_REVISIONS: &[(&str, bool)] = &[
    ("the decoder as it was before revisions were recorded", false),
    (
        "MP3s joined end to end are read past the join at the whole decode's positions (2026-12-07: their \
         windows were a frame off, or the second file lost), and a chained Ogg is refused",
        true,
    ),
    (
        "a FLAC with a tag after its last frame (ID3v1, APEv2, Lyrics3) decodes that frame (2026-12-07: \
         dropped, its crops were skips), and an MP3's tags after its frames are sized by FLAC's rule",
        true,
    ),
    (
        "an unfinished WAV (its RIFF or data size 0, as a recorder whose battery died leaves them) and one \
         cut short of its data size are read to their last whole frame, as ffmpeg reads them (2026-12-07: \
         refused, or a cut one's length was its header's, its crops past the cut skips)",
        true,
    ),
    (
        "AIFF / AIFF-C and M4A (ALAC, AAC-LC: its edit list's priming and padding dropped) are read, as \
         ffmpeg reads them (2026-12-07: refused, \"unrecognised container\")",
        true,
    ),
];

/// A record could not be turned into features; the message says which step failed and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AudioError(pub String);

impl AudioError {
    pub(crate) fn new(msg: impl Into<String>) -> Self {
        AudioError(msg.into())
    }
}

impl fmt::Display for AudioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AudioError {}
