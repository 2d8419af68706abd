//! One error type for the core; every message names the file, row, column or value at fault.
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// Bad loader options.
    Config,
    /// A shard that cannot be used at all (missing, truncated, wrong schema).
    Data,
    /// A saved state that does not fit this data set or config.
    State,
    /// A worker thread died (a panic); the message carries the panic text.
    Worker,
    /// One of this process's limits was met (open files, memory maps, threads): not the data's fault, so
    /// never a skip of the record that met it.
    Limit,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn config(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::Config, message: message.into() }
    }
    pub fn data(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::Data, message: message.into() }
    }
    pub fn state(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::State, message: message.into() }
    }
    pub fn limit(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::Limit, message: message.into() }
    }
    pub fn worker(message: impl Into<String>) -> Self {
        Self { kind: ErrorKind::Worker, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

thread_local! {
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `f()`, or the message of a panic in it, caught and not printed: a bad file's header is an error of
/// that file, said once by the caller (a skip naming the row, prepare's line), not a backtrace; so is
/// a shard's record batch whose header the arrow reader trusts.
pub(crate) fn quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                previous(info)
            }
        }));
    });
    QUIET.with(|q| q.set(true));
    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(false));
    out.map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic".into())
    })
}
