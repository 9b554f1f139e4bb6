//! `Shared`: the state a log's callers and jobs meet in.
//!
//! Callers (through `Log`), the log's commit jobs (`committers`, which run the `appender`)
//! and its background work (`background`), both on process-wide pools, share one `Shared`:
//! the append queue and its tickets, the durable point and the threads parked waiting for
//! it, the failure state, the index and segment table, the segments prepared ahead, the
//! anchors and the counters.
//!
//! This module owns that state and the operations on it that callers and jobs both rely
//! on: reserving room in the queue and queueing requests (in ticket order, which is the
//! order on disk), parking until a ticket is durable and publishing that it is, failing the
//! log, and choosing how the next segment is prepared. It starts no job and writes no
//! segment data (commit jobs write, background jobs prepare and close segments), and it
//! knows nothing of the caller-facing `Log` above it.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nyala_common::{ErrorKind, OpId, OpIndex};
use parking_lot::{Condvar, Mutex, RwLock};
use parking_lot_core::{FilterOp, ParkResult, ParkToken, DEFAULT_UNPARK_TOKEN};

use crate::entry::EntryRef;
use crate::error::{Result, WalError};
use crate::faults::FaultInjection;
use crate::format::{self, EncodedPayload};
use crate::index::{LogIndex, TermRuns};
use crate::metrics::Metrics;
use crate::notify::LogNotify;
use crate::options::LogOptions;
use crate::segment::{Preallocation, PrepareSpec, SegmentFile};

/// Identifies an append (or truncation) in queue order; durability is reported per ticket.
pub type Ticket = u64;

/// What `append` returns: the ticket to wait for and the index of the last entry appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendTicket {
    pub ticket: Ticket,
    pub last_index: OpIndex,
}

/// A byte position in the log: an offset in segment `sequence`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct DataPosition {
    pub sequence: u64,
    pub offset: u64,
}

/// A queued request; the appender handles them strictly in ticket order.
pub(crate) struct Request {
    pub ticket: Ticket,
    pub payload: EncodedPayload,
    /// For a small append framed into the queue's arena (`Queue::arena`): where its payload
    /// is there (`payload.bytes` is then empty). `None`: the payload is `payload.bytes`.
    pub in_arena: Option<Range<usize>>,
    /// For truncation records, the last entry kept; `None` for entries.
    pub truncate_to: Option<OpId>,
    /// Index of the batch's first entry (entries only).
    pub first_index: OpIndex,
}

impl Request {
    pub(crate) fn payload_len(&self) -> usize {
        match &self.in_arena {
            Some(range) => range.len(),
            None => self.payload.bytes.len(),
        }
    }

    pub(crate) fn queued_bytes(&self) -> usize {
        format::BATCH_HEADER_BYTES + self.payload_len()
    }

    /// Hands a payload buffer of its own back for reuse once the batch is written.
    pub(crate) fn recycle(self) {
        if let format::PayloadBytes::Owned(bytes) = self.payload.bytes {
            crate::buffers::give_back(bytes);
        }
    }

    /// The payload; `arena` is the queue arena taken together with this request.
    pub(crate) fn payload_bytes<'a>(&'a self, arena: &'a [u8]) -> &'a [u8] {
        match &self.in_arena {
            Some(range) => &arena[range.clone()],
            None => &self.payload.bytes,
        }
    }
}

/// Appends whose framed payload is at most this many bytes are framed straight into the
/// queue's arena, under the queue lock (checksum included: a few hundred nanoseconds at
/// most), instead of into a buffer of their own. A buffer per append was allocated by the
/// appending thread and freed by the committer; glibc then takes the allocating thread's
/// arena lock for most frees, and an event loop appending while the committer freed the
/// previous group's buffers slept on that lock (and on the queue lock held meanwhile).
pub(crate) const ARENA_PAYLOAD_BYTES_MAX: usize = 4 << 10;

