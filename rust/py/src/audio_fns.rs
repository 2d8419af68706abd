//! Stand-alone audio DSP functions for parity tests against numpy/scipy/soundfile
//! (`tests/test_fbank_parity.py`). Conversion only; the DSP lives in `birdjepa_core::audio`.
use birdjepa_core::audio::clip::{check_rate, check_recording, finite};
use birdjepa_core::audio::decode::{decode_mono_as, AudioReader};
use birdjepa_core::audio::AudioError;
use birdjepa_core::audio::fbank::{Fbank, FbankConfig};
use birdjepa_core::options::LoaderOptions;
use birdjepa_core::audio::resample::resample as resample_core;
use numpy::{PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

/// Borrow a 1-D float32 array as a slice, copying only when it is not contiguous.
fn with_slice<R>(a: &PyReadonlyArray1<'_, f32>, f: impl FnOnce(&[f32]) -> R) -> R {
    match a.as_slice() {
        Ok(s) => f(s),
        Err(_) => f(&a.as_array().to_vec()),
    }
}

/// Kaldi-style log-mel filter bank of a mono float32 signal -> float32 `[frames, n_mels]`. Keyword
/// options are the loader's feature options (`target_rate`, `n_fft`, ...), with the same defaults.
/// Samples the loader refuses (NaN, inf, past its largest magnitude) are a ValueError naming the
/// first: the log floor made them silence.
#[pyfunction]
#[pyo3(signature = (samples, **options))]
fn log_mel<'py>(
    py: Python<'py>,
    samples: PyReadonlyArray1<'py, f32>,
    options: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let text: String = match options {
        Some(o) => py.import("json")?.call_method1("dumps", (o,))?.extract()?,
        None => "{}".into(),
    };
    let options = LoaderOptions::from_json(&text).map_err(|e| PyValueError::new_err(e.message))?;
    let cfg = FbankConfig::from_options(&options);
    let n_mels = cfg.n_mels;
    let fb = Fbank::new(cfg).map_err(PyValueError::new_err)?;
    let n = samples.len();
    let (out, frames) = with_slice(&samples, |x| {
        finite(x, 0)?;
        Ok(py.detach(|| (fb.compute_vec(x), fb.n_frames_for(n))))
    })
    .map_err(|e: AudioError| PyValueError::new_err(format!("log_mel: {}", e.0)))?;
    PyArray1::from_vec(py, out).reshape([frames, n_mels])
}

/// The loader's `gapless` option where a caller gives none (its default).
fn gapless_or_default(gapless: Option<bool>) -> bool {
    gapless.unwrap_or(LoaderOptions::default().gapless)
}

/// Decode encoded audio bytes (OGG/Vorbis, FLAC, WAV, MP3) -> (float32 mono samples, native rate),
/// trimmed as the loader's `gapless` option says.
#[pyfunction]
#[pyo3(signature = (data, *, gapless = None))]
fn decode_audio<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyBytes>,
    gapless: Option<bool>,
) -> PyResult<(Bound<'py, PyArray1<f32>>, u32)> {
    let bytes = data.as_bytes().to_vec();
    let gapless = gapless_or_default(gapless);
    let (samples, rate) =
        py.detach(|| decode_mono_as(bytes, gapless)).map_err(|e| PyValueError::new_err(e.0))?;
    Ok((PyArray1::from_vec(py, samples), rate))
}

/// The length of an audio file in frames, and its rate, as the loader's crops see it, without keeping
/// its samples (`birdjepa_core::audio::decode::AudioReader::length`): OSError where it cannot be read,
/// ValueError where it cannot be decoded. Read here, the file is in memory once (an hour's WAV: 230 MB).
#[pyfunction]
#[pyo3(signature = (path, *, gapless = None))]
fn audio_length(py: Python<'_>, path: std::path::PathBuf, gapless: Option<bool>) -> PyResult<(u64, u32)> {
    let bytes = py.detach(|| std::fs::read(&path)).map_err(|e| os_error(e, &path))?;
    let gapless = gapless_or_default(gapless);
    py.detach(|| {
        let mut reader = AudioReader::open_as(bytes, gapless)?;
        Ok((reader.length()?, reader.info().0))
    })
    .map_err(|e: AudioError| PyValueError::new_err(e.0))
}

/// Python's OSError of `e` (its errno, strerror and file name, as `open` raises it; PyO3's own has
/// neither errno nor strerror).
fn os_error(e: std::io::Error, path: &std::path::Path) -> PyErr {
    let text = e.to_string();
    match e.raw_os_error() {
        Some(n) => {
            let strerror = text.split(" (os error").next().unwrap_or(&text).to_string();
            PyOSError::new_err((n, strerror, path.display().to_string()))
        }
        None => PyOSError::new_err(text),
    }
}

/// A Python `bytes` object's buffer, read without a copy: the reference held beside it keeps the object
/// alive, and CPython never moves or changes a `bytes` object's data.
struct HeldBytes {
    _owner: Py<PyBytes>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the buffer is immutable and lives as long as `_owner`; PyO3 defers a decref made without the GIL.
unsafe impl Send for HeldBytes {}
unsafe impl Sync for HeldBytes {}

impl AsRef<[u8]> for HeldBytes {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see the struct.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// `prepare --check`'s look at encoded audio, with the loader's decoder: raises ValueError with the
/// reason the loader would skip it (`birdjepa_core::audio::clip::check_recording`). The bytes are read
/// where Python holds them (a copy was a second recording in memory per worker).
#[pyfunction]
fn check_audio(py: Python<'_>, data: &Bound<'_, PyBytes>, full: bool, frames: usize) -> PyResult<()> {
    let bytes = data.as_bytes();
    let held = HeldBytes { ptr: bytes.as_ptr(), len: bytes.len(), _owner: data.clone().unbind() };
    py.detach(|| check_recording(held, full, frames)).map_err(|e| PyValueError::new_err(e.0))
}

/// Polyphase Kaiser-sinc resampling of a mono float32 signal from `src` Hz to `dst` Hz.
#[pyfunction]
fn resample<'py>(
    py: Python<'py>,
    samples: PyReadonlyArray1<'py, f32>,
    src: u32,
    dst: u32,
) -> PyResult<Bound<'py, PyArray1<f32>>> {
    for rate in [src, dst] {
        check_rate(rate).map_err(|e| PyValueError::new_err(format!("resample: {}", e.0)))?;
    }
    let out = with_slice(&samples, |x| py.detach(|| resample_core(x, src, dst)));
    Ok(PyArray1::from_vec(py, out))
}

/// Add `log_mel`, `decode_audio`, `audio_length`, `check_audio` and `resample` to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(log_mel, m)?)?;
    m.add_function(wrap_pyfunction!(decode_audio, m)?)?;
    m.add_function(wrap_pyfunction!(audio_length, m)?)?;
    m.add_function(wrap_pyfunction!(check_audio, m)?)?;
    m.add_function(wrap_pyfunction!(resample, m)?)?;
    Ok(())
}
