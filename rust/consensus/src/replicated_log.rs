//! `ReplicatedLog`: one Raft replica's log, the WAL plus a log cache, with both sides of
//! AppendEntries.
//!
//! Leader side: `append` assigns the next OpId and queues the entry in the WAL and the
//! cache; `read_batch` builds the next batch for a follower from the cache (the WAL only for
//! entries older than the cache), or shares the batch as appended when that is what it asks
//! for. Follower side: `append_replicated` is the whole
//! UpdateConsensus log step in one call (log matching, truncation of a conflicting
//! uncommitted suffix, append) and never holds the GIL or creates a Python object per entry.
//!
//! Durability is the WAL's: appends return at once, `durable_index` moves when the group
//! commit has synced, and the WAL's eventfd tells an event loop when to look. This module
//! owns the rules of the `RaftLog` protocol (python/nyala/consensus/log.py); terms and
//! votes are checked by the Python core before it calls in.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nyala_common::{OpId, OpIndex, Term};
use nyala_wal::{EntryRef, EntryType, Log, LogOptions, Ticket};
use parking_lot::Mutex;

use crate::answer_sink::AnswerSink;
use crate::entry_batch::{BatchBuilder, EntryBatch, BATCH_HEADER_BYTES};
use crate::error::{ConsensusError, Result};
use crate::log_cache::{CacheStats, LogCache};

/// Default bound of the log cache (Kudu's `log_cache_size_limit_mb`).
pub const CACHE_BYTES_MAX_DEFAULT: usize = 64 << 20;

/// Bytes read from the WAL at a time when rebuilding the config index on open.
const OPEN_SCAN_CHUNK_BYTES: usize = 4 << 20;

/// Settings of the replicated log on top of the WAL's own.
#[derive(Clone, Debug)]
pub struct ReplicatedLogOptions {
    /// Bytes of recent entries kept in memory for building batches (durable entries beyond
    /// it are evicted oldest first).
    pub cache_bytes_max: usize,
}

impl Default for ReplicatedLogOptions {
    fn default() -> Self {
        ReplicatedLogOptions {
            cache_bytes_max: CACHE_BYTES_MAX_DEFAULT,
        }
    }
}

/// What `append_replicated` did: the fields of the Python `AppendResult` plus the durable
/// index for the response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendOutcome {
    /// The preceding OpId was found; the batch (if any) is now in the log.
    pub matched: bool,
    /// When matched: the last entry known to match the leader's log.
    pub last_received: OpId,
    /// When not matched: the leader should retry from no later than this index.
    pub hint_index: OpIndex,
    /// Entries at this index and above were removed.
    pub truncated_from: Option<OpIndex>,
    /// The durable index right after the call (entries appended now are not yet durable).
    pub durable_index: OpIndex,
}

/// A truncation whose record may not be durable yet: until `ticket` is, the WAL's durable
/// index may still count removed entries, so it is capped at `index`.
#[derive(Clone, Copy, Debug)]
struct TruncationFloor {
    ticket: Ticket,
    index: OpIndex,
}

/// A CONFIG_CHANGE entry kept in memory (they are few and consensus asks for them by index).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigEntry {
    pub op_id: OpId,
    pub payload: Vec<u8>,
}

struct State {
    cache: LogCache,
    /// Every CONFIG_CHANGE entry in the log, by index.
    configs: BTreeMap<OpIndex, ConfigEntry>,
    /// Ticket of the latest append or truncation (what "everything so far" waits for).
    last_ticket: Ticket,
}

/// One replica's log: a WAL with a log cache. Shareable between threads.
pub struct ReplicatedLog {
    wal: Log,
    /// Appends, truncations and reads of the cache are serialised here, so the cache and
    /// the WAL change together.
    state: Mutex<State>,
    /// Kept apart from `state` so `durable_index` never waits behind an append.
    floor: Mutex<Option<TruncationFloor>>,
}

const ANSWER_PENDING: u8 = 0;
const ANSWER_SENT: u8 = 1;
const ANSWER_DROPPED: u8 = 2;

/// An answer handed to `ReplicatedLog::answer_when_durable`.
#[derive(Debug)]
pub struct DurableAnswer {
    state: Arc<AtomicU8>,
}

