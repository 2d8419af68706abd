//! A data set: an ordered list of shards, global sample indices, labels and a fingerprint.
//!
//! Global index `i` addresses row `i - offset[s]` of shard `s`, shards in sorted-path order, so an
//! index means the same recording whatever order the files were listed in.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use arrow_array::{Array, ArrayRef};
use arrow_data::ArrayData;
use arrow_buffer::Buffer;
use arrow_schema::{DataType, Field};

use crate::audio_source::AudioLayout;
use crate::error::{Error, Result};
use crate::options::LoaderOptions;
use crate::rng::hash_words;
use crate::shard::Shard;

#[derive(Clone, Debug, PartialEq)]
pub struct ColumnConfig {
    pub audio_column: String,
    pub label_column: String,
    /// The names every label and multilabel class is read into, by name (`LoaderOptions::label_names`);
    /// None: as stored.
    pub label_names: Option<Vec<String>>,
    /// A list column read as a multi-hot of `n_classes` (or the vocabulary's length) per row.
    pub multilabel_column: Option<String>,
    pub n_classes: Option<usize>,
    /// (start, end) seconds columns; None in train mode, where rows are never cropped to a window.
    pub window_columns: Option<(String, String)>,
    /// Where relative audio paths are resolved (`crate::audio_source`); None: each shard's folder.
    pub audio_root: Option<PathBuf>,
    /// A list column of `[start, end]` seconds to crop train views around; None: uniform crops.
    pub event_column: Option<String>,
}

impl ColumnConfig {
    pub fn from_options(o: &LoaderOptions) -> Self {
        ColumnConfig {
            audio_column: o.audio_column.clone(),
            label_column: o.label_column.clone(),
            label_names: o.label_names.clone(),
            multilabel_column: o.multilabel_column.clone(),
            n_classes: o.n_classes,
            window_columns: (!o.train).then(|| (o.window_start_column.clone(), o.window_end_column.clone())),
            audio_root: o.audio_root.as_ref().map(PathBuf::from),
            event_column: (o.train && o.crop_events).then(|| o.event_column.clone()),
        }
    }
}

