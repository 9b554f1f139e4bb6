//! The tablet storage engine: Arrow row operations, MemRowSet, Parquet DiskRowSets.
//!
//! A tablet replica hands committed op batches (Arrow IPC bytes, also its WAL payload) to an
//! `Engine`, which applies them to an in-memory, key-sorted MemRowSet, flushes that to
//! immutable Parquet DiskRowSets, compacts them, and answers merge-on-read scans. The engine
//! owns the files in one tablet data directory and knows nothing of consensus or Python.
//! Background flushes of every engine in the process run on one shared pool (`flush_pool`).
//! On-disk formats: docs/storage-format.md.

pub mod compaction;
pub mod diff;
pub mod diskrowset;
pub mod engine;
pub mod error;
pub mod flush_pool;
pub mod key;
pub mod key_blocks;
pub mod manifest;
pub mod memrowset;
pub mod ops;
pub mod partition;
pub mod predicate;
pub mod requests;
pub mod scan;
pub mod schema;
pub mod write_entry;
pub mod write_request;

pub use diff::IS_DELETED_COLUMN;
pub use engine::{
    ApplyResult, Engine, EngineOptions, EngineStats, FaultInjector, FaultPoint, Snapshot,
};
pub use error::{Result, StorageError};
pub use flush_pool::{
    configure_flush_pool, flush_pool_options, flush_pool_stats, FlushPoolOptions,
    FLUSH_THREAD_IDLE_EXIT_MS_DEFAULT,
};
pub use key_blocks::{
    key_block_cache_stats, set_key_block_cache_bytes, KEY_BLOCK_CACHE_BYTES_DEFAULT,
};
pub use ops::{
    check_op_batch, encode_ipc, with_op_column, OpBatch, OpType, RowProblem, RowStatus,
    CELL_BYTES_MAX, OP_COLUMN, ROW_BYTES_MAX,
};
pub use predicate::{Predicate, PredicateOp};
pub use requests::{Admission, RequestIndex, RequestOutcome, RequestResult};
pub use scan::{ScanCursor, ScanResult, ScanSpec};
pub use schema::{ColumnSchema, DataType, Schema, Value};
pub use write_entry::{
    apply_write_entries, decode_write_entry, AppliedEntries, RequestId, WriteEffect,
    WriteEntryHeader, WriteKind, WriteOutcome,
};
