//! The Raft AppendEntries hot path and the leader log cache, over the WAL.
//!
//! This crate owns the replicated log of one tablet replica (`ReplicatedLog`): the wire
//! encoding of entry batches (`EntryBatch`, docs/entry-batch.md), the bounded in-memory
//! cache of recent entries a leader builds batches from (`LogCache`), and the follower's
//! log matching, conflict truncation and append in one call. Roles, terms, votes and commit
//! decisions belong to the Python core (`nyala.consensus`); this crate knows nothing of
//! Python and never interprets WRITE payloads.

mod answer_sink;
mod entry_batch;
mod error;
mod log_cache;
mod replicated_log;
pub mod wire;

pub use answer_sink::AnswerSink;
pub use entry_batch::{
    BatchBuilder, BatchStorage, EntryBatch, EntryMeta, BATCH_FORMAT_VERSION, BATCH_HEADER_BYTES,
    BATCH_MAGIC,
};
pub use error::{BatchError, ConsensusError, Result};
pub use log_cache::{CacheStats, LogCache};
pub use replicated_log::{
    AppendOutcome, ConfigEntry, DurableAnswer, ReplicatedLog, ReplicatedLogOptions,
    CACHE_BYTES_MAX_DEFAULT,
};