impl Default for ColumnConfig {
    /// What the default [`LoaderOptions`] name (the defaults are written there only).
    fn default() -> Self {
        Self::from_options(&LoaderOptions::default())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LabelLayout {
    Int,
    Utf8,
    LargeUtf8,
}

/// One decoded row: the encoded audio (a zero-copy slice of the mapped shard) and its labels.
pub struct Record {
    pub audio: Buffer,
    /// The file the audio was read from, where the row names one by path (not bytes in the shard).
    pub file: Option<PathBuf>,
    pub label: i64,
    /// The multi-hot row (`n_classes` bytes of 0 or 1) when a multilabel column is read.
    pub multilabel: Option<Vec<u8>>,
    /// The (start, end) window in seconds, where the shard has window columns and both are non-null.
    pub window: Option<(f64, f64)>,
    /// The row's events (`[start, end]` seconds), where events are read and the shard has them.
    pub events: Option<Vec<(f64, f64)>>,
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

/// `vocab.json` beside a shard: label name -> position.
struct Vocab {
    index: HashMap<String, i64>,
    /// The names listed, in order (their count is the multi-hot's width when `n_classes` is not given).
    names: Vec<String>,
    /// Where `label_names` is given: each listed name's position there, None for a name it lacks.
    relabel: Option<Vec<Option<i64>>>,
    file: PathBuf,
}

impl Vocab {
    fn lookup(&self, name: &str) -> std::result::Result<i64, String> {
        self.index.get(name).copied().ok_or_else(|| format!("label '{name}' is not in {}", self.file.display()))
    }

    /// Label `local` (a position in this vocabulary) in the label names read into; `local` itself
    /// without them, and a missing label (negative) stays as it is. A position past the names is an error.
    fn relabelled(&self, local: i64) -> std::result::Result<i64, String> {
        if local < 0 {
            return Ok(local);
        }
        let at = usize::try_from(local).ok().filter(|&i| i < self.names.len());
        let at = at.ok_or_else(|| format!("label {local} is outside {}'s {} names", self.file.display(), self.names.len()))?;
        let Some(relabel) = self.relabel.as_ref() else {
            return Ok(local);
        };
        relabel[at].ok_or_else(|| {
            format!("label '{}' of {} is not among the names labels are read into", self.names[at], self.file.display())
        })
    }
}

/// Why a shard needs its `vocab.json` (the error says so when it cannot be read).
#[derive(Clone, Copy)]
enum VocabNeed {
    /// String labels map to their position in it.
    Names,
    /// Integer multilabels without `n_classes`: its length is the multi-hot's width.
    Width,
    /// `label_names` given: every label is read by its name.
    ByName,
    /// Integer labels beside a vocabulary: each must index it (an id past it was read as a class the
    /// run's probe and every evaluation count without it: a NaN loss, or a clip scored wrong).
    Bounds,
}

struct ShardEntry {
    shard: Shard,
    audio: AudioLayout,
    /// Where the shard's relative audio paths are resolved.
    audio_root: PathBuf,
    label: LabelLayout,
    /// Whether the shard has both window columns (eval mode only).
    window: bool,
    /// Whether the shard has the event column (when events are read).
    events: bool,
    /// Vocabulary for string labels (from `vocab.json` beside the shard).
    vocab: Option<Arc<Vocab>>,
}

pub struct Dataset {
    shards: Vec<ShardEntry>,
    /// offsets[s] = global index of shard s's first row; offsets[n] = total.
    offsets: Vec<u64>,
    columns: ColumnConfig,
    /// The multi-hot's width when a multilabel column is read.
    n_classes: Option<usize>,
    fingerprint: String,
    /// Some row names its audio by path (a hub's cache): the fingerprint holds those files' stamps.
    reads_audio_by_path: bool,
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

/// A list column of integers or strings (HF's `Sequence(ClassLabel)` is `list<int64>`): the items' layout.
fn multilabel_layout(path: &Path, field: &Field) -> Result<LabelLayout> {
    let items = match field.data_type() {
        DataType::List(f) | DataType::LargeList(f) => Some(f.data_type()),
        _ => None,
    };
    match items {
        Some(t) if t.is_integer() => Ok(LabelLayout::Int),
        Some(DataType::Utf8) => Ok(LabelLayout::Utf8),
        Some(DataType::LargeUtf8) => Ok(LabelLayout::LargeUtf8),
        _ => Err(Error::data(format!(
            "{}: multilabel column '{}' has type {}; expected a list of integers or of strings",
            path.display(),
            field.name(),
            field.data_type()
        ))),
    }
}

/// An event column is a list of `[start, end]` pairs of seconds: a list (or fixed-size list) of lists
/// of floats or integers (BirdSet's `detected_events`).
fn check_events_column(path: &Path, field: &Field) -> Result<()> {
    let inner = match field.data_type() {
        DataType::List(f) | DataType::LargeList(f) => Some(f.data_type()),
        _ => None,
    };
    let seconds = match inner {
        Some(DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, 2)) => Some(f.data_type()),
        _ => None,
    };
    match seconds {
        Some(t) if t.is_integer() || matches!(t, DataType::Float32 | DataType::Float64) => Ok(()),
        _ => Err(Error::data(format!(
            "{}: event column '{}' has type {}; expected a list of [start, end] seconds",
            path.display(),
            field.name(),
            field.data_type()
        ))),
    }
}

/// Row `r`'s events; None for a null or empty list, an error for a pair that is not two numbers.
fn event_list(column: &ArrayRef, r: usize) -> std::result::Result<Option<Vec<(f64, f64)>>, String> {
    if column.is_null(r) {
        return Ok(None);
    }
    let items = match column.data_type() {
        DataType::LargeList(_) => column.as_list::<i64>().value(r),
        _ => column.as_list::<i32>().value(r),
    };
    let mut out = Vec::with_capacity(items.len());
    for i in 0..items.len() {
        let pair = match items.data_type() {
            DataType::FixedSizeList(..) => items.as_fixed_size_list().value(i),
            DataType::LargeList(_) => items.as_list::<i64>().value(i),
            _ => items.as_list::<i32>().value(i),
        };
        if items.is_null(i) || pair.len() != 2 || pair.null_count() > 0 {
            return Err(format!("event {i} is not a [start, end] pair"));
        }
        out.push((seconds_value(&pair, 0), seconds_value(&pair, 1)));
    }
    Ok((!out.is_empty()).then_some(out))
}

/// Window columns hold seconds: a float or an integer.
fn check_seconds_column(path: &Path, field: &Field) -> Result<()> {
    match field.data_type() {
        t if t.is_integer() || matches!(t, DataType::Float32 | DataType::Float64) => Ok(()),
        t => Err(Error::data(format!(
            "{}: window column '{}' has type {t}; expected seconds as a float or an integer",
            path.display(),
            field.name()
        ))),
    }
}

/// The vocabulary's file name, beside the shards it names the labels of.
pub const VOCAB_FILE: &str = "vocab.json";

/// The label names of `vocab.json` beside `shard`, or None where there is none: the one reader of a
/// vocabulary (the loader's, and Python's through `birdjepa.data.shards.vocab_names`).
pub fn vocab_names(shard: &Path) -> Result<Option<Vec<String>>> {
    let file = shard.with_file_name(VOCAB_FILE);
    match std::fs::read_to_string(&file) {
        Ok(text) => parse_vocab(&text, &file).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::data(format!("{}: cannot be read ({e})", file.display()))),
    }
}

/// `{"names": [...]}` (what `birdjepa prepare` writes, beside its `label_column`) or a plain list.
fn parse_vocab(text: &str, file: &Path) -> Result<Vec<String>> {
    let json: serde_json::Value =
        serde_json::from_str(text).map_err(|e| Error::data(format!("{}: not valid JSON: {e}", file.display())))?;
    let names = json.get("names").unwrap_or(&json).as_array().ok_or_else(|| {
        Error::data(format!("{}: expected a list of label names or {{\"names\": [...]}}", file.display()))
    })?;
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            n.as_str()
                .map(str::to_string)
                .ok_or_else(|| Error::data(format!("{}: entry {i} is not a string: {n}", file.display())))
        })
        .collect()
}