pub(crate) struct Queue {
    pub requests: VecDeque<Request>,
    /// Payloads of the small appends in `requests`, back to back (`Request::in_arena`). A
    /// committer takes it together with the requests and swaps in its own emptied one, so
    /// in steady state appends allocate nothing.
    pub arena: Vec<u8>,
    /// Appends blocked by back-pressure on `space_ready`: the committer signals it only
    /// when one waits (a condition variable's signal is a system call even with no waiter).
    pub space_waiters: usize,
    /// Bytes of requests not yet written (queued or in the appender's current group).
    pub queued_bytes: usize,
    pub next_ticket: Ticket,
    /// Terms of the log including queued appends.
    pub terms: TermRuns,
    pub closing: bool,
    /// Bit `i` is set while the commit job of slot `i` is submitted or running (at most
    /// `syncs_in_flight_max` bits). An append starts a job only when none is set, and after
    /// releasing the lock: while a job syncs, the 63 other appends of a 64-writer round
    /// cost no syscall, since that job looks at the queue again before it stops. A job
    /// clears its bit under this lock when it finds the queue empty.
    pub commit_slots_busy: u32,
    /// Jobs started (by an append or `maybe_grow`) that have not looked at the queue yet.
    pub commit_jobs_looking: u32,
    /// Slots that have had a job: the first, and more once appends overlapped syncs
    /// (`Committers::maybe_grow`). Kept for the log's life, as its committer threads were:
    /// an append finding every job syncing starts another while fewer are busy than this.
    pub commit_slots_opened: usize,
    /// An append found the log's commit jobs busy while a group was syncing: appends
    /// overlap syncs, so the turn holder may start another job. (A lone writer appends only
    /// after its group's sync returned, so it never sets this.)
    pub appends_found_busy: bool,
}