impl DurableAnswer {
    /// Takes the answer back: true if the log has not written it and now never will (it was
    /// still waiting, or the log failed or closed first), false if it went.
    pub fn cancel(&self) -> bool {
        self.state.swap(ANSWER_DROPPED, Ordering::AcqRel) != ANSWER_SENT
    }

    /// Whether the log wrote it to its sink.
    pub fn sent(&self) -> bool {
        self.state.load(Ordering::Acquire) == ANSWER_SENT
    }
}

impl ReplicatedLog {
    /// Opens (recovering) the WAL in `dir` and indexes its config entries.
    pub fn open(
        dir: impl AsRef<Path>,
        tablet_id: &str,
        wal_options: LogOptions,
        options: ReplicatedLogOptions,
    ) -> Result<ReplicatedLog> {
        let wal = Log::open(dir, tablet_id, wal_options)?;
        ReplicatedLog::from_wal(wal, options)
    }

    /// Wraps an open WAL. Reads every retained entry once to find the config entries.
    pub fn from_wal(wal: Log, options: ReplicatedLogOptions) -> Result<ReplicatedLog> {
        let mut configs = BTreeMap::new();
        for entry in wal.entries_from(wal.first_index(), OPEN_SCAN_CHUNK_BYTES) {
            let entry = entry?;
            if entry.entry_type == EntryType::ConfigChange {
                let op_id = entry.op_id();
                configs.insert(
                    op_id.index,
                    ConfigEntry {
                        op_id,
                        payload: entry.payload,
                    },
                );
            }
        }
        let last = wal.last_op_id();
        let last_ticket = wal.durable_ticket();
        Ok(ReplicatedLog {
            state: Mutex::new(State {
                cache: LogCache::new(last.index, options.cache_bytes_max),
                configs,
                last_ticket,
            }),
            floor: Mutex::new(None),
            wal,
        })
    }

    /// The WAL underneath (anchors, GC, metrics, close).
    /// Writes `frame` to `sink` on the WAL committer whose sync makes everything appended so
    /// far durable (at once if it is): a follower's answer to an AppendEntries, whose content
    /// is known when the entries are appended, goes out when they are durable without
    /// waiting for the event loop to wake up and learn it. The handle takes it back.
    pub fn answer_when_durable(&self, sink: Arc<AnswerSink>, frame: Vec<u8>) -> DurableAnswer {
        let state = Arc::new(AtomicU8::new(ANSWER_PENDING));
        let shared = Arc::clone(&state);
        self.wal.after_durable(Box::new(move |durable| {
            let next = if durable { ANSWER_SENT } else { ANSWER_DROPPED };
            let taken =
                shared.compare_exchange(ANSWER_PENDING, next, Ordering::AcqRel, Ordering::Acquire);
            if taken.is_ok() && durable {
                sink.write_frame_from_thread(&frame);
            }
        }));
        DurableAnswer { state }
    }

    pub fn wal(&self) -> &Log {
        &self.wal
    }

    /// OpId of the last entry (`OpId::MIN` when the log is empty), durable or not.
    pub fn last_op_id(&self) -> OpId {
        self.wal.last_op_id()
    }

    /// Term of the entry at `index`: 0 for index 0, `None` if the log does not hold it.
    pub fn term_at(&self, index: OpIndex) -> Option<Term> {
        self.wal.term_at(index)
    }

    /// Every entry up to this index is on stable storage and still in the log.
    pub fn durable_index(&self) -> OpIndex {
        let mut floor = self.floor.lock();
        // Ticket first: the appender publishes the index before the ticket, so an index read
        // after a ticket is at least as new as that ticket's group.
        let ticket = self.wal.durable_ticket();
        let wal_durable = self.wal.durable_index();
        match *floor {
            Some(f) if ticket < f.ticket => wal_durable.min(f.index),
            Some(_) => {
                *floor = None;
                wal_durable
            }
            None => wal_durable,
        }
    }

    /// Leader side: appends one entry after the last, in `term` (not lower than the last
    /// entry's). Returns its OpId at once; it becomes durable later.
    pub fn append(&self, term: Term, entry_type: EntryType, payload: &[u8]) -> Result<OpId> {
        self.append_many(term, entry_type, &[payload], usize::MAX)
    }

