//! Counters of the log (entries, bytes, syncs, group sizes, sync latency).
//!
//! Updated by the commit and background jobs with relaxed atomics; a snapshot is a
//! plain struct the binding turns into a Python dict.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Number of power-of-two histogram buckets (bucket `i` counts values in `[2^i, 2^(i+1))`).
pub const HISTOGRAM_BUCKETS: usize = 24;

/// A lock-free power-of-two histogram.
#[derive(Debug)]
pub(crate) struct Histogram {
    buckets: [AtomicU64; HISTOGRAM_BUCKETS],
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Histogram {
    fn record(&self, value: u64) {
        let bucket = (u64::BITS - value.max(1).leading_zeros() - 1) as usize;
        self.buckets[bucket.min(HISTOGRAM_BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> [u64; HISTOGRAM_BUCKETS] {
        std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed))
    }
}

/// The live counters.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub entries_appended: AtomicU64,
    pub batches_appended: AtomicU64,
    pub truncations: AtomicU64,
    pub bytes_written: AtomicU64,
    pub groups: AtomicU64,
    pub group_entries_max: AtomicU64,
    pub syncs: AtomicU64,
    pub sync_micros_total: AtomicU64,
    pub sync_micros_max: AtomicU64,
    pub syncs_overlapped: AtomicU64,
    pub sync_threads: AtomicU64,
    pub segments_created: AtomicU64,
    pub segments_recycled: AtomicU64,
    pub segments_zero_filled: AtomicU64,
    pub segments_deleted: AtomicU64,
    pub fallocate_fallbacks: AtomicU64,
    pub rollover_waits: AtomicU64,
    pub rollover_wait_micros_total: AtomicU64,
    pub append_backpressure_waits: AtomicU64,
    group_entries: Histogram,
    sync_micros: Histogram,
}

impl Metrics {
    pub(crate) fn record_group(&self, entries: u64) {
        self.groups.fetch_add(1, Ordering::Relaxed);
        self.group_entries_max.fetch_max(entries, Ordering::Relaxed);
        self.group_entries.record(entries);
    }

    pub(crate) fn record_sync(&self, elapsed: Duration) {
        let micros = elapsed.as_micros() as u64;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.sync_micros_total.fetch_add(micros, Ordering::Relaxed);
        self.sync_micros_max.fetch_max(micros, Ordering::Relaxed);
        self.sync_micros.record(micros);
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> MetricsSnapshot {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            entries_appended: load(&self.entries_appended),
            batches_appended: load(&self.batches_appended),
            truncations: load(&self.truncations),
            bytes_written: load(&self.bytes_written),
            groups: load(&self.groups),
            group_entries_max: load(&self.group_entries_max),
            syncs: load(&self.syncs),
            sync_micros_total: load(&self.sync_micros_total),
            sync_micros_max: load(&self.sync_micros_max),
            syncs_overlapped: load(&self.syncs_overlapped),
            sync_threads: load(&self.sync_threads),
            segments_created: load(&self.segments_created),
            segments_recycled: load(&self.segments_recycled),
            segments_zero_filled: load(&self.segments_zero_filled),
            segments_deleted: load(&self.segments_deleted),
            fallocate_fallbacks: load(&self.fallocate_fallbacks),
            rollover_waits: load(&self.rollover_waits),
            rollover_wait_micros_total: load(&self.rollover_wait_micros_total),
            append_backpressure_waits: load(&self.append_backpressure_waits),
            group_entries_histogram: self.group_entries.snapshot(),
            sync_micros_histogram: self.sync_micros.snapshot(),
        }
    }
}

/// A point-in-time copy of the counters. Histograms are power-of-two buckets: bucket `i`
/// counts values in `[2^i, 2^(i+1))` (bucket 0 also holds 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsSnapshot {
    /// Entries written to segments (not counting truncated-and-rewritten ones twice).
    pub entries_appended: u64,
    /// Append calls (each becomes one batch frame).
    pub batches_appended: u64,
    /// Truncation records written.
    pub truncations: u64,
    /// Bytes handed to the file system, including page padding.
    pub bytes_written: u64,
    /// Group commits (one write, at most one sync each).
    pub groups: u64,
    /// Largest number of entries in one group.
    pub group_entries_max: u64,
    /// Successful `fdatasync` calls on segments by the group-commit threads.
    pub syncs: u64,
    pub sync_micros_total: u64,
    pub sync_micros_max: u64,
    /// Group syncs started while an earlier group's sync was still running (pipelining).
    pub syncs_overlapped: u64,
    /// Commit jobs the log may run at once (its slots, each with a file description to sync
    /// through): 1, more as appends start to overlap syncs, at most
    /// `LogOptions::syncs_in_flight_max`. Jobs run on the process-wide commit pool; the
    /// name is from when each was a thread of the log's own.
    pub sync_threads: u64,
    pub segments_created: u64,
    pub segments_recycled: u64,
    /// New segments written with zeros before use (`Preallocation::Recycle` chooses that for
    /// logs of many small groups when no GC'd file is free, or `ZeroFill`).
    pub segments_zero_filled: u64,
    pub segments_deleted: u64,
    /// Preallocations that fell back to `ftruncate` because `fallocate` is unsupported.
    pub fallocate_fallbacks: u64,
    /// Roll-overs where the next segment was not ready yet.
    pub rollover_waits: u64,
    pub rollover_wait_micros_total: u64,
    /// Appends that waited because the queue was full.
    pub append_backpressure_waits: u64,
    pub group_entries_histogram: [u64; HISTOGRAM_BUCKETS],
    pub sync_micros_histogram: [u64; HISTOGRAM_BUCKETS],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_power_of_two() {
        let h = Histogram::default();
        for v in [0, 1, 2, 3, 4, 1000] {
            h.record(v);
        }
        let s = h.snapshot();
        assert_eq!(s[0], 2); // 0 and 1
        assert_eq!(s[1], 2); // 2 and 3
        assert_eq!(s[2], 1); // 4
        assert_eq!(s[9], 1); // 1000 in [512, 1024)
    }
}
