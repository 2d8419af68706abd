//! End-to-end tests of the core loader on shards written here (WAV bytes built by hand).
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{BinaryArray, Int64Array, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use birdjepa_core::debug_hooks::DebugHooks;
use birdjepa_core::error::ErrorKind;
use birdjepa_core::loader::{Batch, Loader, LoaderConfig, LoaderState, Poll};

fn wav_bytes(freq: f32, rate: u32, seconds: f32) -> Vec<u8> {
    let n = (rate as f32 * seconds) as usize;
    let data: Vec<u8> = (0..n)
        .flat_map(|i| (((2.0 * std::f32::consts::PI * freq * i as f32 / rate as f32).sin() * 12000.0) as i16).to_le_bytes())
        .collect();
    let mut out = Vec::new();
    out.extend_from_slice(b"RIFF");
    out.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes()); // PCM
    out.extend_from_slice(&1u16.to_le_bytes()); // mono
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * 2).to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(&data);
    out
}

/// Shards of `rows` short WAV recordings each; row r of shard s has label s*100 + r.
fn write_shards(dir: &Path, rows: &[usize], stream: bool, corrupt: &[(usize, usize)]) -> Vec<PathBuf> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("audio", DataType::Binary, true),
        Field::new("ebird_code", DataType::Int64, true),
    ]));
    rows.iter()
        .enumerate()
        .map(|(s, &n)| {
            let audio: Vec<Vec<u8>> = (0..n)
                .map(|r| {
                    if corrupt.contains(&(s, r)) {
                        b"RIFF not really a wav".to_vec()
                    } else {
                        wav_bytes(500.0 + 97.0 * (s * 10 + r) as f32, [16000, 22050, 32000][r % 3], 5.5 + r as f32 * 0.25)
                    }
                })
                .collect();
            let labels: Vec<i64> = (0..n as i64).map(|r| s as i64 * 100 + r).collect();
            let path = dir.join(format!("shard-{s}.arrow"));
            let file = std::fs::File::create(&path).unwrap();
            let mut batches = Vec::new();
            for chunk in (0..n).collect::<Vec<_>>().chunks(2) {
                let a = BinaryArray::from_iter_values(chunk.iter().map(|&r| audio[r].as_slice()));
                let l = Int64Array::from_iter_values(chunk.iter().map(|&r| labels[r]));
                batches.push(RecordBatch::try_new(schema.clone(), vec![Arc::new(a), Arc::new(l)]).unwrap());
            }
            if stream {
                let mut w = arrow_ipc::writer::StreamWriter::try_new(file, &schema).unwrap();
                batches.iter().for_each(|b| w.write(b).unwrap());
                w.finish().unwrap();
            } else {
                let mut w = arrow_ipc::writer::FileWriter::try_new(file, &schema).unwrap();
                batches.iter().for_each(|b| w.write(b).unwrap());
                w.finish().unwrap();
            }
            path
        })
        .collect()
}

/// A test's shard folder, removed when the test ends (each `cargo test` left ~13 MB in the temp dir).
struct TmpDir(PathBuf);

impl std::ops::Deref for TmpDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmpdir(name: &str) -> TmpDir {
    let dir = std::env::temp_dir().join(format!("birdjepa-core-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    TmpDir(dir)
}

fn config(workers: usize) -> LoaderConfig {
    LoaderConfig { batch_size: 3, n_workers: workers, seed: 11, shuffle_buffer: 5, interleave: Some(2), ..Default::default() }
}

fn next(loader: &mut Loader) -> Option<Batch> {
    loop {
        match loader.next_batch(Duration::from_secs(5)).unwrap() {
            Poll::Batch(b) => return Some(b),
            Poll::End => return None,
            Poll::Pending => continue,
        }
    }
}

fn take(loader: &mut Loader, n: usize) -> Vec<Batch> {
    (0..n).map_while(|_| next(loader)).collect()
}

fn same(a: &[Batch], b: &[Batch]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.index, y.index);
        assert_eq!(x.label, y.label);
        assert_eq!(x.shard_id, y.shard_id);
        assert_eq!(x.epoch, y.epoch);
        assert_eq!(x.crop_offset, y.crop_offset);
        assert!(x.spectrogram.iter().zip(&y.spectrogram).all(|(p, q)| p.to_bits() == q.to_bits()));
    }
}

