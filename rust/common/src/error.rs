//! Error kinds: the one classification every crate's error enum maps onto.
//!
//! Each crate keeps its own `thiserror` enum with the details; `Classify` tells the Python
//! binding (and the RPC layer) which public kind an error is, so the mapping to the Python
//! exception tree in `nyala/errors.py` lives in exactly one place (`pyext/src/errors.rs`).

/// The public error kinds. The names match the exception classes in `nyala/errors.py`
/// (`Corruption` -> `CorruptionError`, ...). Keep the two lists in step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Bad input from a caller: a malformed batch, a schema violation, an out-of-range value.
    InvalidArgument,
    /// Checksums, framing or invariants of persisted data do not hold.
    Corruption,
    /// The operating system refused an I/O operation (other than a full disk).
    Io,
    /// No space left on the device; nothing acknowledged was lost.
    DiskFull,
    /// The object (entry, tablet, table, file) does not exist.
    NotFound,
    /// The object already exists.
    AlreadyPresent,
    /// The call is not valid in the object's current state (closed log, stopped replica).
    IllegalState,
    /// A bound was hit (queue bytes, message size); the caller may retry later.
    ServiceUnavailable,
    /// The operation was cancelled or aborted before completing.
    Aborted,
    /// The feature or format version is not supported by this build.
    NotSupported,
}

impl ErrorKind {
    /// Every kind, for checks that the Python side knows each one.
    pub const ALL: [ErrorKind; 10] = [
        ErrorKind::InvalidArgument,
        ErrorKind::Corruption,
        ErrorKind::Io,
        ErrorKind::DiskFull,
        ErrorKind::NotFound,
        ErrorKind::AlreadyPresent,
        ErrorKind::IllegalState,
        ErrorKind::ServiceUnavailable,
        ErrorKind::Aborted,
        ErrorKind::NotSupported,
    ];

    /// The name of the Python exception class for this kind (in `nyala.errors`).
    pub const fn python_class(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "InvalidArgumentError",
            ErrorKind::Corruption => "CorruptionError",
            ErrorKind::Io => "DiskError",
            ErrorKind::DiskFull => "DiskFullError",
            ErrorKind::NotFound => "NotFoundError",
            ErrorKind::AlreadyPresent => "AlreadyPresentError",
            ErrorKind::IllegalState => "IllegalStateError",
            ErrorKind::ServiceUnavailable => "ServiceUnavailableError",
            ErrorKind::Aborted => "AbortedError",
            ErrorKind::NotSupported => "NotSupportedError",
        }
    }

    /// Classifies an OS error: ENOSPC/EDQUOT are a full disk, everything else is I/O.
    pub fn of_io(err: &std::io::Error) -> ErrorKind {
        // 28 = ENOSPC, 122 = EDQUOT on Linux.
        match err.raw_os_error() {
            Some(28) | Some(122) => ErrorKind::DiskFull,
            _ => ErrorKind::Io,
        }
    }
}

/// Implemented by every crate's error enum.
pub trait Classify: std::error::Error {
    fn kind(&self) -> ErrorKind;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enospc_is_disk_full() {
        let full = std::io::Error::from_raw_os_error(28);
        assert_eq!(ErrorKind::of_io(&full), ErrorKind::DiskFull);
        let eio = std::io::Error::from_raw_os_error(5);
        assert_eq!(ErrorKind::of_io(&eio), ErrorKind::Io);
    }
}
