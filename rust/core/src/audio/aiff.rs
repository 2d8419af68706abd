//! An AIFF / AIFF-C file's sound data as ffmpeg reads it, where symphonia's demuxer reads it otherwise.
//!
//! The `SSND` chunk's size counts its 8 bytes of `offset` and `blockSize` before the samples; symphonia
//! takes it for the samples' size, so a stream was 8 bytes longer than its data (2 frames of 16-bit
//! stereo): its length 2 frames past ffmpeg's, and where a chunk follows (an `ID3 ` tag, a marker) 8 of
//! its bytes decoded as samples. And a file cut short of its `SSND` size (a recorder that stopped
//! mid-write, a copy cut off) is read by ffmpeg to its last whole frame. [`sizes`] gives the `SSND` and
//! `FORM` sizes the demuxer is to read in their place (`super::decode`'s overlay, as an unfinished WAV's).

use super::decode::Field;

/// The sizes the demuxer is to read: the `SSND` chunk's as its samples' bytes (its size less 8, at most
/// those the file holds; always less than the file's) and the `FORM`'s (past that chunk where it said
/// less). None for no AIFF (no `SSND` chunk in the chunks' walk from byte 12).
pub(super) fn sizes(bytes: &[u8]) -> Option<[Field; 2]> {
    if bytes.len() < 12 || &bytes[0..4] != b"FORM" || !matches!(&bytes[8..12], b"AIFF" | b"AIFC") {
        return None;
    }
    let be32 = |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let mut at = 12;
    while at + 8 <= bytes.len() {
        let size = be32(at + 4);
        if &bytes[at..at + 4] == b"SSND" {
            // The samples' bytes: the size less its 8 bytes of offset and block size, at most what the
            // file holds after them (0 where a writer left it so: the file's to its end).
            let held = bytes.len().saturating_sub(at + 16);
            let data = match size.checked_sub(8) {
                Some(d) if d > 0 && d as usize <= held => d as usize,
                _ => held,
            };
            let ssnd = u32::try_from(data).ok()?;
            // symphonia counts the FORM chunk's bytes from byte 12, past "AIFF": the SSND chunk must end
            // within it.
            let form = be32(4);
            let form = if (form as usize) < at - 4 + ssnd as usize { u32::try_from(bytes.len() - 8).ok()? } else { form };
            let wanted = [(at as u64 + 4, ssnd.to_be_bytes()), (4, form.to_be_bytes())];
            return (ssnd != size || form != be32(4)).then_some(wanted);
        }
        at = at.saturating_add(8 + size as usize + (size as usize & 1)); // chunks are padded to an even size
    }
    None
}