/// `vocab.json` beside the shard: `{"names": [...]}` or a plain list; label = position in it.
/// With `label_names`, each listed name's position there is looked up once per vocabulary.
fn load_vocab(
    path: &Path,
    need: VocabNeed,
    label_names: Option<&[String]>,
    cache: &mut HashMap<PathBuf, Arc<Vocab>>,
) -> Result<Arc<Vocab>> {
    let file = path.with_file_name(VOCAB_FILE);
    if let Some(v) = cache.get(&file) {
        return Ok(v.clone());
    }
    let text = std::fs::read_to_string(&file).map_err(|e| {
        let (why, fix) = match need {
            VocabNeed::Names => ("string labels need a vocabulary", "`birdjepa prepare` writes one"),
            VocabNeed::Width => ("the multi-hot's width is the vocabulary's length", "or pass n_classes"),
            VocabNeed::ByName => ("labels read by name need their folder's vocabulary", "`birdjepa prepare` writes one"),
            VocabNeed::Bounds => ("its integer labels index the vocabulary beside it", "repair or remove it"),
        };
        Error::data(format!("{}: {why}, but {} cannot be read ({e}); {fix}", path.display(), file.display()))
    })?;
    let names = parse_vocab(&text, &file)?;
    let index = names.iter().enumerate().map(|(i, n)| (n.clone(), i as i64)).collect();
    let relabel = label_names.map(|into| positions_in(&names, into));
    let vocab = Arc::new(Vocab { index, names, relabel, file: file.clone() });
    cache.insert(file, vocab.clone());
    Ok(vocab)
}

