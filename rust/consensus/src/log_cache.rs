//! `LogCache`: the recent tail of the log in memory, so a leader builds batches for its
//! followers without reading the WAL back.
//!
//! The cache holds the batches that were appended (a leader's one-entry batches, a
//! follower's received batches), sharing their bytes rather than copying entries. It always
//! ends at the last entry of the log and covers a contiguous range. It is bounded by
//! `bytes_max`, except that entries not yet durable are never evicted: the WAL can only read
//! back what it has written, so until then the cache is their only copy for readers (the
//! WAL's own queue bound limits how far that can go).

use std::collections::VecDeque;

use nyala_common::OpIndex;

use crate::entry_batch::{BatchBuilder, EntryBatch};
use crate::error::BatchError;

/// Entries `start..end` (positions) of one appended batch.
struct CachedRun {
    batch: EntryBatch,
    start: usize,
    end: usize, // invariant: start < end <= batch.len()
}

impl CachedRun {
    fn first_index(&self) -> OpIndex {
        self.batch.metas()[self.start].index
    }

    fn last_index(&self) -> OpIndex {
        self.batch.metas()[self.end - 1].index
    }

    fn bytes(&self) -> usize {
        self.batch.frames(self.start..self.end).len()
    }
}

/// What the cache holds, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub first_index: OpIndex,
    pub entries: u64,
    pub bytes: usize,
    pub bytes_max: usize,
}

/// The cached tail of the log: entries `first_index()..next_index`.
pub struct LogCache {
    runs: VecDeque<CachedRun>,
    /// Index after the last cached entry; equals the log's last index + 1.
    next_index: OpIndex,
    /// Encoded bytes of the cached entries.
    bytes: usize,
    bytes_max: usize,
}

impl LogCache {
    /// An empty cache for a log whose last index is `last_index`.
    pub fn new(last_index: OpIndex, bytes_max: usize) -> Self {
        LogCache {
            runs: VecDeque::new(),
            next_index: last_index + 1,
            bytes: 0,
            bytes_max,
        }
    }

