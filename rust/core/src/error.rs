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
