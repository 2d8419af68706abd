//! Thin PyO3 layer over birdjepa-core: type conversion only, no loader logic.
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use birdjepa_core::dataset::RecordError;
use birdjepa_core::error::{Error, ErrorKind};
use birdjepa_core::loader::{Batch, Loader, LoaderConfig, LoaderState, Poll};
use birdjepa_core::options::LoaderOptions;
use numpy::{PyArray1, PyArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

mod audio_fns;

create_exception!(_rs, DataError, PyException, "A shard or record cannot be used; the message names the file.");
create_exception!(_rs, StateError, PyException, "A loader state does not fit this data set or config.");
create_exception!(_rs, WorkerError, PyException, "A loader worker thread failed.");

/// How long one wait in Rust lasts before Python gets to check for Ctrl-C.
const POLL: Duration = Duration::from_millis(100);

fn to_py(e: Error) -> PyErr {
    match e.kind {
        ErrorKind::Config => PyValueError::new_err(e.message),
        ErrorKind::Data | ErrorKind::Limit => DataError::new_err(e.message),
        ErrorKind::State => StateError::new_err(e.message),
        ErrorKind::Worker => WorkerError::new_err(e.message),
    }
}

/// The default of every loader option, as a JSON object (`birdjepa.data` reads its defaults from here).
#[pyfunction]
fn loader_defaults() -> String {
    LoaderOptions::default().to_json()
}

/// Checks loader options (a JSON object) without opening a file; a ValueError names the first bad one.
#[pyfunction]
fn check_loader_options(options_json: &str) -> PyResult<(usize, usize)> {
    LoaderOptions::from_json(options_json).and_then(|o| LoaderConfig::from_options(&o).check()).map_err(to_py)
}

/// DataError where no reader takes the audio column `column` of the file `file` whose schema is
/// `schema_ipc` (`pyarrow.Schema.serialize`): `prepare` asks it before converting.
#[pyfunction]
fn check_audio_column(schema_ipc: &[u8], column: &str, file: &str) -> PyResult<()> {
    birdjepa_core::audio_source::check_audio_column(schema_ipc, column, std::path::Path::new(file)).map_err(to_py)
}

/// 2^28 indices and epochs: 4 GiB.
const MAX_PLANNED: usize = 1 << 28;

/// (global sample index, epoch) of output positions 0..count that a loader with these options draws
/// from shards of `shard_rows` rows: its planner alone, no file read (IID measurements at scale).
#[pyfunction]
#[allow(clippy::type_complexity)]
fn plan_indices<'py>(
    py: Python<'py>,
    shard_rows: Vec<u64>,
    options_json: &str,
    count: usize,
) -> PyResult<(Bound<'py, PyArray1<u64>>, Bound<'py, PyArray1<u64>>)> {
    let cfg = LoaderConfig::from_options(&LoaderOptions::from_json(options_json).map_err(to_py)?);
    if count > MAX_PLANNED {
        // 2^40 aborted the process (its allocation failed), deaf to Ctrl-C
        return Err(PyValueError::new_err(format!("count {count}: at most {MAX_PLANNED} samples are planned at once")));
    }
    let planner = cfg.planner(&shard_rows, None).map_err(to_py)?;
    let (index, epoch): (Vec<u64>, Vec<u64>) = py.detach(|| planner.take(count).map(|i| (i.index, i.epoch)).unzip());
    Ok((PyArray1::from_vec(py, index), PyArray1::from_vec(py, epoch)))
}

/// The Rust loader; `birdjepa.data.Loader` wraps it with a Pythonic signature.
#[pyclass(name = "Loader", module = "birdjepa._rs")]
struct PyLoader {
    // Mutex: the loader is Send but not Sync, and Python objects must be both.
    inner: Mutex<Loader>,
}

/// What a batch's flat arrays are reshaped by.
struct BatchShape {
    n_views: usize,
    frames: (usize, usize),
    /// The multi-hot's width, with a multilabel column.
    n_classes: Option<usize>,
}

