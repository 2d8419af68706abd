//! Decoding encoded audio bytes to mono f32 PCM with symphonia 0.5.
//!
//! * Supported: OGG/Vorbis, FLAC, WAV (integer/float PCM), MP3; and gapless (decoder revision 5, `formats`)
//!   AIFF / AIFF-C (PCM, 'sowt', float) and M4A of ALAC or AAC-LC. An M4A's edit list
//!   (`mp4_edits`) says the samples that are the recording: AAC's priming (1024 samples from ffmpeg, 2112
//!   from Apple) and its last frame's padding are dropped, as Apple and ffmpeg from 7.x drop them (5.1
//!   keeps the padding). AAC's windows decode from the stream's start (its noise generator runs on from
//!   there: a seek's decode would differ); ALAC's and AIFF's seek.
//! * Mono mix: per frame `(c0 + c1 + ... ) / n_channels`, summed in channel order, in f32. Integer
//!   samples are converted by symphonia's `IntoSample<f32>` (e.g. `i16 / 32768`), so 16-bit PCM and
//!   FLAC decode to exactly the values `soundfile.read(dtype="float32")` gives.
//! * Gapless (the `gapless` option, on by default): MP3 is trimmed as ffmpeg and libsndfile trim it:
//!   the encoder's delay plus the decoder's 529 frames before its first sample (1105 for LAME) and the
//!   padding after its last, as its LAME/Info tag says (nothing without one; the tag read by
//!   `mp3_frames`, also behind a CRC, where the demuxer does not see it), so its frame `i` is the
//!   signal's frame `i` as in any other codec ([`trim`];
//!   symphonia's own `enable_gapless` is left off: it trims a whole decode only, not a stream opened at a
//!   frame mid-file, and ends the stream at the Xing header's frame count where the frames' own count
//!   is the one read here). The trim is applied in both the whole decode and the windows, so a window
//!   is still the whole decode's frames, bit for bit. A Vorbis stream ends at its last granule position
//!   (the final block's padding past it, < 1 block, is dropped), as libvorbisfile ends it. Off, both
//!   are the decoder's whole output, as birdjepa read them before the option: an MP3 1105 frames late.
//!
//! ## Windowed decoding
//! [`AudioReader::read_window_mono`] returns frames `[start, start + len)` of the stream (frames outside
//! the stream are 0.0). When the container can seek *and* reports its length (FLAC, WAV, OGG Vorbis;
//! see [`AudioReader::can_seek`]) it seeks to `start - margin` and decodes forward, placing each decoded
//! packet at its timestamp and discarding what falls outside the window. The margin covers the codec's
//! pre-roll (Vorbis renders nothing for the first packet after a seek, so the margin is one long block;
//! FLAC and PCM frames decode independently, margin 0). If the first rendered frame lies after `start`
//! (a seek overshoot) the margin is doubled and the seek retried; after a few tries, or on a seek
//! error, the stream is reopened and decoded from its beginning. Every decoded frame is therefore the
//! same as in a full decode, bit for bit (the unit tests check this per codec). MP3 seeks too: its length is
//! counted from its frames' headers at open (`super::mp3_frames`; without a Xing/Info header, common at
//! a constant bit rate, the container's estimate from the first frame is off for a variable rate), and
//! a seek opens the stream at the frame holding `start - margin` instead of parsing every frame from the
//! start (a stream that does not scan cleanly counts and seeks through the demuxer instead). The frame
//! it starts at is back far enough for the bit reservoir of the frames before `start` (up to 511 bytes
//! of main data, which at 8 kbps spans 23 frames: `Mp3Frames::decode_from` counts them from the
//! frames' own sizes) and the synthesis filter bank's history, and at least `DEFAULT_MARGIN` (about 7
//! frames, which a seek through the demuxer keeps: enough from 64 kbps up), after which the
//! decoder's output no longer depends on where decoding began (checked bit for bit on the fixtures,
//! 8 kbps at 24 kHz among them). Streams of unknown length are decoded whole once and the window copied
//! out of it.
//!
//! Gapless too, a FLAC's tags after its last frame (ID3v1, APEv2, Lyrics3: taggers append them) are cut
//! off before the demuxer reads it, which took them for part of that frame, failed its CRC and dropped
//! it ([`flac_frames_end`]; an MP3's frame index ends at them, `mp3_frames`). And a WAV whose header's
//! sizes are not the file's (0, as a recorder that stopped mid-write leaves them, or past its end: a copy
//! cut short) is read as ffmpeg reads it, to its last whole frame: the demuxer reads the true sizes in
//! place of those 8 bytes ([`unfinished_wav`], [`Overlaid`]); a finished one is read as it is.
//!
//! Packets that fail to decode (`DecodeError`) are skipped, as players do; they are counted in
//! [`AudioReader::packet_errors`]. A stream that yields no audio frame at all is an error.

use std::io::{Cursor, Read, Seek, SeekFrom};
use std::sync::Arc;

use symphonia::core::audio::{AudioBuffer, AudioBufferRef, Signal};
use symphonia::core::checksum::{Crc16Ansi, Crc8Ccitt};
use symphonia::core::codecs::{
    Decoder, DecoderOptions, CODEC_TYPE_ADPCM_IMA_QT, CODEC_TYPE_ADPCM_IMA_WAV, CODEC_TYPE_ADPCM_MS, CODEC_TYPE_NULL, CODEC_TYPE_OPUS,
};
use symphonia::core::conv::IntoSample;
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::{FormatOptions, FormatReader, Packet, SeekMode, SeekTo};
use symphonia::core::io::{MediaSource, MediaSourceStream, MediaSourceStreamOptions, Monitor};
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;
use symphonia::core::sample::Sample;
use symphonia::core::units::TimeBase;

use super::aiff;
use super::formats;
use super::joined;
use super::mp3_frames::{self, Mp3Frames};
use super::mp4_edits;
use super::tags;
use super::AudioError;
use crate::error::quietly;
use crate::options::LoaderOptions;

/// Seek retries (each doubling the pre-roll margin) before falling back to decoding from the start.
const SEEK_TRIES: usize = 3;
/// Pre-roll for MP3 (bit reservoir + filter-bank history) and codecs whose frames we do not parse.
const DEFAULT_MARGIN: u64 = 8192;

/// Shared, cheaply clonable view of the encoded bytes, so a stream can be reopened from the start.
#[derive(Clone)]
struct SharedBytes(Arc<dyn AsRef<[u8]> + Send + Sync>);

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

/// The encoded bytes from an offset on (an MP3 read from one of its frames).
struct Tail(SharedBytes, usize);

impl AsRef<[u8]> for Tail {
    fn as_ref(&self) -> &[u8] {
        &self.0.as_ref()[self.1..]
    }
}

/// The encoded bytes up to an offset (a FLAC without the tags after its last frame: [`flac_frames_end`]).
struct Head(SharedBytes, usize);

impl AsRef<[u8]> for Head {
    fn as_ref(&self) -> &[u8] {
        &self.0.as_ref()[..self.1]
    }
}

/// Where a FLAC's frames end: before the tags appended after its last frame (`tags::trailing`: ID3v1,
/// APEv2, Lyrics3), which its demuxer reads as part of that frame, whose CRC then fails: the frame was
/// dropped, and the crops in it were counted skips. Cut only where the bytes before the tags end a
/// frame: a frame header (its CRC-8 checked) at most the largest frame back from them, from which the
/// CRC-16 to them checks and to the file's end does not (a last frame whose own bytes happen to look
/// like a tag keeps them, its CRC-16 being the one to the end). The file's end otherwise: not a FLAC, or
/// no tag (a few bytes compared; a cut costs a CRC over a frame or two).
fn flac_frames_end(data: &[u8]) -> usize {
    let (whole, at) = (data.len(), tags::past_id3(data));
    let Some(info) = data.get(at..at + 42).filter(|h| h.starts_with(b"fLaC")) else {
        return whole;
    };
    let tag = tags::trailing(data);
    if tag == 0 {
        return whole;
    }
    // STREAMINFO (the first metadata block): the largest frame's bytes, or where it says 0 (not known)
    // the largest block's samples stored verbatim (a side channel one bit wider), plus headers.
    let s = &info[8..];
    let max_frame = (s[7] as usize) << 16 | (s[8] as usize) << 8 | s[9] as usize;
    let (channels, bits) = (((s[12] >> 1) & 7) as usize + 1, ((s[12] & 1) << 4 | s[13] >> 4) as usize + 1);
    let verbatim = u16::from_be_bytes([s[2], s[3]]) as usize * channels * (bits + 1) / 8 + 32;
    let cut = whole - tag;
    let reach = cut.saturating_sub(if max_frame > 0 { max_frame } else { verbatim }).max(at + 42);
    let crc16 = |b: &[u8]| {
        let mut crc = Crc16Ansi::new(0);
        crc.process_buf_bytes(b);
        crc.crc()
    };
    (reach..cut.saturating_sub(1))
        .rev()
        .filter(|&f| data[f] == 0xFF && data[f + 1] & 0xFE == 0xF8 && flac_header_checks(&data[f..cut]))
        .find(|&f| crc16(&data[f..cut]) == 0)
        .map_or(whole, |f| if crc16(&data[f..]) == 0 { whole } else { cut })
}

/// Whether `frame` starts with a FLAC frame header (its sync code already matched) whose CRC-8 checks.
fn flac_header_checks(frame: &[u8]) -> bool {
    let Some(&[_, _, sizes, _, first]) = frame.get(..5) else { return false };
    let number = match first.leading_ones() {
        0 => 1,
        n @ 2..=7 => n as usize, // a UTF-8-coded frame or sample number
        _ => return false,
    };
    let block = match sizes >> 4 {
        0 => return false,
        6 => 1,
        7 => 2,
        _ => 0,
    };
    let rate = match sizes & 15 {
        12 => 1,
        13 | 14 => 2,
        15 => return false,
        _ => 0,
    };
    let len = 4 + number + block + rate;
    frame.len() > len && {
        let mut crc = Crc8Ccitt::new(0);
        crc.process_buf_bytes(&frame[..len]);
        crc.crc() == frame[len]
    }
}

fn sym_err(what: &str, e: SymError) -> AudioError {
    AudioError(format!("{what}: {e}"))
}

fn is_end_of_stream(e: &SymError) -> bool {
    matches!(e, SymError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof)
        // A chained OGG stream (a new logical stream starts): we only read the first one.
        || matches!(e, SymError::ResetRequired)
}

/// Stream properties: `(sample_rate, channels, n_frames)`; `channels` is 0 when the container does not
/// say (the mix then uses each decoded buffer's own channel count).
pub type StreamInfo = (u32, usize, Option<u64>);

/// A demuxer + decoder over in-memory encoded bytes, reading mono windows or the whole stream.
pub struct AudioReader {
    bytes: SharedBytes,
    format: Box<dyn FormatReader>,
    decoder: PooledDecoder,
    track_id: u32,
    sample_rate: u32,
    channels: usize,
    n_frames: Option<u64>,
    start_ts: u64,
    can_seek: bool,
    seek_margin: u64,
    codec_name: &'static str,
    packet_errors: usize,
    /// Seek retries with a wider margin, and fallbacks to decoding from the start (diagnostics).
    seek_retries: usize,
    fallbacks: usize,
    /// Nothing has been read since the stream was (re)opened.
    fresh: bool,
    /// An MP3's frames (`mp3_frames::scan`): a seek opens the stream at a frame instead of parsing
    /// every frame from the start; None for other codecs, or a stream that does not scan cleanly.
    mp3: Option<Arc<Mp3Frames>>,
    /// The byte the stream's decode starts at: 0, or an MP3's first audio frame (read gapless).
    from: usize,
    /// Sizes read in place of the header's ([`overlay`]: an unfinished WAV's, an AIFF's; gapless).
    overlay: Option<[Field; 2]>,
    /// Opened gapless: the formats of revision 5 on are read (`formats`).
    gapless: bool,
    /// The timestamp of the stream's first packet as the current reader numbers it (0 unless the
    /// reader was opened at an MP3 frame).
    ts_base: u64,
    /// Frames the decoder renders before the stream's first sample, dropped (see [`trim`]); frame
    /// `i` of the stream is frame `lead + i` of the decoder's output.
    lead: u64,
    /// Where the stream ends, for a codec whose decode runs past it (see [`trim`]): frames from
    /// there on are dropped. None where the decode's own end is the stream's end.
    end: Option<u64>,
}