/// Each of `names`' position in `into`, None where `into` lacks it.
fn positions_in(names: &[String], into: &[String]) -> Vec<Option<i64>> {
    let at: HashMap<&str, i64> = into.iter().enumerate().map(|(i, n)| (n.as_str(), i as i64)).collect();
    names.iter().map(|n| at.get(n.as_str()).copied()).collect()
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

/// Seconds in a float or integer column (checked at open).
fn seconds_value(array: &ArrayRef, row: usize) -> f64 {
    match array.data_type() {
        DataType::Float64 => array.as_primitive::<Float64Type>().value(row),
        DataType::Float32 => array.as_primitive::<Float32Type>().value(row) as f64,
        _ => int_value(array, row).map_or(f64::NAN, |v| v as f64),
    }
}

/// Row `r` of a list column as a multi-hot of width `c`; the error says what is wrong with the row.
fn multi_hot(column: &ArrayRef, r: usize, c: usize, vocab: Option<&Vocab>) -> std::result::Result<Vec<u8>, String> {
    if column.is_null(r) {
        return Err("the list is null (an empty list means no class)".into());
    }
    let items = match column.data_type() {
        DataType::LargeList(_) => column.as_list::<i64>().value(r),
        _ => column.as_list::<i32>().value(r),
    };
    let mut hot = vec![0u8; c];
    for i in 0..items.len() {
        if items.is_null(i) {
            return Err(format!("element {i} is null"));
        }
        let class = match items.data_type() {
            DataType::Utf8 => vocab.expect("vocab loaded at open").lookup(items.as_string::<i32>().value(i))?,
            DataType::LargeUtf8 => vocab.expect("vocab loaded at open").lookup(items.as_string::<i64>().value(i))?,
            _ => int_value(&items, i).ok_or_else(|| format!("element {i} does not fit in int64"))?,
        };
        let class = vocab.map_or(Ok(class), |v| v.relabelled(class))?;
        let slot = usize::try_from(class).ok().filter(|&k| k < c);
        hot[slot.ok_or_else(|| format!("class {class} (element {i}) is outside [0, {c})"))?] = 1;
    }
    Ok(hot)
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
            let audio = AudioLayout::of(path, &field_of(&columns.audio_column)?)?;
            let parent = path.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
            let audio_root = columns.audio_root.clone().unwrap_or(parent);
            let label = label_layout(path, &field_of(&columns.label_column)?)?;
            let multilabel =
                columns.multilabel_column.as_deref().map(|c| multilabel_layout(path, &field_of(c)?)).transpose()?;
            let window = match &columns.window_columns {
                Some((start, end)) => match (shard.schema.field_with_name(start), shard.schema.field_with_name(end)) {
                    (Ok(s), Ok(e)) => check_seconds_column(path, s).and(check_seconds_column(path, e)).map(|_| true)?,
                    _ => false,
                },
                None => false,
            };
            let events = match &columns.event_column {
                Some(name) => match shard.schema.field_with_name(name) {
                    Ok(f) => check_events_column(path, f).map(|_| true)?,
                    Err(_) => false,
                },
                None => false,
            };
            let strings = [Some(label), multilabel].iter().flatten().any(|l| *l != LabelLayout::Int);
            let need = if columns.label_names.is_some() {
                Some(VocabNeed::ByName)
            } else if strings {
                Some(VocabNeed::Names)
            } else if multilabel.is_some() && columns.n_classes.is_none() {
                Some(VocabNeed::Width)
            } else {
                path.with_file_name(VOCAB_FILE).is_file().then_some(VocabNeed::Bounds)
            };
            let vocab = need.map(|n| load_vocab(path, n, columns.label_names.as_deref(), &mut vocabs)).transpose()?;
            offsets.push(offsets.last().unwrap() + shard.rows());
            shards.push(ShardEntry { shard, audio, audio_root, label, window, events, vocab });
        }
        if let (Some(name), Some(first)) = (&columns.event_column, shards.first()) {
            // Rows without events keep the uniform crop; no shard with the column is a misnamed one (a
            // typo trained on uniform crops, without a word).
            if !shards.iter().any(|s| s.events) {
                let fields = first.shard.schema.fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>();
                return Err(Error::data(format!(
                    "event_column '{name}': no shard has it, so no view would be cropped around an event ({}: columns {})",
                    sorted[0].display(),
                    fields.join(", ")
                )));
            }
        }
        let n_classes = match (&columns.multilabel_column, &columns.label_names) {
            (Some(_), Some(names)) => Some(columns.n_classes.unwrap_or(names.len())),
            (Some(_), None) => Some(multi_hot_width(&shards, columns.n_classes)?),
            (None, _) => None,
        };
        let (fingerprint, reads_audio_by_path) = fingerprint(&shards, &columns)?;
        Ok(Self { shards, offsets, columns, n_classes, fingerprint, reads_audio_by_path })
    }

    /// C, the width of each multi-hot row, when a multilabel column is read.
    pub fn n_classes(&self) -> Option<usize> {
        self.n_classes
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

    /// Whether some row names its audio by path rather than holding its bytes.
    pub fn reads_audio_by_path(&self) -> bool {
        self.reads_audio_by_path
    }

    /// Each shard's name ([`shard_names`]) and a digest of its content but the audio's bytes: every
    /// column's values (labels, recording ids, events, windows, paths), the size of each recording's
    /// audio, and the `vocab.json` beside it. The fingerprint reads only a shard's size and the bytes at
    /// its ends (a data set of 100,000 recordings is read in milliseconds): a shard rewritten at the same
    /// size, relabelled by a second `prepare`, kept it. Its non-audio columns are a small part of a shard.
    pub fn shard_digests(&self) -> Result<Vec<(String, String)>> {
        let names = shard_names(self.shards.iter().map(|e| e.shard.path.as_path()));
        self.shards
            .iter()
            .zip(names)
            .map(|(e, name)| Ok((name, format!("{:016x}", shard_digest(e, &self.columns.audio_column)?))))
            .collect()
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

        let (audio, file) = entry.audio.read(&audio_col, r, &entry.audio_root).map_err(RecordError::Fatal)?.map_err(RecordError::Skip)?;
        entry.shard.will_need(&audio);

        // Bad labels stop the loader (they are the data set's, not one recording's): one line naming the row.
        let fatal = |what: String| RecordError::Fatal(Error::data(format!("{}: row {row}: {what}", path.display())));
        let label = if label_col.is_null(r) {
            -1
        } else {
            let local = match entry.label {
                LabelLayout::Int => {
                    int_value(&label_col, r).ok_or_else(|| fatal("label does not fit in int64".into()))?
                }
                LabelLayout::Utf8 | LabelLayout::LargeUtf8 => {
                    let name = if entry.label == LabelLayout::Utf8 {
                        label_col.as_string::<i32>().value(r)
                    } else {
                        label_col.as_string::<i64>().value(r)
                    };
                    entry.vocab.as_ref().expect("vocab loaded at open").lookup(name).map_err(fatal)?
                }
            };
            if local < -1 {  // -5 came out as the label -5: a probe's index past its classes' start
                return Err(fatal(format!("label {local} is neither a class index nor -1 (none)")));
            }
            match &entry.vocab {
                Some(vocab) => vocab.relabelled(local).map_err(fatal)?,
                None => local,
            }
        };
        let multilabel = match (&self.columns.multilabel_column, self.n_classes) {
            (Some(name), Some(c)) => {
                let column = entry.shard.column(&batch, name).map_err(RecordError::Fatal)?;
                let hot = multi_hot(&column, r, c, entry.vocab.as_deref());
                Some(hot.map_err(|e| fatal(format!("multilabel column '{name}': {e}")))?)
            }
            _ => None,
        };
        let window = match (&self.columns.window_columns, entry.window) {
            (Some((start, end)), true) => {
                let start = entry.shard.column(&batch, start).map_err(RecordError::Fatal)?;
                let end = entry.shard.column(&batch, end).map_err(RecordError::Fatal)?;
                (start.is_valid(r) && end.is_valid(r)).then(|| (seconds_value(&start, r), seconds_value(&end, r)))
            }
            _ => None,
        };
        let events = match (&self.columns.event_column, entry.events) {
            (Some(name), true) => {
                let column = entry.shard.column(&batch, name).map_err(RecordError::Fatal)?;
                event_list(&column, r).map_err(|e| RecordError::Skip(format!("event column '{name}': {e}")))?
            }
            _ => None,
        };
        Ok(Record { audio, file, label, multilabel, window, events, shard: s, row })
    }
}