    /// Leader side: appends one entry per payload after the last, in `term`, as batches of
    /// at most `batch_bytes_max` encoded bytes (at least one entry each), cut where
    /// `read_batch` with that limit would cut: a follower that is caught up is then sent
    /// each batch as it was appended, shared rather than copied. Each batch is one WAL
    /// append. Returns the last entry's OpId (the others precede it one by one). `payloads`
    /// must not be empty.
    pub fn append_many<P: AsRef<[u8]>>(
        &self,
        term: Term,
        entry_type: EntryType,
        payloads: &[P],
        batch_bytes_max: usize,
    ) -> Result<OpId> {
        assert!(!payloads.is_empty(), "append_many of no payload");
        let mut state = self.state.lock();
        let last = self.wal.last_op_id();
        if term < last.term {
            return Err(ConsensusError::TermRegression {
                term,
                last_term: last.term,
            });
        }
        let entries: Vec<EntryRef<'_>> = (last.index + 1..)
            .zip(payloads)
            .map(|(index, payload)| EntryRef::new(term, index, entry_type, payload.as_ref()))
            .collect();
        // Every batch is encoded (and so checked) before the first is appended: an entry the
        // encoding refuses leaves the log as it was, not with the proposals before it.
        let mut batches = Vec::new();
        let mut start = 0;
        while start < entries.len() {
            let mut end = start + 1;
            let mut size = BATCH_HEADER_BYTES + entries[start].frame_bytes();
            while end < entries.len() && size + entries[end].frame_bytes() <= batch_bytes_max {
                size += entries[end].frame_bytes();
                end += 1;
            }
            batches.push((start..end, EntryBatch::encode(&entries[start..end])?));
            start = end;
        }
        for (positions, batch) in batches {
            // The WAL queues the batch's frames themselves rather than a copy of them.
            let (storage, range) = batch.shared_frames(0..batch.len());
            let ticket = self
                .wal
                .append_shared(&entries[positions], storage, range)?;
            debug_assert_eq!(ticket.last_index, batch.last_op_id().index);
            state.last_ticket = ticket.ticket;
            self.cache_appended(&mut state, &batch, 0);
        }
        Ok(self.wal.last_op_id())
    }

    /// Leader side: the entries after `after_index` as one batch of at most `bytes_max`
    /// encoded bytes (always at least one entry); `None` when `after_index` is the last.
    pub fn read_batch(&self, after_index: OpIndex, bytes_max: usize) -> Result<Option<EntryBatch>> {
        self.read_range(after_index, OpIndex::MAX, bytes_max)
    }

    /// Like `read_batch`, but no entry after `last_index` (what the applier asks for: a
    /// committed range, not the uncommitted tail behind it).
    pub fn read_range(
        &self,
        after_index: OpIndex,
        last_index: OpIndex,
        bytes_max: usize,
    ) -> Result<Option<EntryBatch>> {
        let state = self.state.lock();
        let last = self.wal.last_op_id();
        if after_index > last.index {
            return Err(ConsensusError::ReadBeyondEnd {
                after_index,
                last_index: last.index,
            });
        }
        if after_index == last.index || after_index >= last_index {
            return Ok(None);
        }
        let end_index = last.index.min(last_index);
        // A batch cached whole that holds exactly what a build would (it fits, and it ends
        // at `end_index` or where the next entry would not fit) goes shared, not copied: what
        // a caught-up follower asks for, as `append_many` cuts batches where this does.
        if let Some(whole) = state.cache.whole_batch_at(after_index + 1) {
            let size = whole.size_bytes();
            let whole_last = whole.last_op_id().index;
            let build_stops_there = whole_last == end_index
                || (whole_last < end_index
                    && state
                        .cache
                        .frame_bytes_at(whole_last + 1)
                        .is_some_and(|next| size + next > bytes_max));
            if size <= bytes_max && build_stops_there {
                return Ok(Some(whole.clone()));
            }
        }
        let cache_first = state.cache.first_index();
        let mut builder = BatchBuilder::with_capacity(bytes_max.min(1 << 20));
        let mut next = after_index + 1;
        if next < cache_first {
            // Older than the cache: written and durable (only durable entries are evicted).
            let wal_bytes_max = bytes_max.saturating_sub(BATCH_HEADER_BYTES);
            for entry in self
                .wal
                .read(next, (cache_first - 1).min(end_index), wal_bytes_max)?
            {
                builder.push(entry.as_ref())?;
            }
            next = builder
                .next_index()
                .expect("the WAL returns at least one entry");
        }
        let room_left = builder.is_empty() || builder.size_bytes() < bytes_max;
        if next >= cache_first && next <= end_index && room_left {
            state
                .cache
                .copy_into(&mut builder, next, end_index, bytes_max)?;
        }
        Ok(Some(builder.finish()?))
    }

