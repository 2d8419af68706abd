//! One Arrow IPC shard (file or stream format), memory-mapped, with random access to rows.
//!
//! Opening a shard reads only metadata: the schema, and the list of record-batch messages with
//! their row counts. That list is cached in a small JSON index beside the shard (or in the user
//! cache folder when the data folder is read-only), so start-up never scans data it already knows.
//! Rows are read zero-copy: a record batch is decoded straight from the mapped pages and the audio
//! bytes handed out are a slice of the mapping.
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_buffer::Buffer;
use arrow_ipc::reader::FileDecoder;
use arrow_ipc::{Block, MessageHeader, MetadataVersion};
use arrow_schema::SchemaRef;
use serde::{Deserialize, Serialize};

use crate::error::{quietly, Error, Result};

const ARROW_MAGIC: &[u8; 6] = b"ARROW1";
const CONTINUATION: [u8; 4] = [0xff; 4];
const INDEX_VERSION: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IpcFormat {
    File,
    Stream,
}

/// One encapsulated IPC message: where it is and, for record batches, how many rows it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageBlock {
    pub offset: u64,
    pub meta_len: u32,
    pub body_len: u64,
    pub rows: u64,
}

impl MessageBlock {
    fn ipc_block(&self) -> Block {
        Block::new(self.offset as i64, self.meta_len as i32, self.body_len as i64)
    }
    fn end(&self) -> u64 {
        self.offset + self.meta_len as u64 + self.body_len
    }
}

/// The cached metadata of a shard; valid while the file's size and mtime are unchanged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardIndex {
    pub version: u32,
    pub file_size: u64,
    pub mtime_ns: u128,
    pub format: IpcFormat,
    pub dictionaries: Vec<MessageBlock>,
    pub batches: Vec<MessageBlock>,
}

impl ShardIndex {
    pub fn rows(&self) -> u64 {
        self.batches.iter().map(|b| b.rows).sum()
    }
}

pub struct Shard {
    pub path: PathBuf,
    pub index: ShardIndex,
    pub schema: SchemaRef,
    data: Buffer,
    /// The mapping behind `data`, for access advice.
    mmap: Arc<memmap2::Mmap>,
    decoder: FileDecoder,
    /// Cumulative row count at the start of each record batch (for binary search).
    batch_starts: Vec<u64>,
}

struct MmapOwner(#[allow(dead_code)] Arc<memmap2::Mmap>);

/// Why `path` could not be opened or mapped (`what`): the file's fault, or one of this process's limits met
/// (`ErrorKind::Limit`, said so: under `ulimit -n` healthy audio files read by path were skipped as bad,
/// another set at every run, and past ~65,000 shards or under `ulimit -v` a healthy shard was named).
fn open_error(path: &Path, what: &str, e: std::io::Error) -> Error {
    // Linux's numbers (macOS's too): std names none of the first two.
    const ENOMEM: i32 = 12;
    const ENFILE: i32 = 23;
    const EMFILE: i32 = 24;
    let limit = match e.raw_os_error() {
        Some(EMFILE) => "this process's limit on open files (ulimit -n)",
        Some(ENFILE) => "the system's limit on open files (fs.file-max)",
        Some(ENOMEM) => {
            "this process's limit on memory maps (vm.max_map_count; a data set maps each of its shards) or on \
             its address space (ulimit -v), or the machine's memory"
        }
        _ => return Error::data(format!("{}: {what}: {e}", path.display())),
    };
    Error::limit(format!("{}: {what}: {e}: {limit} was met, not this file's fault", path.display()))
}

/// The file at `path` mapped into memory, as a buffer the mapping's owner keeps alive (shards, and audio
/// files read by path: a crop touches only the pages it decodes).
pub(crate) fn mmap_buffer(path: &Path) -> Result<(Buffer, Arc<memmap2::Mmap>)> {
    // Before the open: a FIFO's open waits for a writer, for ever and deaf to Ctrl-C (a path a row names,
    // or a shard); a folder's was "cannot mmap: No such device".
    let kind = std::fs::metadata(path).map_err(|e| open_error(path, "cannot open", e))?;
    if !kind.is_file() {
        let what = if kind.is_dir() { "a folder" } else { "not a regular file (a pipe, socket or device)" };
        return Err(Error::data(format!("{}: cannot open: {what}", path.display())));
    }
    let file = File::open(path).map_err(|e| open_error(path, "cannot open", e))?;
    let len = kind.len(); // the stat above: one per file, as before
    if len == 0 {
        return Err(Error::data(format!("{}: file is empty (truncated?)", path.display())));
    }
    // SAFETY: shards and audio files are treated as immutable while the loader runs; the data set's
    // fingerprint and its shards' digests (`Dataset::shard_digests`) see a file rewritten between
    // segments, and the resume's dataset check refuses it.
    let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| open_error(path, "cannot mmap", e))?;
    // Rows are read where the plan points, from every shard at once by default: the kernel's
    // read-around would read up to read_ahead_kb (8 MiB here) around each page touched, 10x the
    // bytes a loader needs. Instead each record asks for exactly its bytes (`Shard::will_need`).
    // Advice only: a kernel that ignores it reads more, never wrong.
    let _ = mmap.advise(memmap2::Advice::Random);
    let mmap = Arc::new(mmap);
    let ptr = std::ptr::NonNull::new(mmap.as_ptr() as *mut u8).expect("mmap returned null");
    let len = mmap.len();
    // SAFETY: the pointer and length come from the mapping, which the Arc keeps alive.
    Ok((unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(MmapOwner(mmap.clone()))) }, mmap))
}

