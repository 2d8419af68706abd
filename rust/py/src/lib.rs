//! Thin PyO3 layer over birdjepa-core: type conversion only, no loader logic.
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use birdjepa_core::audio::{ClipConfig, FbankConfig, MaskConfig};
use birdjepa_core::dataset::ColumnConfig;
use birdjepa_core::error::{Error, ErrorKind};
use birdjepa_core::loader::{Batch, Loader, LoaderConfig, LoaderState, Poll};
use numpy::{PyArray1, PyArrayMethods};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::Value;

mod audio_fns;

create_exception!(_rs, DataError, PyException, "A shard or record cannot be used; the message names the file.");
create_exception!(_rs, StateError, PyException, "A loader state does not fit this data set or config.");
create_exception!(_rs, WorkerError, PyException, "A loader worker thread failed.");

/// How long one wait in Rust lasts before Python gets to check for Ctrl-C.
const POLL: Duration = Duration::from_millis(100);

fn to_py(e: Error) -> PyErr {
    match e.kind {
        ErrorKind::Config => PyValueError::new_err(e.message),
        ErrorKind::Data => DataError::new_err(e.message),
        ErrorKind::State => StateError::new_err(e.message),
        ErrorKind::Worker => WorkerError::new_err(e.message),
    }
}

/// Read `key` from the option object, or keep `default`; a wrong type is a ValueError naming it.
fn opt<T: serde::de::DeserializeOwned>(obj: &serde_json::Map<String, Value>, key: &str, default: T) -> PyResult<T> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|e| PyValueError::new_err(format!("loader option {key}={v}: {e}"))),
    }
}

const KNOWN: &[&str] = &[
    "batch_size", "n_workers", "n_views", "train", "augment", "drop_last", "seed", "shuffle_buffer",
    "shuffle_initial", "interleave", "prefetch_batches", "audio_column", "label_column", "debug_panic_index",
    "target_rate", "clip_samples", "n_frames", "mean", "std", "time_mask_count", "time_mask_width",
    "freq_mask_count", "freq_mask_width", "n_fft", "win_length", "hop_length", "n_mels", "f_min", "f_max", "preemphasis",
    "remove_dc", "log_floor",
];

fn config_from_json(text: &str) -> PyResult<LoaderConfig> {
    let value: Value = serde_json::from_str(text).map_err(|e| PyValueError::new_err(format!("loader options: {e}")))?;
    let o = value.as_object().ok_or_else(|| PyValueError::new_err("loader options must be a JSON object"))?;
    if let Some(k) = o.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(PyValueError::new_err(format!("unknown loader option '{k}'")));
    }
    let d = LoaderConfig::default();
    let (dc, df) = (ClipConfig::default(), FbankConfig::default());
    let fbank = FbankConfig {
        sample_rate: opt(o, "target_rate", df.sample_rate)?,
        n_fft: opt(o, "n_fft", df.n_fft)?,
        win_length: opt(o, "win_length", df.win_length)?,
        hop_length: opt(o, "hop_length", df.hop_length)?,
        n_mels: opt(o, "n_mels", df.n_mels)?,
        f_min: opt(o, "f_min", df.f_min)?,
        f_max: opt(o, "f_max", df.f_max)?,
        preemphasis: opt(o, "preemphasis", df.preemphasis)?,
        remove_dc: opt(o, "remove_dc", df.remove_dc)?,
        log_floor: opt(o, "log_floor", df.log_floor)?,
    };
    let clip = ClipConfig {
        target_rate: fbank.sample_rate,
        clip_samples: opt(o, "clip_samples", dc.clip_samples)?,
        n_frames: opt(o, "n_frames", dc.n_frames)?,
        mean: opt(o, "mean", dc.mean)?,
        std: opt(o, "std", dc.std)?,
        time_mask: MaskConfig {
            count: opt(o, "time_mask_count", dc.time_mask.count)?,
            max_width: opt(o, "time_mask_width", dc.time_mask.max_width)?,
        },
        freq_mask: MaskConfig {
            count: opt(o, "freq_mask_count", dc.freq_mask.count)?,
            max_width: opt(o, "freq_mask_width", dc.freq_mask.max_width)?,
        },
        fbank,
    };
    Ok(LoaderConfig {
        batch_size: opt(o, "batch_size", d.batch_size)?,
        n_workers: opt(o, "n_workers", d.n_workers)?,
        n_views: opt(o, "n_views", d.n_views)?,
        train: opt(o, "train", d.train)?,
        augment: opt(o, "augment", d.augment)?,
        drop_last: opt(o, "drop_last", d.drop_last)?,
        seed: opt(o, "seed", d.seed)?,
        shuffle_buffer: opt(o, "shuffle_buffer", d.shuffle_buffer)?,
        shuffle_initial: opt(o, "shuffle_initial", d.shuffle_initial)?,
        interleave: opt(o, "interleave", d.interleave)?,
        prefetch_batches: opt(o, "prefetch_batches", d.prefetch_batches)?,
        columns: ColumnConfig {
            audio_column: opt(o, "audio_column", d.columns.audio_column.clone())?,
            label_column: opt(o, "label_column", d.columns.label_column.clone())?,
        },
        clip,
        debug_panic_index: opt(o, "debug_panic_index", None)?,
    })
}

/// The Rust loader; `birdjepa.data.Loader` wraps it with a Pythonic signature.
#[pyclass(name = "Loader", module = "birdjepa._rs")]
struct PyLoader {
    // Mutex: the loader is Send but not Sync, and Python objects must be both.
    inner: Mutex<Loader>,
}

fn batch_to_dict<'py>(py: Python<'py>, b: Batch, n_views: usize, frames: (usize, usize)) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    let spec = PyArray1::from_vec(py, b.spectrogram);
    // Vec -> ndarray without copying; the reshape is a view of the same buffer.
    let spec = if n_views == 1 {
        spec.reshape([b.n, frames.0, frames.1])?.into_any()
    } else {
        spec.reshape([b.n, n_views, frames.0, frames.1])?.into_any()
    };
    dict.set_item("spectrogram", spec)?;
    dict.set_item("label", PyArray1::from_vec(py, b.label))?;
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
        let cfg = config_from_json(options_json)?;
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
                    let (n_views, frames) = {
                        let l = self.inner.lock().unwrap();
                        (l.config().n_views, l.frame_shape())
                    };
                    return batch_to_dict(py, b, n_views, frames).map(Some);
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

    fn state_json(&self) -> String {
        serde_json::to_string(&self.inner.lock().unwrap().state()).expect("state serialises")
    }

    fn diagnostics_json(&self) -> String {
        serde_json::to_string(&self.inner.lock().unwrap().diagnostics()).expect("diagnostics serialise")
    }

    fn __len__(&self) -> usize {
        self.inner.lock().unwrap().dataset().len() as usize
    }

    fn fingerprint(&self) -> String {
        self.inner.lock().unwrap().dataset().fingerprint().to_string()
    }

    /// Rows per shard, in shard-id order (for the IID diagnostics' shard statistics).
    fn shard_rows(&self) -> Vec<u64> {
        self.inner.lock().unwrap().dataset().shard_rows()
    }
}

#[pymodule]
fn _rs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLoader>()?;
    m.add("DataError", m.py().get_type::<DataError>())?;
    m.add("StateError", m.py().get_type::<StateError>())?;
    m.add("WorkerError", m.py().get_type::<WorkerError>())?;
    audio_fns::register(m)?;
    Ok(())
}