    /// The first cached index (`next_index` when empty).
    pub fn first_index(&self) -> OpIndex {
        self.runs
            .front()
            .map_or(self.next_index, CachedRun::first_index)
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            first_index: self.first_index(),
            entries: self.next_index - self.first_index(),
            bytes: self.bytes,
            bytes_max: self.bytes_max,
        }
    }

    /// Caches entries `start..` of `batch`, which the log just appended after its last entry.
    pub fn push(&mut self, batch: &EntryBatch, start: usize) {
        assert!(start < batch.len());
        let run = CachedRun {
            batch: batch.clone(),
            start,
            end: batch.len(),
        };
        assert_eq!(
            run.first_index(),
            self.next_index,
            "cache must stay contiguous"
        );
        self.next_index = run.last_index() + 1;
        self.bytes += run.bytes();
        self.runs.push_back(run);
    }

    /// Forgets entries after `last_kept` (the log truncated them). If the cache started
    /// after `last_kept`, it becomes empty and continues from there.
    pub fn truncate_after(&mut self, last_kept: OpIndex) {
        while let Some(run) = self.runs.back_mut() {
            if run.first_index() > last_kept {
                self.bytes -= run.bytes();
                self.runs.pop_back();
                continue;
            }
            if run.last_index() > last_kept {
                self.bytes -= run.bytes();
                run.end = run.start + (last_kept - run.first_index()) as usize + 1;
                self.bytes += run.bytes();
            }
            break;
        }
        self.next_index = last_kept + 1;
        debug_assert!(self.runs.back().is_none_or(|r| r.last_index() == last_kept));
    }

    /// Drops the oldest runs while over the byte limit, but only runs whose entries are all
    /// at or below `durable_index`. The last run is never dropped, so the cache always knows
    /// where the log ends.
    pub fn evict(&mut self, durable_index: OpIndex) {
        while self.bytes > self.bytes_max && self.runs.len() > 1 {
            let front = &self.runs[0];
            if front.last_index() > durable_index {
                break;
            }
            self.bytes -= front.bytes();
            self.runs.pop_front();
        }
    }

    /// Drops the oldest runs whose entries are all at or below both `index` and
    /// `durable_index`, whatever the byte limit: Kudu's eviction through the index every
    /// peer has received. Entries nobody will ask for again then cost no memory (during a
    /// bulk load the cache otherwise held a second copy of everything until the limit). The
    /// last run stays, as in `evict`.
    pub fn evict_through(&mut self, index: OpIndex, durable_index: OpIndex) {
        let through = index.min(durable_index);
        while self.runs.len() > 1 && self.runs[0].last_index() <= through {
            let front = self.runs.pop_front().expect("more than one run");
            self.bytes -= front.bytes();
        }
    }

    /// The cached batch that starts at `first` and is cached whole (as it was appended),
    /// if there is one: a reader can then share its bytes instead of copying them.
    pub fn whole_batch_at(&self, first: OpIndex) -> Option<&EntryBatch> {
        if first < self.first_index() || first >= self.next_index {
            return None;
        }
        let run = &self.runs[self.runs.partition_point(|r| r.last_index() < first)];
        let whole = run.start == 0 && run.end == run.batch.len() && run.first_index() == first;
        whole.then_some(&run.batch)
    }

    /// Bytes the cached entry at `index` takes in a batch (header and payload), if cached.
    pub fn frame_bytes_at(&self, index: OpIndex) -> Option<usize> {
        if index < self.first_index() || index >= self.next_index {
            return None;
        }
        let run = &self.runs[self.runs.partition_point(|r| r.last_index() < index)];
        let position = run.start + usize::try_from(index - run.first_index()).ok()?;
        Some(run.batch.metas()[position].frame_bytes())
    }

    /// Appends cached entries `from..=last` to `builder`, stopping before the next entry
    /// would pass `bytes_max` (the builder always gets at least one entry). `from` must be
    /// cached.
    pub fn copy_into(
        &self,
        builder: &mut BatchBuilder,
        from: OpIndex,
        last: OpIndex,
        bytes_max: usize,
    ) -> Result<(), BatchError> {
        assert!(from >= self.first_index() && from < self.next_index && from <= last);
        let mut run_at = self.runs.partition_point(|r| r.last_index() < from);
        let mut next = from;
        while let Some(run) = self.runs.get(run_at) {
            if next > last {
                return Ok(());
            }
            let metas = run.batch.metas();
            let start = run.start + (next - run.first_index()) as usize;
            let wanted = usize::try_from(last - next + 1).unwrap_or(usize::MAX);
            let run_end = run.end.min(start.saturating_add(wanted));
            let mut end = start;
            let mut size = builder.size_bytes();
            while end < run_end {
                let entry_bytes = metas[end].frame_bytes();
                if size + entry_bytes > bytes_max && !(builder.is_empty() && end == start) {
                    break;
                }
                size += entry_bytes;
                end += 1;
            }
            builder.push_from(&run.batch, start..end)?;
            if end < run.end {
                return Ok(()); // full, or `last` reached
            }
            next = run.last_index() + 1;
            run_at += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use nyala_common::OpId;
    use nyala_wal::{EntryRef, EntryType};

    use super::*;

    fn batch(
        term: u64,
        indexes: std::ops::RangeInclusive<u64>,
        payload_bytes: usize,
    ) -> EntryBatch {
        let payload = vec![7u8; payload_bytes];
        let entries: Vec<_> = indexes
            .map(|i| EntryRef::new(term, i, EntryType::Write, &payload))
            .collect();
        EntryBatch::encode(&entries).unwrap()
    }

    fn read(cache: &LogCache, from: OpIndex, bytes_max: usize) -> (OpId, OpId) {
        let mut builder = BatchBuilder::with_capacity(0);
        cache
            .copy_into(&mut builder, from, u64::MAX, bytes_max)
            .unwrap();
        let out = builder.finish().unwrap();
        (out.first_op_id(), out.last_op_id())
    }

    #[test]
    fn reads_span_runs_and_respect_the_limit() {
        let mut cache = LogCache::new(0, 1 << 20);
        cache.push(&batch(1, 1..=3, 76), 0); // 100 bytes per entry
        cache.push(&batch(2, 4..=4, 76), 0);
        cache.push(&batch(2, 5..=6, 76), 0);
        assert_eq!(read(&cache, 2, 1 << 20), (OpId::new(1, 2), OpId::new(2, 6)));
        // 24 header + 3 entries of 100 = 324.
        assert_eq!(read(&cache, 2, 330), (OpId::new(1, 2), OpId::new(2, 4)));
        assert_eq!(read(&cache, 5, 1), (OpId::new(2, 5), OpId::new(2, 5)));
    }

    #[test]
    fn push_may_start_inside_a_batch() {
        let mut cache = LogCache::new(2, 1 << 20);
        cache.push(&batch(1, 1..=4, 10), 2);
        assert_eq!(cache.first_index(), 3);
        assert_eq!(read(&cache, 3, 1 << 20), (OpId::new(1, 3), OpId::new(1, 4)));
    }

    #[test]
    #[should_panic(expected = "contiguous")]
    fn push_refuses_a_gap() {
        let mut cache = LogCache::new(0, 1 << 20);
        cache.push(&batch(1, 2..=3, 10), 0);
    }

    #[test]
    fn truncation_shrinks_runs_and_may_empty_the_cache() {
        let mut cache = LogCache::new(0, 1 << 20);
        cache.push(&batch(1, 1..=3, 76), 0);
        cache.push(&batch(1, 4..=6, 76), 0);
        cache.truncate_after(4);
        assert_eq!(cache.stats().entries, 4);
        assert_eq!(cache.stats().bytes, 400);
        assert_eq!(read(&cache, 1, 1 << 20), (OpId::new(1, 1), OpId::new(1, 4)));
        cache.push(&batch(3, 5..=5, 76), 0);
        assert_eq!(read(&cache, 4, 1 << 20), (OpId::new(1, 4), OpId::new(3, 5)));
        cache.truncate_after(0);
        assert_eq!(
            cache.stats(),
            CacheStats {
                first_index: 1,
                entries: 0,
                bytes: 0,
                bytes_max: 1 << 20
            }
        );
    }

    #[test]
    fn eviction_keeps_entries_that_are_not_durable() {
        let mut cache = LogCache::new(0, 250);
        for i in 1..=5 {
            cache.push(&batch(1, i..=i, 76), 0);
        }
        cache.evict(0);
        assert_eq!(cache.first_index(), 1);
        cache.evict(2);
        assert_eq!(cache.first_index(), 3);
        cache.evict(5);
        assert_eq!(cache.first_index(), 4); // 200 bytes <= 250
        assert_eq!(cache.stats().bytes, 200);
    }

    #[test]
    fn eviction_through_an_index_ignores_the_limit_but_keeps_what_is_not_durable() {
        let mut cache = LogCache::new(0, usize::MAX);
        cache.push(&batch(1, 1..=2, 10), 0);
        cache.push(&batch(1, 3..=4, 10), 0);
        cache.push(&batch(1, 5..=6, 10), 0);
        cache.evict_through(3, 6); // the run 3..=4 is not wholly at or below 3
        assert_eq!(cache.first_index(), 3);
        cache.evict_through(6, 4); // nor is 5..=6 durable
        assert_eq!(cache.first_index(), 5);
        assert!(cache.whole_batch_at(5).is_some());
        assert!(cache.whole_batch_at(6).is_none()); // inside a batch
        assert!(cache.whole_batch_at(3).is_none()); // evicted
        cache.truncate_after(5);
        assert!(cache.whole_batch_at(5).is_none()); // no longer whole
        cache.push(&batch(2, 6..=7, 10), 0);
        cache.evict_through(6, 6); // the last run always stays
        assert_eq!(cache.first_index(), 6);
        assert_eq!(
            read(&cache, 6, usize::MAX),
            (OpId::new(2, 6), OpId::new(2, 7))
        );
    }
}
