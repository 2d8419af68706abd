//! Where each audio frame of an MPEG layer III stream starts, from the frames' 4-byte headers alone.
//!
//! A crop of a long MP3 needs the stream's length (the crop's range) and the byte where the frame it
//! starts in begins. Symphonia knows neither without a Xing/Info header: it estimates the length from
//! the first frame's bit rate, and its accurate seek parses every frame from the start. [`scan`] walks
//! the headers once (a 60-minute file in about a millisecond) and gives both: the decoder then starts
//! at a frame a few frames before the crop (`super::decode`), whose output from there on equals a
//! whole decode's, bit for bit.
//!
//! A frame's main data may begin in the frames before it (the bit reservoir: up to 511 bytes back in
//! MPEG-1, 255 in MPEG-2 and 2.5), and a decoder that starts without those bytes renders zeros until
//! its reservoir holds them. At a low bit rate that is many frames: 8 kbps at 24 kHz carries 11 bytes
//! of main data a frame, so 255 bytes reach back 23 frames. [`Mp3Frames::decode_from`] walks back
//! from a crop's first frame over the frames' own main-data sizes until they hold a full reservoir.
//!
//! Only a stream that parses cleanly to its end is indexed: an ID3v2 tag in front, then layer III frames
//! back to back (a Xing/Info/VBRI header frame first is skipped, as the demuxer skips it), then at most
//! an ID3v1 tag or an APE/Lyrics trailer. Anything else (junk between frames, free-format bit rates,
//! a change of version or sample rate) gives None, and the caller falls back to the demuxer's own
//! frame-by-frame counting and seeking.

use super::tags;

/// The frames of a stream: each audio frame's first byte, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mp3Frames {
    pub offsets: Vec<usize>,
    /// The Xing/Info header frame's tag, where the stream starts with one ([`info_tag`]).
    pub tag: Option<InfoTag>,
    /// 1152 (MPEG-1) or 576 (MPEG-2 and 2.5).
    pub samples_per_frame: u64,
    /// Each frame's bytes of main data (what follows its header, CRC and side information).
    main_bytes: Vec<u16>,
    /// The farthest back a frame's main data may begin: 511 bytes (MPEG-1) or 255 (MPEG-2 and 2.5).
    reservoir: usize,
}

/// Frames decoded before a crop's first frame beyond those its reservoir needs: the IMDCT overlaps
/// each granule with the one before, and the synthesis filter bank keeps 512 samples of history, so
/// the two frames before the crop must decode as in a whole decode too.
const OVERLAP_FRAMES: usize = 2;

impl Mp3Frames {
    /// Frames in the stream times the samples each renders: the whole decode's length.
    pub fn n_samples(&self) -> u64 {
        self.offsets.len() as u64 * self.samples_per_frame
    }

    /// The frame a decode must start at for frame `first` on to equal a whole decode's: the frames from
    /// it to the [`OVERLAP_FRAMES`] before `first` hold at least a full reservoir of main data, which
    /// is as far back as any of those frames can reach (or the stream's first frame).
    pub fn decode_from(&self, first: usize) -> usize {
        let mut k = first.saturating_sub(OVERLAP_FRAMES).min(self.offsets.len());
        let mut held = 0;
        while k > 0 && held < self.reservoir {
            k -= 1;
            held += self.main_bytes[k] as usize;
        }
        k
    }
}

const KBPS_V1: [u32; 15] = [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320];
const KBPS_V2: [u32; 15] = [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160];

/// The layer III header at the start of a frame.
struct Header {
    bytes: usize,
    samples: u64,
    /// Header, CRC and side information: the bytes before the main data.
    overhead: usize,
    /// What must not change along the stream (version and sample rate).
    key: u8,
    rate: u32,
    channels: u8,
}

