//! The consensus crate's errors: malformed entry batches (`BatchError`) and refusals of the
//! replicated log (`ConsensusError`). Both map onto one public `ErrorKind` (see `Classify`).

use nyala_common::{Classify, ErrorKind, OpId, OpIndex, Term};
use nyala_wal::WalError;

/// Why bytes are not a valid entry batch (docs/entry-batch.md). Checksum failures are
/// corruption; every other reason is malformed input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Fewer bytes than the fixed header, or than the header says follow it.
    #[error("entry batch cut short: {needed} bytes needed, {got} present")]
    CutShort { needed: usize, got: usize },
    /// Bytes follow the entries the header accounts for.
    #[error("entry batch has {extra} bytes after its entries")]
    TrailingBytes { extra: usize },
    #[error("entry batch has no batch magic")]
    BadMagic,
    #[error("entry batch format version {0} is not supported (this build reads 1)")]
    UnsupportedVersion(u8),
    #[error("entry batch header checksum mismatch")]
    HeaderChecksum,
    #[error(
        "entry batch payload checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
    )]
    PayloadChecksum { stored: u32, computed: u32 },
    /// A batch always holds at least one entry (a heartbeat carries no batch at all).
    #[error("entry batch holds no entries")]
    Empty,
    #[error("entry batch header says {header} entries, the payload holds {actual}")]
    CountMismatch { header: u32, actual: u32 },
    /// An entry's stated length runs past the end of the payload.
    #[error("entry at payload offset {offset} overruns the batch")]
    EntryOverrun { offset: usize },
    #[error("entry {index} has unknown type {code}")]
    UnknownEntryType { index: OpIndex, code: u8 },
    /// Index 0 and term 0 both mean "before the first entry"; no entry carries them.
    #[error("entry {index} has term {term}: entries start at index 1, term 1")]
    ZeroOpId { index: OpIndex, term: Term },
    #[error("entries are not contiguous: expected index {expected}, got {got}")]
    NonContiguous { expected: OpIndex, got: OpIndex },
    #[error("term goes backwards at index {index}: {term} after {previous}")]
    TermRegression {
        index: OpIndex,
        term: Term,
        previous: Term,
    },
    /// An entry or the whole payload does not fit the 32-bit length fields.
    #[error("entry batch too large: {bytes} bytes")]
    TooLarge { bytes: usize },
}

impl Classify for BatchError {
    fn kind(&self) -> ErrorKind {
        match self {
            BatchError::HeaderChecksum | BatchError::PayloadChecksum { .. } => {
                ErrorKind::Corruption
            }
            _ => ErrorKind::InvalidArgument,
        }
    }
}

/// Everything the replicated log refuses or fails with.
#[derive(Debug, thiserror::Error)]
pub enum ConsensusError {
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error("malformed entry batch: {0}")]
    Batch(#[from] BatchError),
    /// A leader asked to replace a committed entry: a Raft safety violation (a bug or a
    /// corrupt peer), never done.
    #[error(
        "refusing to truncate at index {index}: at or below the commit index {committed_index}"
    )]
    TruncateCommitted {
        index: OpIndex,
        committed_index: OpIndex,
    },
    /// The entry is needed for log matching but was garbage-collected although it is not
    /// known to be committed (GC must only pass committed, anchored entries).
    #[error("entry {index} was garbage-collected but is above the commit index {committed_index}")]
    CollectedUncommitted {
        index: OpIndex,
        committed_index: OpIndex,
    },
    /// The batch does not start right after the entry it claims to follow.
    #[error("batch starts at {first} but the preceding entry is {preceding}")]
    BatchDoesNotFollow { preceding: OpId, first: OpId },
    /// A leader append with a term lower than the last entry's.
    #[error("append at term {term} after an entry of term {last_term}")]
    TermRegression { term: Term, last_term: Term },
    /// `read_batch` after an index the log does not reach.
    #[error("read after index {after_index}: the log ends at {last_index}")]
    ReadBeyondEnd {
        after_index: OpIndex,
        last_index: OpIndex,
    },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl Classify for ConsensusError {
    fn kind(&self) -> ErrorKind {
        match self {
            ConsensusError::Wal(err) => err.kind(),
            ConsensusError::Batch(err) => err.kind(),
            ConsensusError::TruncateCommitted { .. }
            | ConsensusError::CollectedUncommitted { .. } => ErrorKind::Corruption,
            ConsensusError::BatchDoesNotFollow { .. }
            | ConsensusError::TermRegression { .. }
            | ConsensusError::ReadBeyondEnd { .. }
            | ConsensusError::InvalidArgument(_) => ErrorKind::InvalidArgument,
        }
    }
}

/// Shorthand for results of the replicated log.
pub type Result<T> = std::result::Result<T, ConsensusError>;