    /// Frees cached entries at or below `index` that are durable (see
    /// `LogCache::evict_through`); later reads of them come from the WAL.
    pub fn evict_through(&self, index: OpIndex) {
        let durable = self.durable_index();
        self.state.lock().cache.evict_through(index, durable);
    }

    /// The batch of entries from `after_index + 1`, shared rather than copied, when the
    /// cache holds it whole (as appended) and it ends at or before `last_index`; `None`
    /// otherwise (then `read_range` builds a batch).
    pub fn read_whole_batch(
        &self,
        after_index: OpIndex,
        last_index: OpIndex,
    ) -> Option<EntryBatch> {
        let state = self.state.lock();
        let batch = state.cache.whole_batch_at(after_index.checked_add(1)?)?;
        (batch.last_op_id().index <= last_index).then(|| batch.clone())
    }

    /// Follower side: log matching against `preceding`, truncation of a conflicting suffix
    /// (never at or below `committed_index`: that is `TruncateCommitted`, nothing changes),
    /// append of the entries not already in the log. A mismatch changes nothing and returns
    /// a hint for the leader. `batch`, if any, must start right after `preceding`.
    pub fn append_replicated(
        &self,
        preceding: OpId,
        batch: Option<&EntryBatch>,
        committed_index: OpIndex,
    ) -> Result<AppendOutcome> {
        let mut state = self.state.lock();
        let last = self.wal.last_op_id();
        let first = self.wal.first_index();
        if !self.holds(preceding, first, committed_index)? {
            let hint_index = self.mismatch_hint(preceding, last, first, committed_index);
            return Ok(self.outcome(false, OpId::MIN, hint_index, None));
        }
        let Some(batch) = batch else {
            return Ok(self.outcome(true, preceding, 0, None));
        };
        if batch.first_op_id().index != preceding.index + 1 {
            return Err(ConsensusError::BatchDoesNotFollow {
                preceding,
                first: batch.first_op_id(),
            });
        }
        let start = self.first_new_position(batch, last, first, committed_index)?;
        if start == batch.len() {
            // Everything is already here (a duplicate or stale batch): keep a longer log.
            return Ok(self.outcome(true, batch.last_op_id(), 0, None));
        }
        let start_index = batch.metas()[start].index;
        let truncated_from = (start_index <= last.index).then_some(start_index);
        let entries = batch.entries(start..batch.len());
        let ticket = match truncated_from {
            None => {
                let (storage, range) = batch.shared_frames(start..batch.len());
                self.wal.append_shared(&entries, storage, range)?.ticket
            }
            Some(from) => {
                if from <= committed_index {
                    return Err(ConsensusError::TruncateCommitted {
                        index: from,
                        committed_index,
                    });
                }
                self.truncate_and_append(&mut state, from - 1, &entries)?
            }
        };
        state.last_ticket = ticket;
        self.cache_appended(&mut state, batch, start);
        Ok(self.outcome(true, batch.last_op_id(), 0, truncated_from))
    }

    /// CONFIG_CHANGE entries with an index above `index`, in log order.
    pub fn config_entries_after(&self, index: OpIndex) -> Vec<ConfigEntry> {
        let state = self.state.lock();
        state
            .configs
            .range(index.saturating_add(1)..)
            .map(|(_, entry)| entry.clone())
            .collect()
    }

    /// Waits until everything appended so far is durable; `false` if `timeout` passed first.
    pub fn wait_durable(&self, timeout: Option<Duration>) -> Result<bool> {
        let ticket = self.state.lock().last_ticket;
        match timeout {
            None => self.wal.wait(ticket).map(|()| true),
            Some(timeout) => self.wal.wait_timeout(ticket, timeout),
        }
        .map_err(ConsensusError::from)
    }