fn file_stamp(path: &Path) -> Result<(u64, u128)> {
    let meta = std::fs::metadata(path).map_err(|e| Error::data(format!("{}: {e}", path.display())))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    Ok((meta.len(), mtime))
}

/// Parse the encapsulated message starting at `offset`: (block, header type, rows).
/// Returns None at an end-of-stream marker.
fn read_message_at(path: &Path, data: &[u8], offset: u64) -> Result<Option<(MessageBlock, MessageHeader)>> {
    let truncated = || {
        if offset == 0 && !data.starts_with(&CONTINUATION) {
            // A vocab.json or a script given as a shard was called truncated.
            return Error::data(format!("{}: not an Arrow shard (no IPC file or stream starts it)", path.display()));
        }
        Error::data(format!(
            "{}: truncated shard: an IPC message at byte {offset} runs past the end of the file ({} bytes)",
            path.display(),
            data.len()
        ))
    };
    let at = offset as usize;
    let head = data.get(at..at + 4).ok_or_else(truncated)?;
    // Current format: 0xFFFFFFFF then a little-endian i32 length; pre-1.0 writers omit the marker.
    let (prefix, meta_size) = if head == CONTINUATION {
        let len = data.get(at + 4..at + 8).ok_or_else(truncated)?;
        (8usize, i32::from_le_bytes(len.try_into().unwrap()))
    } else {
        (4usize, i32::from_le_bytes(head.try_into().unwrap()))
    };
    if meta_size == 0 {
        return Ok(None);
    }
    if meta_size < 0 {
        return Err(Error::data(format!(
            "{}: corrupt shard: negative message length {meta_size} at byte {offset}",
            path.display()
        )));
    }
    let meta_start = at + prefix;
    let meta_end = meta_start + meta_size as usize;
    let meta = data.get(meta_start..meta_end).ok_or_else(truncated)?;
    let message = arrow_ipc::root_as_message(meta).map_err(|e| {
        Error::data(format!("{}: corrupt IPC message at byte {offset}: {}", path.display(), first_line(&e)))
    })?;
    let body_len = u64::try_from(message.bodyLength()).map_err(|_| truncated())?;
    let batch = match message.header_type() {
        MessageHeader::RecordBatch => message.header_as_record_batch(),
        MessageHeader::DictionaryBatch => message.header_as_dictionary_batch().and_then(|d| d.data()),
        _ => None,
    };
    let rows = match batch {
        Some(b) => checked_batch_header(b, body_len)
            .map_err(|why| Error::data(format!("{}: corrupt record batch at byte {offset}: {why}", path.display())))?,
        None => 0,
    };
    let block = MessageBlock { offset, meta_len: (prefix + meta_size as usize) as u32, body_len, rows };
    if block.end() > data.len() as u64 {
        return Err(truncated());
    }
    Ok(Some((block, message.header_type())))
}