/// The multi-hot's width: `n_classes` if given, else the length of the one vocabulary all shards share.
fn multi_hot_width(shards: &[ShardEntry], n_classes: Option<usize>) -> Result<usize> {
    if let Some(c) = n_classes {
        return Ok(c);
    }
    let mut width: Option<(usize, &Path)> = None;
    for e in shards {
        let vocab = e.vocab.as_ref().expect("loaded at open when n_classes is not given");
        match width {
            Some((c, first)) if c != vocab.names.len() => {
                return Err(Error::data(format!(
                    "{} lists {} names but {} lists {c}: the multi-hot needs one width; pass n_classes",
                    vocab.file.display(),
                    vocab.names.len(),
                    first.display()
                )))
            }
            Some(_) => {}
            None => width = Some((vocab.names.len(), &vocab.file)),
        }
    }
    match width {
        Some((c, _)) if c > 0 => Ok(c),
        Some((_, file)) => Err(Error::data(format!("{} lists no names; pass n_classes", file.display()))),
        None => Err(Error::config("no shard to take n_classes from")),
    }
}

/// Identity of the data: names, sizes, row counts and the bytes at both ends of every shard, and the size
/// and modification time of every audio file a row names by path.
/// Shard paths are reduced to file names so the same data copied to node-local scratch keeps its id.
fn push_bytes(words: &mut Vec<u64>, bytes: &[u8]) {
    words.push(bytes.len() as u64);
    for chunk in bytes.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        words.push(u64::from_le_bytes(w));
    }
}

