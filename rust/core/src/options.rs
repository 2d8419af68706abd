//! The loader's options as a caller names them: one flat, serde-typed schema with every default.
//!
//! This is the only place the defaults are written. The Python package reads them from here
//! (`birdjepa._rs.loader_defaults()`). Each config is built from these options by the module that owns
//! it (`LoaderConfig::from_options`, `ColumnConfig::from_options`, `ClipConfig::from_options`,
//! `FbankConfig::from_options`) and defaults to what the default options build. This module is plain
//! data and imports none of them, so the crate reads one way (loader -> dataset, audio -> options).
//! Unknown names and wrong types are errors that name the option.
//!
//! Floats are `f64` here and narrowed to `f32` where they are used, so a value survives a round trip
//! through JSON and Python's `float` exactly (e.g. the log floor `f32::EPSILON`).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoaderOptions {
    // The stream.
    pub seed: u64,
    pub batch_size: usize,
    /// Decode threads; 0: one per CPU this process may run on (`loader::workers_for`).
    pub n_workers: usize,
    /// Train: infinite, shuffled, random crops. Eval: one ordered pass of centre crops.
    pub train: bool,
    pub n_views: usize,
    pub shuffle_buffer: usize,
    pub shuffle_initial: Option<usize>,
    pub interleave: Option<usize>,
    pub prefetch_batches: usize,
    pub drop_last: bool,
    pub augment: bool,
    pub audio_column: String,
    pub label_column: String,
    /// Read every shard's `label_column` (and `multilabel_column`) by name into these names, an integer
    /// through its shard's `vocab.json`: one label space for a split whose folders index different
    /// vocabularies (the multi-hot as wide as these, unless `n_classes`). None: as each shard stores it.
    pub label_names: Option<Vec<String>>,
    /// A list column of class ids or names (BirdSet's `ebird_code_multilabel`): batches then carry a
    /// `[B, C]` multi-hot beside `label`. None: off.
    pub multilabel_column: Option<String>,
    /// C, the multi-hot's width; None: the number of names in `vocab.json` beside the shards.
    pub n_classes: Option<usize>,
    /// Eval only: a row whose shard has both columns (seconds) is cropped to that window of its
    /// recording instead of the centre (BirdSet's soundscape segments).
    pub window_start_column: String,
    pub window_end_column: String,
    /// Train only: crop around each row's events (`event_column`: a list of `[start, end]` seconds)
    /// instead of uniformly; a row without events keeps the uniform crop.
    pub crop_events: bool,
    pub event_column: String,
    /// Where a relative audio path (a row whose audio is a file, `audio_source`) is resolved; None: the
    /// folder of the row's shard.
    pub audio_root: Option<String>,
    pub debug_panic_index: Option<u64>,
    /// Debug: the sample whose global index equals this takes every view's crop one hop further
    /// (plants a difference on purpose, e.g. for a divergence test); -1: off.
    pub debug_crop_shift_index: i64,
    // The features (Python's `birdjepa.data.Features`).
    pub target_rate: u32,
    pub clip_seconds: f64,
    pub n_fft: usize,
    pub win_length: usize,
    pub hop_length: usize,
    pub n_mels: usize,
    pub f_min: f64,
    pub f_max: Option<f64>,
    pub preemphasis: f64,
    pub remove_dc: bool,
    pub log_floor: f64,
    pub n_frames: usize,
    pub mean: f64,
    pub std: f64,
    pub time_mask_count: usize,
    pub time_mask_width: usize,
    pub freq_mask_count: usize,
    pub freq_mask_width: usize,
    /// Decode an MP3 without its encoder's delay and padding, and a Vorbis stream without its last
    /// block's padding, as their headers say (`audio::decode`); false: as birdjepa read them before.
    pub gapless: bool,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            seed: 0,
            batch_size: 16,
            n_workers: 0,
            train: true,
            n_views: 1,
            shuffle_buffer: 4096,
            shuffle_initial: None,
            // Every shard at once and 4096 buffered indices: near-IID batches at 500 shards and batch
            // 256-1024 (scripts/bench_scale.py, docs/benchmarks.md), for 64 KiB of indices.
            interleave: None,
            prefetch_batches: 2,
            drop_last: false,
            augment: true,
            audio_column: "audio".into(),
            label_column: "ebird_code".into(),
            label_names: None,
            multilabel_column: None,
            n_classes: None,
            window_start_column: "start_time".into(),
            window_end_column: "end_time".into(),
            crop_events: false,
            event_column: "detected_events".into(),
            audio_root: None,
            debug_panic_index: None,
            debug_crop_shift_index: -1,
            // 5 s at 32 kHz, Kaldi-style fbank: 25 ms window, 10 ms hop, 128 mel bins from 20 Hz to
            // Nyquist, normalised with AudioMAE's fbank statistics; no masks.
            target_rate: 32_000,
            clip_seconds: 5.0,
            n_fft: 1024,
            win_length: 800,
            hop_length: 320,
            n_mels: 128,
            f_min: 20.0,
            f_max: None,
            preemphasis: 0.97,
            remove_dc: true,
            log_floor: f32::EPSILON as f64,
            n_frames: 512,
            mean: -4.2677393,
            std: 4.5689974,
            time_mask_count: 0,
            time_mask_width: 0,
            freq_mask_count: 0,
            freq_mask_width: 0,
            gapless: true,
        }
    }
}

impl LoaderOptions {
    /// Parse a JSON object of options; absent ones take their defaults.
    /// Errs naming the option at fault where one is (serde names none for a value of the wrong type or
    /// range: "invalid value: integer `-1`, expected usize at line 1 column 17").
    pub fn from_json(text: &str) -> Result<Self> {
        serde_json::from_str(text).map_err(|e| {
            let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(text) else {
                return Error::config(format!("loader options: {e}"));
            };
            for (key, value) in map {
                let alone = serde_json::Value::Object([(key.clone(), value.clone())].into_iter().collect());
                if let Err(e) = serde_json::from_value::<Self>(alone) {
                    return Error::config(match value.as_i64() {
                        Some(n) if n < 0 => format!("{key} must be >= 0 (got {n})"),
                        _ => format!("{key} {value}: {e}"),
                    });
                }
            }
            Error::config(format!("loader options: {e}"))
        })
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("options serialise")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    // What the configs build from these options (clip samples, the f32 log floor) and the range checks
    // are tested in loader.rs, which sees every config.

    #[test]
    fn absent_options_take_the_defaults_and_unknown_or_mistyped_ones_are_named() {
        let o = LoaderOptions::from_json(r#"{"batch_size": 4, "clip_seconds": 2.5}"#).unwrap();
        assert_eq!(o, LoaderOptions { batch_size: 4, clip_seconds: 2.5, ..Default::default() });
        let e = LoaderOptions::from_json(r#"{"shuffle_bufer": 4}"#).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Config);
        assert!(e.message.contains("unknown field `shuffle_bufer`"), "{}", e.message);
        let e = LoaderOptions::from_json(r#"{"n_mels": "many"}"#).unwrap_err();
        assert!(e.message.starts_with("n_mels \"many\": invalid type"), "{}", e.message);
        let e = LoaderOptions::from_json(r#"{"batch_size": 4, "n_workers": -1}"#).unwrap_err();
        assert_eq!(e.message, "n_workers must be >= 0 (got -1)"); // serde named no field
    }

    #[test]
    fn defaults_round_trip_through_json_exactly() {
        let d = LoaderOptions::default();
        assert_eq!(LoaderOptions::from_json(&d.to_json()).unwrap(), d);
    }
}
