//! A data set: an ordered list of shards, global sample indices, labels and a fingerprint.
//!
//! Global index `i` addresses row `i - offset[s]` of shard `s`, shards in sorted-path order, so an
//! index means the same recording whatever order the files were listed in.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type};
use arrow_array::{Array, ArrayRef};
use arrow_buffer::Buffer;
use arrow_schema::{DataType, Field};

use crate::error::{Error, Result};
use crate::options::LoaderOptions;
use crate::rng::hash_words;
use crate::shard::Shard;

#[derive(Clone, Debug, PartialEq)]
pub struct ColumnConfig {
    pub audio_column: String,
    pub label_column: String,
}

impl ColumnConfig {
    pub fn from_options(o: &LoaderOptions) -> Self {
        ColumnConfig { audio_column: o.audio_column.clone(), label_column: o.label_column.clone() }
    }
}

impl Default for ColumnConfig {
    /// What the default [`LoaderOptions`] name (the defaults are written there only).
    fn default() -> Self {
        Self::from_options(&LoaderOptions::default())
    }
}

/// Where the encoded bytes sit: a binary column, or a struct with a `bytes` field (HF's Audio).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AudioLayout {
    Binary,
    LargeBinary,
    StructBinary,
    StructLargeBinary,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LabelLayout {
    Int,
    Utf8,
    LargeUtf8,
}

/// One decoded row: the encoded audio (a zero-copy slice of the mapped shard) and its label.
pub struct Record {
    pub audio: Buffer,
    pub label: i64,
    pub shard: usize,
    pub row: u64,
}

/// Why a record could not be produced.
#[derive(Debug)]
pub enum RecordError {
    /// This record is bad (e.g. null audio); skip it and count it.
    Skip(String),
    /// The data set is unusable (e.g. unreadable batch); stop.
    Fatal(Error),
}

struct ShardEntry {
    shard: Shard,
    audio: AudioLayout,
    label: LabelLayout,
    /// Vocabulary for string labels (from `vocab.json` beside the shard).
    vocab: Option<std::sync::Arc<HashMap<String, i64>>>,
}

pub struct Dataset {
    shards: Vec<ShardEntry>,
    /// offsets[s] = global index of shard s's first row; offsets[n] = total.
    offsets: Vec<u64>,
    columns: ColumnConfig,
    fingerprint: String,
}

fn audio_layout(path: &Path, field: &Field) -> Result<AudioLayout> {
    let bad = |t: &DataType| {
        Error::data(format!(
            "{}: column '{}' has type {t}; expected binary bytes or a struct with a binary 'bytes' field",
            path.display(),
            field.name()
        ))
    };
    match field.data_type() {
        DataType::Binary => Ok(AudioLayout::Binary),
        DataType::LargeBinary => Ok(AudioLayout::LargeBinary),
        DataType::Struct(fields) => match fields.iter().find(|f| f.name() == "bytes").map(|f| f.data_type()) {
            Some(DataType::Binary) => Ok(AudioLayout::StructBinary),
            Some(DataType::LargeBinary) => Ok(AudioLayout::StructLargeBinary),
            _ => Err(bad(field.data_type())),
        },
        t => Err(bad(t)),
    }
}

fn label_layout(path: &Path, field: &Field) -> Result<LabelLayout> {
    match field.data_type() {
        t if t.is_integer() => Ok(LabelLayout::Int),
        DataType::Utf8 => Ok(LabelLayout::Utf8),
        DataType::LargeUtf8 => Ok(LabelLayout::LargeUtf8),
        t => Err(Error::data(format!(
            "{}: label column '{}' has type {t}; expected an integer or a string",
            path.display(),
            field.name()
        ))),
    }
}

