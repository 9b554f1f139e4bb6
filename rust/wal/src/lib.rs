//! The tablet write-ahead log (format: docs/wal-format.md).
//!
//! This crate owns one tablet's log directory: segment files, framing and checksums, group
//! commit, preallocation, the in-memory index, recovery, truncation, anchors and GC, and the
//! process-wide worker pools every log's group commits and segment work run on (`pools`). It
//! knows nothing of Raft beyond (term, index) and nothing of Python; payloads are opaque bytes.
//!
//! ```no_run
//! use nyala_wal::{EntryRef, EntryType, Log, LogOptions};
//! let log = Log::open("/tmp/wal-demo", "t1", LogOptions::default())?;
//! let ticket = log.append(&[EntryRef::new(1, 1, EntryType::NoOp, b"")])?;
//! log.wait(ticket.ticket)?;
//! assert_eq!(log.durable_index(), 1);
//! log.close()?;
//! # Ok::<(), nyala_wal::WalError>(())
//! ```

mod active_segment;
mod appender;
mod background;
mod buffers;
mod committers;
mod copy_image;
mod entry;
mod error;
mod faults;
pub mod format;
mod gc;
mod index;
pub mod inspect;
mod log;
mod metrics;
mod notify;
mod options;
mod pipeline;
mod pools;
mod reader;
mod recovery;
mod segment;
mod shared;

pub use appender::IDLE_BUFFER_BYTES;
pub use copy_image::SegmentImage;
pub use entry::{Entry, EntryRef, EntryType};
pub use error::{Result, WalError};
pub use faults::FaultInjection;
pub use gc::GcReport;
pub use log::{AnchorId, Log};
pub use metrics::{MetricsSnapshot, HISTOGRAM_BUCKETS};
pub use notify::{EventFd, Notifier};
pub use options::{
    LogOptions, SyncPolicy, INITIAL_PREALLOCATION_BYTES_DEFAULT, QUEUE_BYTES_MAX_DEFAULT,
    SEGMENT_SIZE_BYTES_DEFAULT, SYNCS_IN_FLIGHT_LIMIT, SYNCS_IN_FLIGHT_MAX_DEFAULT,
};
pub use pools::{
    configure_thread_pools, thread_pool_options, thread_pool_stats, ThreadPoolOptions,
    ThreadPoolsStats, THREAD_IDLE_EXIT_MS_DEFAULT,
};
pub use reader::EntryIter;
pub use segment::{parse_segment_name, segment_file_name, Preallocation};
pub use shared::{AfterDurable, AppendTicket, Ticket};
