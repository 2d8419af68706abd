//! Tags around a stream: an ID3v2 tag in front ([`past_id3`]), and those appended after its last frame,
//! which its demuxer does not read as tags: an ID3v1 tag (the last 128 bytes, from "TAG"), and before it
//! at most one APEv2 tag (a 32-byte footer from "APETAGEX" that gives its size, and its 32-byte header in
//! front where it has one) or Lyrics3 tag (from "LYRICSBEGIN" to a 6-digit size and "LYRICS200", or to
//! "LYRICSEND"). An MP3's frame index ends there (`mp3_frames`); a FLAC's last frame was read to the
//! file's end, failed its CRC and was dropped (`decode`).

/// Where `data`'s stream starts: past an ID3v2 tag in front, if it has one (MP3's first frame, FLAC's
/// `fLaC`).
pub fn past_id3(data: &[u8]) -> usize {
    if data.len() >= 10 && &data[..3] == b"ID3" {
        let size = data[6..10].iter().fold(0usize, |s, &b| (s << 7) | (b & 0x7F) as usize);
        return 10 + size + if data[5] & 0x10 != 0 { 10 } else { 0 }; // a footer, when flagged
    }
    0
}

/// The bytes at the end of `data` that are such tags: 0 where it ends otherwise.
pub fn trailing(data: &[u8]) -> usize {
    let id3v1 = match data.len().checked_sub(128) {
        Some(n) if data[n..].starts_with(b"TAG") => 128,
        _ => 0,
    };
    let body = &data[..data.len() - id3v1];
    id3v1 + ape(body).or_else(|| lyrics3(body)).unwrap_or(0)
}

/// The length of the APEv2 tag `body` ends with: its size field (the items and the footer) plus its
/// 32-byte header where one is there ("APETAGEX"), as it must be where the footer's flags (bit 31) say
/// (some writers leave the flags 0 with a header).
fn ape(body: &[u8]) -> Option<usize> {
    let footer = body.get(body.len().checked_sub(32)?..)?;
    if !footer.starts_with(b"APETAGEX") {
        return None;
    }
    let le = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let size = Some(le(&footer[12..16])).filter(|&n| n >= 32 && n <= body.len())?;
    let header = body.len().checked_sub(size + 32).is_some_and(|h| body[h..].starts_with(b"APETAGEX"));
    if le(&footer[20..24]) >> 31 == 1 && !header {
        return None;
    }
    Some(size + if header { 32 } else { 0 })
}

/// The length of the Lyrics3 tag `body` ends with: v2 sized by its 6 digits (from "LYRICSBEGIN" to
/// them), v1 from the last "LYRICSBEGIN" at most 5100 bytes of lyrics before its "LYRICSEND".
fn lyrics3(body: &[u8]) -> Option<usize> {
    const BEGIN: &[u8] = b"LYRICSBEGIN";
    if body.ends_with(b"LYRICS200") {
        let digits = body.get(body.len().checked_sub(15)?..body.len() - 9)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let len = 15 + digits.iter().fold(0, |n, &d| 10 * n + (d - b'0') as usize);
        return body.get(body.len().checked_sub(len)?..)?.starts_with(BEGIN).then_some(len);
    }
    if body.ends_with(b"LYRICSEND") {
        let from = body.len().saturating_sub(BEGIN.len() + 5100 + 9);
        let at = body[from..].windows(BEGIN.len()).rposition(|w| w == BEGIN)?;
        return Some(body.len() - from - at);
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An APEv2 tag of one item, with its header or not.
    pub(crate) fn ape_tag(header: bool) -> Vec<u8> {
        let items = b"\x05\0\0\0\0\0\0\0Title\0birds".to_vec();
        let block = |flags: u32| {
            let mut b = b"APETAGEX".to_vec();
            b.extend(2000u32.to_le_bytes());
            b.extend((items.len() as u32 + 32).to_le_bytes());
            b.extend(1u32.to_le_bytes());
            b.extend(flags.to_le_bytes());
            b.extend([0; 8]);
            b
        };
        let mut tag = if header { block(0xA000_0000) } else { Vec::new() };
        tag.extend(&items);
        tag.extend(block(if header { 0x8000_0000 } else { 0 }));
        tag
    }

    #[test]
    fn the_trailing_tags_are_sized_whole_and_nothing_else_is() {
        let audio = vec![0xA5u8; 300];
        let mut id3v1 = b"TAG".to_vec();
        id3v1.resize(128, b' ');
        let fields = b"LYRICSBEGININD0000211LYR00005birds";
        let lyrics2 = [&fields[..], format!("{:06}LYRICS200", fields.len()).as_bytes()].concat();
        let lyrics1 = b"LYRICSBEGINbirds singLYRICSEND".to_vec();
        for (tag, with_id3v1) in [
            (Vec::new(), true),
            (ape_tag(true), false),
            (ape_tag(true), true),
            (ape_tag(false), true),
            (lyrics2.clone(), true),
            (lyrics1.clone(), true),
        ] {
            let mut data = audio.clone();
            data.extend(&tag);
            if with_id3v1 {
                data.extend(&id3v1);
            }
            assert_eq!(trailing(&data), data.len() - audio.len(), "{:?}", String::from_utf8_lossy(&tag));
        }
        // A header its footer's flags do not say (0: the tag in `decode`'s tests of joined MP3s).
        let flagless = [&b"APETAGEX\xd0\x07\0\0\x20\0\0\0"[..], &[0; 16]].concat().repeat(2);
        assert_eq!(trailing(&[&audio[..], &flagless].concat()), 64);
        assert_eq!(trailing(&audio), 0);
        assert_eq!(trailing(&id3v1[..127]), 0); // too short for an ID3v1 tag
        // An APEv2 footer that sizes more than there is, or a header its flags say and that is not there.
        let mut ape = ape_tag(true);
        let n = ape.len();
        ape[n - 20..n - 16].copy_from_slice(&10_000u32.to_le_bytes());
        assert_eq!(trailing(&[&audio[..], &ape].concat()), 0);
        assert_eq!(trailing(&[&audio[..], &ape_tag(true)[32..]].concat()), 0);
        // A Lyrics3v2 size that does not reach its "LYRICSBEGIN".
        let mut lyrics = lyrics2;
        let n = lyrics.len();
        lyrics[n - 15..n - 9].copy_from_slice(b"000033");
        assert_eq!(trailing(&[&audio[..], &lyrics, &id3v1].concat()), 128);
    }
}