impl Queue {
    /// Queues a batch of entries framed into `payload` (checked to continue the log).
    pub(crate) fn push_entries(
        &mut self,
        entries: &[EntryRef<'_>],
        payload: EncodedPayload,
    ) -> AppendTicket {
        for e in entries {
            self.terms.push(OpId::new(e.term, e.index));
        }
        let ticket = self.push_request(payload, None, None, entries[0].index);
        AppendTicket {
            ticket,
            last_index: entries[entries.len() - 1].index,
        }
    }

    /// Like `push_entries`, framing the entries into the queue's arena.
    pub(crate) fn push_entries_in_arena(&mut self, entries: &[EntryRef<'_>]) -> AppendTicket {
        for e in entries {
            self.terms.push(OpId::new(e.term, e.index));
        }
        let start = self.arena.len();
        let crc = format::encode_entries_into(entries, &mut self.arena);
        let payload = EncodedPayload {
            kind: format::BatchKind::Entries,
            bytes: format::PayloadBytes::Owned(Vec::new()),
            crc,
            entry_count: entries.len() as u32,
        };
        let range = start..self.arena.len();
        let ticket = self.push_request(payload, Some(range), None, entries[0].index);
        AppendTicket {
            ticket,
            last_index: entries[entries.len() - 1].index,
        }
    }

    /// Queues a truncation record discarding every entry after `last_kept`.
    pub(crate) fn push_truncation(&mut self, last_kept: OpIndex) -> Result<Ticket> {
        let last = self.terms.last();
        if last_kept >= last.index {
            // Nothing to discard; the caller may still wait for everything queued so far.
            return Ok(self.next_ticket - 1);
        }
        let Some(term) = self.terms.term_at(last_kept) else {
            return Err(WalError::NotFound {
                index: last_kept,
                first: self.terms.first(),
                last: last.index,
            });
        };
        let kept = OpId::new(term, last_kept);
        self.terms.truncate_after(kept);
        Ok(self.push_request(format::encode_truncate(kept), None, Some(kept), 0))
    }

    fn push_request(
        &mut self,
        payload: EncodedPayload,
        in_arena: Option<Range<usize>>,
        truncate_to: Option<OpId>,
        first_index: OpIndex,
    ) -> Ticket {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let request = Request {
            ticket,
            payload,
            in_arena,
            truncate_to,
            first_index,
        };
        self.queued_bytes += request.queued_bytes();
        self.requests.push_back(request);
        ticket
    }
}

/// Segments prepared by background jobs, in sequence order, waiting for the appender.
pub(crate) type PreparedSegments = VecDeque<Result<SegmentFile>>;

/// How many segments the background keeps ready beyond the active one. Two, so a
/// slow preparation (two fsyncs on a busy disk) does not stall a fast writer at roll-over.
pub(crate) const SEGMENTS_PREPARED_AHEAD: u64 = 2;

/// The most segments kept prepared: a roll-over that finds none ready doubles the count up
/// to this (a bulk writer fills an 8 MiB segment in a few ms, faster than one preparation's
/// fsyncs on a busy disk). Bounds the space preallocated ahead to this many segments.
pub(crate) const SEGMENTS_PREPARED_AHEAD_MAX: u64 = 8;

/// State shared by callers, the commit jobs and the background jobs.
pub(crate) struct Shared {
    pub dir: PathBuf,
    pub tablet_id: String,
    pub options: LogOptions,
    pub faults: Arc<FaultInjection>,
    /// A `std` mutex, not `parking_lot`'s: parking_lot hands a contended lock over to the
    /// woken waiter every ~0.5 ms ("eventual fairness"), and on a busy machine the waiter is
    /// often a commit job's worker not yet scheduled, so a caller holding the GIL (term_at,
    /// append) stalled a whole Python process for a scheduling quantum. A barging mutex lets
    /// the running thread take it (docs/performance.md).
    pub queue: std::sync::Mutex<Queue>,
    /// Signalled when the last commit job of the log stops (`Log::close` waits for it).
    pub commit_jobs_stopped: std::sync::Condvar,
    /// Appenders blocked by back-pressure wait here.
    pub space_ready: std::sync::Condvar,
    /// Highest ticket that is durable; only the committers raise it, in group order.
    pub durable_ticket: AtomicU64,
    /// Group syncs running now (committers raise it when a group is written, lower it when
    /// its sync returns, before publishing).
    pub syncs_in_flight: AtomicUsize,
    /// Last entry index that is durable (drops on truncation).
    pub durable_index: AtomicU64,
    /// Where the durable data ends: every byte of the log before it is durable and never
    /// changes again (`copy_image`). Raised with `durable_ticket`, in group order; unlike
    /// `durable_index` it never drops (a truncation is a frame after it, not a rewrite).
    pub durable_end: Mutex<DataPosition>,
    /// Set, with the first error, when a write or sync failed; never cleared.
    pub failure: Mutex<Option<(ErrorKind, String)>>,
    pub failed: AtomicBool,
    pub index: RwLock<LogIndex>,
    /// Open segments in sequence order; the last one is the active segment.
    pub segments: RwLock<VecDeque<Arc<SegmentFile>>>,
    pub prepared: Mutex<PreparedSegments>,
    pub prepared_ready: Condvar,
    pub recycle_pool: Mutex<Vec<PathBuf>>,
    /// What the log's recent groups look like, for `fresh_segment_preallocation`.
    pub group_profile: Mutex<GroupProfile>,
    pub anchors: Mutex<Anchors>,
    pub gc_lock: Mutex<()>,
    pub metrics: Metrics,
    pub notify: LogNotify,
    /// What to run once a ticket is durable (`Log::after_durable`), in ticket order.
    pub after_durable: Mutex<VecDeque<(Ticket, AfterDurable)>>,
    /// Durable changes do not signal `notify` (`Log::set_quiet_durability`); a failure does.
    pub quiet_durability: AtomicBool,
    /// A durable change was not signalled while quiet: turning loud signals it.
    pub durability_untold: AtomicBool,
}

/// Work handed to the log to run on the committer that makes its ticket durable: called
/// with `true` then, or with `false` if the log fails or closes first.
pub type AfterDurable = Box<dyn FnOnce(bool) + Send>;

/// Groups committed and bytes written when `fresh_segment_preallocation` last decided, and
/// what it decided.
#[derive(Default)]
pub(crate) struct GroupProfile {
    groups: u64,
    bytes: u64,
    small_groups: bool,
}

/// Groups a log must have committed since the last decision before its group sizes count:
/// an idle or newly opened log keeps `fallocate` (zero-filling costs a segment of writes).
pub(crate) const PROFILE_GROUPS_MIN: u64 = 64;
/// Average bytes per group (page padding included) at or below which groups count as small:
/// such a log is bound by sync latency, not bandwidth.
const SMALL_GROUP_BYTES_MAX: u64 = 64 * 1024;

#[derive(Default)]
pub(crate) struct Anchors {
    next_id: u64,
    by_id: BTreeMap<u64, OpIndex>,
}

impl Anchors {
    /// Registers an anchor at `index`; returns its id.
    pub(crate) fn register(&mut self, index: OpIndex) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.by_id.insert(id, index);
        id
    }

    /// Every anchor as (id, index), by id.
    pub(crate) fn list(&self) -> Vec<(u64, OpIndex)> {
        self.by_id.iter().map(|(id, index)| (*id, *index)).collect()
    }

    /// Moves anchor `id` to `index`; false if there is no such anchor.
    pub(crate) fn update(&mut self, id: u64, index: OpIndex) -> bool {
        match self.by_id.get_mut(&id) {
            Some(slot) => {
                *slot = index;
                true
            }
            None => false,
        }
    }

    /// Releases anchor `id`; false if there is no such anchor.
    pub(crate) fn release(&mut self, id: u64) -> bool {
        self.by_id.remove(&id).is_some()
    }

    /// The lowest registered anchor, if any.
    pub(crate) fn min(&self) -> Option<OpIndex> {
        self.by_id.values().min().copied()
    }
}

impl Shared {
    /// Locks the append queue. A panic while holding it leaves nothing half-done that a later
    /// holder could trip over (every change is a push, a drain or a counter), so poisoning is
    /// ignored.
    pub(crate) fn lock_queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The error every waiter and later append gets once the log has failed.
    pub(crate) fn failure_error(&self) -> WalError {
        match &*self.failure.lock() {
            Some((kind, message)) => WalError::Failed {
                kind: *kind,
                message: message.clone(),
            },
            None => WalError::Closed,
        }
    }