/// The layer III header at the start of `h`, or None.
fn header(h: &[u8]) -> Option<Header> {
    if h.len() < 4 || h[0] != 0xFF || h[1] & 0xE0 != 0xE0 {
        return None;
    }
    let version = (h[1] >> 3) & 3; // 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5, 1: reserved
    if version == 1 || (h[1] >> 1) & 3 != 1 {
        return None; // reserved, or not layer III
    }
    let (bitrate, rate) = ((h[2] >> 4) as usize, ((h[2] >> 2) & 3) as usize);
    if bitrate == 0 || bitrate == 15 || rate == 3 {
        return None; // free format, bad index
    }
    let base = [[11_025u32, 12_000, 8_000], [0, 0, 0], [22_050, 24_000, 16_000], [44_100, 48_000, 32_000]];
    let sample_rate = base[version as usize][rate];
    let padding = ((h[2] >> 1) & 1) as usize;
    let (kbps, spf) = if version == 3 { (KBPS_V1[bitrate], 1152u64) } else { (KBPS_V2[bitrate], 576u64) };
    let bytes = (spf as usize / 8) * kbps as usize * 1000 / sample_rate as usize + padding;
    let mono = h[3] >> 6 == 3;
    let side = match (version == 3, mono) {
        (true, true) => 17,
        (true, false) => 32,
        (false, true) => 9,
        (false, false) => 17,
    };
    let crc = if h[1] & 1 == 0 { 2 } else { 0 };
    let (key, channels) = (h[1] & 0x18 | (h[2] & 0x0C), if mono { 1 } else { 2 });
    Some(Header { bytes, samples: spf, overhead: 4 + crc + side, key, rate: sample_rate, channels })
}

/// Whether `frame` is a Xing/Info/VBRI header rather than audio.
fn is_info_frame(frame: &[u8]) -> bool {
    let head = &frame[..frame.len().min(48)];
    head.windows(4).any(|w| w == b"Xing" || w == b"Info" || w == b"VBRI")
}

/// What a Xing/Info header frame says of the stream after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InfoTag {
    /// The audio frames it counts (its frames field), where it has one.
    pub frames: Option<u64>,
    /// The samples before the first one written (the encoder's delay and the decoder's 529) and the
    /// padding after the last, where a LAME (or Lavf/Lavc) extension says them.
    pub delay_padding: Option<(u64, u64)>,
}

impl InfoTag {
    /// `(delay, padding)` to trim off a stream of `n` audio frames: no padding where `n` is not the
    /// frames the tag counts (a stream cut short: the padding is the tag's last frame's, not its own).
    pub fn trim(&self, n: u64) -> (u64, u64) {
        let (delay, padding) = self.delay_padding.unwrap_or((0, 0));
        (delay, if self.frames.is_some_and(|f| f != n) { 0 } else { padding })
    }
}

/// The Xing/Info tag of header frame `frame` (its header, CRC and side information `overhead` bytes),
/// read as ffmpeg reads it and LAME writes it: the side information's length past the 4-byte header,
/// the CRC's two bytes (where the frame has them) inside that span. (Symphonia's demuxer asks those
/// bytes to be zero, the CRC's among them: a CRC-protected stream's header frame was decoded as a frame
/// of audio, and its delay kept.)
fn info_tag(frame: &[u8], overhead: usize) -> Option<InfoTag> {
    let crc = if frame[1] & 1 == 0 { 2 } else { 0 };
    let side = overhead - 4 - crc;
    let tag = frame.get(4 + side..)?;
    let be32 = |b: &[u8]| b.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64);
    if !(tag.starts_with(b"Xing") || tag.starts_with(b"Info")) {
        return None;
    }
    let flags = be32(&tag[4..])?;
    let frames = if flags & 1 != 0 { Some(be32(tag.get(8..)?)?) } else { None };
    let mut at = 8 + 4 * (flags & 1 != 0) as usize + 4 * (flags & 2 != 0) as usize;
    at += 100 * (flags & 4 != 0) as usize + 4 * (flags & 8 != 0) as usize;
    // The LAME extension: encoder (9 bytes), revision, lowpass, peak (4), two gains (2 each), flags, ABR,
    // then 12 bits of delay and 12 of padding.
    let ext = tag.get(at..at + 24);
    let delay_padding = ext.filter(|e| [&b"LAME"[..], b"Lavf", b"Lavc"].contains(&&e[..4])).map(|e| {
        let trim = u64::from(e[21]) << 16 | u64::from(e[22]) << 8 | u64::from(e[23]);
        (529 + (trim >> 12), (trim & 0xFFF).saturating_sub(529))
    });
    Some(InfoTag { frames, delay_padding })
}

