//! Where a row's encoded audio sits: bytes inside the shard (a binary column, or the `bytes` of HF's
//! `Audio` struct), or a file that a path names (the struct's `path` where its `bytes` is null, as the
//! cache of a `datasets` loading script holds BirdSet; or a plain string column of paths). A relative
//! path is resolved against the `audio_root` option when given, else against the shard's folder.
//!
//! A file read by path is part of the data set's identity: `stamps` gives each one's size and
//! modification time for the fingerprint, so a file changed between two segments is refused at resume,
//! like a changed shard. Only the rows whose audio is a path cost a `stat` each at open.
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, StructArray};
use arrow_buffer::Buffer;
use arrow_schema::{DataType, Field};

use crate::error::{Error, ErrorKind, Result};
use crate::shard::{mmap_buffer, Shard};

/// A file read by path up to this size is asked for in one read (it is decoded whole); a longer one is
/// read page by page where its crop is decoded.
const WHOLE_READ_BYTES: usize = 4 << 20;

/// i32 or i64 offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Width {
    Small,
    Large,
}

/// How a shard's audio column holds the audio: which of bytes and path it has, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AudioLayout {
    /// The column is a struct (HF's `Audio`: `bytes` and `path`), not the values themselves.
    in_struct: bool,
    bytes: Option<Width>,
    path: Option<Width>,
}

/// Why no reader takes the audio column `column` of a file whose schema is `schema_ipc` (an Arrow IPC
/// schema message, as `pyarrow.Schema.serialize` writes it), naming `file`; Ok where it takes it. What
/// `prepare` asks before it converts: decoded audio, a dictionary of paths, a list of bytes were
/// converted, exit 0, and refused by every command that read them.
pub fn check_audio_column(schema_ipc: &[u8], column: &str, file: &Path) -> Result<()> {
    let schema = arrow_ipc::convert::try_schema_from_ipc_buffer(schema_ipc)
        .map_err(|e| Error::data(format!("{}: its schema cannot be read: {e}", file.display())))?;
    let field = schema
        .field_with_name(column)
        .map_err(|_| Error::data(format!("{}: no column '{column}'", file.display())))?;
    AudioLayout::of(file, field).map(|_| ())
}

impl AudioLayout {
    /// The layout of `field`, the audio column of the shard at `shard`.
    pub fn of(shard: &Path, field: &Field) -> Result<Self> {
        let binary = |t: &DataType| match t {
            DataType::Binary => Some(Width::Small),
            DataType::LargeBinary => Some(Width::Large),
            _ => None,
        };
        let string = |t: &DataType| match t {
            DataType::Utf8 => Some(Width::Small),
            DataType::LargeUtf8 => Some(Width::Large),
            _ => None,
        };
        let layout = match field.data_type() {
            DataType::Struct(fields) => {
                let typed = |name: &str| fields.iter().find(|f| f.name() == name).map(|f| f.data_type().clone());
                if typed("bytes").is_none() && typed("array").is_some() {
                    // HF's decoded form: every row read its path, "cannot open", naming nothing of why.
                    return Err(Error::data(format!(
                        "{}: column '{}' holds decoded samples (HF's array and sampling_rate), not the encoded audio the loader decodes: save the data set with Audio(decode=False)",
                        shard.display(),
                        field.name()
                    )));
                }
                let bytes = typed("bytes").and_then(|t| binary(&t));
                let path = typed("path").and_then(|t| string(&t));
                Self { in_struct: true, bytes, path }
            }
            t => Self { in_struct: false, bytes: binary(t), path: string(t) },
        };
        if layout.bytes.is_none() && layout.path.is_none() {
            return Err(Error::data(format!(
                "{}: column '{}' has type {}; expected binary bytes, a string path, or a struct with a \
                 binary 'bytes' and/or a string 'path' field (HF's Audio)",
                shard.display(),
                field.name(),
                field.data_type()
            )));
        }
        Ok(layout)
    }

    /// The bytes of row `r` of `column`, or the path it names instead (None: neither).
    fn locate(&self, column: &ArrayRef, r: usize) -> Option<Located> {
        let (bytes, path) = if self.in_struct {
            if column.is_null(r) {
                return None;
            }
            let s: &StructArray = column.as_struct();
            (s.column_by_name("bytes").cloned(), s.column_by_name("path").cloned())
        } else if self.bytes.is_some() {
            (Some(column.clone()), None)
        } else {
            (None, Some(column.clone()))
        };
        if let (Some(col), Some(width)) = (bytes, self.bytes) {
            if col.is_valid(r) {
                return Some(Located::Bytes(binary_slice(&col, width, r)));
            }
        }
        match (path, self.path) {
            (Some(col), Some(width)) if col.is_valid(r) => Some(Located::Path(match width {
                Width::Small => col.as_string::<i32>().value(r).to_string(),
                Width::Large => col.as_string::<i64>().value(r).to_string(),
            })),
            _ => None,
        }
    }

    /// The encoded audio of row `r` of `column` (a shard's audio column), a file read whole where the row
    /// names one (relative paths under `root`), with that file's path (None: bytes in the shard). The
    /// inner error is why the row has none, for a counted skip; the outer, a limit of this process that
    /// the read met (a skip would hang on the process, not the file, and differ between runs).
    pub fn read(&self, column: &ArrayRef, r: usize, root: &Path) -> Result<std::result::Result<(Buffer, Option<PathBuf>), String>> {
        Ok(match self.locate(column, r) {
            Some(Located::Bytes(b)) => Ok((b, None)),
            Some(Located::Path(p)) => match mmap_buffer(&resolve(root, &p)) {
                Ok((buffer, map)) => {
                    if buffer.len() <= WHOLE_READ_BYTES {
                        let _ = map.advise(memmap2::Advice::WillNeed); // decoded whole: one read
                    }
                    Ok((buffer, Some(resolve(root, &p))))
                }
                Err(e) if e.kind == ErrorKind::Limit => return Err(Error::limit(format!("audio file {e}"))),
                Err(e) => Err(format!("audio file {e}")),
            },
            None if self.path.is_some() => Err("audio bytes and path are null".into()),
            None => Err("audio bytes are null".into()),
        })
    }