/// `(lead, end)` of a stream of `n` decoded frames (its container's count) whose container says to
/// drop `delay` frames at the start and `padding` at the end, as ffmpeg, libsndfile (mpg123) and so
/// librosa do: an MP3's LAME/Info tag gives the encoder's delay plus the decoder's 529 frames, and the
/// padding of its last frame (1105 and 0 to 1151 for LAME; without a LAME tag, or with another
/// encoder's, nothing is dropped, as there). A tag that would drop the whole stream or more is ignored
/// (the decode kept whole). An Ogg stream's granule positions give its last block's padding the same
/// way (symphonia's `CodecParameters::padding`), as libvorbisfile trims it.
fn trim(delay: u64, padding: u64, n: Option<u64>) -> (u64, Option<u64>) {
    match n {
        Some(n) if delay.saturating_add(padding) < n => (delay, Some(n - delay - padding)),
        Some(n) => (0, Some(n)),
        None => (delay, None),
    }
}

struct Opened {
    format: Box<dyn FormatReader>,
    decoder: PooledDecoder,
    track_id: u32,
    sample_rate: u32,
    channels: usize,
    n_frames: Option<u64>,
    start_ts: u64,
    codec_name: &'static str,
    /// The timestamps' unit (an M4A's media timescale).
    time_base: Option<TimeBase>,
    vorbis_long_block: Option<u64>,
    /// Frames the container says to drop at the start and the end of the decode (`CodecParameters`'
    /// `delay` and `padding`): an MP3's LAME/Info tag (symphonia reads it whatever `enable_gapless`).
    delay: u64,
    padding: u64,
}

/// Vorbis decoders parse their codebooks from the setup header (about half a millisecond), and
/// files from one encoder setting share that header. Each worker thread keeps a few decoders keyed
/// by the header bytes; a reused decoder is `reset()` first, which clears the only state Vorbis
/// carries between packets (the overlap buffers), so it decodes exactly like a new one.
const DECODER_CACHE: usize = 16;

thread_local! {
    static DECODERS: std::cell::RefCell<Vec<(u64, Box<dyn Decoder>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn decoder_key(params: &symphonia::core::codecs::CodecParameters) -> Option<u64> {
    if params.codec != symphonia::core::codecs::CODEC_TYPE_VORBIS {
        return None;
    }
    let extra = params.extra_data.as_deref()?;
    let mut words: Vec<u64> = extra.chunks(8).map(|c| c.iter().fold(0u64, |w, &b| (w << 8) | b as u64)).collect();
    words.push(extra.len() as u64);
    Some(crate::rng::hash_words(&words))
}

fn take_cached_decoder(params: &symphonia::core::codecs::CodecParameters) -> Option<Box<dyn Decoder>> {
    let key = decoder_key(params)?;
    DECODERS.with(|cache| {
        let mut cache = cache.borrow_mut();
        let at = cache.iter().position(|(k, _)| *k == key)?;
        let (_, mut decoder) = cache.swap_remove(at);
        decoder.reset();
        Some(decoder)
    })
}

fn return_decoder(decoder: Box<dyn Decoder>) {
    if let Some(key) = decoder_key(decoder.codec_params()) {
        DECODERS.with(|cache| {
            let mut cache = cache.borrow_mut();
            if cache.len() == DECODER_CACHE {
                cache.remove(0);
            }
            cache.push((key, decoder));
        });
    }
}

/// A decoder that goes back to this thread's cache when dropped.
struct PooledDecoder(Option<Box<dyn Decoder>>);

impl std::ops::Deref for PooledDecoder {
    type Target = Box<dyn Decoder>;
    fn deref(&self) -> &Self::Target {
        self.0.as_ref().expect("decoder present until drop")
    }
}

impl std::ops::DerefMut for PooledDecoder {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.0.as_mut().expect("decoder present until drop")
    }
}

impl Drop for PooledDecoder {
    fn drop(&mut self) {
        if let Some(d) = self.0.take() {
            return_decoder(d);
        }
    }
}

/// A RIFF WAVE's header, its chunks walked by their own sizes to the `data` chunk.
struct WavHeader {
    /// The RIFF chunk's size (bytes 4..8).
    riff: u32,
    /// Where the `data` chunk's header starts; its samples start 8 bytes on.
    data_at: usize,
    /// The size the `data` chunk says.
    data: u32,
    /// Bytes a frame, where the `fmt ` chunk's block is one frame (PCM, float, A-law, mu-law, or
    /// extensible: the codecs whose crops seek).
    block: Option<u64>,
}

/// `bytes`' header where they are a RIFF WAVE with a `data` chunk header; None for any other file.
fn wav_header(bytes: &[u8]) -> Option<WavHeader> {
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return None;
    }
    let le32 = |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let mut at = 12;
    let mut block = None; // bytes a frame, from `fmt `
    while at + 8 <= bytes.len() {
        let size = le32(at + 4);
        if &bytes[at..at + 4] == b"fmt " && at + 22 <= bytes.len() {
            let format = u16::from_le_bytes([bytes[at + 8], bytes[at + 9]]);
            let align = u16::from_le_bytes([bytes[at + 20], bytes[at + 21]]);
            block = matches!(format, 1 | 3 | 6 | 7 | 0xFFFE).then_some(align as u64).filter(|&a| a > 0);
        }
        if &bytes[at..at + 4] == b"data" {
            return Some(WavHeader { riff: le32(4), data_at: at, data: size, block });
        }
        at = at.saturating_add(8 + size as usize + (size as usize & 1)); // chunks are padded to an even size
    }
    None
}

/// For a RIFF WAVE whose `data` chunk says its size is unknown (0xFFFFFFFF, as a writer to a pipe leaves
/// it): `Some` of the frames its data holds to the file's end, where the `fmt ` chunk's block is one
/// frame, else `Some(None)`. `None` for any other file.
fn streamed_wav_frames(bytes: &[u8]) -> Option<Option<u64>> {
    let h = wav_header(bytes)?;
    let data = (bytes.len() - (h.data_at + 8)) as u64;
    (h.data == u32::MAX).then(|| h.block.map(|b| data / b))
}

/// `(byte, value)`: a size to read at a byte of the file in place of the one there ([`Overlaid`]).
pub(super) type Field = (u64, [u8; 4]);

/// The sizes to read a WAV's header with where it says others than the file holds, as ffmpeg reads
/// them: a `data` size of 0 (a recorder whose battery died never wrote it: "no audio frames") or past
/// the file's end (a copy cut short: its length was the header's, every crop past the cut a skip; or
/// past the RIFF size too: refused) is the bytes there are to the file's end, and a RIFF size short of
/// that data chunk as symphonia's chunk reader counts it (0: "wav: missing data chunk") is the file's.
/// The demuxer then reads whole frames (blocks) alone: a byte cut mid-frame is dropped. None where the
/// header is consistent (read as it is, as before), sizes 0xFFFFFFFF both (a stream to a pipe, which
/// symphonia reads: [`streamed_wav_frames`]), past 32 bits, or not a WAV: a few header bytes compared.
/// A `data` size of 0 under a RIFF size that is the file's own is a finished file's empty chunk, not an
/// unfinished one: the chunks after it (a `LIST`) were read as sound (refused: "no audio frames").
fn unfinished_wav(bytes: &[u8]) -> Option<[Field; 2]> {
    let h = wav_header(bytes)?;
    if (h.riff, h.data) == (u32::MAX, u32::MAX) {
        return None;
    }
    let held = bytes.len() - (h.data_at + 8);
    let finished = h.riff as usize == bytes.len() - 8;
    let data = match h.data {
        0 if finished => 0,
        0 => u32::try_from(held).ok()?,
        n if n as usize > held => u32::try_from(held).ok()?,
        n => n,
    };
    // Symphonia counts the RIFF chunk's bytes from byte 12, past "WAVE".
    let riff = match h.riff {
        r if (r as usize) < h.data_at - 4 + data as usize => u32::try_from(bytes.len() - 8).ok()?,
        r => r,
    };
    let fields = [(4, riff.to_le_bytes()), (h.data_at as u64 + 4, data.to_le_bytes())];
    ((riff, data) != (h.riff, h.data)).then_some(fields)
}

/// The sizes the demuxer reads in place of the file's: an unfinished WAV's ([`unfinished_wav`]; gapless),
/// an AIFF's sound chunk's ([`aiff::sizes`]).
fn overlay(bytes: &[u8], gapless: bool) -> Option<[Field; 2]> {
    if !gapless {
        return None;
    }
    unfinished_wav(bytes).or_else(|| aiff::sizes(bytes))
}

/// The encoded bytes as the demuxer reads them, with the sizes of [`overlay`] in place of the header's
/// (their bytes overlaid as they are read): the rest as they are, not copied.
struct Overlaid(Cursor<SharedBytes>, [Field; 2]);

impl Read for Overlaid {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let at = self.0.position();
        let n = self.0.read(buf)?;
        for (field, value) in self.1 {
            for (byte, b) in (field..).zip(value) {
                if let Some(slot) = byte.checked_sub(at).and_then(|i| buf[..n].get_mut(i as usize)) {
                    *slot = b;
                }
            }
        }
        Ok(n)
    }
}

impl Seek for Overlaid {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.0.seek(pos)
    }
}

impl MediaSource for Overlaid {
    fn is_seekable(&self) -> bool {
        true
    }

    fn byte_len(&self) -> Option<u64> {
        Some(self.0.get_ref().as_ref().len() as u64)
    }
}

/// A PCM WAV whose `fmt ` block align is not its channels x bytes a sample: symphonia counts its frames
/// as the data's length over that align, so a damaged one (4 for 16-bit mono) cut the recording to half
/// or less, silently, where libsndfile reads it whole.
fn wav_align_mismatch(bytes: &[u8]) -> Option<String> {
    if bytes.len() < 12 || &bytes[0..4] != b"RIFF" || &bytes[8..12] != b"WAVE" {
        return None;
    }
    let word = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]) as u64;
    let mut at = 12;
    while at + 8 <= bytes.len() {
        let size = u32::from_le_bytes([bytes[at + 4], bytes[at + 5], bytes[at + 6], bytes[at + 7]]);
        if &bytes[at..at + 4] == b"fmt " && at + 24 <= bytes.len() {
            let (format, channels, align, bits) = (word(at + 8), word(at + 10), word(at + 20), word(at + 22));
            let expected = channels * bits.div_ceil(8);
            let pcm = matches!(format, 1 | 3 | 6 | 7 | 0xFFFE);
            return (pcm && expected > 0 && align != expected).then(|| {
                format!("decode: a WAV whose block align ({align} bytes) is not its {channels} channel(s) x {bits} bits ({expected} bytes): a damaged header")
            });
        }
        at = at.saturating_add(8 + size as usize + (size as usize & 1));
    }
    None
}

