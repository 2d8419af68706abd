//! Recordings joined end to end in one file, which a demuxer reads wrong without a word: a chained Ogg's
//! second logical stream was dropped (the whole decode, the length and the windows all stopped at the
//! first's end). Refused where the decode is gapless (`decode::AudioReader::open_as`); off, read as
//! before (what a run recorded then trained on). MP3 joins are read (`mp3_frames`, `decode`).

/// The refusal of a file that holds a second recording after its first, naming the byte it starts at,
/// for the codecs whose demuxer misreads one (`codec`: symphonia's short name); None otherwise.
pub fn second_recording(codec: &str, data: &[u8]) -> Option<String> {
    let at = match codec {
        "vorbis" => chained_ogg(data)?,
        _ => return None,
    };
    Some(format!(
        "decode ({codec}): a second Ogg stream (a chained Ogg) starts at byte {at} (recordings joined end \
         to end?): each alone is read"
    ))
}

/// Where an Ogg page that begins a logical stream (its header type's 0x02 bit) follows a page that does
/// not: a chain (a multiplexed file's streams all begin before any other page). Pages walked by their
/// lengths (a header every 4-8 KB: `audio_length` of a 20-minute, 12 MB file took 2.5 ms with the walk,
/// 2.8 ms without); None where they do not parse (the demuxer's own checks then speak).
fn chained_ogg(data: &[u8]) -> Option<usize> {
    let (mut at, mut past_starts) = (0usize, false);
    while let Some(page) = data.get(at..at + 27).filter(|p| p.starts_with(b"OggS")) {
        let segments = page[26] as usize;
        let table = data.get(at + 27..at + 27 + segments)?;
        let begins = page[5] & 0x02 != 0;
        if begins && past_starts {
            return Some(at);
        }
        past_starts |= !begins;
        at += 27 + segments + table.iter().map(|&s| s as usize).sum::<usize>();
    }
    None
}