/// Whether `data` starts (past an ID3v2 tag) with a free-format layer III frame: bit-rate index 0,
/// which the demuxer does not read.
pub fn is_free_format(data: &[u8]) -> bool {
    let h = data.get(tags::past_id3(data)..).unwrap_or_default();
    h.len() >= 4 && h[0] == 0xFF && h[1] & 0xE0 == 0xE0 && (h[1] >> 1) & 3 == 1 && h[2] >> 4 == 0
}

/// A stream's Xing/Info header frame (its first, past an ID3v2 tag) as `(its tag, where the next frame
/// starts, the samples a frame renders)`, read alone: for a stream [`scan`] does not index (cut
/// mid-frame, or bytes after its frames), whose tag the demuxer may not see (behind a CRC).
pub fn leading_tag(data: &[u8]) -> Option<(InfoTag, usize, u64)> {
    let at = tags::past_id3(data);
    let frame = data.get(at..)?;
    let h = header(frame)?;
    let frame = frame.get(..h.bytes)?;
    is_info_frame(frame).then(|| info_tag(frame, h.overhead)).flatten().map(|tag| (tag, at + h.bytes, h.samples))
}

/// Whether symphonia's demuxer drops `frame` as a Xing/Info or VBRI header frame met past a stream's
/// first frame (its `next_packet`, as two files joined end to end hold one): its tag just past zeroed
/// side information (the CRC's two bytes counted in it), and the tag's fields all there. Such a frame
/// renders no audio: counted as a frame, every window after it was a frame off the whole decode.
fn dropped_midway(frame: &[u8], h: &Header) -> bool {
    let side = h.overhead - 4 - if frame[1] & 1 == 0 { 2 } else { 0 };
    let zeroed = |end: usize| frame.get(4..end).is_some_and(|b| b.iter().all(|&b| b == 0));
    let tag = &frame[(4 + side).min(frame.len())..];
    if tag.len() >= 8 && (tag.starts_with(b"Xing") || tag.starts_with(b"Info")) && zeroed(4 + side) {
        let flags = u32::from_be_bytes([tag[4], tag[5], tag[6], tag[7]]);
        let fields = 4 * (flags & 1) + 4 * (flags >> 1 & 1) + 100 * (flags >> 2 & 1) + 4 * (flags >> 3 & 1);
        return tag.len() >= 8 + fields as usize; // else not read as a tag, and decoded as audio
    }
    // VBRI: 32 bytes past the header whatever the side information; version 1.
    frame.len() >= 62 && &frame[36..40] == b"VBRI" && zeroed(36) && frame[40..42] == [0, 1]
}

/// Whether `data` holds a Xing/Info/VBRI tag's id past its first frame's first 48 bytes (where a header
/// frame's is): a stream the index does not take whose demuxer may drop a header frame midway, which
/// its seeks count (two files joined, the second behind an ID3v2 tag the index cannot pass).
pub fn tag_past_first_frame(data: &[u8]) -> bool {
    let rest = data.get(tags::past_id3(data) + 48..).unwrap_or_default();
    rest.windows(4).any(|w| w == b"Xing" || w == b"Info" || w == b"VBRI")
}

/// Whether `rest`, past the last frame, is the stream's end: nothing, or a trailing tag. `gapless`: tags
/// that run to the end (`tags::trailing`: an APEv2 or Lyrics3 tag, then at most an ID3v1): one between
/// two files joined ended the index there, and the second file was lost to the whole decode and the
/// windows. Off, a tag's first bytes, as birdjepa read them before the option.
fn trailer(rest: &[u8], gapless: bool) -> bool {
    if !gapless {
        return rest.starts_with(b"TAG") && rest.len() == 128 || rest.starts_with(b"APETAGEX") || rest.starts_with(b"LYRICS");
    }
    !rest.is_empty() && tags::trailing(rest) == rest.len()
}