/// An array's words for a digest: its length, validity and buffers, its children's in turn; `payload`
/// false leaves out a binary array's values (the audio: the recordings' bytes) but keeps their offsets.
fn push_array(words: &mut Vec<u64>, data: &ArrayData, payload: bool) {
    words.extend([data.len() as u64, data.offset() as u64]);
    if let Some(nulls) = data.nulls() {
        push_bytes(words, nulls.validity());
    }
    let binary = matches!(data.data_type(), DataType::Binary | DataType::LargeBinary);
    for (i, buffer) in data.buffers().iter().enumerate() {
        if payload || !(binary && i == 1) {
            push_bytes(words, buffer.as_slice());
        }
    }
    for child in data.child_data() {
        push_array(words, child, payload);
    }
}

/// A name for each shard, unique in the set and the same wherever the set is moved: its file name, or,
/// where two shards share one (a glob over two folders `prepare` wrote, each `train-00000.arrow`), its
/// path below the folder those shards share (keyed by file name alone, one digest stood for both, and a
/// shard relabelled in one folder passed the resume checks).
pub fn shard_names<'a>(paths: impl Iterator<Item = &'a Path> + Clone) -> Vec<String> {
    let file_name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut same: HashMap<String, Vec<&Path>> = HashMap::new();
    for p in paths.clone() {
        same.entry(file_name(p)).or_default().push(p);
    }
    paths
        .map(|p| {
            let name = file_name(p);
            let group = &same[&name];
            if group.len() == 1 {
                return name;
            }
            let shared = group.iter().map(|q| q.components().count()).min().unwrap_or(0);
            let depth = (0..shared)
                .take_while(|&i| group.iter().all(|q| q.components().nth(i) == p.components().nth(i)))
                .count();
            p.components().skip(depth).map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
        })
        .collect()
}

