//! The loader's one seam for the verification harness: what a run does to its own data on purpose,
//! to see the harness catch it. Off in every real run (the default); the loader asks it per sample and
//! knows nothing else about it. Built from the `debug_*` loader options.
use std::collections::BTreeMap;

use crate::error::{Error, Result};
use crate::options::LoaderOptions;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugHooks {
    /// A worker panics when it reaches this sample index (the loader must report it, not hang).
    pub panic_index: Option<u64>,
    /// The sample of this global index takes every view's crop one hop further
    /// (`ClipExtractor::shift_offset`), a difference planted for `birdjepa bisect`;
    /// -1: off.
    pub crop_shift_index: i64,
}

impl Default for DebugHooks {
    fn default() -> Self {
        Self::from_options(&LoaderOptions::default())
    }
}

impl DebugHooks {
    /// The hooks the options ask for.
    pub fn from_options(o: &LoaderOptions) -> Self {
        Self {
            panic_index: o.debug_panic_index,
            crop_shift_index: o.debug_crop_shift_index,
        }
    }

    /// Every hook in its range.
    pub fn check(&self) -> Result<()> {
        if self.crop_shift_index < -1 {
            return Err(Error::config(
                "debug_crop_shift_index must be >= -1 (-1: off)",
            ));
        }
        Ok(())
    }

    /// Whether a worker panics on sample `index`.
    pub fn panics_at(&self, index: u64) -> bool {
        self.panic_index == Some(index)
    }

    /// Whether sample `index` takes the crop shift.
    pub fn shifts_crop(&self, index: u64) -> bool {
        u64::try_from(self.crop_shift_index).is_ok_and(|i| i == index)
    }

    /// What of the hooks shapes the batch stream, into a loader's stream signature: the crop shift, and
    /// only when on (like `shuffle_initial`), so the states of runs without it still match.
    pub fn sign(&self, m: &mut BTreeMap<String, String>) {
        if self.crop_shift_index >= 0 {
            m.insert(
                "debug_crop_shift_index".into(),
                self.crop_shift_index.to_string(),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hook_is_off_by_default_and_the_crop_shift_signs_the_stream_only_when_on() {
        let off = DebugHooks::default();
        assert_eq!((off.panic_index, off.crop_shift_index), (None, -1));
        assert!(!(0..1000).any(|i| off.shifts_crop(i) || off.panics_at(i)));
        let mut m = BTreeMap::new();
        off.sign(&mut m);
        assert!(m.is_empty());
        let on = DebugHooks {
            crop_shift_index: 7,
            ..Default::default()
        };
        assert!(on.shifts_crop(7) && !on.shifts_crop(6) && !on.shifts_crop(8));
        on.sign(&mut m);
        assert_eq!(m["debug_crop_shift_index"], "7");
        let e = DebugHooks {
            crop_shift_index: -2,
            ..Default::default()
        }
        .check()
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("debug_crop_shift_index must be >= -1"),
            "{e}"
        );
    }
}