    /// Size and modification time (ns) of every file the shard's rows read by path, in row order (a
    /// missing file gives `u64::MAX` twice: its rows are skipped when read, and a file that appears later
    /// changes the stamps). Empty where the layout holds no path.
    pub fn stamps(&self, shard: &Shard, column: &str, root: &Path) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        if self.path.is_none() {
            return Ok(out);
        }
        let mut row = 0;
        while row < shard.rows() {
            let (batch, first) = shard.batch_for_row(row)?;
            let col = shard.column(&batch, column)?;
            for r in first..batch.num_rows() {
                if let Some(Located::Path(p)) = self.locate(&col, r) {
                    let meta = std::fs::metadata(resolve(root, &p)).ok();
                    let mtime = meta.as_ref().and_then(|m| m.modified().ok()?.duration_since(UNIX_EPOCH).ok());
                    out.push(meta.as_ref().map_or(u64::MAX, |m| m.len()));
                    out.push(mtime.map_or(u64::MAX, |t| t.as_nanos() as u64));
                }
            }
            row += (batch.num_rows() - first) as u64;
        }
        Ok(out)
    }
}

enum Located {
    Bytes(Buffer),
    Path(String),
}

/// `path` as stored in a row, under `root` unless absolute.
fn resolve(root: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        root.join(p)
    }
}

fn binary_slice(array: &ArrayRef, width: Width, row: usize) -> Buffer {
    match width {
        Width::Large => {
            let a = array.as_binary::<i64>();
            let (start, end) = (a.value_offsets()[row] as usize, a.value_offsets()[row + 1] as usize);
            a.values().slice_with_length(start, end - start)
        }
        Width::Small => {
            let a = array.as_binary::<i32>();
            let (start, end) = (a.value_offsets()[row] as usize, a.value_offsets()[row + 1] as usize);
            a.values().slice_with_length(start, end - start)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, StringArray};
    use arrow_schema::Fields;
    use std::sync::Arc;

    fn hf_audio(bytes: Vec<Option<&[u8]>>, paths: Vec<Option<&str>>) -> (Field, ArrayRef) {
        let fields = Fields::from(vec![
            Field::new("bytes", DataType::Binary, true),
            Field::new("path", DataType::Utf8, true),
        ]);
        let columns: Vec<ArrayRef> =
            vec![Arc::new(BinaryArray::from_opt_vec(bytes)), Arc::new(StringArray::from(paths))];
        let array = StructArray::new(fields.clone(), columns, None);
        (Field::new("audio", DataType::Struct(fields), true), Arc::new(array))
    }

    #[test]
    fn bytes_win_a_null_falls_back_to_the_path_and_a_relative_path_is_under_the_root() {
        let dir = std::env::temp_dir().join(format!("birdjepa-audio-source-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("clips")).unwrap();
        std::fs::write(dir.join("clips/a.flac"), b"file a").unwrap();
        let absolute = dir.join("clips/a.flac").to_string_lossy().into_owned();
        let (field, column) = hf_audio(
            vec![Some(b"inline"), None, None, None, None],
            vec![Some("ignored.flac"), Some("clips/a.flac"), Some(&absolute), Some("clips/missing.flac"), None],
        );
        let layout = AudioLayout::of(Path::new("s.arrow"), &field).unwrap();
        let read = |r| layout.read(&column, r, &dir).unwrap();
        assert_eq!(read(0).unwrap(), (Buffer::from(b"inline"), None));
        assert_eq!(read(1).unwrap(), (Buffer::from(b"file a"), Some(dir.join("clips/a.flac"))));
        assert_eq!(read(2).unwrap(), (Buffer::from(b"file a"), Some(dir.join("clips/a.flac"))));
        let missing = read(3).unwrap_err();
        assert!(missing.starts_with("audio file ") && missing.contains("clips/missing.flac"), "{missing}");
        assert_eq!(read(4).unwrap_err(), "audio bytes and path are null");
        std::fs::remove_dir_all(&dir).unwrap();
        // HF's decoded form (array, sampling_rate, path): every row was "cannot open" its path.
        let decoded = Fields::from(vec![
            Field::new("array", DataType::new_list(DataType::Float32, true), true),
            Field::new("sampling_rate", DataType::Int64, true),
            Field::new("path", DataType::Utf8, true),
        ]);
        let e = AudioLayout::of(Path::new("s.arrow"), &Field::new("audio", DataType::Struct(decoded), true));
        let said = e.unwrap_err().to_string();
        assert!(said.contains("holds decoded samples (HF's array and sampling_rate), not the encoded audio"), "{said}");
    }

    #[test]
    fn a_column_with_neither_bytes_nor_a_path_is_refused_naming_the_shard() {
        let field = Field::new("audio", DataType::Int64, true);
        let e = AudioLayout::of(Path::new("x/s.arrow"), &field).unwrap_err().to_string();
        assert!(e.contains("x/s.arrow: column 'audio' has type Int64"), "{e}");
        let plain = AudioLayout::of(Path::new("s"), &Field::new("audio", DataType::LargeUtf8, true)).unwrap();
        assert_eq!(plain, AudioLayout { in_struct: false, bytes: None, path: Some(Width::Large) });
    }
}