/// The rows of a record batch whose header holds: a row count that is not negative, and buffers inside
/// the body. The arrow reader trusts both: a buffer past the body was a panic in it (a Rust backtrace,
/// then a traceback naming no file), a negative count wrapped to 2^64 - 3 rows.
fn checked_batch_header(batch: arrow_ipc::RecordBatch, body_len: u64) -> std::result::Result<u64, String> {
    let rows = u64::try_from(batch.length()).map_err(|_| format!("a negative row count ({})", batch.length()))?;
    for (i, b) in batch.buffers().into_iter().flatten().enumerate() {
        let end = u64::try_from(b.offset()).ok().zip(u64::try_from(b.length()).ok()).and_then(|(o, l)| o.checked_add(l));
        if end.is_none_or(|end| end > body_len) {
            return Err(format!("buffer {i} (offset {}, length {}) is not inside its {body_len}-byte body", b.offset(), b.length()));
        }
    }
    Ok(rows)
}

/// The first line of a flatbuffer verifier's error: the rest is its path through the tables ("\twhile
/// verifying table field ..."), six lines and two blank ones in a message meant to be one line.
fn first_line(e: &impl std::fmt::Display) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// The IPC message an indexed block holds (past its continuation marker and length).
fn block_message<'a>(data: &'a [u8], block: &MessageBlock) -> std::result::Result<arrow_ipc::Message<'a>, String> {
    let at = block.offset as usize;
    let prefix = if data[at..at + 4] == CONTINUATION { 8 } else { 4 };
    arrow_ipc::root_as_message(&data[at + prefix..at + block.meta_len as usize]).map_err(|e| first_line(&e))
}

fn schema_from_message(path: &Path, data: &[u8], block: &MessageBlock) -> Result<arrow_schema::Schema> {
    let message = block_message(data, block)
        .map_err(|e| Error::data(format!("{}: corrupt schema message: {e}", path.display())))?;
    let fb = message
        .header_as_schema()
        .ok_or_else(|| Error::data(format!("{}: stream does not start with a schema message", path.display())))?;
    arrow_ipc::convert::try_fb_to_schema(fb).map_err(|e| Error::data(format!("{}: bad schema: {e}", path.display())))
}

fn detect_format(path: &Path, data: &[u8]) -> Result<IpcFormat> {
    if data.len() >= 8 && &data[..6] == ARROW_MAGIC {
        if data.len() < 16 || &data[data.len() - 6..] != ARROW_MAGIC {
            return Err(Error::data(format!(
                "{}: truncated shard: Arrow IPC file without its footer (expected 'ARROW1' at the end)",
                path.display()
            )));
        }
        return Ok(IpcFormat::File);
    }
    if data.len() >= 8 && (data[..4] == CONTINUATION || i32::from_le_bytes(data[..4].try_into().unwrap()) > 0) {
        return Ok(IpcFormat::Stream);
    }
    Err(Error::data(format!("{}: not an Arrow IPC file or stream", path.display())))
}

/// Footer of the file format: schema, version and the blocks (row counts still need each header).
fn read_file_footer(path: &Path, data: &[u8]) -> Result<(arrow_schema::Schema, MetadataVersion, Vec<Block>, Vec<Block>)> {
    let trailer = data.len() - 10;
    let footer_len = arrow_ipc::reader::read_footer_length(data[trailer..].try_into().unwrap())
        .map_err(|e| Error::data(format!("{}: {e}", path.display())))?;
    let start = trailer
        .checked_sub(footer_len)
        .ok_or_else(|| Error::data(format!("{}: corrupt footer length {footer_len}", path.display())))?;
    let footer = arrow_ipc::root_as_footer(&data[start..trailer])
        .map_err(|e| Error::data(format!("{}: corrupt footer: {}", path.display(), first_line(&e))))?;
    let schema = footer
        .schema()
        .ok_or_else(|| Error::data(format!("{}: footer has no schema", path.display())))
        .and_then(|s| {
            arrow_ipc::convert::try_fb_to_schema(s).map_err(|e| Error::data(format!("{}: bad schema: {e}", path.display())))
        })?;
    let dicts = footer.dictionaries().map(|v| v.iter().copied().collect()).unwrap_or_default();
    let batches = footer.recordBatches().map(|v| v.iter().copied().collect()).unwrap_or_default();
    Ok((schema, footer.version(), dicts, batches))
}

