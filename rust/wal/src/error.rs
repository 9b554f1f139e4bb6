//! The WAL's error type. Every variant maps onto one public `ErrorKind` (see `Classify`).

use std::io;
use std::path::PathBuf;

use nyala_common::{Classify, ErrorKind, OpIndex, Term};

/// Everything that can go wrong in the write-ahead log.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// The operating system refused an operation on a WAL file or directory.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Persisted bytes fail a checksum, framing or ordering rule. Nothing was deleted.
    #[error("corrupt WAL segment {} at offset {offset}: {reason}", path.display())]
    Corruption {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// A segment was written by a format version this build does not read.
    #[error("WAL segment {} has format version {version}, this build reads {supported}", path.display())]
    UnsupportedVersion {
        path: PathBuf,
        version: u32,
        supported: u32,
    },
    /// An append does not continue the log at the next index.
    #[error("non-contiguous append: expected index {expected}, got {got}")]
    NonContiguous { expected: OpIndex, got: OpIndex },
    /// An append carries a term lower than the entry before it.
    #[error("term goes backwards at index {index}: {term} after {previous}")]
    TermRegression {
        index: OpIndex,
        term: Term,
        previous: Term,
    },
    /// A caller passed a value the log cannot accept (empty batch, oversized entry, bad option).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The requested entry is not in the log (garbage-collected, or never appended).
    #[error("entry {index} is not in the log (retained: {first}..={last})")]
    NotFound {
        index: OpIndex,
        first: OpIndex,
        last: OpIndex,
    },
    /// The log was closed.
    #[error("the log is closed")]
    Closed,
    /// An earlier write or sync failed; the log acknowledges nothing after it and refuses
    /// appends until reopened (recovery then decides what is on disk).
    #[error("the log failed and refuses appends: {message}")]
    Failed { kind: ErrorKind, message: String },
}

impl WalError {
    /// Wraps an I/O error with the operation and the file it concerned.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        WalError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn corruption(
        path: impl Into<PathBuf>,
        offset: u64,
        reason: impl Into<String>,
    ) -> Self {
        WalError::Corruption {
            path: path.into(),
            offset,
            reason: reason.into(),
        }
    }
}

impl Classify for WalError {
    fn kind(&self) -> ErrorKind {
        match self {
            WalError::Io { source, .. } => ErrorKind::of_io(source),
            WalError::Corruption { .. } => ErrorKind::Corruption,
            WalError::UnsupportedVersion { .. } => ErrorKind::NotSupported,
            WalError::NonContiguous { .. }
            | WalError::TermRegression { .. }
            | WalError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            WalError::NotFound { .. } => ErrorKind::NotFound,
            WalError::Closed => ErrorKind::IllegalState,
            WalError::Failed { kind, .. } => *kind,
        }
    }
}

/// Shorthand for results of WAL operations.
pub type Result<T> = std::result::Result<T, WalError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_disk_is_classified_as_disk_full() {
        let err = WalError::io(
            "fdatasync",
            "/x",
            io::Error::from_raw_os_error(libc::ENOSPC),
        );
        assert_eq!(err.kind(), ErrorKind::DiskFull);
        let failed = WalError::Failed {
            kind: ErrorKind::DiskFull,
            message: err.to_string(),
        };
        assert_eq!(failed.kind(), ErrorKind::DiskFull);
        assert_eq!(WalError::Closed.kind(), ErrorKind::IllegalState);
    }
}
