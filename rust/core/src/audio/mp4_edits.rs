//! An ISO-MP4 (`.m4a`) audio track's edit list, read from the file's boxes.
//!
//! An AAC encoder's first frames are its priming (1024 samples from ffmpeg, 2112 from Apple's), and its
//! last frame is padded to a whole 1024: the `elst` box of the track says which of the decoded samples
//! are the recording (its one edit's `media_time`, and its `segment_duration` in the movie's timescale).
//! symphonia's demuxer parses that box but keeps it to itself (its track's length is the media's whole
//! duration, `mdhd`): [`track_edit`] reads it here, as `mp3_frames` reads an MP3's LAME tag.

/// The samples of a track that are the recording: `lead` decoded samples dropped, then `len` kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edit {
    pub lead: u64,
    pub len: u64,
}

/// A box's `(type, body)` at `at` in `bytes[..end]`, and where the next begins; None past the end or
/// for a size that does not fit.
fn next_box(bytes: &[u8], at: usize, end: usize) -> Option<([u8; 4], &[u8], usize)> {
    let head = bytes.get(at..at.checked_add(8)?.min(end))?;
    if head.len() < 8 {
        return None;
    }
    let kind = [head[4], head[5], head[6], head[7]];
    let (size, body_at) = match u32::from_be_bytes([head[0], head[1], head[2], head[3]]) {
        0 => (end - at, at + 8), // to the end of the parent
        1 => {
            let big = bytes.get(at + 8..at + 16)?;
            (usize::try_from(u64::from_be_bytes(big.try_into().ok()?)).ok()?, at + 16)
        }
        n => (n as usize, at + 8),
    };
    let next = at.checked_add(size).filter(|&n| n <= end && n >= body_at)?;
    Some((kind, &bytes[body_at..next], next))
}

/// The child boxes of `parent`'s body of type `kind`, in order.
fn children<'a>(body: &'a [u8], kind: &'a [u8; 4]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut at = 0;
    std::iter::from_fn(move || loop {
        let (k, b, next) = next_box(body, at, body.len())?;
        at = next;
        if &k == kind {
            return Some(b);
        }
    })
}

fn child<'a>(body: &'a [u8], kind: &'a [u8; 4]) -> Option<&'a [u8]> {
    children(body, kind).next()
}

fn be(bytes: &[u8], at: usize, n: usize) -> Option<u64> {
    Some(bytes.get(at..at + n)?.iter().fold(0u64, |v, &b| (v << 8) | b as u64))
}

/// A full box's (`mvhd`, `mdhd`) timescale and duration: 32-bit fields in version 0, 64-bit in 1.
fn timescale_duration(body: &[u8]) -> Option<(u64, u64)> {
    match body.first()? {
        0 => Some((be(body, 12, 4)?, be(body, 16, 4)?)),
        1 => Some((be(body, 20, 4)?, be(body, 24, 8)?)),
        _ => None,
    }
}