#[test]
fn stream_is_independent_of_workers_and_resumes_exactly() {
    let dir = tmpdir("resume");
    let files = write_shards(&dir, &[4, 3, 5], false, &[]);
    let reference = take(&mut Loader::new(&files, config(1), None).unwrap(), 12);
    same(&reference, &take(&mut Loader::new(&files, config(3), None).unwrap(), 12));

    let mut loader = Loader::new(&files, config(2), None).unwrap();
    for k in 0..8 {
        let json = serde_json::to_string(&loader.state()).unwrap();
        let state: LoaderState = serde_json::from_str(&json).unwrap();
        let mut resumed = Loader::new(&files, config(1 + k % 3), Some(state)).unwrap();
        same(&take(&mut resumed, 4), &reference[k..k + 4]);
        next(&mut loader);
    }
    // Labels follow the rows: label = shard * 100 + row.
    for b in &reference {
        for (i, &idx) in b.index.iter().enumerate() {
            let (s, r) = if idx < 4 { (0, idx) } else if idx < 7 { (1, idx - 4) } else { (2, idx - 7) };
            assert_eq!(b.label[i], s * 100 + r);
            assert_eq!(b.shard_id[i], s);
        }
    }
}

#[test]
fn a_batch_put_back_is_the_next_one_and_the_state_is_before_it_again() {
    // A caller that never got the batch (a Ctrl-C as it came): its saved state counted the batch.
    let dir = tmpdir("put-back");
    let files = write_shards(&dir, &[4, 3, 5], false, &[]);
    let reference = take(&mut Loader::new(&files, config(1), None).unwrap(), 3);
    let mut loader = Loader::new(&files, config(2), None).unwrap();
    next(&mut loader);
    let before = serde_json::to_string(&loader.state()).unwrap();
    let second = next(&mut loader).unwrap();
    let after = serde_json::to_string(&loader.state()).unwrap();
    loader.put_back(second);
    assert_eq!(serde_json::to_string(&loader.state()).unwrap(), before);
    let again = next(&mut loader).unwrap();
    assert_eq!(serde_json::to_string(&loader.state()).unwrap(), after);
    same(&[again, next(&mut loader).unwrap()], &reference[1..3]);
}

#[test]
fn file_and_stream_formats_give_the_same_batches() {
    let dir_f = tmpdir("file");
    let dir_s = tmpdir("stream");
    let f = write_shards(&dir_f, &[4, 3], false, &[]);
    let s = write_shards(&dir_s, &[4, 3], true, &[]);
    let eval = LoaderConfig { train: false, ..config(2) };
    let a = take(&mut Loader::new(&f, eval.clone(), None).unwrap(), 10);
    let b = take(&mut Loader::new(&s, eval, None).unwrap(), 10);
    assert_eq!(a.iter().map(|b| b.n).sum::<usize>(), 7);
    same(&a, &b);
}

#[test]
fn corrupt_records_are_skipped_and_reported() {
    let dir = tmpdir("corrupt");
    let files = write_shards(&dir, &[4, 3], false, &[(1, 2)]);
    let eval = LoaderConfig { train: false, ..config(2) };
    let mut loader = Loader::new(&files, eval, None).unwrap();
    let batches = take(&mut loader, 10);
    let idx: Vec<i64> = batches.iter().flat_map(|b| b.index.clone()).collect();
    assert_eq!(idx, vec![0, 1, 2, 3, 4, 5]);
    // One crop offset per kept row (eval: the centre crop's), none for the skipped one.
    let offsets: Vec<i64> = batches.iter().flat_map(|b| b.crop_offset.clone()).collect();
    assert_eq!(offsets.len(), idx.len());
    let d = loader.diagnostics();
    assert_eq!(d.counters.skipped, 1);
    assert_eq!((d.skipped[0].shard, d.skipped[0].row, d.skipped[0].index), (1, 2, 6));
    assert!(d.skipped[0].file.ends_with("shard-1.arrow"));
}