    /// Puts the log into the failed state (first error wins) and wakes every waiter.
    pub(crate) fn fail(&self, err: &WalError) {
        use nyala_common::Classify;
        {
            let mut failure = self.failure.lock();
            if failure.is_none() {
                *failure = Some((err.kind(), err.to_string()));
            }
        }
        {
            let mut queue = self.lock_queue();
            self.failed.store(true, Ordering::SeqCst);
            queue.requests.clear();
            queue.arena.clear();
            self.space_ready.notify_all();
        }
        self.publish_durable_change();
        let mut ready = self.prepared.lock();
        if ready.is_empty() {
            ready.push_back(Err(WalError::Closed));
        }
        self.prepared_ready.notify_all();
    }

    /// Wakes the threads in `Log::wait` whose tickets are durable now (every one once the
    /// log failed), then signals the event-loop descriptor. Call after raising
    /// `durable_ticket` or setting `failed`.
    pub(crate) fn publish_durable_change(&self) {
        let durable = self.durable_ticket.load(Ordering::Acquire);
        let failed = self.failed.load(Ordering::SeqCst);
        let filter = |token: ParkToken| {
            if failed || token_ticket(token) <= durable {
                FilterOp::Unpark
            } else {
                FilterOp::Skip
            }
        };
        // SAFETY: the key is the address of this `Shared`'s `durable_ticket`, which no lock
        // or other parking uses; the callbacks neither panic nor call into parking_lot.
        unsafe {
            parking_lot_core::unpark_filter(self.durable_key(), filter, |_| DEFAULT_UNPARK_TOKEN)
        };
        // Before the event loop's signal: what waits here is on a peer's critical path.
        self.run_after_durable(durable, failed);
        if failed || !self.quiet_durability.load(Ordering::SeqCst) {
            self.notify.signal();
        } else {
            // Marked, then checked again: either this sees the log turned loud meanwhile, or
            // `set_quiet_durability` sees the mark (both may: one signal too many).
            self.durability_untold.store(true, Ordering::SeqCst);
            if !self.quiet_durability.load(Ordering::SeqCst) {
                self.notify.signal();
            }
        }
    }