fn batch_to_dict<'py>(py: Python<'py>, b: Batch, shape: &BatchShape) -> PyResult<Bound<'py, PyDict>> {
    let (n_views, frames) = (shape.n_views, shape.frames);
    let dict = PyDict::new(py);
    let spec = PyArray1::from_vec(py, b.spectrogram);
    // Vec -> ndarray without copying; the reshape is a view of the same buffer.
    let spec = if n_views == 1 {
        spec.reshape([b.n, frames.0, frames.1])?.into_any()
    } else {
        spec.reshape([b.n, n_views, frames.0, frames.1])?.into_any()
    };
    dict.set_item("spectrogram", spec)?;
    let offsets = PyArray1::from_vec(py, b.crop_offset);
    let offsets = if n_views == 1 { offsets.into_any() } else { offsets.reshape([b.n, n_views])?.into_any() };
    dict.set_item("crop_offset", offsets)?;
    dict.set_item("label", PyArray1::from_vec(py, b.label))?;
    if let Some(c) = shape.n_classes {
        dict.set_item("multilabel", PyArray1::from_vec(py, b.multilabel).reshape([b.n, c])?)?;
    }
    dict.set_item("index", PyArray1::from_vec(py, b.index))?;
    dict.set_item("shard_id", PyArray1::from_vec(py, b.shard_id))?;
    dict.set_item("epoch", PyArray1::from_vec(py, b.epoch))?;
    Ok(dict)
}

#[pymethods]
impl PyLoader {
    #[new]
    #[pyo3(signature = (files, options_json, state_json=None))]
    fn new(py: Python<'_>, files: Vec<PathBuf>, options_json: &str, state_json: Option<&str>) -> PyResult<Self> {
        // Names, types and defaults of the options are `LoaderOptions`'s; an unknown one is a ValueError.
        let cfg = LoaderConfig::from_options(&LoaderOptions::from_json(options_json).map_err(to_py)?);
        let state: Option<LoaderState> = state_json
            .map(|s| serde_json::from_str(s).map_err(|e| StateError::new_err(format!("malformed loader state: {e}"))))
            .transpose()?;
        let loader = py.detach(|| Loader::new(&files, cfg, state)).map_err(to_py)?;
        Ok(Self { inner: Mutex::new(loader) })
    }

