//! Settings of a log, with Kudu's defaults unless a measurement chose otherwise.

use std::sync::Arc;

use crate::faults::FaultInjection;
use crate::notify::Notifier;
use crate::segment::Preallocation;

/// When the appender makes a group durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPolicy {
    /// One `fdatasync` per group commit; an append is acknowledged only after it.
    Group,
    /// No sync at all: entries are acknowledged once written to the page cache.
    /// For tests and throwaway logs only.
    None,
}

/// Settings of a log.
#[derive(Clone, Debug)]
pub struct LogOptions {
    /// Size each segment is preallocated to; a segment rolls over before exceeding it
    /// (a single batch larger than this gets a segment of its own).
    pub segment_size_bytes: u64,
    pub sync_policy: SyncPolicy,
    /// Group syncs that may run at once (1..=`SYNCS_IN_FLIGHT_LIMIT`). With more than one,
    /// the next group is written while earlier groups' `fdatasync`s are still running;
    /// durability is still published strictly in order (docs/wal-format.md, "Group commit").
    /// Each one beyond the first costs a job on the shared commit pool while appends
    /// overlap syncs (docs/wal-format.md, "Threads") and a file descriptor on the active
    /// segment.
    pub syncs_in_flight_max: usize,
    /// Bytes of appended batches queued for the appender before appends block
    /// (back-pressure). One batch larger than this is admitted alone.
    pub queue_bytes_max: usize,
    /// Closed segments GC always keeps, whatever the anchors say.
    pub min_segments_to_retain: usize,
    pub preallocation: Preallocation,
    /// Space preallocated for the segment a log opens with (when it is `fallocate`d): it
    /// grows, doubling up to `segment_size_bytes`, as writes fill it, so a replica that stays
    /// idle holds this much disk instead of a whole segment. Segments prepared ahead, which
    /// a log asks for only once it writes, get `segment_size_bytes` at once.
    pub initial_preallocation_bytes: u64,
    /// GC'd segment files kept for reuse (with `Preallocation::Recycle`).
    pub recycle_pool_segments_max: usize,
    /// Test-only fault injection (see `faults`); `None` in production.
    pub fault_injection: Option<Arc<FaultInjection>>,
    /// Signal durability on this shared notifier under this token instead of on a
    /// descriptor of the log's own (`None`: a descriptor of its own).
    pub notifier: Option<(Arc<Notifier>, u64)>,
}

/// Default segment size (Kudu's is 8 MiB in nyala's DESIGN.md §8).
pub const SEGMENT_SIZE_BYTES_DEFAULT: u64 = 8 << 20;
/// Default number of group syncs in flight, chosen by benches/wal_bench.py
/// (docs/wal-format.md, "Group commit latency").
pub const SYNCS_IN_FLIGHT_MAX_DEFAULT: usize = 1;
/// The most group syncs a log may have in flight.
pub const SYNCS_IN_FLIGHT_LIMIT: usize = 8;
/// Default preallocation of the segment a log opens with: an idle tablet replica's log
/// holds this much disk (docs/wal-format.md, "Preallocation").
pub const INITIAL_PREALLOCATION_BYTES_DEFAULT: u64 = 64 << 10;
/// Default bound of the append queue.
pub const QUEUE_BYTES_MAX_DEFAULT: usize = 64 << 20;

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_size_bytes: SEGMENT_SIZE_BYTES_DEFAULT,
            sync_policy: SyncPolicy::Group,
            syncs_in_flight_max: SYNCS_IN_FLIGHT_MAX_DEFAULT,
            queue_bytes_max: QUEUE_BYTES_MAX_DEFAULT,
            min_segments_to_retain: 1,
            // Chosen by benches/wal_bench.py (docs/wal-format.md): recycled segments gave
            // lower p99 latency and slightly higher throughput than fresh fallocate'd ones.
            preallocation: Preallocation::Recycle,
            initial_preallocation_bytes: INITIAL_PREALLOCATION_BYTES_DEFAULT,
            recycle_pool_segments_max: 2,
            fault_injection: None,
            notifier: None,
        }
    }
}
