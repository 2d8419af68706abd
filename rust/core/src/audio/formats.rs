//! The containers and codecs the decoder reads, by decoder revision.
//!
//! AIFF / AIFF-C and M4A (ALAC, AAC-LC) are read from revision 5 on, which is gapless-only: a run
//! recorded without `gapless` probes with the formats it had (OGG, FLAC, MP3, WAV), so such a file is
//! "unrecognised" there as it was, and the batches of its resume do not change. symphonia's own default
//! probe is not used: it would also register raw ADTS AAC (no container to say its priming; not read).

use std::sync::OnceLock;

use symphonia::core::codecs::CodecRegistry;
use symphonia::core::probe::Probe;
use symphonia::default::codecs::{AacDecoder, AlacDecoder, FlacDecoder, MpaDecoder, PcmDecoder, VorbisDecoder};
use symphonia::default::formats::{AiffReader, FlacReader, IsoMp4Reader, MpaReader, OggReader, WavReader};
use symphonia_metadata::id3v2::Id3v2Reader;

/// The probe of the formats read: with the M4A and AIFF readers where `new` (gapless, revision 5 on).
/// Registered in the order of symphonia's default probe.
pub(super) fn probe(new: bool) -> &'static Probe {
    static PROBES: OnceLock<[Probe; 2]> = OnceLock::new();
    let probes = PROBES.get_or_init(|| {
        [false, true].map(|new| {
            let mut p = Probe::default();
            p.register_all::<FlacReader>();
            if new {
                p.register_all::<IsoMp4Reader>();
            }
            p.register_all::<MpaReader>();
            if new {
                p.register_all::<AiffReader>();
            }
            p.register_all::<WavReader>();
            p.register_all::<OggReader>();
            p.register_all::<Id3v2Reader>();
            p
        })
    });
    &probes[new as usize]
}

/// The codecs decoded: with ALAC and AAC where `new`.
pub(super) fn codecs(new: bool) -> &'static CodecRegistry {
    static REGISTRIES: OnceLock<[CodecRegistry; 2]> = OnceLock::new();
    let registries = REGISTRIES.get_or_init(|| {
        [false, true].map(|new| {
            let mut r = CodecRegistry::new();
            if new {
                r.register_all::<AacDecoder>();
                r.register_all::<AlacDecoder>();
            }
            r.register_all::<FlacDecoder>();
            r.register_all::<MpaDecoder>();
            r.register_all::<PcmDecoder>();
            r.register_all::<VorbisDecoder>();
            r
        })
    });
    &registries[new as usize]
}