/// Shard `e`'s content digest (`Dataset::shard_digests`).
fn shard_digest(e: &ShardEntry, audio_column: &str) -> Result<u64> {
    let mut words: Vec<u64> = Vec::new();
    for i in 0..e.shard.n_batches() {
        let batch = e.shard.batch(i)?;
        for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
            push_bytes(&mut words, field.name().as_bytes());
            let data = column.to_data();
            if field.name() != audio_column {
                push_array(&mut words, &data, true);
            } else if let DataType::Struct(fields) = field.data_type() {
                // HF's Audio: the paths whole, the bytes' sizes only.
                words.extend([data.len() as u64, data.offset() as u64]);
                for (f, child) in fields.iter().zip(data.child_data()) {
                    push_array(&mut words, child, f.name() != "bytes");
                }
            } else {
                push_array(&mut words, &data, false);
            }
        }
    }
    match vocab_names(&e.shard.path)? {  // its names, as every reader reads them (not its spacing)
        Some(names) => names.iter().for_each(|n| push_bytes(&mut words, n.as_bytes())),
        None => words.push(u64::MAX),
    }
    Ok(hash_words(&words))
}

/// The data set's fingerprint, and whether any row names its audio by path (whose file's stamps it holds).
fn fingerprint(shards: &[ShardEntry], columns: &ColumnConfig) -> Result<(String, bool)> {
    let (mut words, mut by_path): (Vec<u64>, bool) = (Vec::new(), false);
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
        let stamps = e.audio.stamps(&e.shard, &columns.audio_column, &e.audio_root)?;
        by_path |= !stamps.is_empty();
        words.extend(stamps);
    }
    Ok((format!("{:016x}", hash_words(&words)), by_path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::builder::{ListBuilder, StringBuilder};
    use arrow_array::types::Int64Type;
    use arrow_array::ListArray;

    fn field(t: DataType) -> Field {
        Field::new("ebird_code_multilabel", t, true)
    }

    fn list_of(t: DataType) -> DataType {
        DataType::List(Arc::new(Field::new("item", t, true)))
    }

    #[test]
    fn shards_of_one_file_name_in_two_folders_are_named_by_their_folders() {
        let paths = ["/d/a/train-0.arrow", "/d/b/train-0.arrow", "/d/b/train-1.arrow", "/d/c/x/train-0.arrow"];
        let names = shard_names(paths.iter().map(Path::new));
        assert_eq!(names, ["a/train-0.arrow", "b/train-0.arrow", "train-1.arrow", "c/x/train-0.arrow"]);
    }

    #[test]
    fn multilabel_columns_are_lists_of_integers_or_strings() {
        let path = Path::new("/data/a.arrow");
        assert_eq!(multilabel_layout(path, &field(list_of(DataType::Int64))).unwrap(), LabelLayout::Int);
        assert_eq!(multilabel_layout(path, &field(list_of(DataType::UInt8))).unwrap(), LabelLayout::Int);
        assert_eq!(multilabel_layout(path, &field(list_of(DataType::Utf8))).unwrap(), LabelLayout::Utf8);
        let large = DataType::LargeList(Arc::new(Field::new("item", DataType::LargeUtf8, true)));
        assert_eq!(multilabel_layout(path, &field(large)).unwrap(), LabelLayout::LargeUtf8);
        for bad in [list_of(list_of(DataType::Int64)), DataType::Int64, list_of(DataType::Float64)] {
            let e = multilabel_layout(path, &field(bad)).unwrap_err();
            assert_eq!(e.kind, crate::error::ErrorKind::Data);
            assert!(e.message.starts_with("/data/a.arrow: multilabel column 'ebird_code_multilabel' has type"), "{e}");
            assert!(!e.message.contains('\n'), "{e}");
        }
    }

    #[test]
    fn multi_hot_rows_of_integer_lists() {
        let rows =
            vec![Some(vec![Some(0), Some(2)]), Some(vec![]), None, Some(vec![Some(1), None]), Some(vec![Some(3)])];
        let column: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(rows));
        assert_eq!(multi_hot(&column, 0, 3, None).unwrap(), vec![1, 0, 1]);
        assert_eq!(multi_hot(&column, 1, 3, None).unwrap(), vec![0, 0, 0]);
        assert!(multi_hot(&column, 2, 3, None).unwrap_err().contains("the list is null"));
        assert_eq!(multi_hot(&column, 3, 3, None).unwrap_err(), "element 1 is null");
        assert_eq!(multi_hot(&column, 4, 3, None).unwrap_err(), "class 3 (element 0) is outside [0, 3)");
        assert_eq!(multi_hot(&column, 4, 4, None).unwrap(), vec![0, 0, 0, 1]);
    }

    #[test]
    fn multi_hot_rows_of_string_lists_map_through_the_vocabulary() {
        let names = ["amecro", "blujay", "norcar"].map(String::from).to_vec();
        let index = names.iter().enumerate().map(|(i, n)| (n.clone(), i as i64)).collect();
        let vocab = Vocab { index, names, relabel: None, file: PathBuf::from("/data/vocab.json") };
        let mut b = ListBuilder::new(StringBuilder::new());
        b.append_value([Some("norcar"), Some("amecro")]);
        b.append_value([Some("nosuch")]);
        b.append_value([Some("norcar")]);
        let column: ArrayRef = Arc::new(b.finish());
        assert_eq!(multi_hot(&column, 0, 3, Some(&vocab)).unwrap(), vec![1, 0, 1]);
        assert_eq!(multi_hot(&column, 1, 3, Some(&vocab)).unwrap_err(), "label 'nosuch' is not in /data/vocab.json");
        // A name whose position is past n_classes is out of range like an integer.
        assert_eq!(multi_hot(&column, 2, 2, Some(&vocab)).unwrap_err(), "class 2 (element 0) is outside [0, 2)");
    }

    #[test]
    fn labels_read_by_name_take_their_name_s_position_among_the_names_read_into() {
        // This folder lists three names; the split's names (another folder's first) lack one.
        let names = ["norcar", "amecro", "houspa"].map(String::from).to_vec();
        let into = ["amecro", "blujay", "norcar"].map(String::from).to_vec();
        let index = names.iter().enumerate().map(|(i, n)| (n.clone(), i as i64)).collect();
        let relabel = Some(positions_in(&names, &into));
        assert_eq!(relabel, Some(vec![Some(2), Some(0), None]));
        let vocab = Vocab { index, names, relabel, file: PathBuf::from("/data/vocab.json") };
        assert_eq!((vocab.relabelled(0), vocab.relabelled(1), vocab.relabelled(-1)), (Ok(2), Ok(0), Ok(-1)));
        let lacking = "label 'houspa' of /data/vocab.json is not among the names labels are read into";
        assert_eq!(vocab.relabelled(2).unwrap_err(), lacking);
        assert_eq!(vocab.relabelled(3).unwrap_err(), "label 3 is outside /data/vocab.json's 3 names");
        // The multi-hot's classes too, named or numbered: "norcar" and 1 ("amecro") at 2 and 0.
        let mut b = ListBuilder::new(StringBuilder::new());
        b.append_value([Some("norcar")]);
        let named: ArrayRef = Arc::new(b.finish());
        assert_eq!(multi_hot(&named, 0, 3, Some(&vocab)).unwrap(), vec![0, 0, 1]);
        let numbered: ArrayRef = Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(1)])]));
        assert_eq!(multi_hot(&numbered, 0, 3, Some(&vocab)).unwrap(), vec![1, 0, 0]);
        // Integer labels read as they are (no names to read into) must index the vocabulary all the same.
        let plain = Vocab { relabel: None, ..vocab };
        assert_eq!((plain.relabelled(2), plain.relabelled(-1)), (Ok(2), Ok(-1)));
        assert_eq!(plain.relabelled(3).unwrap_err(), "label 3 is outside /data/vocab.json's 3 names");
    }
}