/// Open `bytes`' stream, its header read with the sizes of `overlay` ([`overlay`]); the formats of
/// revision 5 on read where `new` (gapless: `formats`).
fn open_stream(bytes: &SharedBytes, overlay: Option<[Field; 2]>, new: bool) -> Result<Opened, AudioError> {
    if bytes.as_ref().is_empty() {
        return Err(AudioError::new("decode: empty input (0 bytes)"));
    }
    if let Some(why) = wav_align_mismatch(bytes.as_ref()) {
        return Err(AudioError::new(why));
    }
    let source: Box<dyn MediaSource> = match overlay {
        None => Box::new(Cursor::new(bytes.clone())),
        Some(fields) => Box::new(Overlaid(Cursor::new(bytes.clone()), fields)),
    };
    let mss = MediaSourceStream::new(source, MediaSourceStreamOptions::default());
    let fmt_opts = FormatOptions { enable_gapless: false, ..Default::default() };
    // A header symphonia cannot take panics in it (a WAV of sample rate 0: "TimeBase cannot have 0
    // numerator"), which stopped a training run at that row for good and was a traceback in prepare.
    let probed = quietly(|| formats::probe(new).format(&Hint::new(), mss, &fmt_opts, &MetadataOptions::default()))
        .map_err(|panic| AudioError::new(format!("decode: the container's header cannot be read ({panic})")))?
        .map_err(|e| match bytes.as_ref().get(..4) {
            // A WAV past 4 GB's form, which symphonia does not read: "unrecognised container: end of stream"
            Some(b"RF64") => AudioError::new("decode: an RF64 WAV (a WAV past 4 GB's form) is not read: convert it to FLAC"),
            // libsndfile and ffmpeg read it; "unrecognised container" sent one looking for another cause.
            _ if mp3_frames::is_free_format(bytes.as_ref()) => AudioError::new(
                "decode: a free-format MP3 (bit-rate index 0) is not read: re-encode it at a standard bit rate",
            ),
            _ => sym_err("decode: unrecognised container", e),
        })?;
    let format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| t.codec_params.codec != CODEC_TYPE_NULL && t.codec_params.sample_rate.is_some())
        .ok_or_else(|| AudioError::new("decode: no audio track with a known sample rate"))?;
    let params = &track.codec_params;
    let sample_rate = params.sample_rate.unwrap_or(0);
    if sample_rate == 0 {
        return Err(AudioError::new("decode: sample rate 0"));
    }
    let codecs = formats::codecs(new);
    // A codec no decoder here reads was "unknown" in the error ("cannot open codec unknown").
    let codec_name = codecs.get_codec(params.codec).map(|d| d.short_name).unwrap_or(match params.codec {
        CODEC_TYPE_OPUS => "Opus (convert it to FLAC or Ogg Vorbis)",
        CODEC_TYPE_ADPCM_IMA_WAV | CODEC_TYPE_ADPCM_IMA_QT | CODEC_TYPE_ADPCM_MS => "ADPCM (convert it to FLAC or PCM WAV)",
        _ => "unknown",
    });
    let decoder = PooledDecoder(Some(match take_cached_decoder(params) {
        Some(d) => d,
        None => codecs
            .make(params, &DecoderOptions { verify: false })
            .map_err(|e| sym_err(&format!("decode: cannot open codec {codec_name}"), e))?,
    }));
    // Vorbis identification header: byte 28 holds blocksize_0 (low nibble) and blocksize_1 (high
    // nibble) exponents. One long block of pre-roll covers the packet a seek lands in.
    let vorbis_long_block = if codec_name == "vorbis" {
        params
            .extra_data
            .as_deref()
            .filter(|x| x.len() > 28 && x[0] == 1 && &x[1..7] == b"vorbis")
            .map(|x| 1u64 << (x[28] >> 4).clamp(6, 13))
    } else {
        None
    };
    Ok(Opened {
        track_id: track.id,
        sample_rate,
        channels: params.channels.map(|c| c.count()).unwrap_or(0),
        // A streamed WAV (ffmpeg to a pipe) writes 0xFFFFFFFF as its data size: a length it does not know,
        // read as 2^31 frames (prepare's check refused it; the window past its end read as zeros). Its
        // frames are what its data holds to the file's end: without them every crop of an hour-long one
        // decoded it from its start (2 s a batch of 4, against 26 ms with its header whole).
        n_frames: match streamed_wav_frames(bytes.as_ref()) {
            None => params.n_frames,
            Some(frames) => frames,
        },
        start_ts: params.start_ts,
        codec_name,
        time_base: params.time_base,
        vorbis_long_block,
        delay: params.delay.unwrap_or(0) as u64,
        padding: params.padding.unwrap_or(0) as u64,
        decoder,
        format,
    })
}

/// Packets in a row of a new format that make an MP3 two recordings joined ([`count_frames`]): random
/// bytes give one now and then, of any format, where the demuxer syncs to them.
const CHANGED_AFTER: usize = 8;

/// The frames of `track` in the stream, summed from its packets' durations (the demuxer parses each
/// frame's header and skips its data: no decoding); None where a packet cannot be read. `mp3_format`:
/// layer III packets of another rate or channel count than the first, [`CHANGED_AFTER`] in a row, are
/// another recording's (`mp3_frames::changes`); fewer, a false sync in damaged data (a packet that
/// fails to decode, counted as before: random bytes after a file's frames were refused as a join).
fn count_frames(format: &mut dyn FormatReader, track: u32, mp3_format: bool) -> Result<Option<u64>, AudioError> {
    // `run`: the format of the packets in a row that differ from the first's, and where they began.
    let (mut frames, mut k, mut first, mut run) = (0u64, 0usize, None, None);
    loop {
        match format.next_packet() {
            Ok(p) if p.track_id() == track => {
                match (first, mp3_frames::frame_format(p.buf()).filter(|_| mp3_format)) {
                    (None, now) => first = now,
                    (Some(was), Some(now)) if was != now => {
                        let from = match run {
                            Some((f, from)) if f == now => from,
                            _ => k,
                        };
                        run = Some((now, from));
                        if k + 1 - from == CHANGED_AFTER {
                            return Err(AudioError::new(mp3_frames::changes(was, now, from)));
                        }
                    }
                    _ => run = None,
                }
                (frames, k) = (frames + p.dur, k + 1);
            }
            Ok(_) => {}
            Err(e) if is_end_of_stream(&e) => return Ok((frames > 0).then_some(frames)),
            Err(_) => return Ok(None),
        }
    }
}

impl AudioReader {
    /// [`open_as`](Self::open_as) trimmed as the default options say (`LoaderOptions::gapless`).
    pub fn open(data: impl AsRef<[u8]> + Send + Sync + 'static) -> Result<Self, AudioError> {
        Self::open_as(data, LoaderOptions::default().gapless)
    }

    /// Probe the container and open the first audio track's decoder. `gapless`: an MP3's and a Vorbis
    /// stream's frames are the recording's (see [`trim`]); off, the decoder's whole output, as
    /// birdjepa read them before the option (what a run recorded then trained on).
    pub fn open_as(data: impl AsRef<[u8]> + Send + Sync + 'static, gapless: bool) -> Result<Self, AudioError> {
        let mut bytes = SharedBytes(Arc::new(data));
        // A FLAC's tags after its frames: every open and seek reads the frames alone (off, as before).
        let end = if gapless { flac_frames_end(bytes.as_ref()) } else { bytes.as_ref().len() };
        if end < bytes.as_ref().len() {
            bytes = SharedBytes(Arc::new(Head(bytes, end)));
        }
        // An unfinished WAV's sizes: every open reads them in place of its header's (off, as before).
        let overlay = overlay(bytes.as_ref(), gapless);
        let mut o = open_stream(&bytes, overlay, gapless)?;
        let (mut mp3, mut from, mut tag_midway) = (None, 0, false);
        if o.codec_name == "mp3" {
            // Without a Xing/Info header (common at a constant bit rate) symphonia estimates the length
            // from the first frame's bit rate: off by frames for a variable rate. Count the frames from
            // their headers instead (`mp3_frames`); where that scan fails, from the demuxer's packets.
            mp3 = mp3_frames::scan(bytes.as_ref(), gapless).map(Arc::new);
            match &mp3 {
                Some(frames) if gapless => {
                    // The stream starts at its first audio frame, as the windows do, and its header
                    // frame's tag is read there (a CRC-protected stream's was decoded as audio by the
                    // demuxer, its delay kept, and its windows and whole decode were a frame apart). A
                    // stream cut short of the frames its tag counts keeps its last samples: the
                    // padding is the tag's last frame's.
                    from = frames.offsets[0];
                    o = open_stream(&SharedBytes(Arc::new(Tail(bytes.clone(), from))), None, gapless)?;
                    let n = frames.offsets.len() as u64;
                    (o.delay, o.padding) = frames.tag.map_or((0, 0), |tag| tag.trim(n));
                    o.n_frames = Some(frames.n_samples());
                }
                Some(frames) => o.n_frames = Some(frames.n_samples()),
                None => {
                    // Not indexed (cut mid-frame, or bytes after its frames): read gapless as above, from
                    // the frame after the header frame, counted by the demuxer.
                    let lead = mp3_frames::leading_tag(bytes.as_ref()).filter(|_| gapless);
                    from = lead.map_or(0, |(_, next, _)| next);
                    if from >= bytes.as_ref().len() && lead.is_some() {
                        return Err(AudioError::new("decode (mp3): no audio frames (only its Xing/Info header frame)"));
                    }
                    let reopened = || match from {
                        0 => open_stream(&bytes, overlay, gapless),
                        _ => open_stream(&SharedBytes(Arc::new(Tail(bytes.clone(), from))), None, gapless),
                    };
                    if from > 0 {
                        o = reopened()?;
                    }
                    // The demuxer drops a header frame midway that its seek counts: windows decode from
                    // the start there (joined files, the second behind a tag the index cannot pass).
                    tag_midway = gapless && mp3_frames::tag_past_first_frame(bytes.as_ref());
                    let counted = count_frames(&mut *o.format, o.track_id, gapless)?;
                    o = reopened()?;
                    o.n_frames = counted;
                    if let Some((tag, _, spf)) = lead {
                        // A count that is no whole number of frames is none of the tag's.
                        let n = counted.filter(|c| c % spf == 0).map_or(u64::MAX, |c| c / spf);
                        (o.delay, o.padding) = tag.trim(n);
                    }
                }
            }
        }
        if let Some(why) = joined::second_recording(o.codec_name, bytes.as_ref()).filter(|_| gapless) {
            return Err(AudioError::new(why));
        }
        if matches!(o.codec_name, "aac" | "alac") {
            // An M4A (read gapless alone: `formats`): its edit list's priming and end padding dropped.
            // Its packets' timestamps are in its media timescale, taken here for frames.
            if o.time_base != Some(TimeBase::new(1, o.sample_rate)) {
                return Err(AudioError(format!(
                    "decode ({}): an M4A whose timescale ({:?}) is not its sample rate ({}) is not read",
                    o.codec_name, o.time_base, o.sample_rate
                )));
            }
            // A fragmented M4A (`-movflags frag_keyframe+empty_moov`, DASH, some recorders) keeps its
            // samples in movie fragments and says 0 in its movie header, which symphonia takes for the
            // length: it decoded to nothing, refused as "no audio frames (0 packets failed to decode)".
            if o.n_frames == Some(0) {
                return Err(AudioError(format!(
                    "decode ({}): a fragmented M4A (its samples in movie fragments) is not read: remux it \
                     (ffmpeg -i IN -c copy OUT.m4a) or convert it to FLAC",
                    o.codec_name
                )));
            }
            let edit = mp4_edits::track_edit(bytes.as_ref(), o.track_id as usize).map_err(AudioError)?;
            let n = o.n_frames.unwrap_or(0);
            (o.delay, o.padding) = edit.map_or((0, 0), |e| (e.lead, n.saturating_sub(e.lead + e.len)));
        }
        // WAV, AIFF and FLAC decode exactly what they hold: only MP3, Vorbis and M4A are trimmed.
        let (lead, end) = match o.codec_name {
            "mp3" | "vorbis" | "aac" | "alac" if gapless => trim(o.delay, o.padding, o.n_frames),
            _ => (0, None),
        };
        o.n_frames = end.or(o.n_frames);
        // Not AAC: its decoder's noise (PNS) draws from a generator that runs on from the stream's start,
        // so a window decoded from a seek differs from the whole decode's; its windows decode from the start.
        let seekable_codec = matches!(o.codec_name, "flac" | "vorbis" | "mp3" | "alac") || o.codec_name.starts_with("pcm");
        let can_seek = seekable_codec && o.n_frames.is_some_and(|n| n > 0) && !tag_midway;
        let seek_margin = match o.codec_name {
            "flac" | "alac" => 0, // frames that decode alone
            n if n.starts_with("pcm") => 0,
            "vorbis" => o.vorbis_long_block.unwrap_or(DEFAULT_MARGIN),
            _ => DEFAULT_MARGIN,
        };
        Ok(AudioReader {
            bytes,
            format: o.format,
            decoder: o.decoder,
            track_id: o.track_id,
            sample_rate: o.sample_rate,
            channels: o.channels,
            n_frames: o.n_frames,
            start_ts: o.start_ts,
            can_seek,
            seek_margin,
            codec_name: o.codec_name,
            packet_errors: 0,
            seek_retries: 0,
            fallbacks: 0,
            fresh: true,
            mp3,
            from,
            overlay,
            gapless,
            ts_base: 0,
            lead,
            end,
        })
    }

    /// `(sample_rate, channels, n_frames)` as the container reports them.
    pub fn info(&self) -> StreamInfo {
        (self.sample_rate, self.channels, self.n_frames)
    }