/// `vocab.json` beside the shard: `{"names": [...]}` or a plain list; label = position in it.
fn load_vocab(path: &Path, cache: &mut HashMap<PathBuf, std::sync::Arc<HashMap<String, i64>>>) -> Result<std::sync::Arc<HashMap<String, i64>>> {
    let file = path.with_file_name("vocab.json");
    if let Some(v) = cache.get(&file) {
        return Ok(v.clone());
    }
    let text = std::fs::read_to_string(&file).map_err(|e| {
        Error::data(format!(
            "{}: string labels need a vocabulary, but {} cannot be read ({e}); `birdjepa prepare` writes one",
            path.display(),
            file.display()
        ))
    })?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::data(format!("{}: not valid JSON: {e}", file.display())))?;
    let names = json.get("names").unwrap_or(&json).as_array().ok_or_else(|| {
        Error::data(format!("{}: expected a list of label names or {{\"names\": [...]}}", file.display()))
    })?;
    let mut map = HashMap::new();
    for (i, n) in names.iter().enumerate() {
        let name = n.as_str().ok_or_else(|| Error::data(format!("{}: entry {i} is not a string: {n}", file.display())))?;
        map.insert(name.to_string(), i as i64);
    }
    let map = std::sync::Arc::new(map);
    cache.insert(file, map.clone());
    Ok(map)
}

fn binary_slice(array: &ArrayRef, large: bool, row: usize) -> Buffer {
    if large {
        let a = array.as_binary::<i64>();
        let (start, end) = (a.value_offsets()[row] as usize, a.value_offsets()[row + 1] as usize);
        a.values().slice_with_length(start, end - start)
    } else {
        let a = array.as_binary::<i32>();
        let (start, end) = (a.value_offsets()[row] as usize, a.value_offsets()[row + 1] as usize);
        a.values().slice_with_length(start, end - start)
    }
}

fn int_value(array: &ArrayRef, row: usize) -> Option<i64> {
    Some(match array.data_type() {
        DataType::Int8 => array.as_primitive::<Int8Type>().value(row) as i64,
        DataType::Int16 => array.as_primitive::<Int16Type>().value(row) as i64,
        DataType::Int32 => array.as_primitive::<Int32Type>().value(row) as i64,
        DataType::Int64 => array.as_primitive::<Int64Type>().value(row),
        DataType::UInt8 => array.as_primitive::<UInt8Type>().value(row) as i64,
        DataType::UInt16 => array.as_primitive::<UInt16Type>().value(row) as i64,
        DataType::UInt32 => array.as_primitive::<UInt32Type>().value(row) as i64,
        DataType::UInt64 => i64::try_from(array.as_primitive::<UInt64Type>().value(row)).ok()?,
        _ => return None,
    })
}