/// A frame's `(sample rate, channels)`, where `frame` starts with a layer III header.
pub fn frame_format(frame: &[u8]) -> Option<(u32, u8)> {
    header(frame).map(|h| (h.rate, h.channels))
}

/// The error of a stream whose frames change format from frame `at` on (two recordings joined end to
/// end): the decoder fails every frame past it, and a whole decode ended there without a word.
pub fn changes(was: (u32, u8), now: (u32, u8), at: usize) -> String {
    let mode = |(rate, channels): (u32, u8)| format!("{rate} Hz {}", ["mono", "stereo"][channels as usize - 1]);
    let (was, now) = (mode(was), mode(now));
    format!("decode (mp3): the stream changes from {was} to {now} at frame {at} (recordings joined end to end?): each alone is read")
}

/// The frames of `data`, or None where it does not parse cleanly to its end (see the module docs).
/// `gapless`: a Xing/Info/VBRI header frame past the first is no frame of audio ([`dropped_midway`]), a
/// tag is a trailer only where it runs to the end ([`trailer`]), and a change of channel count midway
/// is not indexed. Off, as birdjepa read them before the option (what a run recorded then read).
pub fn scan(data: &[u8], gapless: bool) -> Option<Mp3Frames> {
    let mut at = tags::past_id3(data);
    let (mut offsets, mut main_bytes, mut spf, mut key, mut tag) = (Vec::new(), Vec::new(), 0, None, None);
    let mut format = None;
    let done = |offsets: Vec<usize>, main_bytes, spf, tag| {
        let reservoir = if spf == 1152 { 511 } else { 255 };
        (!offsets.is_empty()).then_some(Mp3Frames { offsets, tag, samples_per_frame: spf, main_bytes, reservoir })
    };
    while at < data.len() {
        let rest = &data[at..];
        let Some(h) = header(rest) else {
            return if trailer(rest, gapless) { done(offsets, main_bytes, spf, tag) } else { None };
        };
        // Another version, rate or (gapless) channel count midway (two recordings joined: the packet
        // count refuses it, `decode`), a last frame cut short, or no main data.
        let other = key.is_some_and(|k| k != h.key) || gapless && format.is_some_and(|f| f != (h.rate, h.channels));
        if other || h.bytes > rest.len() || h.bytes < h.overhead {
            return None;
        }
        format = Some((h.rate, h.channels));
        if offsets.is_empty() && key.is_none() && is_info_frame(&rest[..h.bytes]) {
            tag = info_tag(&rest[..h.bytes], h.overhead);
        } else if gapless && key.is_some() && dropped_midway(&rest[..h.bytes], &h) {
            // Dropped by the demuxer: neither a frame of audio nor main data for the reservoir.
        } else {
            offsets.push(at);
            main_bytes.push((h.bytes - h.overhead) as u16);
        }
        key = Some(h.key);
        spf = h.samples;
        at += h.bytes;
    }
    done(offsets, main_bytes, spf, tag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::decode::tests::fixture;

    #[test]
    fn the_fixtures_index_every_audio_frame_and_skip_the_header_frame() {
        for name in ["birds_32k_mono.mp3", "birds_32k_mono_cbr.mp3"] {
            let data = fixture(name);
            let frames = scan(&data, true).unwrap();
            assert_eq!(frames.samples_per_frame, 1152);
            assert!(frames.offsets[0] > 0, "{name}: the Xing/Info frame is not audio");
            assert!(frames.offsets.windows(2).all(|w| w[0] < w[1]));
            // Junk between frames, or a cut in the middle of the stream, is not indexed.
            let mut junk = data.clone();
            junk.insert(frames.offsets[5], 0);
            assert_eq!(scan(&junk, true), None, "{name}");
        }
        assert_eq!(scan(b"not an mp3 at all", true), None);
    }
}