    /// Symphonia's short codec name ("vorbis", "flac", "mp3", "pcm_s16le", ...).
    pub fn codec_name(&self) -> &'static str {
        self.codec_name
    }

    /// Whether [`read_window_mono`](Self::read_window_mono) seeks (length known, codec seeks exactly).
    pub fn can_seek(&self) -> bool {
        self.can_seek
    }

    /// Packets skipped because they failed to decode, so far.
    pub fn packet_errors(&self) -> usize {
        self.packet_errors
    }

    /// `(seek retries, fallbacks to a decode from the start)` so far.
    pub fn seek_stats(&self) -> (usize, usize) {
        (self.seek_retries, self.fallbacks)
    }

    fn reopen(&mut self) -> Result<(), AudioError> {
        if self.fresh {
            return Ok(());
        }
        let o = match self.from {
            0 => open_stream(&self.bytes, self.overlay, self.gapless)?,
            from => open_stream(&SharedBytes(Arc::new(Tail(self.bytes.clone(), from))), None, self.gapless)?,
        };
        self.format = o.format;
        self.decoder = o.decoder;
        self.track_id = o.track_id;
        self.ts_base = 0;
        self.fresh = true;
        Ok(())
    }

    /// The next packet of our track, or None at the end of the stream.
    fn next_packet(&mut self) -> Result<Option<Packet>, AudioError> {
        loop {
            match self.format.next_packet() {
                Ok(p) if p.track_id() == self.track_id => return Ok(Some(p)),
                Ok(_) => continue,
                Err(e) if is_end_of_stream(&e) => return Ok(None),
                Err(e) => return Err(sym_err(&format!("decode ({}): reading packet", self.codec_name), e)),
            }
        }
    }

    /// Decode one packet; None for a packet that renders nothing or fails to decode (counted in
    /// `packet_errors` and skipped, as players do).
    fn decode_packet(&mut self, packet: &Packet) -> Result<Option<AudioBufferRef<'_>>, AudioError> {
        match self.decoder.decode(packet) {
            Ok(d) if d.frames() > 0 => Ok(Some(d)),
            Ok(_) => Ok(None),
            Err(SymError::DecodeError(_)) => {
                self.packet_errors += 1;
                Ok(None)
            }
            Err(e) => Err(sym_err(&format!("decode ({}): packet", self.codec_name), e)),
        }
    }

    /// Decode the whole stream from its start into mono (reopening the stream if it was read before).
    /// Decoded buffers are concatenated in packet order. Errors if no frame was decoded.
    pub fn read_all_mono(&mut self) -> Result<Vec<f32>, AudioError> {
        // Reserve from the container length, capped so a corrupt header cannot reserve gigabytes.
        let mut out: Vec<f32> = Vec::with_capacity(self.n_frames.unwrap_or(0).min(1 << 22) as usize);
        self.for_each_mono(|chunk, _| out.extend_from_slice(chunk))?;
        Ok(out)
    }

    /// Every frame of the stream from its start, mixed to mono a packet at a time into one reused
    /// buffer: `f(frames, index of the first)`. Returns the frame count. What reads a whole recording
    /// once holds a packet, not the recording (an hour of 48 kHz is 690 MB of samples).
    pub fn for_each_mono(&mut self, mut f: impl FnMut(&[f32], u64)) -> Result<u64, AudioError> {
        let (mut buf, mut n) = (Vec::new(), 0u64);
        self.for_each_decoded(|decoded, skip, len| {
            buf.clear();
            buf.resize(len, 0.0);
            mix_to_mono(decoded, skip, &mut buf);
            f(&buf, n);
            n += len as u64;
        })?;
        Ok(n)
    }

    /// The stream's length in frames, as the loader's crops see it: the container's count where the
    /// stream seeks and its last reported frame decodes (one seek), else every frame decoded and
    /// counted, none kept (an hour's samples are 460 MB at 32 kHz).
    pub fn length(&mut self) -> Result<u64, AudioError> {
        if let Some(n) = self.n_frames.filter(|_| self.can_seek) {
            if self.read_window_mono(n - 1, &mut [0.0]).is_ok() {
                return Ok(n);
            }
        }
        let mut n = 0u64;
        self.for_each_decoded(|_, _, len| n += len as u64)?;
        Ok(n)
    }

    /// Every decoded packet of the stream from its start, in order, as `f(packet, skip, len)`: its
    /// frames `[skip, skip + len)` are the stream's (the decoder's output less the stream's `lead` and
    /// what follows its `end`; a packet none of whose frames are is not passed). An error where no
    /// packet decodes.
    fn for_each_decoded(&mut self, mut f: impl FnMut(&AudioBufferRef<'_>, usize, usize)) -> Result<(), AudioError> {
        self.reopen()?;
        self.fresh = false;
        let (lead, stop) = (self.lead, self.end.map(|n| self.lead + n));
        let (mut any, mut at) = (false, 0u64); // `at`: the decoder's frames so far
        while let Some(packet) = self.next_packet()? {
            if stop.is_some_and(|stop| at >= stop) {
                break;
            }
            let Some(decoded) = self.decode_packet(&packet)? else { continue };
            any = true;
            let n = decoded.frames() as u64;
            let lo = at.max(lead);
            let hi = stop.map_or(at + n, |stop| (at + n).min(stop));
            if lo < hi {
                f(&decoded, (lo - at) as usize, (hi - lo) as usize);
            }
            at += n;
        }
        if !any {
            return Err(AudioError(format!(
                "decode ({}): no audio frames ({} packets failed to decode)",
                self.codec_name, self.packet_errors
            )));
        }
        Ok(())
    }

    /// Mono frames `[start, start + out.len())` of the stream into `out`; frames past the end are 0.0.
    /// Seeks when [`can_seek`](Self::can_seek); otherwise decodes the stream from its start.
    pub fn read_window_mono(&mut self, start: u64, out: &mut [f32]) -> Result<(), AudioError> {
        out.fill(0.0);
        if out.is_empty() {
            return Ok(());
        }
        let errors_before = self.packet_errors;
        if !self.can_seek {
            // Decode from the beginning; stop once past the window.
            self.reopen()?;
            let w = self.decode_into(None, start, out)?;
            return self.check_window(&w, start, out.len(), errors_before);
        }
        if self.n_frames.is_some_and(|n| start >= n) {
            return Ok(());
        }
        let mut margin = self.seek_margin;
        for _ in 0..SEEK_TRIES {
            // The margin before the window's first frame as the decoder renders it (its `lead` of delay
            // before the stream's first): a window near the start of a stream of a long delay was
            // sought to its first frame exactly, and its bit reservoir not decoded.
            let from = (start + self.lead).saturating_sub(margin);
            match self.decode_into(Some(from), start, out) {
                Ok(w) if w.covered && w.rendered > 0 => return self.check_window(&w, start, out.len(), errors_before),
                // Overshoot, nothing decodable after the seek point, or a seek failure: widen the
                // margin and retry.
                _ => {
                    out.fill(0.0);
                    self.seek_retries += 1;
                    if from == 0 {
                        break;
                    }
                    margin = (margin * 2).max(DEFAULT_MARGIN);
                }
            }
        }
        // Fallback: decode from the very start of a freshly opened stream.
        out.fill(0.0);
        self.fallbacks += 1;
        self.reopen()?;
        let w = self.decode_into(None, start, out)?;
        self.check_window(&w, start, out.len(), errors_before)
    }

    fn check_window(&self, w: &Window, start: u64, len: usize, errors_before: usize) -> Result<(), AudioError> {
        let errors = self.packet_errors - errors_before;
        if start == 0 && w.stream_end == 0 && !w.stopped_early && errors == 0 {
            // No frame at all (an Ogg of no audio packets, its length unknown): the window was silence
            // and prepare's header check passed a file the loader skips.
            return Err(AudioError(format!("decode ({}): no audio frames", self.codec_name)));
        }
        if w.rendered == 0 && errors > 0 {
            return Err(AudioError(format!(
                "decode ({}): no audio frames in window ({errors} packets failed to decode)",
                self.codec_name
            )));
        }
        if let Some(n) = self.n_frames {
            // The container promised frames here but the stream ended before the window, or inside it
            // (a file cut short under its header: the crop's tail was silence, and the next crop past
            // the cut skipped the record). A codec's last packet may end short of its header's count by
            // a few frames (priming, padding): a stream within `END_SLACK` of that count is whole.
            let end = (start + len as u64).min(n);
            let cut_inside = w.stream_end < end && n - w.stream_end > END_SLACK;
            if (w.stream_end <= start || cut_inside) && start < n && !w.stopped_early {
                return Err(AudioError(format!(
                    "decode ({}): stream ends at frame {} but the container reports {n} frames",
                    self.codec_name, w.stream_end
                )));
            }
            // Frames inside the stream that no packet gave: damaged data the decoder passed over (a
            // FLAC with a MiB overwritten read as silence there, every crop of it kept).
            // Past the stream's end where it ended in the window (a packet after it: the stream went on).
            let past_end = if w.stopped_early { 0 } else { end.saturating_sub(w.stream_end.max(start)) };
            let missing = end.saturating_sub(start).saturating_sub(w.inside);
            if missing > past_end {
                return Err(AudioError(format!(
                    "decode ({}): {} frames of the window at frame {start} did not decode (damaged data)",
                    self.codec_name,
                    missing - past_end
                )));
            }
        }
        Ok(())
    }

    /// Decode packets (after seeking to the decoder's frame `seek_from`, if given) and place them by
    /// timestamp into `out` = frames `[start, start + len)` of the stream; see [`Window`] for what is
    /// returned. The stream's frame `i` is the decoder's `lead + i`.
    fn decode_into(&mut self, seek_from: Option<u64>, start: u64, out: &mut [f32]) -> Result<Window, AudioError> {
        self.fresh = false;
        if let Some(from) = seek_from {
            let first = start + self.lead; // the decoder's frame
            if let Some(frames) = self.mp3.clone() {
                // Open the stream at the frame holding `from`, or before it where the bit reservoir of
                // the frames before `start` reaches further: no frame before it is parsed.
                let spf = frames.samples_per_frame;
                let k = ((from / spf) as usize).min(frames.decode_from((first / spf) as usize));
                let offset = frames.offsets.get(k).copied().unwrap_or(self.bytes.as_ref().len());
                let tail = SharedBytes(Arc::new(Tail(self.bytes.clone(), offset)));
                let o = open_stream(&tail, None, self.gapless)?;
                (self.format, self.decoder, self.track_id) = (o.format, o.decoder, o.track_id);
                self.ts_base = k as u64 * spf;
            } else {
                let to = SeekTo::TimeStamp { ts: self.start_ts + from, track_id: self.track_id };
                self.format
                    .seek(SeekMode::Accurate, to)
                    .map_err(|e| sym_err(&format!("decode ({}): seek to frame {from}", self.codec_name), e))?;
            }
            self.decoder.reset();
        }
        let end = start + out.len() as u64;
        // Frames from the stream's end on (an MP3's padding) are not the stream's.
        let cap = self.end.map_or(i128::MAX, |n| n as i128);
        let mut w = Window { covered: true, rendered: 0, stream_end: 0, stopped_early: false, inside: 0 };
        let mut first = true;
        while let Some(packet) = self.next_packet()? {
            // Position of the packet's first rendered frame relative to the stream start (its `lead`
            // frames of delay are before it).
            let pos = (self.ts_base + packet.ts) as i128 - self.start_ts as i128 - self.lead as i128;
            if pos >= end as i128 && !first {
                w.stopped_early = true;
                break;
            }
            let Some(decoded) = self.decode_packet(&packet)? else { continue };
            let n = decoded.frames();
            if first {
                first = false;
                if seek_from.is_some() && pos > start as i128 {
                    w.covered = false;
                    return Ok(w);
                }
                if pos >= end as i128 {
                    w.stopped_early = true;
                    break;
                }
            }
            w.rendered += n as u64;
            w.stream_end = w.stream_end.max((pos + n as i128).min(cap).max(0) as u64);
            let lo = pos.max(start as i128);
            let hi = (pos + n as i128).min(end as i128).min(cap);
            if lo < hi {
                w.inside += (hi - lo) as u64;
                let skip = (lo - pos) as usize;
                let dst = &mut out[(lo - start as i128) as usize..(hi - start as i128) as usize];
                mix_to_mono(&decoded, skip, dst);
            }
        }
        Ok(w)
    }
}

/// Frames a stream may end short of its container's count and be whole (a codec's priming and padding:
/// an MP3 frame is 1152, an AAC one 1024, a Vorbis block at most 8192 / 2).
const END_SLACK: u64 = 4096;

/// What one windowed decode pass saw.
struct Window {
    /// False when the first rendered frame lies after the window start (seek overshoot).
    covered: bool,
    /// Frames rendered by the decoder in this pass.
    rendered: u64,
    /// One past the last rendered frame position.
    stream_end: u64,
    /// Stopped at a packet past the window (rather than at the end of the stream).
    stopped_early: bool,
    /// Frames of the window that decoded packets covered.
    inside: u64,
}

/// Full decode of one recording: channels averaged to mono, at the native rate, trimmed as the default
/// options say.
pub fn decode_mono(data: impl AsRef<[u8]> + Send + Sync + 'static) -> Result<(Vec<f32>, u32), AudioError> {
    decode_mono_as(data, LoaderOptions::default().gapless)
}

/// [`decode_mono`], trimmed or not (`gapless`, [`AudioReader::open_as`]).
pub fn decode_mono_as(
    data: impl AsRef<[u8]> + Send + Sync + 'static,
    gapless: bool,
) -> Result<(Vec<f32>, u32), AudioError> {
    let mut r = AudioReader::open_as(data, gapless)?;
    let rate = r.sample_rate;
    let samples = r.read_all_mono()?;
    Ok((samples, rate))
}