fn build_index(path: &Path, data: &[u8], format: IpcFormat, stamp: (u64, u128)) -> Result<ShardIndex> {
    let mut dictionaries = Vec::new();
    let mut batches = Vec::new();
    match format {
        IpcFormat::File => {
            let (_, _, dicts, blocks) = read_file_footer(path, data)?;
            for b in &dicts {
                let (block, _) = read_message_at(path, data, b.offset() as u64)?
                    .ok_or_else(|| Error::data(format!("{}: empty dictionary block", path.display())))?;
                dictionaries.push(block);
            }
            for b in &blocks {
                let (block, kind) = read_message_at(path, data, b.offset() as u64)?
                    .ok_or_else(|| Error::data(format!("{}: empty record-batch block", path.display())))?;
                if kind != MessageHeader::RecordBatch {
                    return Err(Error::data(format!("{}: footer block at byte {} is not a record batch", path.display(), b.offset())));
                }
                batches.push(block);
            }
        }
        IpcFormat::Stream => {
            let mut offset = 0u64;
            let mut first = true;
            loop {
                if offset as usize >= data.len() {
                    return Err(Error::data(format!(
                        "{}: truncated shard: the stream ends at byte {offset} without its end-of-stream marker",
                        path.display()
                    )));
                }
                let Some((block, kind)) = read_message_at(path, data, offset)? else { break };
                match kind {
                    MessageHeader::Schema if first => {}
                    MessageHeader::DictionaryBatch => dictionaries.push(block),
                    MessageHeader::RecordBatch => batches.push(block),
                    other => {
                        return Err(Error::data(format!(
                            "{}: unexpected IPC message {other:?} at byte {offset}",
                            path.display()
                        )))
                    }
                }
                first = false;
                offset = block.end();
            }
        }
    }
    // A dictionary replaced mid-stream (pandas Categorical chunks written one by one): the reader applies
    // the dictionaries it read at open to every batch, so earlier batches read the last one's values
    // (an index past its end an error, one inside it a wrong value, silently). Deltas only append.
    let mut seen = std::collections::HashSet::new();
    for d in &dictionaries {
        let header = block_message(data, d).ok().and_then(|m| m.header_as_dictionary_batch().map(|b| (b.id(), b.isDelta())));
        if let Some((id, false)) = header {
            if !seen.insert(id) {
                return Err(Error::data(format!(
                    "{}: dictionary {id} is replaced at byte {}: the loader reads one dictionary a column for \
                     every batch; unify them (pyarrow's Table.unify_dictionaries) or write the column as plain values",
                    path.display(),
                    d.offset
                )));
            }
        }
    }
    Ok(ShardIndex { version: INDEX_VERSION, file_size: stamp.0, mtime_ns: stamp.1, format, dictionaries, batches })
}