    /// The next batch as a dict of numpy arrays, or None at the end of an eval pass.
    fn next_batch<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        loop {
            let polled = py.detach(|| self.inner.lock().unwrap().next_batch(POLL)).map_err(to_py)?;
            match polled {
                Poll::Batch(b) => {
                    // A Ctrl-C during the wait is raised by Python as this call returns, and the batch
                    // was lost with `state()` past it: raised here, with the batch kept for the next call.
                    if let Err(e) = py.check_signals() {
                        self.inner.lock().unwrap().put_back(b);
                        return Err(e);
                    }
                    let shape = {
                        let l = self.inner.lock().unwrap();
                        let n_classes = l.dataset().n_classes();
                        BatchShape { n_views: l.config().n_views, frames: l.frame_shape(), n_classes }
                    };
                    return batch_to_dict(py, b, &shape).map(Some);
                }
                Poll::End => return Ok(None),
                // Gives Ctrl-C a chance: KeyboardInterrupt is raised from here.
                Poll::Pending => py.check_signals()?,
            }
        }
    }

    fn restart(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.lock().unwrap().restart()).map_err(to_py)
    }

    // Each call below waits for the loader's lock without the GIL: `next_batch` holds the lock through
    // its 100 ms polls, and a `state()` from another thread froze every Python thread meanwhile.
    fn state_json(&self, py: Python<'_>) -> String {
        py.detach(|| serde_json::to_string(&self.inner.lock().unwrap().state()).expect("state serialises"))
    }

    fn diagnostics_json(&self, py: Python<'_>) -> String {
        py.detach(|| serde_json::to_string(&self.inner.lock().unwrap().diagnostics()).expect("diagnostics serialise"))
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        py.detach(|| self.inner.lock().unwrap().dataset().len() as usize)
    }

    fn fingerprint(&self, py: Python<'_>) -> String {
        py.detach(|| self.inner.lock().unwrap().dataset().fingerprint().to_string())
    }

    fn reads_audio_by_path(&self, py: Python<'_>) -> bool {
        py.detach(|| self.inner.lock().unwrap().dataset().reads_audio_by_path())
    }

    /// Each shard's file name and content digest (`Dataset::shard_digests`).
    fn shard_digests(&self, py: Python<'_>) -> PyResult<Vec<(String, String)>> {
        py.detach(|| self.inner.lock().unwrap().dataset().shard_digests()).map_err(to_py)
    }

    /// The decode threads it runs (`n_workers`; 0 asked for one per CPU this process may run on).
    fn n_workers(&self, py: Python<'_>) -> usize {
        py.detach(|| self.inner.lock().unwrap().config().n_workers)
    }

    /// Rows per shard, in shard-id order (for the IID diagnostics' shard statistics).
    fn shard_rows(&self, py: Python<'_>) -> Vec<u64> {
        py.detach(|| self.inner.lock().unwrap().dataset().shard_rows())
    }

    /// The encoded audio of global sample `index`, as the loader reads it (bytes in the shard, or the
    /// file its path names); a row the loader skips is a DataError saying why.
    fn encoded_audio<'py>(&self, py: Python<'py>, index: u64) -> PyResult<Bound<'py, PyBytes>> {
        let guard = self.inner.lock().unwrap();
        let dataset = guard.dataset();
        if index >= dataset.len() {
            // Else the core's assert panicked with the lock held: every later call a PoisonError.
            return Err(PyIndexError::new_err(format!("sample index {index}: the loader has {} samples", dataset.len())));
        }
        match dataset.record(index) {
            Ok(record) => Ok(PyBytes::new(py, record.audio.as_slice())),
            Err(RecordError::Skip(why)) => {
                let (shard, row) = dataset.locate(index);
                Err(to_py(Error::data(format!("{}: row {row}: {why}", dataset.shard_path(shard).display()))))
            }
            Err(RecordError::Fatal(e)) => Err(to_py(e)),
        }
    }
}

/// (fingerprint, rows, whether some row names its audio by path) of the shards a loader with these
/// options would read, opened and checked as `Loader::new` opens them, with no thread started.
#[pyfunction]
fn open_shards(py: Python<'_>, files: Vec<PathBuf>, options_json: &str) -> PyResult<(String, u64, bool)> {
    let cfg = LoaderConfig::from_options(&LoaderOptions::from_json(options_json).map_err(to_py)?);
    let dataset = py.detach(|| Loader::open_dataset(&files, &cfg)).map_err(to_py)?;
    Ok((dataset.fingerprint().to_string(), dataset.len(), dataset.reads_audio_by_path()))
}

/// The label names of the `vocab.json` beside `shard`, or None where there is none.
#[pyfunction]
fn vocab_names(shard: PathBuf) -> PyResult<Option<Vec<String>>> {
    birdjepa_core::dataset::vocab_names(&shard).map_err(to_py)
}

#[pymodule]
fn _rs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLoader>()?;
    m.add_function(wrap_pyfunction!(loader_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(check_loader_options, m)?)?;
    m.add_function(wrap_pyfunction!(check_audio_column, m)?)?;
    m.add_function(wrap_pyfunction!(plan_indices, m)?)?;
    m.add_function(wrap_pyfunction!(vocab_names, m)?)?;
    m.add_function(wrap_pyfunction!(open_shards, m)?)?;
    m.add("VOCAB_FILE", birdjepa_core::dataset::VOCAB_FILE)?;
    m.add("DECODE_REVISIONS", birdjepa_core::audio::DECODE_REVISIONS.to_vec())?;
    m.add("DataError", m.py().get_type::<DataError>())?;
    m.add("StateError", m.py().get_type::<StateError>())?;
    m.add("WorkerError", m.py().get_type::<WorkerError>())?;
    audio_fns::register(m)?;
    Ok(())
}