fn mix_generic<S: Sample + IntoSample<f32>>(buf: &AudioBuffer<S>, skip: usize, dst: &mut [f32]) {
    let n = dst.len();
    let nch = buf.spec().channels.count();
    for (d, &s) in dst.iter_mut().zip(&buf.chan(0)[skip..skip + n]) {
        *d = s.into_sample();
    }
    if nch > 1 {
        for c in 1..nch {
            for (d, &s) in dst.iter_mut().zip(&buf.chan(c)[skip..skip + n]) {
                let v: f32 = s.into_sample();
                *d += v;
            }
        }
        let div = nch as f32;
        for d in dst.iter_mut() {
            *d /= div;
        }
    }
}

/// Average frames `[skip, skip + dst.len())` of a decoded buffer over its channels into `dst`.
fn mix_to_mono(buf: &AudioBufferRef<'_>, skip: usize, dst: &mut [f32]) {
    match buf {
        AudioBufferRef::U8(b) => mix_generic(b.as_ref(), skip, dst),
        AudioBufferRef::U16(b) => mix_generic(b.as_ref(), skip, dst),
        AudioBufferRef::U24(b) => mix_generic(b.as_ref(), skip, dst),
        AudioBufferRef::U32(b) => mix_generic(b.as_ref(), skip, dst),
        AudioBufferRef::S8(b) => mix_generic(b.as_ref(), skip, dst),
        AudioBufferRef::S16(b) => mix_generic(b.as_ref(), skip, dst),
        AudioBufferRef::S24(b) => mix_generic(b.as_ref(), skip, dst),
        AudioBufferRef::S32(b) => mix_generic(b.as_ref(), skip, dst),
        AudioBufferRef::F32(b) => mix_generic(b.as_ref(), skip, dst),
        AudioBufferRef::F64(b) => mix_generic(b.as_ref(), skip, dst),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Little-endian RIFF/WAVE bytes for interleaved 16-bit PCM.
    pub(crate) fn wav_i16(samples: &[i16], channels: u16, rate: u32) -> Vec<u8> {
        let data_len = (samples.len() * 2) as u32;
        let mut v = Vec::with_capacity(44 + data_len as usize);
        v.extend_from_slice(b"RIFF");
        v.extend_from_slice(&(36 + data_len).to_le_bytes());
        v.extend_from_slice(b"WAVEfmt ");
        v.extend_from_slice(&16u32.to_le_bytes());
        v.extend_from_slice(&1u16.to_le_bytes()); // PCM
        v.extend_from_slice(&channels.to_le_bytes());
        v.extend_from_slice(&rate.to_le_bytes());
        v.extend_from_slice(&(rate * channels as u32 * 2).to_le_bytes());
        v.extend_from_slice(&(channels * 2).to_le_bytes());
        v.extend_from_slice(&16u16.to_le_bytes());
        v.extend_from_slice(b"data");
        v.extend_from_slice(&data_len.to_le_bytes());
        for s in samples {
            v.extend_from_slice(&s.to_le_bytes());
        }
        v
    }

    pub(crate) fn fixture(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (run scripts/make_codec_fixtures.py)", path.display()))
    }

    fn fnv1a64(bytes: impl Iterator<Item = u8>) -> u64 {
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    /// Deterministic pseudo-random 16-bit stereo PCM.
    fn pcm_stereo(frames: usize) -> Vec<i16> {
        let mut s = crate::rng::Stream::new(&[99]);
        (0..frames * 2).map(|_| s.next_u64() as i16).collect()
    }

    #[test]
    fn wav_decodes_to_exact_pcm_mono_mix() {
        let pcm = pcm_stereo(10_000);
        let (mono, rate) = decode_mono(wav_i16(&pcm, 2, 22_050)).unwrap();
        assert_eq!(rate, 22_050);
        assert_eq!(mono.len(), 10_000);
        for (i, m) in mono.iter().enumerate() {
            let want = (pcm[2 * i] as f32 / 32768.0 + pcm[2 * i + 1] as f32 / 32768.0) / 2.0;
            assert_eq!(m.to_bits(), want.to_bits(), "frame {i}");
        }
        let mono_pcm: Vec<i16> = pcm.iter().step_by(2).copied().collect();
        let (m1, _) = decode_mono(wav_i16(&mono_pcm, 1, 8000)).unwrap();
        assert!(m1.iter().zip(&mono_pcm).all(|(a, &b)| *a == b as f32 / 32768.0));
    }

    #[test]
    fn a_header_symphonia_panics_on_is_an_error_not_a_panic() {
        // The fmt chunk's sample rate (byte 24) set to 0: "TimeBase cannot have 0 numerator" in the probe.
        let mut bytes = wav_i16(&[0, 1, 2, 3], 1, 32_000);
        bytes[24..28].copy_from_slice(&0u32.to_le_bytes());
        let e = decode_mono(bytes).unwrap_err().to_string();
        assert!(e.starts_with("decode: the container's header cannot be read ("), "{e}");
    }

    #[test]
    fn a_wav_whose_block_align_lies_is_an_error_not_a_recording_cut_short() {
        // Block align (byte 32) 4 for 16-bit mono: 48 of 96 frames decoded, the rest gone without a word.
        let mut bytes = wav_i16(&[7; 96], 1, 32_000);
        assert_eq!(decode_mono(bytes.clone()).unwrap().0.len(), 96);
        bytes[32..34].copy_from_slice(&4u16.to_le_bytes());
        let e = decode_mono(bytes).unwrap_err().to_string();
        assert!(e.starts_with("decode: a WAV whose block align (4 bytes) is not its 1 channel(s) x 16 bits (2 bytes)"), "{e}");
    }

    #[test]
    fn wav_windows_equal_full_decode_and_pad_with_zeros() {
        let pcm = pcm_stereo(50_000);
        let bytes = wav_i16(&pcm, 2, 44_100);
        let (full, _) = decode_mono(bytes.clone()).unwrap();
        let mut r = AudioReader::open(bytes).unwrap();
        assert!(r.can_seek());
        assert_eq!(r.info(), (44_100, 2, Some(50_000)));
        for &(start, len) in &[(0u64, 1000usize), (12_345, 7_000), (49_000, 3_000), (60_000, 10), (1, 49_999)] {
            let mut w = vec![1.0f32; len];
            r.read_window_mono(start, &mut w).unwrap();
            for (j, v) in w.iter().enumerate() {
                let i = start as usize + j;
                let want = if i < full.len() { full[i] } else { 0.0 };
                assert_eq!(v.to_bits(), want.to_bits(), "start {start} j {j}");
            }
        }
    }

    #[test]
    fn flac_decodes_to_the_pcm_written_by_soundfile() {
        let meta = String::from_utf8(fixture("birds_44k_stereo.flac.mono_f32.txt")).unwrap();
        let (mono, rate) = decode_mono(fixture("birds_44k_stereo.flac")).unwrap();
        assert_eq!(rate, 44_100);
        let hash = fnv1a64(mono.iter().flat_map(|x| x.to_le_bytes()));
        assert_eq!(meta.trim(), format!("frames={} fnv1a64={hash:016x}", mono.len()));
    }

    /// `n` windows `(start < max_start, 1000 <= len < 1000 + max_len)` drawn from `seed`.
    fn random_windows(seed: u64, n: usize, max_start: u64, max_len: u64) -> Vec<(u64, usize)> {
        let mut s = crate::rng::Stream::new(&[seed]);
        (0..n).map(|_| (s.below(max_start), 1000 + s.below(max_len) as usize)).collect()
    }

    fn check_windows_equal_full(name: &str, windows: &[(u64, usize)]) {
        check_bytes_windows_equal_full(name, fixture(name), windows);
    }

    fn check_bytes_windows_equal_full(name: &str, bytes: Vec<u8>, windows: &[(u64, usize)]) {
        let (full, _) = decode_mono(bytes.clone()).unwrap();
        let mut r = AudioReader::open(bytes.clone()).unwrap();
        assert!(r.can_seek(), "{name} ({}) should seek", r.codec_name());
        let n = r.info().2.unwrap();
        eprintln!("{name}: container frames {n}, full decode {}", full.len());
        assert!((n as i64 - full.len() as i64).abs() <= 4096, "{name}: container length {n} vs decoded {}", full.len());
        for &(start, len) in windows {
            // Fresh reader and reused reader must agree with the full decode.
            let mut fresh = AudioReader::open(bytes.clone()).unwrap();
            let mut a = vec![0.0f32; len];
            let mut b = vec![0.0f32; len];
            fresh.read_window_mono(start, &mut a).unwrap();
            r.read_window_mono(start, &mut b).unwrap();
            for j in 0..len {
                let i = start as usize + j;
                let want = if i < full.len() { full[i] } else { 0.0 };
                assert_eq!(a[j].to_bits(), want.to_bits(), "{name}: fresh window at {start}, frame {i}");
                assert_eq!(b[j].to_bits(), want.to_bits(), "{name}: reused window at {start}, frame {i}");
            }
            // The window came from a seek (or, at the start, a plain forward decode): no fallback.
            assert_eq!(fresh.seek_stats(), (0, 0), "{name}: window at {start} needed retries/fallback");
        }
        assert_eq!(r.seek_stats(), (0, 0), "{name}: reused reader needed retries/fallback");
    }

    #[test]
    fn flac_seek_windows_equal_full_decode() {
        check_windows_equal_full(
            "birds_44k_stereo.flac",
            &[(0, 5000), (4095, 3), (4096, 10_000), (30_001, 20_000), (60_000, 10_000), (1, 66_149)],
        );
        check_windows_equal_full("birds_22k_mono_short.flac", &[(0, 33_075), (10_000, 50_000)]);
    }

    #[test]
    fn a_flac_with_a_tag_after_its_frames_decodes_its_last_frame() {
        // An ID3v1 tag, or an APEv2 tag then an ID3v1, after the last frame: the demuxer read the tags
        // as part of that frame, whose CRC then failed, and dropped it (65_536 of 66_150 frames decoded,
        // the crops there counted skips "cut short").
        let mut id3v1 = b"TAG".to_vec();
        id3v1.resize(128, b' ');
        for name in ["birds_44k_stereo.flac", "birds_22k_mono_short.flac"] {
            let bare = fixture(name);
            let (want, _) = decode_mono(bare.clone()).unwrap();
            let n = AudioReader::open(bare.clone()).unwrap().info().2.unwrap();
            assert_eq!(want.len() as u64, n, "{name}: the untagged file decodes whole");
            for tag in [id3v1.clone(), [crate::audio::tags::tests::ape_tag(true), id3v1.clone()].concat()] {
                let tagged = [&bare[..], &tag].concat();
                let mut r = AudioReader::open(tagged).unwrap();
                let all = r.read_all_mono().unwrap();
                assert_eq!(all.len(), want.len(), "{name} + {} tag bytes: the whole decode's frames", tag.len());
                assert!(all == want, "{name} + {} tag bytes: the whole decode", tag.len());
                assert_eq!((r.packet_errors(), r.length().unwrap()), (0, n), "{name} + {} tag bytes", tag.len());
                // A window over the last frame's end and past it, sought: the whole decode's, then zeros.
                let mut w = vec![1f32; 300];
                r.read_window_mono(n - 200, &mut w).unwrap();
                assert_eq!(w[..200], want[n as usize - 200..], "{name} + {} tag bytes: the window", tag.len());
                assert!(w[200..].iter().all(|&x| x == 0.0));
                assert_eq!(r.seek_stats(), (0, 0), "{name}: the window was sought");
            }
        }
        // Without gapless it is read as before the option (what a run recorded then read): its last frame
        // dropped.
        let tagged = [fixture("birds_44k_stereo.flac"), id3v1].concat();
        assert_eq!(decode_mono_as(tagged, false).unwrap().0.len(), 65_536);
    }

    #[test]
    fn a_flac_whose_last_frame_ends_in_bytes_like_a_tag_keeps_them() {
        // The last frame's own bytes 128 from its end read "TAG" (its CRC-16 set to match): no tag to cut.
        let mut bytes = fixture("birds_44k_stereo.flac");
        let k = bytes.len();
        let header = |f: usize| bytes[f] == 0xFF && bytes[f + 1] & 0xFE == 0xF8 && flac_header_checks(&bytes[f..]);
        let last = (0..k - 1).rev().find(|&f| header(f)).unwrap(); // the last frame's first byte
        bytes[k - 128..k - 125].copy_from_slice(b"TAG");
        let mut crc = Crc16Ansi::new(0);
        crc.process_buf_bytes(&bytes[last..k - 2]);
        bytes[k - 2..].copy_from_slice(&crc.crc().to_be_bytes());
        assert_eq!(tags::trailing(&bytes), 128);
        assert_eq!(flac_frames_end(&bytes), k);
        let mut r = AudioReader::open(bytes).unwrap();
        let n = r.info().2.unwrap();
        assert_eq!(r.read_all_mono().unwrap().len() as u64, n);
        assert_eq!(r.packet_errors(), 0);
    }

    #[test]
    fn ogg_vorbis_seek_windows_equal_full_decode() {
        check_windows_equal_full(
            "birds_48k_stereo.ogg",
            &[(0, 4000), (100, 1000), (2047, 3000), (70_001, 100_000), (240_000, 200_000), (383_000, 2000)],
        );
        check_windows_equal_full("birds_44k_stereo_30s.ogg", &random_windows(5, 12, 30 * 44_100, 250_000));
    }

    #[test]
    fn vorbis_seek_overshoot_is_retried_with_a_wider_margin() {
        let bytes = fixture("birds_48k_stereo.ogg");
        let (full, _) = decode_mono(bytes.clone()).unwrap();
        let mut r = AudioReader::open(bytes).unwrap();
        // Without pre-roll the first packet after a seek renders nothing, so the seek overshoots.
        r.seek_margin = 0;
        let mut w = vec![0f32; 10_000];
        r.read_window_mono(200_000, &mut w).unwrap();
        assert_eq!(w, &full[200_000..210_000]);
        let (retries, fallbacks) = r.seek_stats();
        assert!(retries >= 1 && fallbacks == 0, "retries {retries} fallbacks {fallbacks}");
    }

    #[test]
    fn length_is_the_decoded_frame_count_a_cut_file_included() {
        for name in ["birds_22k_mono_short.flac", "birds_32k_mono.mp3", "birds_32k_mono_cbr.mp3",
                     "birds_44k_stereo.flac", "birds_44k_stereo_30s.ogg", "birds_48k_stereo.ogg"] {
            let (all, _) = decode_mono(fixture(name)).unwrap();
            let n = AudioReader::open(fixture(name)).unwrap().length().unwrap();
            assert_eq!(n, all.len() as u64, "{name}");
        }
        let mut cut = wav_i16(&pcm_stereo(50_000), 2, 16_000);
        cut.truncate(44 + 20_000 * 4); // the header still claims 50_000 frames
        assert_eq!(AudioReader::open(cut).unwrap().length().unwrap(), 20_000);
    }

    #[test]
    fn a_window_over_damaged_data_is_an_error_not_silence() {
        // A FLAC with bytes overwritten mid-file: the decoder passes over the damaged frames, and the
        // crops there read as silence, every one kept (prepare's default check reads the header only).
        let whole = fixture("birds_44k_stereo.flac");
        let mut damaged = whole.clone();
        let (mid, mut x) = (damaged.len() / 2, 0x9E37_79B9_7F4A_7C15u64);
        for b in &mut damaged[mid..mid + 20_000] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8; // random bytes, as the helper's 1 MiB of an hour-long file
        }
        let n = AudioReader::open(whole.clone()).unwrap().info().2.unwrap();
        let (mut good, mut bad) = (AudioReader::open(whole).unwrap(), AudioReader::open(damaged).unwrap());
        let mut failed = 0;
        for start in (0..n - 4410).step_by(4410) {
            let (mut want, mut got) = (vec![0f32; 4410], vec![0f32; 4410]);
            good.read_window_mono(start, &mut want).unwrap();
            match bad.read_window_mono(start, &mut got) {
                Ok(()) => assert!(got == want, "window at {start}: read otherwise, without a word"),
                Err(e) => {
                    assert!(e.0.contains("did not decode (damaged data)") || e.0.contains("failed"), "{e}");
                    failed += 1;
                }
            }
        }
        assert!(failed > 0);
    }

    #[test]
    fn a_wav_written_to_a_pipe_knows_its_length_and_seeks() {
        // Sizes 0xFFFFFFFF: its length unknown, every crop of an hour-long one decoded it from its start.
        let pcm = pcm_stereo(50_000);
        let whole = wav_i16(&pcm, 2, 16_000);
        let mut streamed = whole.clone();
        streamed[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        streamed[40..44].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut r = AudioReader::open(streamed).unwrap();
        assert_eq!((r.info().2, r.can_seek()), (Some(50_000), true));
        let mut expect = AudioReader::open(whole).unwrap();
        for start in [0u64, 30_000, 49_500] {
            let (mut got, mut want) = (vec![0f32; 1000], vec![0f32; 1000]);
            r.read_window_mono(start, &mut got).unwrap();
            expect.read_window_mono(start, &mut want).unwrap();
            assert_eq!(got, want, "window at {start}");
        }
        assert_eq!(r.fallbacks, 0); // each window sought, none decoded from the start
    }

    /// A sine of `frames` 16-bit frames, each channel at its own pitch, as a finished WAV writes it.
    fn sine_wav(frames: usize, channels: u16) -> Vec<u8> {
        let pcm: Vec<i16> = (0..frames * channels as usize)
            .map(|k| {
                let (i, c) = (k / channels as usize, k % channels as usize);
                ((i as f32 * 0.0345 * (c + 1) as f32).sin() * 12_000.0) as i16
            })
            .collect();
        wav_i16(&pcm, channels, 16_000)
    }

    /// `wav` with its RIFF size and its `data` chunk's (at byte 36: [`wav_i16`]'s header) said as given.
    fn with_sizes(wav: &[u8], riff: u32, data: u32) -> Vec<u8> {
        let mut v = wav.to_vec();
        v[4..8].copy_from_slice(&riff.to_le_bytes());
        v[40..44].copy_from_slice(&data.to_le_bytes());
        v
    }

    /// Every frame of `bytes` read gapless, the whole decode and the windows a crop seeks to alike (each
    /// checked to be sought, not decoded from the start); and the length.
    fn read_gapless(bytes: Vec<u8>) -> (Vec<f32>, u64) {
        let mut r = AudioReader::open(bytes).unwrap();
        let all = r.read_all_mono().unwrap();
        let n = r.info().2.unwrap();
        assert!(r.can_seek() && n == all.len() as u64 && r.length().unwrap() == n);
        for start in [0, n / 3, n.saturating_sub(500)] {
            let mut w = vec![1f32; 1000];
            r.read_window_mono(start, &mut w).unwrap();
            let there = (n - start).min(1000) as usize;
            assert!(w[..there] == all[start as usize..start as usize + there], "window at {start}");
            assert!(w[there..].iter().all(|&x| x == 0.0), "window at {start}: past the end");
        }
        assert_eq!(r.seek_stats().1, 0);
        (all, n)
    }

    #[test]
    fn an_unfinished_wav_reads_as_its_finished_header_would_say() {
        // A recorder whose battery died never wrote its sizes: RIFF 0 (refused "wav: missing data chunk"),
        // data 0 ("no audio frames"), or both. ffmpeg reads each as the file's 16_000 frames.
        for channels in [1u16, 2] {
            let good = sine_wav(16_000, channels);
            let riff = (good.len() - 8) as u32;
            let block = 2 * channels as usize;
            assert!(unfinished_wav(&good).is_none(), "a finished header is read as it is");
            let (want, _) = decode_mono(good.clone()).unwrap();
            assert_eq!(want.len(), 16_000);
            for (r, d) in [(0, 32_000 * channels as u32), (0, 0), (0, u32::MAX), (riff, u32::MAX)] {
                let unfinished = with_sizes(&good, r, d);
                let (got, n) = read_gapless(unfinished.clone());
                assert_eq!(n, 16_000, "{channels} channel(s), sizes {r:#x} {d:#x}");
                assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "sizes {r:#x} {d:#x}");
                // A frame cut short (the battery died mid-write): its bytes dropped, whole frames kept.
                for cut in 1..block {
                    let (got, n) = read_gapless([&unfinished[..], &good[44..44 + cut]].concat());
                    assert!(n == 16_000 && got == want, "sizes {r:#x} {d:#x}, {cut} byte(s) of a frame after");
                }
            }
        }
        // Sizes 0xFFFFFFFF both (a stream to a pipe) and a RIFF size past the file's end (its data chunk's
        // whole) were read already: as they are.
        let good = sine_wav(1_000, 1);
        let riff_past = with_sizes(&good, 10 * good.len() as u32, 2_000);
        assert!(unfinished_wav(&with_sizes(&good, u32::MAX, u32::MAX)).is_none() && unfinished_wav(&riff_past).is_none());
        // A data chunk of no frames is none still; and a finished file's empty one (its RIFF size the
        // file's), the chunk after it not read as sound (ffmpeg reads that LIST's 34 bytes as 17 frames).
        let e = decode_mono(with_sizes(&good[..44], 0, 0)).unwrap_err();
        assert!(e.0.contains("no audio frames"), "{e}");
        let list = [&b"LIST"[..], &26u32.to_le_bytes(), b"INFOISFT", &14u32.to_le_bytes(), b"a recorder\0\0\0\0"].concat();
        let empty = [&good[..44], &list[..]].concat();
        let empty = with_sizes(&empty, (empty.len() - 8) as u32, 0);
        assert!(unfinished_wav(&empty).is_none());
        let e = AudioReader::open(empty).and_then(|mut r| r.read_all_mono()).unwrap_err();
        assert!(e.0.contains("no audio frames"), "{e}");
    }

    #[test]
    fn a_wav_cut_short_of_its_data_size_reads_the_whole_frames_there() {
        // A copy cut short: the header's length was the stream's (every crop past the cut a skip), and a
        // data size past the RIFF size's was refused. ffmpeg reads the whole frames there are.
        let good = sine_wav(16_000, 2);
        let (want, _) = decode_mono(good.clone()).unwrap();
        let (riff, data) = ((good.len() - 8) as u32, 64_000);
        for (r, d, keep, frames) in [
            (riff, data, 10_001 * 4, 10_001),    // cut at a frame, the header as it was
            (riff, data, 10_001 * 4 + 3, 10_001), // and inside a frame: 3 of its 4 bytes dropped
            (riff, 3 * data, 16_000 * 4, 16_000), // whole, its data size past its RIFF size's
            (0, 3 * data, 7_777 * 4 + 1, 7_777),
        ] {
            let cut = with_sizes(&good[..44 + keep], r, d);
            let (got, n) = read_gapless(cut.clone());
            assert_eq!(n, frames, "sizes {r} {d}, {keep} bytes");
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "sizes {r} {d}, {keep} bytes");
            // A crop past its last frame is zeros, not an error ("stream ends at frame ..."): the length
            // the crops are drawn in is the frames there are.
            let mut w = vec![1f32; 100];
            AudioReader::open(cut).unwrap().read_window_mono(frames, &mut w).unwrap();
            assert!(w.iter().all(|&x| x == 0.0));
        }
    }

    #[test]
    fn without_gapless_an_unfinished_wav_is_read_as_before() {
        // What a run recorded before revision 4 read: refused, or the header's length.
        let good = sine_wav(16_000, 1);
        let riff = (good.len() - 8) as u32;
        for (r, d, why) in [
            (0, 32_000, "wav: missing data chunk"),
            (0, 0, "wav: missing data chunk"),
            (riff, 0, "no audio frames"),
            (riff, 3 * 32_000, "chunk length exceeds parent"),
        ] {
            let e = decode_mono_as(with_sizes(&good, r, d), false).unwrap_err();
            assert!(e.0.contains(why), "sizes {r} {d}: {e}");
        }
        let cut = good[..44 + 2 * 10_001].to_vec();
        let mut r = AudioReader::open_as(cut, false).unwrap();
        assert_eq!(r.info().2, Some(16_000));
        let e = r.read_window_mono(12_000, &mut [0.0; 100]).unwrap_err();
        assert!(e.0.contains("stream ends at frame 10001 but the container reports 16000"), "{e}");
    }

    #[test]
    fn truncated_stream_is_an_error_only_past_its_real_end() {
        let pcm = pcm_stereo(50_000);
        let mut bytes = wav_i16(&pcm, 2, 16_000);
        bytes.truncate(44 + 20_000 * 4); // the header still claims 50_000 frames
        // Without gapless: gapless reads a WAV's frames there are (`a_wav_cut_short_of_its_data_size_...`).
        let mut r = AudioReader::open_as(bytes.clone(), false).unwrap();
        assert_eq!(r.info().2, Some(50_000));
        let mut w = vec![0f32; 1000];
        r.read_window_mono(5000, &mut w).unwrap();
        let want: Vec<f32> =
            (5000..6000).map(|i| (pcm[2 * i] as f32 / 32768.0 + pcm[2 * i + 1] as f32 / 32768.0) / 2.0).collect();
        assert_eq!(w, want);
        let e = r.read_window_mono(30_000, &mut w).unwrap_err();
        assert!(e.0.contains("stream ends at frame 20000 but the container reports 50000 frames"), "{e}");
        // A window across the cut: its last 500 frames were silence, without a word.
        let e = r.read_window_mono(19_500, &mut w).unwrap_err();
        assert!(e.0.contains("stream ends at frame 20000 but the container reports 50000 frames"), "{e}");
    }

    #[test]
    fn mp3_seek_windows_equal_full_decode() {
        check_windows_equal_full("birds_32k_mono.mp3", &random_windows(6, 40, 4 * 32_000, 60_000));
    }

    #[test]
    fn mp3_windows_of_a_bit_reservoir_that_reaches_back_many_frames_equal_full_decode() {
        // 8 kbps at 24 kHz: a frame's main data may begin 255 bytes back, 23 frames of 11 bytes; a crop
        // whose decode started a fixed 14 frames before it opened with up to 180 ms of zeros.
        check_windows_equal_full("birds_24k_mono_8kbps.mp3", &random_windows(8, 40, 8 * 24_000, 60_000));
        check_windows_equal_full("birds_48k_mono_vbr.mp3", &random_windows(9, 40, 6 * 48_000, 60_000));
    }

    /// `bytes` without its first frame, which must be a Xing/Info header: a file written without one.
    fn without_xing(bytes: &[u8]) -> Vec<u8> {
        let h = &bytes[..4];
        assert_eq!((h[0], h[1] & 0xFE), (0xFF, 0xFA), "MPEG-1 layer III, no ID3 tag in front");
        const KBPS: [u64; 15] = [0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320];
        const RATES: [u64; 3] = [44_100, 48_000, 32_000];
        let (kbps, rate) = (KBPS[(h[2] >> 4) as usize], RATES[((h[2] >> 2) & 3) as usize]);
        let len = (144 * kbps * 1000 / rate + ((h[2] >> 1) & 1) as u64) as usize;
        assert!(bytes[..len].windows(4).any(|w| w == b"Xing" || w == b"Info"), "the first frame is a header");
        bytes[len..].to_vec()
    }

    #[test]
    fn mp3_without_a_xing_or_info_header_counts_its_frames_and_seeks_exactly() {
        // Variable and constant bit rate, each with its header stripped: the header frame renders
        // nothing, so the stream decodes as before, except that without its LAME tag nothing says
        // what to trim (nor do ffmpeg and libsndfile trim it): the decoder's whole output, the trimmed
        // stream `lead` frames into it; its length is now counted from the frames.
        for name in ["birds_32k_mono.mp3", "birds_32k_mono_cbr.mp3"] {
            let with = fixture(name);
            let without = without_xing(&with);
            let (a, _) = decode_mono(with.clone()).unwrap();
            let (b, _) = decode_mono(without.clone()).unwrap();
            let (tagged, r) = (AudioReader::open(with).unwrap(), AudioReader::open(without.clone()).unwrap());
            let (lead, end) = (tagged.lead as usize, tagged.end.unwrap() as usize);
            assert_eq!((lead, end, a.len()), (1105, 128_000, 128_000), "{name}: LAME's delay, the frames written");
            assert_eq!((r.lead, r.end), (0, Some(b.len() as u64)), "{name}: untrimmed");
            assert!(b.len() > lead + a.len() && b.len() - lead - a.len() < 1152, "{name}: padding < a frame");
            let same = a.iter().zip(&b[lead..]).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{name}: the trimmed decode is the untrimmed one from frame {lead}");
            assert_eq!(r.info().2, Some(b.len() as u64), "{name}: counted frames = decoded frames");
            check_bytes_windows_equal_full(name, without, &random_windows(7, 40, 4 * 32_000, 60_000));
        }
    }

    #[test]
    fn mp3_decodes_to_the_frames_written_as_libsndfile_reads_them() {
        // The encoder's delay (and the decoder's 529 frames) before an MP3's first sample, and the
        // padding after its last (its LAME tag), are not the recording's: every crop of an MP3 was
        // 1105 frames late (35 ms at 32 kHz) against ffmpeg, libsndfile and librosa.
        // `soundfile.info(path).frames` of each fixture; the 8 kbps one's first frame is too small for a
        // LAME tag, so nothing is trimmed there (nor by libsndfile).
        for (name, frames) in [
            ("birds_32k_mono.mp3", 128_000u64),
            ("birds_32k_mono_cbr.mp3", 128_000),
            ("birds_48k_mono_vbr.mp3", 288_000),
            ("birds_24k_mono_8kbps.mp3", 193_536),
            ("birds_32k_mono_crc.mp3", 128_000),
            ("birds_48k_stereo.ogg", 384_000),
            ("birds_44k_stereo_30s.ogg", 1_323_000),
        ] {
            let (all, _) = decode_mono(fixture(name)).unwrap();
            let mut r = AudioReader::open(fixture(name)).unwrap();
            assert_eq!((all.len() as u64, r.info().2, r.length().unwrap()), (frames, Some(frames), frames), "{name}");
        }
        // The windows of the 24 kHz one from its first frame are its whole decode's (the other
        // fixtures' are checked above), and so are the last frames of every one.
        check_windows_equal_full("birds_24k_mono_8kbps.mp3", &[(0, 5000), (190_000, 5000), (193_000, 1000)]);
        check_windows_equal_full("birds_32k_mono_cbr.mp3", &[(0, 1000), (127_000, 1000), (127_999, 10), (126_000, 5000)]);
        check_windows_equal_full("birds_48k_mono_vbr.mp3", &[(0, 1200), (287_000, 3000)]);
        check_windows_equal_full("birds_48k_stereo.ogg", &[(380_000, 5000), (383_999, 1)]);
        // CRC-protected: its header frame was decoded as 1152 samples of audio (the demuxer did not see
        // its tag behind the CRC), its delay kept, and its windows were a frame off its whole decode.
        check_windows_equal_full("birds_32k_mono_crc.mp3", &[(0, 3000), (64_000, 5000), (127_000, 1000)]);
    }

    #[test]
    fn an_mp3_cut_short_of_the_frames_its_tag_counts_keeps_its_last_samples() {
        // The tag's padding is its last frame's: trimmed off a stream that ends earlier, it cut real
        // samples (1071 of the fixture missing its last 100 bytes, against libsndfile). Cut at a frame's
        // start (the frames indexed) and inside one (counted by the demuxer).
        let whole = fixture("birds_32k_mono_cbr.mp3");
        let frames = crate::audio::mp3_frames::scan(&whole, true).unwrap();
        let n = frames.offsets.len() as u64;
        assert_eq!(frames.tag.and_then(|t| t.frames), Some(n));
        for cut in [*frames.offsets.last().unwrap(), whole.len() - 100] {
            let cut = whole[..cut].to_vec(); // the last frame gone, or cut short
            let (untrimmed, _) = decode_mono_as(cut.clone(), false).unwrap();
            let (got, _) = decode_mono_as(cut.clone(), true).unwrap();
            assert_eq!((untrimmed.len() as u64, got.len() as u64), ((n - 1) * 1152, (n - 1) * 1152 - 1105));
            let last = (n - 1) * 1152 - 1105;
            check_bytes_windows_equal_full("cut", cut, &[(0, 1000), (last - 2000, 2000), (last - 1, 1)]);
        }
    }

    #[test]
    fn a_window_near_the_start_of_a_stream_of_a_long_delay_is_its_whole_decode_s() {
        // A tag's delay of 3000 or 4095 (another encoder's, or a damaged tag) in a stream the index does
        // not take (4 bytes after its frames): a window at 0 was sought to the decoder's frame `lead`
        // exactly, its bit reservoir not decoded, and differed from the whole decode from its first sample.
        for delay in [3000u32, 4095] {
            let mut data = fixture("birds_32k_mono.mp3");
            let at = data.windows(4).position(|w| w == b"LAME").unwrap() + 21;
            let padding = u32::from(data[at + 1] & 0x0F) << 8 | u32::from(data[at + 2]);
            data[at..at + 3].copy_from_slice(&((delay << 12) | padding).to_be_bytes()[1..]);
            data.extend([0; 4]);
            assert_eq!(AudioReader::open(data.clone()).unwrap().lead, 529 + delay as u64);
            check_bytes_windows_equal_full("long delay", data, &[(0, 1000), (1, 3000), (3000, 2000)]);
        }
        // A stream of its header frame alone: no audio (it said "empty input (0 bytes)").
        let frames = crate::audio::mp3_frames::scan(&fixture("birds_32k_mono_cbr.mp3"), true).unwrap();
        let header = fixture("birds_32k_mono_cbr.mp3")[..frames.offsets[0]].to_vec();
        let e = decode_mono(header).unwrap_err();
        assert!(e.0.contains("no audio frames"), "{e}");
    }

    #[test]
    fn two_mp3s_joined_end_to_end_seek_as_their_whole_decode() {
        // `cat a.mp3 b.mp3`: the demuxer drops b's Info header frame, which the index counted as a frame
        // of audio, so every window past the join was 1152 samples off the whole decode. Without gapless
        // it is counted as before (what a run recorded then read).
        let (a, b) = (fixture("birds_32k_mono_cbr.mp3"), fixture("birds_32k_mono.mp3"));
        let joined = [a.clone(), b.clone()].concat();
        let frames = |data: &[u8], gapless| crate::audio::mp3_frames::scan(data, gapless).unwrap().offsets.len();
        let (na, nb) = (frames(&a, true), frames(&b, true));
        assert_eq!((frames(&joined, true), frames(&joined, false)), (na + nb, na + nb + 1));
        let (full, _) = decode_mono(joined.clone()).unwrap();
        let mut r = AudioReader::open(joined.clone()).unwrap();
        assert_eq!(r.length().unwrap(), full.len() as u64, "the length the windows are drawn in");
        let join = na as u64 * 1152 - 1105;
        let windows = [(join - 3000, 6000), (join + 20_000, 5000), (full.len() as u64 - 2000, 2000)];
        check_bytes_windows_equal_full("joined", joined, &windows);
        // A CRC-protected header frame midway is decoded as audio by the demuxer, and counted so.
        let crc = [a.clone(), fixture("birds_32k_mono_crc.mp3")].concat();
        assert_eq!(frames(&crc, true), na + frames(&fixture("birds_32k_mono_crc.mp3"), true) + 1);
        check_bytes_windows_equal_full("joined crc", crc, &[(join + 1000, 5000), (join + 100_000, 5000)]);
        // The second behind an ID3v2 tag (ffmpeg writes one) or an APEv2 tag (mp3gain's): not indexed (an
        // APE tag was taken for the trailer, and the second file lost), and its windows are decoded from
        // the start, as the demuxer's seek counts the header frame its packets drop (a frame off).
        let id3 = |text: &[u8]| {
            let frame = [&b"TSSE\0\0\0"[..], &[text.len() as u8, 0, 0], text].concat();
            [&b"ID3\x04\0\0\0\0\0"[..], &[frame.len() as u8], &frame].concat()
        };
        let ape = [&b"APETAGEX\xd0\x07\0\0\x20\0\0\0"[..], &[0; 16], b"APETAGEX\xd0\x07\0\0\x20\0\0\0", &[0; 16]].concat();
        let (whole_a, _) = decode_mono(a.clone()).unwrap();
        for between in [id3(b"\x03Lavf61.7.100"), id3(b"\x03Lavf\xff1.7.100"), ape.clone()] {
            let tagged = [a.clone(), between, b.clone()].concat();
            assert_eq!(crate::audio::mp3_frames::scan(&tagged, true), None);
            let (full, _) = decode_mono(tagged.clone()).unwrap();
            assert!(full.len() > whole_a.len() + 100_000, "the second file decoded");
            let mut r = AudioReader::open(tagged.clone()).unwrap();
            assert_eq!((r.can_seek(), r.length().unwrap()), (false, full.len() as u64));
            let starts = (0..12).map(|k| join - 1500 + 500 * k).chain([join + 20_000, full.len() as u64 - 2000]);
            for start in starts {
                let (mut w, mut fresh) = ([vec![0.0f32; 2000], vec![0.0f32; 2000]], AudioReader::open(tagged.clone()).unwrap());
                r.read_window_mono(start, &mut w[0]).unwrap();
                fresh.read_window_mono(start, &mut w[1]).unwrap();
                let same = |w: &[f32]| w.iter().zip(&full[start as usize..]).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same(&w[0]) && same(&w[1]), "window at {start}");
            }
        }
        // An APE tag that ends the stream (then an ID3v1 tag) is its trailer.
        let id3v1 = [&b"TAG"[..], &[b' '; 125]].concat();
        for end in [ape.clone(), [ape, id3v1].concat()] {
            assert_eq!(frames(&[a.clone(), end].concat(), true), na);
        }
        // Another rate or channel count past the join, indexed or not: the decoder failed every frame
        // past it, and the whole decode ended there without a word (windows went on). Read as before
        // without gapless.
        let mut stereo = b.clone();
        for &o in &crate::audio::mp3_frames::scan(&b, true).unwrap().offsets {
            stereo[o + 3] &= 0x3F; // the channel mode: stereo
        }
        stereo[3] &= 0x3F; // its header frame too
        for (other, now) in [(fixture("birds_48k_mono_vbr.mp3"), "48000 Hz mono"), (stereo, "32000 Hz stereo")] {
            let want = format!("decode (mp3): the stream changes from 32000 Hz mono to {now} at frame {na} (");
            for mixed in [[a.clone(), other.clone()].concat(), [a.clone(), id3(b"\x03Lavf"), other].concat()] {
                let e = AudioReader::open(mixed.clone()).err().unwrap();
                assert!(e.0.starts_with(&want), "{e}");
                assert!(decode_mono_as(mixed, false).is_ok());
            }
        }
        // Random bytes after a file's frames: the demuxer syncs to a false frame of any format now and
        // then, which was refused as a join. Read, its audio whole.
        for seed in 1..4u64 {
            let mut x = seed;
            let junk = (0..20_000).map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            });
            let (got, _) = decode_mono([a.clone(), junk.collect()].concat()).unwrap();
            assert!(got.len() >= whole_a.len() && got[..whole_a.len()] == whole_a[..], "seed {seed}");
        }
    }

    #[test]
    fn a_chained_ogg_is_refused_where_its_second_stream_was_dropped() {
        // `cat a.ogg b.ogg`: the demuxer's "reset required" at the second stream ended the decode, the
        // length and the windows alike, without a word. Read as before without gapless.
        let a = fixture("birds_48k_stereo.ogg");
        let chained = [a.clone(), fixture("birds_44k_stereo_30s.ogg")].concat();
        let e = AudioReader::open(chained.clone()).err().unwrap();
        let want = format!("decode (vorbis): a second Ogg stream (a chained Ogg) starts at byte {} (", a.len());
        assert!(e.0.starts_with(&want), "{e}");
        let (first, _) = decode_mono_as(a, false).unwrap();
        assert_eq!(decode_mono_as(chained, false).unwrap().0.len(), first.len());
    }

    #[test]
    fn a_crc_protected_mp3_that_is_not_indexed_is_trimmed_alike() {
        // Cut inside its last frame, or followed by bytes that are no frame: not indexed (counted by the
        // demuxer), and its tag behind the CRC was unread there too (2257 samples late).
        let whole = fixture("birds_32k_mono_crc.mp3");
        let (want, _) = decode_mono(whole.clone()).unwrap();
        let junk = [whole.clone(), vec![0; 4]].concat();
        assert!(crate::audio::mp3_frames::scan(&junk, true).is_none());
        let (got, _) = decode_mono(junk.clone()).unwrap();
        assert!(got.len() == want.len() && got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
        let cut = whole[..whole.len() - 1].to_vec();
        let (got, _) = decode_mono(cut.clone()).unwrap();
        assert!(got.len() < want.len() && got.len() + 1152 > want.len(), "{} of {}", got.len(), want.len());
        assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "sample-aligned");
        check_bytes_windows_equal_full("crc+junk", junk, &[(0, 1000), (60_000, 5000), (127_000, 1000)]);
    }

    #[test]
    fn without_gapless_a_stream_is_the_decoders_whole_output_as_before_the_option() {
        // What a run recorded before the option trained on: the trimmed stream is the untrimmed one
        // from its `lead`, bit for bit, and the untrimmed one is longer by the delay and the padding.
        for (name, lead, extra) in [
            ("birds_32k_mono.mp3", 1105usize, 1105 + 1071),
            ("birds_48k_mono_vbr.mp3", 1105, 1105 + 47),
            ("birds_48k_stereo.ogg", 0, 704),
        ] {
            let (on, _) = decode_mono_as(fixture(name), true).unwrap();
            let (off, _) = decode_mono_as(fixture(name), false).unwrap();
            assert_eq!(off.len(), on.len() + extra, "{name}");
            assert!(on.iter().zip(&off[lead..]).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}");
            let mut r = AudioReader::open_as(fixture(name), false).unwrap();
            assert_eq!(r.length().unwrap(), off.len() as u64, "{name}");
            let (start, len) = (lead as u64 + 3000, 4000);
            let mut window = vec![0.0f32; len];
            r.read_window_mono(start, &mut window).unwrap();
            let same = window.iter().zip(&off[start as usize..]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{name}: a window of the untrimmed stream is its whole decode's");
        }
    }

    #[test]
    fn an_rf64_wav_says_what_it_is() {
        let mut rf64 = wav_i16(&[0, 1, 2, 3], 1, 16_000);
        rf64[..4].copy_from_slice(b"RF64");
        let e = decode_mono(rf64).unwrap_err();
        assert!(e.0.contains("an RF64 WAV (a WAV past 4 GB's form) is not read"), "{e}");
    }

    #[test]
    fn a_free_format_mp3_says_what_it_is() {
        // Every frame's bit-rate index 0 (libsndfile and ffmpeg read such a stream; the demuxer does not):
        // it was "unrecognised container: end of stream".
        let mut free = fixture("birds_32k_mono_cbr.mp3");
        let frames = crate::audio::mp3_frames::scan(&free, true).unwrap();
        for o in std::iter::once(0).chain(frames.offsets) {
            free[o + 2] &= 0x0F;
        }
        let e = decode_mono(free).unwrap_err();
        assert!(e.0.starts_with("decode: a free-format MP3 (bit-rate index 0) is not read"), "{e}");
    }

    /// `name`'s decode against ffmpeg's (`NAME.ffmpeg.txt`: its frames and the FNV-1a 64 hash of its
    /// mono mix, written by `scripts/make_codec_fixtures.py`), bit for bit; and its windows alike.
    fn check_as_ffmpeg_decodes(name: &str) -> Vec<f32> {
        let want = String::from_utf8(fixture(&format!("{name}.ffmpeg.txt"))).unwrap();
        let (mono, _) = decode_mono(fixture(name)).unwrap();
        let hash = fnv1a64(mono.iter().flat_map(|x| x.to_le_bytes()));
        assert_eq!(format!("frames={} fnv1a64={hash:016x}", mono.len()), want.trim(), "{name}");
        let n = mono.len() as u64;
        let windows = [(0, 1000), (1, 999), (4095, 3), (n / 3, 5000), (n / 2 + 7, 4000), (n - 500, 1000), (n + 10, 10)];
        check_bytes_windows_equal_full(name, fixture(name), &windows.map(|(s, l)| (s, l as usize)));
        mono
    }

    #[test]
    fn aiff_and_aifc_decode_to_ffmpegs_samples_and_seek() {
        // AIFF 16-bit stereo, AIFF-C 'sowt' (little-endian) and AIFF-C 'NONE' 24-bit mono with a chunk
        // after its sound data: symphonia read 8 bytes past the samples (the SSND chunk's offset and
        // block size counted as samples), its length 2 frames over ffmpeg's and the chunk's bytes samples.
        let aiff = check_as_ffmpeg_decodes("birds_44k_stereo.aiff");
        let sowt = check_as_ffmpeg_decodes("birds_44k_stereo_sowt.aiff");
        assert!(aiff == sowt, "the same samples, big- and little-endian");
        let (flac, _) = decode_mono(fixture("birds_44k_stereo.flac")).unwrap();
        assert!(aiff[..] == flac[..aiff.len()], "the FLAC's first 0.5 s");
        let none = check_as_ffmpeg_decodes("birds_22k_mono_24bit_none.aifc");
        let (flac, _) = decode_mono(fixture("birds_22k_mono_short.flac")).unwrap();
        assert!(none == flac, "16-bit samples written as 24");
        let r = AudioReader::open(fixture("birds_44k_stereo_sowt.aiff")).unwrap();
        assert_eq!((r.info(), r.codec_name()), ((44_100, 2, Some(22_050)), "pcm_s16le"));
        // Cut short mid-frame (a recorder stopped, a copy cut off): its whole frames, as ffmpeg reads it.
        let bytes = fixture("birds_44k_stereo.aiff");
        let cut = bytes[..bytes.len() - 4 * 5_000 - 3].to_vec();
        let (got, n) = read_gapless(cut);
        assert!(n == 22_050 - 5_001 && got[..] == aiff[..n as usize], "{n}");
    }

    #[test]
    fn alac_m4a_decodes_to_ffmpegs_samples_and_seeks() {
        let alac = check_as_ffmpeg_decodes("birds_44k_stereo_alac.m4a");
        let (flac, _) = decode_mono(fixture("birds_44k_stereo.flac")).unwrap();
        assert!(alac == flac, "lossless: the FLAC's samples");
        assert_eq!(AudioReader::open(fixture("birds_44k_stereo_alac.m4a")).unwrap().codec_name(), "alac");
    }

    #[test]
    fn aac_m4a_is_sample_aligned_with_ffmpeg() {
        // ffmpeg (5.1) drops the priming its edit list says (1024 samples) and keeps the last frame's
        // padding: 31_744 samples of 30_870 encoded. The edit list's length is the encoded recording's.
        let name = "birds_44k_stereo_aac.m4a";
        let want: Vec<f32> = fixture(&format!("{name}.ffmpeg_f32")).chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let (got, rate) = decode_mono(fixture(name)).unwrap();
        assert_eq!((rate, got.len(), want.len()), (44_100, 30_870, 31_744));
        let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        let peak = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        eprintln!("{name}: max |ours - ffmpeg| {diff:e} (peak {peak})");
        assert!(diff <= AAC_TOLERANCE, "{diff}");
        // One frame late or early is far outside it.
        let off = got[1..].iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(off > 100.0 * AAC_TOLERANCE, "{off}");
        // Same bytes, same samples; its windows are the whole decode's (decoded from the start).
        let mut r = AudioReader::open(fixture(name)).unwrap();
        assert_eq!((r.info().2, r.can_seek(), r.length().unwrap()), (Some(30_870), false, 30_870));
        assert!(r.read_all_mono().unwrap().iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()));
        for start in [0u64, 1, 1023, 1024, 12_345, 30_000] {
            let mut w = vec![1f32; 2000];
            r.read_window_mono(start, &mut w).unwrap();
            let there = (30_870 - start as usize).min(2000);
            assert!(w[..there] == got[start as usize..start as usize + there], "window at {start}");
            assert!(w[there..].iter().all(|&x| x == 0.0));
        }
    }

    /// The largest difference of our AAC decode from ffmpeg's allowed (on samples in [-1, 1]): two
    /// decoders of a lossy codec round their transforms differently.
    const AAC_TOLERANCE: f32 = 1e-5;

    #[test]
    fn a_fragmented_m4a_is_refused_saying_so() {
        // ffmpeg's `-movflags frag_keyframe+empty_moov` writes the media header's duration as 0 (the
        // samples are in `moof` fragments): the fixture with that field zeroed reads as one.
        for name in ["birds_44k_stereo_aac.m4a", "birds_44k_stereo_alac.m4a"] {
            let mut bytes = fixture(name);
            let mdhd = bytes.windows(4).position(|w| w == b"mdhd").unwrap();
            assert_eq!(bytes[mdhd + 4], 0, "{name}: a version 0 mdhd");
            bytes[mdhd + 20..mdhd + 24].copy_from_slice(&[0; 4]);
            let e = decode_mono(bytes).unwrap_err();
            assert!(e.0.contains("a fragmented M4A (its samples in movie fragments) is not read"), "{name}: {e}");
        }
    }

    #[test]
    fn without_gapless_aiff_and_m4a_are_refused_as_before() {
        // Revision 5 is gapless-only: a run recorded before it read these as it did, "unrecognised".
        for name in ["birds_44k_stereo.aiff", "birds_22k_mono_24bit_none.aifc", "birds_44k_stereo_alac.m4a", "birds_44k_stereo_aac.m4a"] {
            let e = decode_mono_as(fixture(name), false).unwrap_err();
            assert!(e.0.starts_with("decode: unrecognised container"), "{name}: {e}");
        }
    }

    #[test]
    fn garbage_and_empty_inputs_are_errors() {
        let e = decode_mono(Vec::<u8>::new()).unwrap_err();
        assert!(e.0.contains("empty"), "{e}");
        let e = decode_mono(vec![7u8; 5000]).unwrap_err();
        assert!(e.0.contains("decode"), "{e}");
        // A WAV header with no data frames.
        let e = decode_mono(wav_i16(&[], 1, 16_000)).unwrap_err();
        assert!(e.0.contains("decode"), "{e}");
    }
}