/// The edit of track `track` (the `trak` boxes' order, as symphonia numbers its tracks) of the MP4 in
/// `bytes`: `Ok(None)` where the file is no MP4, or the track has no edit list (its samples are all the
/// recording's); an error for an edit list of other than one edit of the media at normal rate (an empty
/// edit, a cut in two, a slowed playback), which ffmpeg plays by inserting or cutting what this does not.
pub fn track_edit(bytes: &[u8], track: usize) -> Result<Option<Edit>, String> {
    if bytes.get(4..8) != Some(b"ftyp") {
        return Ok(None);
    }
    let mut at = 0;
    let moov = loop {
        let Some((kind, body, next)) = next_box(bytes, at, bytes.len()) else { return Ok(None) };
        if &kind == b"moov" {
            break body;
        }
        at = next;
    };
    let Some(movie_scale) = child(moov, b"mvhd").and_then(timescale_duration).map(|(s, _)| s) else { return Ok(None) };
    let Some(trak) = children(moov, b"trak").nth(track) else { return Ok(None) };
    let Some((media_scale, media_len)) = child(trak, b"mdia").and_then(|m| child(m, b"mdhd")).and_then(timescale_duration) else {
        return Ok(None);
    };
    let Some(elst) = child(trak, b"edts").and_then(|e| child(e, b"elst")) else { return Ok(None) };
    let wide = elst.first() == Some(&1);
    let n = be(elst, 4, 4).unwrap_or(0);
    let field = if wide { 8 } else { 4 };
    if movie_scale == 0 {
        // Said as such: it was "an edit list of 1 edits (one is read)".
        return Err("decode: an M4A whose movie timescale is 0 (its edit list cannot be read)".into());
    }
    if n != 1 {
        return Err(format!("decode: an M4A whose edit list has {n} edits (one is read)"));
    }
    let entry = 8;
    let (Some(duration), Some(time), Some(rate)) =
        (be(elst, entry, field), be(elst, entry + field, field), be(elst, entry + 2 * field, 4))
    else {
        return Err("decode: an M4A whose edit list is cut short".into());
    };
    let empty = if wide { u64::MAX } else { u32::MAX as u64 };
    if time == empty || rate != 0x0001_0000 || time > media_len {
        return Err("decode: an M4A whose edit is an empty one or not at normal rate (not read)".into());
    }
    // The edit's duration is in the movie's timescale (ffmpeg writes milliseconds: 66_150 samples at
    // 44.1 kHz are 1500 ms, and 66_160 are 1500 too): the media's own end where the two are within a
    // tick of each other (ffmpeg's last sample's duration is the frames the encoder was given), else
    // the edit's, rounded to the nearest sample. 0 (a fragmented file's) is the media's end.
    let to_end = media_len - time;
    let edited = ((duration as u128 * media_scale as u128 + movie_scale as u128 / 2) / movie_scale as u128) as u64;
    let tick = media_scale.div_ceil(movie_scale);
    let len = if duration == 0 || edited.abs_diff(to_end) <= tick { to_end } else { edited.min(to_end) };
    Ok(Some(Edit { lead: time, len }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boxed(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
        [&(8 + body.len() as u32).to_be_bytes()[..], kind, body].concat()
    }

    /// An MP4 of one track: movie timescale 1000, media timescale 44_100 of `media_len` samples, its edit
    /// list `edits` (`(duration, media_time)`, version 0).
    fn mp4(media_len: u32, edits: &[(u32, i32)]) -> Vec<u8> {
        let full = |v: u8, rest: &[u8]| [&[v, 0, 0, 0][..], rest].concat();
        let hd = |scale: u32, len: u32| full(0, &[&[0u8; 8][..], &scale.to_be_bytes(), &len.to_be_bytes()].concat());
        let entries: Vec<u8> =
            edits.iter().flat_map(|&(d, t)| [d.to_be_bytes(), t.to_be_bytes(), 0x0001_0000u32.to_be_bytes()].concat()).collect();
        let elst = boxed(b"elst", &full(0, &[&(edits.len() as u32).to_be_bytes()[..], &entries].concat()));
        let trak = boxed(b"trak", &[boxed(b"edts", &elst), boxed(b"mdia", &boxed(b"mdhd", &hd(44_100, media_len)))].concat());
        let moov = boxed(b"moov", &[boxed(b"mvhd", &hd(1000, 1500)), trak].concat());
        [boxed(b"ftyp", b"M4A \0\0\0\0"), boxed(b"mdat", &[0; 100]), moov].concat()
    }

    #[test]
    fn an_edit_list_gives_the_priming_and_the_recordings_length() {
        // ffmpeg's: 1024 priming, 66_150 samples (1500 ms) of 67_174.
        assert_eq!(track_edit(&mp4(67_174, &[(1500, 1024)]), 0), Ok(Some(Edit { lead: 1024, len: 66_150 })));
        // 66_160 samples, written 1500 ms: the media's end, within a millisecond of the edit's.
        assert_eq!(track_edit(&mp4(67_184, &[(1500, 1024)]), 0), Ok(Some(Edit { lead: 1024, len: 66_160 })));
        // Apple's: 2112 priming, and an edit that ends well before the media's last frame.
        assert_eq!(track_edit(&mp4(70_656, &[(1000, 2112)]), 0), Ok(Some(Edit { lead: 2112, len: 44_100 })));
        assert_eq!(track_edit(&mp4(67_174, &[(0, 1024)]), 0), Ok(Some(Edit { lead: 1024, len: 66_150 })));
        assert_eq!(track_edit(&mp4(67_174, &[]), 1), Ok(None), "no such track");
        assert_eq!(track_edit(b"RIFF....WAVEfmt ", 0), Ok(None));
        assert!(track_edit(&mp4(67_174, &[(10, -1), (1500, 1024)]), 0).unwrap_err().contains("2 edits"));
        assert!(track_edit(&mp4(67_174, &[(1500, -1)]), 0).unwrap_err().contains("empty"));
        let mut zero_scale = mp4(67_174, &[(1500, 1024)]);
        let mvhd = zero_scale.windows(4).position(|w| w == b"mvhd").unwrap();
        zero_scale[mvhd + 16..mvhd + 20].copy_from_slice(&[0; 4]);
        assert!(track_edit(&zero_scale, 0).unwrap_err().contains("movie timescale is 0"));
    }
}