    /// Runs the `after_durable` work whose tickets are durable now (with `true`), and once
    /// the log failed the rest too (with `false`).
    pub(crate) fn run_after_durable(&self, durable: Ticket, failed: bool) {
        let due: Vec<(Ticket, AfterDurable)> = {
            let mut waiting = self.after_durable.lock();
            if waiting.is_empty() {
                return;
            }
            let mut due = Vec::new();
            while let Some(&(ticket, _)) = waiting.front() {
                if ticket > durable && !failed {
                    break;
                }
                due.extend(waiting.pop_front());
            }
            due
        };
        for (ticket, work) in due {
            work(ticket <= durable);
        }
    }

    /// Where threads waiting for a ticket park, each with its ticket as the park token, so a
    /// durable change wakes only the threads it completes. With one condition variable for
    /// all, each group commit woke every waiter, most of them only to wait again: with 64
    /// threads on 2 cores some waited 50-120 group commits for a CPU (docs/wal-format.md).
    fn durable_key(&self) -> usize {
        std::ptr::from_ref(&self.durable_ticket) as usize
    }

    /// How `Recycle` prepares a segment when no GC'd file is free. A log committing many
    /// small groups (sync-latency bound: a consensus log under many small writes) gets a
    /// zero-filled segment: a sync after writing into already-written blocks took 0.14 ms
    /// against 0.23 ms into `fallocate`d ones (unwritten extents are converted in the journal
    /// at each sync), and 64 asyncio writers appended 25–35 % more records per second
    /// (docs/wal-format.md, "Choice of the default preallocation"). A bulk writer, whose
    /// groups are large, keeps `fallocate`, so it does not write every byte twice; so does an
    /// idle or newly opened log.
    pub(crate) fn fresh_segment_preallocation(&self) -> Preallocation {
        let mut profile = self.group_profile.lock();
        let groups = self.metrics.groups.load(Ordering::Relaxed);
        let bytes = self.metrics.bytes_written.load(Ordering::Relaxed);
        let new_groups = groups.saturating_sub(profile.groups);
        if new_groups >= PROFILE_GROUPS_MIN {
            let per_group = bytes.saturating_sub(profile.bytes) / new_groups;
            *profile = GroupProfile {
                groups,
                bytes,
                small_groups: per_group <= SMALL_GROUP_BYTES_MAX,
            };
        }
        if profile.small_groups {
            Preallocation::ZeroFill
        } else {
            Preallocation::Fallocate
        }
    }

    pub(crate) fn prepare_spec(&self, sequence: u64, recycled: Option<PathBuf>) -> PrepareSpec<'_> {
        let preallocation = match self.options.preallocation {
            Preallocation::Recycle if recycled.is_none() => self.fresh_segment_preallocation(),
            chosen => chosen,
        };
        PrepareSpec {
            dir: &self.dir,
            tablet_id: &self.tablet_id,
            sequence,
            capacity_bytes: self.options.segment_size_bytes,
            preallocation,
            recycled,
            faults: &self.faults,
            metrics: &self.metrics,
        }
    }