#[test]
fn a_state_for_other_data_or_config_is_refused_with_the_reason() {
    let dir = tmpdir("refuse");
    let files = write_shards(&dir, &[4, 3], false, &[]);
    let mut loader = Loader::new(&files, config(1), None).unwrap();
    take(&mut loader, 2);
    let state = loader.state();
    let err = Loader::new(&files[..1], config(1), Some(state.clone())).err().unwrap();
    assert_eq!(err.kind, ErrorKind::State);
    assert!(err.message.contains("other data"), "{}", err.message);
    let err = Loader::new(&files, LoaderConfig { shuffle_buffer: 6, ..config(1) }, Some(state)).err().unwrap();
    assert!(err.message.contains("shuffle_buffer: saved 5 now 6"), "{}", err.message);
}

#[test]
fn the_shard_index_is_cached_beside_the_shard_and_refreshed_when_it_changes() {
    let dir = tmpdir("index");
    let files = write_shards(&dir, &[4], false, &[]);
    Loader::new(&files, config(1), None).unwrap();
    let sidecar = dir.join(".shard-0.arrow.bjindex.json");
    let index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&sidecar).unwrap()).unwrap();
    assert_eq!(index["batches"].as_array().unwrap().len(), 2);
    // Rewrite the shard with more rows: size and mtime change, so the index is rebuilt.
    std::thread::sleep(Duration::from_millis(20));
    write_shards(&dir, &[6], false, &[]);
    let loader = Loader::new(&files, config(1), None).unwrap();
    assert_eq!(loader.dataset().len(), 6);
}

#[test]
fn batches_carry_each_views_crop_offset_and_the_debug_shift_moves_one_sample_by_one_hop() {
    let dir = tmpdir("crop-shift");
    let files = write_shards(&dir, &[4, 3], false, &[]);
    let views = LoaderConfig { n_views: 2, ..config(2) };
    let (frame, hop) = (views.clip.n_frames * views.clip.fbank.n_mels, views.clip.fbank.hop_length as i64);
    let plain = take(&mut Loader::new(&files, views.clone(), None).unwrap(), 3);
    for b in &plain {
        assert_eq!(b.crop_offset.len(), 2 * b.n);
        // Recordings of 5.5 s to 6.25 s and 5 s clips: offsets in [0, 1.25 s at 32 kHz].
        assert!(b.crop_offset.iter().all(|&o| (0..=40_001).contains(&o)), "{:?}", b.crop_offset);
    }
    let target = plain[1].index[1];
    let shift = LoaderConfig { debug: DebugHooks { crop_shift_index: target, ..Default::default() }, ..views };
    let shifted = take(&mut Loader::new(&files, shift, None).unwrap(), 3);
    for (p, s) in plain.iter().zip(&shifted) {
        assert_eq!((&p.index, &p.label, &p.epoch), (&s.index, &s.label, &s.epoch));
        for row in 0..p.n {
            let (po, so) = (&p.crop_offset[2 * row..2 * row + 2], &s.crop_offset[2 * row..2 * row + 2]);
            let rows = 2 * row * frame..2 * (row + 1) * frame;
            let (pf, sf) = (&p.spectrogram[rows.clone()], &s.spectrogram[rows]);
            if p.index[row] == target {
                // One hop forward, or less (even backward) within a hop of the recording's end.
                assert!(po.iter().zip(so).all(|(a, b)| a != b && (a - b).abs() <= hop), "{po:?} -> {so:?}");
                assert_ne!(pf, sf);
            } else {
                assert_eq!(po, so);
                assert!(pf.iter().zip(sf).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }
    // Eval: centre crops, shifted alike.
    let eval = LoaderConfig { train: false, n_views: 1, ..config(1) };
    let offsets = |cfg: LoaderConfig| -> Vec<i64> {
        take(&mut Loader::new(&files, cfg, None).unwrap(), 3).iter().flat_map(|b| b.crop_offset.clone()).collect()
    };
    let centre = offsets(eval.clone());
    let moved = offsets(LoaderConfig { debug: DebugHooks { crop_shift_index: 4, ..Default::default() }, ..eval });
    assert_eq!(centre.len(), 7);
    for i in 0..7 {
        assert_eq!(moved[i], centre[i] + if i == 4 { hop } else { 0 }, "sample {i}");
    }
}