/// Whether a cached index still describes the file, by what is cheap to read again: its first and last
/// record batches' headers, and the file format's footer (its blocks). A file replaced at the same size
/// and modification time (`rsync -a`, `tar x`) kept an index of another layout: an open that spun for
/// ever, deaf to signals, or a panic blaming a valid row.
fn still_describes(path: &Path, data: &[u8], index: &ShardIndex) -> bool {
    let same = |cached: &MessageBlock| {
        matches!(read_message_at(path, data, cached.offset), Ok(Some((block, _))) if block == *cached)
    };
    let ends = index.batches.first().is_none_or(same) && index.batches.last().is_none_or(same);
    ends && match index.format {
        IpcFormat::File => read_file_footer(path, data).is_ok_and(|(_, _, dicts, blocks)| {
            let listed = |found: &[Block], cached: &[MessageBlock]| {
                found.len() == cached.len()
                    && found.iter().zip(cached).all(|(f, c)| {
                        (f.offset(), f.metaDataLength(), f.bodyLength()) == (c.offset as i64, c.meta_len as i32, c.body_len as i64)
                    })
            };
            listed(&blocks, &index.batches) && listed(&dicts, &index.dictionaries)
        }),
        IpcFormat::Stream => true,
    }
}

/// Where the index of `path` is cached: beside it if that folder is writable, else the user cache.
fn index_paths(path: &Path) -> Vec<PathBuf> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut out = vec![path.with_file_name(format!(".{name}.bjindex.json"))];
    // Empty is unset, as the Python side reads them (an empty XDG_CACHE_HOME put the index in the working
    // folder).
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    let cache = var("BIRDJEPA_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|p| p.join("birdjepa")))
        .or_else(|| var("HOME").map(|p| p.join(".cache").join("birdjepa")));
    if let Some(dir) = cache {
        let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        let key = crate::rng::hash_words(&abs.to_string_lossy().bytes().map(u64::from).collect::<Vec<_>>());
        // The shard's name cut to fit a file name (255 bytes): a longer one was never cached; the key tells
        // shards apart.
        let short: String = name.chars().scan(0, |used, c| {
            *used += c.len_utf8();
            (*used <= 200).then_some(c)
        }).collect();
        out.push(dir.join("index").join(format!("{key:016x}-{short}.json")));
    }
    out
}

fn load_cached_index(path: &Path, stamp: (u64, u128)) -> Option<ShardIndex> {
    index_paths(path).into_iter().find_map(|p| {
        let text = std::fs::read_to_string(p).ok()?;
        let idx: ShardIndex = serde_json::from_str(&text).ok()?;
        (idx.version == INDEX_VERSION && idx.file_size == stamp.0 && idx.mtime_ns == stamp.1).then_some(idx)
    })
}

fn store_index(path: &Path, index: &ShardIndex) {
    let text = serde_json::to_string(index).expect("index serialises");
    for p in index_paths(path) {
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        // Write-then-rename so a concurrent reader never sees half an index.
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &text).is_ok() && std::fs::rename(&tmp, &p).is_ok() {
            return;
        }
        let _ = std::fs::remove_file(&tmp);
    }
}

impl Shard {
    pub fn open(path: &Path) -> Result<Self> {
        let (data, mmap) = mmap_buffer(path)?;
        let stamp = file_stamp(path)?;
        let format = detect_format(path, &data)?;
        let index = match load_cached_index(path, stamp) {
            Some(idx) if idx.format == format && still_describes(path, &data, &idx) => idx,
            _ => {
                let idx = build_index(path, &data, format, stamp)?;
                store_index(path, &idx);
                idx
            }
        };
        if let Some(bad) = index.batches.iter().chain(&index.dictionaries).find(|b| b.end() > data.len() as u64) {
            return Err(Error::data(format!(
                "{}: truncated shard: record batch at byte {} ends past the end of the file",
                path.display(),
                bad.offset
            )));
        }
        let (schema, version) = match format {
            IpcFormat::File => {
                let (schema, version, _, _) = read_file_footer(path, &data)?;
                (schema, version)
            }
            IpcFormat::Stream => {
                let (first, _) = read_message_at(path, &data, 0)?
                    .ok_or_else(|| Error::data(format!("{}: empty stream", path.display())))?;
                let version = block_message(&data, &first)
                    .map(|m| m.version())
                    .map_err(|e| Error::data(format!("{}: {e}", path.display())))?;
                (schema_from_message(path, &data, &first)?, version)
            }
        };
        let schema = Arc::new(schema);
        let mut decoder = FileDecoder::new(schema.clone(), version);
        for d in &index.dictionaries {
            let buf = data.slice_with_length(d.offset as usize, (d.meta_len as u64 + d.body_len) as usize);
            quietly(|| decoder.read_dictionary(&d.ipc_block(), &buf))
                .unwrap_or_else(|panic| Err(arrow_schema::ArrowError::IpcError(panic)))
                .map_err(|e| Error::data(format!("{}: bad dictionary at byte {}: {e}", path.display(), d.offset)))?;
        }
        let mut batch_starts = Vec::with_capacity(index.batches.len());
        let mut total = 0;
        for b in &index.batches {
            batch_starts.push(total);
            total += b.rows;
        }
        Ok(Self { path: path.to_path_buf(), index, schema, data, mmap, decoder, batch_starts })
    }