    /// What the log cache holds.
    pub fn cache_stats(&self) -> CacheStats {
        self.state.lock().cache.stats()
    }

    /// Whether the log holds `preceding` (log matching). Entries before the first retained
    /// one were garbage-collected, which only happens to committed entries: they match.
    fn holds(&self, preceding: OpId, first: OpIndex, committed_index: OpIndex) -> Result<bool> {
        if preceding.index > 0 && preceding.index < first {
            if preceding.index > committed_index {
                return Err(ConsensusError::CollectedUncommitted {
                    index: preceding.index,
                    committed_index,
                });
            }
            return Ok(true);
        }
        Ok(self.wal.term_at(preceding.index) == Some(preceding.term))
    }

    /// Position of the first entry of `batch` that the log does not already hold: past the
    /// end of the log, or the first whose term conflicts.
    fn first_new_position(
        &self,
        batch: &EntryBatch,
        last: OpId,
        first: OpIndex,
        committed_index: OpIndex,
    ) -> Result<usize> {
        for (position, meta) in batch.metas().iter().enumerate() {
            if meta.index > last.index {
                return Ok(position);
            }
            if meta.index < first {
                if meta.index > committed_index {
                    return Err(ConsensusError::CollectedUncommitted {
                        index: meta.index,
                        committed_index,
                    });
                }
                continue;
            }
            if self.wal.term_at(meta.index) != Some(meta.term) {
                return Ok(position);
            }
        }
        Ok(batch.len())
    }

    /// Where a leader should retry after a mismatch: just past our end if `preceding` is
    /// beyond it, else the start of our run of the conflicting term (one round trip per
    /// term), but not at or below the commit index.
    fn mismatch_hint(
        &self,
        preceding: OpId,
        last: OpId,
        first: OpIndex,
        committed_index: OpIndex,
    ) -> OpIndex {
        if preceding.index > last.index {
            return last.index + 1;
        }
        let conflict_term = self.wal.term_at(preceding.index);
        let lowest = (committed_index + 1).max(first);
        let mut index = preceding.index;
        while index > lowest && self.wal.term_at(index - 1) == conflict_term {
            index -= 1;
        }
        index
    }

    /// Queues the truncation after `last_kept` and the append, capping the durable index
    /// until the truncation record is durable. Returns the append's ticket.
    fn truncate_and_append(
        &self,
        state: &mut State,
        last_kept: OpIndex,
        entries: &[EntryRef<'_>],
    ) -> Result<Ticket> {
        let previous = {
            let mut floor = self.floor.lock();
            let previous = *floor;
            let index = previous.map_or(last_kept, |f| f.index.min(last_kept));
            // Set before queueing, so no reader sees the old suffix counted as durable.
            *floor = Some(TruncationFloor {
                ticket: Ticket::MAX,
                index,
            });
            previous
        };
        let ticket = match self.wal.truncate_and_append(last_kept, entries) {
            Ok(ticket) => ticket.ticket,
            Err(err) => {
                *self.floor.lock() = previous;
                return Err(err.into());
            }
        };
        if let Some(floor) = self.floor.lock().as_mut() {
            floor.ticket = ticket;
        }
        state.cache.truncate_after(last_kept);
        state.configs.split_off(&(last_kept + 1));
        Ok(ticket)
    }

    /// Records entries `start..` of `batch`, just queued in the WAL, in the cache and the
    /// config index, then evicts what the cache may.
    fn cache_appended(&self, state: &mut State, batch: &EntryBatch, start: usize) {
        state.cache.push(batch, start);
        for position in start..batch.len() {
            let meta = &batch.metas()[position];
            if meta.entry_type == EntryType::ConfigChange {
                let entry = batch.entry(position);
                state.configs.insert(
                    meta.index,
                    ConfigEntry {
                        op_id: meta.op_id(),
                        payload: entry.payload.to_vec(),
                    },
                );
            }
        }
        let durable = self.durable_index();
        state.cache.evict(durable);
    }

    fn outcome(
        &self,
        matched: bool,
        last_received: OpId,
        hint_index: OpIndex,
        truncated_from: Option<OpIndex>,
    ) -> AppendOutcome {
        AppendOutcome {
            matched,
            last_received,
            hint_index,
            truncated_from,
            durable_index: self.durable_index(),
        }
    }
}
