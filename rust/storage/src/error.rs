//! The storage engine's error type and its mapping onto the shared `ErrorKind`s.

use nyala_common::{Classify, ErrorKind};

/// Everything the storage engine can fail with. Input problems are `InvalidArgument`, damaged
/// files are `Corruption`, and the operating system's refusals keep their `io::Error`.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The caller's input (schema, batch, predicate, op index) is not acceptable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A persisted file failed a checksum, a magic number or an invariant.
    #[error("corruption: {0}")]
    Corruption(String),
    /// The operating system refused an I/O call on `path`.
    #[error("i/o error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The named object (tablet data directory, column, snapshot) does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The object already exists (e.g. creating an engine over an existing manifest).
    #[error("already present: {0}")]
    AlreadyPresent(String),
    /// The call does not fit the engine's state (op index going backwards, closed engine).
    #[error("illegal state: {0}")]
    IllegalState(String),
    /// The on-disk format version is newer than this build understands.
    #[error("not supported: {0}")]
    NotSupported(String),
}

impl StorageError {
    /// Wraps an I/O error with the path it concerned.
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        StorageError::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }

    /// Shorthand for an `InvalidArgument` error.
    pub fn invalid(message: impl Into<String>) -> Self {
        StorageError::InvalidArgument(message.into())
    }

    /// Shorthand for a `Corruption` error.
    pub fn corruption(message: impl Into<String>) -> Self {
        StorageError::Corruption(message.into())
    }

    /// An error from reading a Parquet file that is part of the tablet: the file is damaged,
    /// unless the underlying cause was the operating system.
    pub fn parquet(path: &std::path::Path, err: parquet::errors::ParquetError) -> Self {
        match err {
            parquet::errors::ParquetError::External(inner) => {
                match inner.downcast::<std::io::Error>() {
                    Ok(io) => StorageError::io(path, *io),
                    Err(other) => StorageError::corruption(format!("{}: {other}", path.display())),
                }
            }
            other => StorageError::corruption(format!("{}: {other}", path.display())),
        }
    }

    /// An arrow error while computing over data we produced or validated: a bug or damage.
    pub fn arrow_internal(context: &str, err: arrow::error::ArrowError) -> Self {
        match err {
            arrow::error::ArrowError::IoError(message, source) => StorageError::Io {
                path: format!("{context}: {message}"),
                source,
            },
            other => StorageError::corruption(format!("{context}: {other}")),
        }
    }
}

impl Classify for StorageError {
    fn kind(&self) -> ErrorKind {
        match self {
            StorageError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            StorageError::Corruption(_) => ErrorKind::Corruption,
            StorageError::Io { source, .. } => ErrorKind::of_io(source),
            StorageError::NotFound(_) => ErrorKind::NotFound,
            StorageError::AlreadyPresent(_) => ErrorKind::AlreadyPresent,
            StorageError::IllegalState(_) => ErrorKind::IllegalState,
            StorageError::NotSupported(_) => ErrorKind::NotSupported,
        }
    }
}

/// The crate's result type.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;