    pub fn rows(&self) -> u64 {
        self.index.rows()
    }

    /// Ask the kernel to read `bytes` (a slice of this shard) in one go, before they are touched.
    pub fn will_need(&self, bytes: &[u8]) {
        let offset = (bytes.as_ptr() as usize).wrapping_sub(self.mmap.as_ptr() as usize);
        if offset < self.mmap.len() && !bytes.is_empty() {
            let _ = self.mmap.advise_range(memmap2::Advice::WillNeed, offset, bytes.len().min(self.mmap.len() - offset));
        }
    }

    /// Bytes at both ends of the file: cheap evidence for a data-set fingerprint.
    pub fn edge_bytes(&self, n: usize) -> (&[u8], &[u8]) {
        let len = self.data.len();
        let (head, tail) = (&self.data[..n.min(len)], &self.data[len.saturating_sub(n)..]);
        self.will_need(head);
        self.will_need(tail);
        (head, tail)
    }

    pub fn file_size(&self) -> u64 {
        self.data.len() as u64
    }

    /// The record batch holding `row`, and the row's offset inside it.
    pub fn batch_for_row(&self, row: u64) -> Result<(RecordBatch, usize)> {
        let i = self.batch_starts.partition_point(|&s| s <= row).saturating_sub(1);
        if i >= self.index.batches.len() || row >= self.rows() {
            return Err(Error::data(format!("{}: row {row} out of range ({} rows)", self.path.display(), self.rows())));
        }
        Ok((self.batch(i)?, (row - self.batch_starts[i]) as usize))
    }

    /// Record batch `i`, decoded (its arrays are views of the mapped file).
    pub fn batch(&self, i: usize) -> Result<RecordBatch> {
        let block = &self.index.batches[i];
        let buf = self.data.slice_with_length(block.offset as usize, (block.meta_len as u64 + block.body_len) as usize);
        // A header the index checked (`checked_batch_header`) still meets the arrow reader's own panics.
        let batch = quietly(|| self.decoder.read_record_batch(&block.ipc_block(), &buf))
            .unwrap_or_else(|panic| Err(arrow_schema::ArrowError::IpcError(panic)))
            .map_err(|e| Error::data(format!("{}: cannot read record batch at byte {}: {e}", self.path.display(), block.offset)))?
            .ok_or_else(|| Error::data(format!("{}: empty record batch at byte {}", self.path.display(), block.offset)))?;
        if batch.num_rows() as u64 != block.rows {  // else a reader of its rows by the index looped for ever
            return Err(Error::data(format!(
                "{}: the record batch at byte {} holds {} rows where the shard's index says {}: the file changed \
                 after it was indexed; remove its .bjindex.json (it is built again)",
                self.path.display(),
                block.offset,
                batch.num_rows(),
                block.rows
            )));
        }
        Ok(batch)
    }

    /// Record batches in the file.
    pub fn n_batches(&self) -> usize {
        self.index.batches.len()
    }

    /// The named column of a decoded batch, or an error naming the file and column.
    pub fn column(&self, batch: &RecordBatch, name: &str) -> Result<ArrayRef> {
        batch.column_by_name(name).cloned().ok_or_else(|| {
            Error::data(format!(
                "{}: missing column '{name}' (columns: {})",
                self.path.display(),
                batch.schema().fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>().join(", ")
            ))
        })
    }
}