impl Dataset {
    /// Open shards (sorted by path; duplicates are an error) and check their schemas.
    pub fn open(paths: &[PathBuf], columns: ColumnConfig) -> Result<Self> {
        if paths.is_empty() {
            return Err(Error::config("no shard files given"));
        }
        let mut sorted = paths.to_vec();
        sorted.sort();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::config(format!("shard listed twice: {}", w[0].display())));
        }
        let mut vocabs = HashMap::new();
        let mut shards = Vec::with_capacity(sorted.len());
        let mut offsets = vec![0u64];
        for path in &sorted {
            let shard = Shard::open(path)?;
            let field_of = |name: &str| {
                shard.schema.field_with_name(name).cloned().map_err(|_| {
                    Error::data(format!(
                        "{}: missing column '{name}' (columns: {})",
                        path.display(),
                        shard.schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
                    ))
                })
            };
            let audio = audio_layout(path, &field_of(&columns.audio_column)?)?;
            let label = label_layout(path, &field_of(&columns.label_column)?)?;
            let vocab = match label {
                LabelLayout::Int => None,
                _ => Some(load_vocab(path, &mut vocabs)?),
            };
            offsets.push(offsets.last().unwrap() + shard.rows());
            shards.push(ShardEntry { shard, audio, label, vocab });
        }
        let fingerprint = fingerprint(&shards, &columns);
        Ok(Self { shards, offsets, columns, fingerprint })
    }

    pub fn len(&self) -> u64 {
        *self.offsets.last().unwrap()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn n_shards(&self) -> usize {
        self.shards.len()
    }

    pub fn shard_rows(&self) -> Vec<u64> {
        self.offsets.windows(2).map(|w| w[1] - w[0]).collect()
    }

    pub fn shard_offset(&self, shard: usize) -> u64 {
        self.offsets[shard]
    }

    pub fn shard_path(&self, shard: usize) -> &Path {
        &self.shards[shard].shard.path
    }

    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Global index -> (shard, row).
    pub fn locate(&self, index: u64) -> (usize, u64) {
        assert!(index < self.len(), "sample index {index} out of range ({} samples)", self.len());
        let s = self.offsets.partition_point(|&o| o <= index) - 1;
        (s, index - self.offsets[s])
    }

    /// The encoded audio and label of global sample `index`.
    pub fn record(&self, index: u64) -> std::result::Result<Record, RecordError> {
        let (s, row) = self.locate(index);
        let entry = &self.shards[s];
        let path = &entry.shard.path;
        let (batch, r) = entry.shard.batch_for_row(row).map_err(RecordError::Fatal)?;
        let audio_col = entry.shard.column(&batch, &self.columns.audio_column).map_err(RecordError::Fatal)?;
        let label_col = entry.shard.column(&batch, &self.columns.label_column).map_err(RecordError::Fatal)?;

        let (bytes_col, large) = match entry.audio {
            AudioLayout::Binary => (audio_col.clone(), false),
            AudioLayout::LargeBinary => (audio_col.clone(), true),
            AudioLayout::StructBinary | AudioLayout::StructLargeBinary => {
                if audio_col.is_null(r) {
                    return Err(RecordError::Skip("audio is null".into()));
                }
                let bytes = audio_col.as_struct().column_by_name("bytes").cloned().expect("checked at open");
                (bytes, entry.audio == AudioLayout::StructLargeBinary)
            }
        };
        if bytes_col.is_null(r) {
            return Err(RecordError::Skip("audio bytes are null".into()));
        }
        let audio = binary_slice(&bytes_col, large, r);
        entry.shard.will_need(&audio);

        let label = if label_col.is_null(r) {
            -1
        } else {
            match entry.label {
                LabelLayout::Int => int_value(&label_col, r).ok_or_else(|| {
                    RecordError::Fatal(Error::data(format!(
                        "{}: row {row}: label does not fit in int64",
                        path.display()
                    )))
                })?,
                LabelLayout::Utf8 | LabelLayout::LargeUtf8 => {
                    let name = if entry.label == LabelLayout::Utf8 {
                        label_col.as_string::<i32>().value(r)
                    } else {
                        label_col.as_string::<i64>().value(r)
                    };
                    *entry.vocab.as_ref().expect("vocab loaded at open").get(name).ok_or_else(|| {
                        RecordError::Fatal(Error::data(format!(
                            "{}: row {row}: label '{name}' is not in {}",
                            path.display(),
                            path.with_file_name("vocab.json").display()
                        )))
                    })?
                }
            }
        };
        Ok(Record { audio, label, shard: s, row })
    }
}

/// Identity of the data: names, sizes, row counts and the bytes at both ends of every shard.
/// Paths are reduced to file names so the same data copied to node-local scratch keeps its id.
fn fingerprint(shards: &[ShardEntry], columns: &ColumnConfig) -> String {
    let mut words: Vec<u64> = Vec::new();
    let push_bytes = |words: &mut Vec<u64>, bytes: &[u8]| {
        words.push(bytes.len() as u64);
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            words.push(u64::from_le_bytes(w));
        }
    };
    push_bytes(&mut words, columns.audio_column.as_bytes());
    push_bytes(&mut words, columns.label_column.as_bytes());
    for e in shards {
        let name = e.shard.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        push_bytes(&mut words, name.as_bytes());
        words.push(e.shard.file_size());
        words.push(e.shard.rows());
        let (head, tail) = e.shard.edge_bytes(64 * 1024);
        push_bytes(&mut words, head);
        push_bytes(&mut words, tail);
    }
    format!("{:016x}", hash_words(&words))
}