    /// Like `prepare_spec`, for the segment a log opens with when recovery left none to
    /// reuse: a fresh `fallocate`d one gets only `initial_preallocation_bytes`, and grows as
    /// writes fill it (`ActiveSegment::grow_allocation`), so a replica that stays idle holds
    /// that much disk instead of a whole segment. A recycled file keeps its blocks, and a
    /// zero-filled segment is written whole, as before.
    pub(crate) fn opening_spec(&self, sequence: u64, recycled: Option<PathBuf>) -> PrepareSpec<'_> {
        let mut spec = self.prepare_spec(sequence, recycled);
        if spec.recycled.is_none() && spec.preallocation == Preallocation::Fallocate {
            spec.capacity_bytes = spec
                .capacity_bytes
                .min(self.options.initial_preallocation_bytes);
        }
        spec
    }

    /// A GC'd file to reuse for the next segment, if recycling is on and one is free.
    pub(crate) fn take_recyclable(&self) -> Option<PathBuf> {
        if self.options.preallocation != Preallocation::Recycle {
            return None;
        }
        self.recycle_pool.lock().pop()
    }

    /// Whether a write or sync failed (the log then accepts and completes nothing more).
    pub(crate) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Blocks until `ticket` is durable, or until `deadline` if one is given; returns whether
    /// it is durable. Fails with the log's error if a write or sync failed before that.
    pub(crate) fn wait_durable(&self, ticket: Ticket, deadline: Option<Instant>) -> Result<bool> {
        let durable = || self.durable_ticket.load(Ordering::Acquire) >= ticket;
        let token = ticket_token(ticket);
        loop {
            if durable() {
                return Ok(true);
            }
            if self.failed.load(Ordering::SeqCst) {
                return Err(self.failure_error());
            }
            // The publisher raises `durable_ticket` (or sets `failed`) before it takes the
            // parking bucket's lock to unpark, and `validate` runs under that lock: either it
            // sees the change and this thread does not park, or the publisher finds it parked.
            let validate = || !durable() && !self.failed.load(Ordering::SeqCst);
            // SAFETY: as in `publish_durable_change`; the callbacks neither panic nor call
            // into parking_lot.
            let parked = unsafe {
                parking_lot_core::park(
                    self.durable_key(),
                    validate,
                    || {},
                    |_, _| {},
                    token,
                    deadline,
                )
            };
            if parked == ParkResult::TimedOut {
                return Ok(durable());
            }
        }
    }

    /// Locks the queue once it has room for `bytes`, waiting while it has not.
    pub(crate) fn reserve_space(&self, bytes: usize) -> Result<std::sync::MutexGuard<'_, Queue>> {
        self.reserve(bytes, true)
            .map(|queue| queue.expect("a blocking reservation always succeeds"))
    }

    /// Locks the queue once it has room for `bytes`; without `block`, `None` when it has not.
    pub(crate) fn reserve(
        &self,
        bytes: usize,
        block: bool,
    ) -> Result<Option<std::sync::MutexGuard<'_, Queue>>> {
        let mut queue = self.lock_queue();
        let mut waited = false;
        loop {
            if queue.closing {
                return Err(WalError::Closed);
            }
            if self.failed.load(Ordering::SeqCst) {
                return Err(self.failure_error());
            }
            if queue.queued_bytes == 0 || queue.queued_bytes + bytes <= self.options.queue_bytes_max
            {
                return Ok(Some(queue));
            }
            if !block {
                return Ok(None);
            }
            if !waited {
                waited = true;
                Metrics::add(&self.metrics.append_backpressure_waits, 1);
            }
            queue.space_waiters += 1;
            queue = self
                .space_ready
                .wait(queue)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            queue.space_waiters -= 1;
        }
    }
}

/// The park token of a waiter for `ticket`, saturated where `usize` is narrower than a
/// ticket (such a waiter wakes early and parks again).
fn ticket_token(ticket: Ticket) -> ParkToken {
    ParkToken(usize::try_from(ticket).unwrap_or(usize::MAX))
}

/// The ticket a waiter parked with (`ticket_token`'s inverse, up to that saturation).
fn token_ticket(token: ParkToken) -> Ticket {
    token.0 as Ticket
}
