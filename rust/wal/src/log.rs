//! `Log`: the public face of one tablet's write-ahead log.
//!
//! Appending threads frame their batch, then reserve its place in a bounded queue under one
//! lock (that order is the order on disk). The committer threads (`appender`) drain the
//! queue into one write and one `fdatasync` per group, with up to
//! `LogOptions::syncs_in_flight_max` syncs overlapping, and publish the durable point in
//! order; the background thread (`background`) prepares the next segment and closes
//! finished ones.
//! This module owns the shared state those threads meet in and the caller-facing API.

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::ops::Range;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nyala_common::{ErrorKind, OpId, OpIndex, Term};
use parking_lot::{Condvar, Mutex, RwLock};
use parking_lot_core::{FilterOp, ParkResult, ParkToken, DEFAULT_UNPARK_TOKEN};

use crate::appender::{ActiveSegment, Appender, Committers};
use crate::background;
use crate::entry::{Entry, EntryRef};
use crate::error::{Result, WalError};
use crate::faults::FaultInjection;
use crate::format::{self, EncodedPayload};
use crate::index::{LogIndex, TermRuns};
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::notify::EventFd;
use crate::options::{LogOptions, SYNCS_IN_FLIGHT_LIMIT};
use crate::recovery;
use crate::segment::{self, Preallocation, PrepareSpec, SegmentFile};

/// Identifies an append (or truncation) in queue order; durability is reported per ticket.
pub type Ticket = u64;

/// What `append` returns: the ticket to wait for and the index of the last entry appended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendTicket {
    pub ticket: Ticket,
    pub last_index: OpIndex,
}

/// A registered log anchor: GC keeps every entry at or after its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AnchorId(pub u64);

/// What a `gc` call removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    pub segments_deleted: usize,
    pub segments_recycled: usize,
    /// The first entry index still in the log after GC.
    pub first_index: OpIndex,
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
const ARENA_PAYLOAD_BYTES_MAX: usize = 4 << 10;

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
    /// The appender is blocked on `work_ready` (or about to be) and nobody has woken it
    /// yet. Appends signal it only then, and after releasing the lock: while it syncs,
    /// the 63 other appends of a 64-writer round cost no syscall, and a woken appender
    /// never finds the queue still locked by the thread that woke it.
    pub appender_idle: bool,
    /// An append found the committer holding the write turn busy (not waiting for work)
    /// while a group was syncing: appends overlap syncs, so the turn holder may start
    /// another committer. (A lone writer appends only after its group's sync returned, so
    /// it never sets this.)
    pub appends_found_busy: bool,
}

/// Segments prepared by the background thread, in sequence order, waiting for the appender.
pub(crate) type PreparedSegments = VecDeque<Result<SegmentFile>>;

/// How many segments the background thread keeps ready beyond the active one. Two, so a
/// slow preparation (two fsyncs on a busy disk) does not stall a fast writer at roll-over.
pub(crate) const SEGMENTS_PREPARED_AHEAD: u64 = 2;

/// The most segments kept prepared: a roll-over that finds none ready doubles the count up
/// to this (a bulk writer fills an 8 MiB segment in a few ms, faster than one preparation's
/// fsyncs on a busy disk). Bounds the space preallocated ahead to this many segments.
pub(crate) const SEGMENTS_PREPARED_AHEAD_MAX: u64 = 8;

/// State shared by callers, the appender thread and the background thread.
pub(crate) struct Shared {
    pub dir: PathBuf,
    pub tablet_id: String,
    pub options: LogOptions,
    pub faults: Arc<FaultInjection>,
    /// A `std` mutex, not `parking_lot`'s: parking_lot hands a contended lock over to the
    /// woken waiter every ~0.5 ms ("eventual fairness"), and on a busy machine the waiter is
    /// often the appender thread not yet scheduled, so a caller holding the GIL (term_at,
    /// append) stalled a whole Python process for a scheduling quantum. A barging mutex lets
    /// the running thread take it (docs/performance.md).
    pub queue: std::sync::Mutex<Queue>,
    /// The appender waits here for requests.
    pub work_ready: std::sync::Condvar,
    /// Appenders blocked by back-pressure wait here.
    pub space_ready: std::sync::Condvar,
    /// Highest ticket that is durable; only the appender raises it.
    pub durable_ticket: AtomicU64,
    /// Group syncs running now (committers raise it when a group is written, lower it when
    /// its sync returns, before publishing).
    pub syncs_in_flight: AtomicUsize,
    /// Last entry index that is durable (drops on truncation).
    pub durable_index: AtomicU64,
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
    pub notify: EventFd,
}

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
            self.work_ready.notify_all();
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
        self.notify.signal();
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

    /// A GC'd file to reuse for the next segment, if recycling is on and one is free.
    pub(crate) fn take_recyclable(&self) -> Option<PathBuf> {
        if self.options.preallocation != Preallocation::Recycle {
            return None;
        }
        self.recycle_pool.lock().pop()
    }
}

/// One tablet's write-ahead log. Cheap to share between threads (`&Log` is enough for
/// everything but `close`, which also works through `&self`).
pub struct Log {
    pub(crate) shared: Arc<Shared>,
    /// The background thread (the committers stop it when the last of them stops).
    threads: Mutex<Vec<JoinHandle<()>>>,
    committers: Arc<Committers>,
}

impl Log {
    /// Opens (creating if needed) the log of `tablet_id` in `dir`, recovering what is there:
    /// a torn or zeroed tail of a segment ends the log and is cut off; any other damage is
    /// a `Corruption` error naming the file and offset, and nothing is changed on disk.
    pub fn open(dir: impl AsRef<Path>, tablet_id: &str, options: LogOptions) -> Result<Log> {
        let dir = dir.as_ref().to_path_buf();
        validate_options(tablet_id, &options)?;
        fs::create_dir_all(&dir).map_err(|e| WalError::io("create directory", &dir, e))?;
        let recovered = recovery::recover(&dir, tablet_id)?;
        let notify = EventFd::new().map_err(|e| WalError::io("eventfd", &dir, e))?;
        let faults = options.fault_injection.clone().unwrap_or_default();
        let last = recovered.terms.last();
        let shared = Arc::new(Shared {
            dir,
            tablet_id: tablet_id.to_owned(),
            faults,
            queue: std::sync::Mutex::new(Queue {
                requests: VecDeque::new(),
                arena: Vec::new(),
                space_waiters: 0,
                queued_bytes: 0,
                next_ticket: 1,
                terms: recovered.terms,
                closing: false,
                appender_idle: false,
                appends_found_busy: false,
            }),
            work_ready: std::sync::Condvar::new(),
            space_ready: std::sync::Condvar::new(),
            durable_ticket: AtomicU64::new(0),
            syncs_in_flight: AtomicUsize::new(0),
            durable_index: AtomicU64::new(last.index),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
            index: RwLock::new(recovered.index),
            segments: RwLock::new(VecDeque::new()),
            prepared: Mutex::new(VecDeque::new()),
            prepared_ready: Condvar::new(),
            recycle_pool: Mutex::new(Vec::new()),
            group_profile: Mutex::new(GroupProfile::default()),
            anchors: Mutex::new(Anchors::default()),
            gc_lock: Mutex::new(()),
            metrics: Metrics::default(),
            notify,
            options,
        });
        let active = finish_recovery(
            &shared,
            recovered.segments,
            recovered.reusable_tail,
            recovered.leftovers,
            recovered.recyclable,
            recovered.next_sequence,
        )?;
        let (background_tx, background_rx) = crossbeam_channel::unbounded();
        let threads = vec![background::spawn(Arc::clone(&shared), background_rx)?];
        // No segment is prepared ahead yet: the appender asks once the log has shown what its
        // groups look like (`Appender::request_first_preparations`), so those segments get
        // the preallocation that suits it, and a log that stays idle preallocates nothing
        // beyond its active segment. The committers own the only sender: when the last
        // stops, the background thread stops.
        let appender = Appender::new(Arc::clone(&shared), active, last.index, background_tx);
        let committers = Committers::start(Arc::clone(&shared), appender)?;
        Ok(Log {
            shared,
            threads: Mutex::new(threads),
            committers,
        })
    }

    /// Queues `entries` (contiguous, continuing the log, terms not decreasing) and returns
    /// without waiting for the disk. Blocks only while the queue is full (back-pressure).
    /// Wait for durability with `wait`.
    pub fn append(&self, entries: &[EntryRef<'_>]) -> Result<AppendTicket> {
        validate_batch(entries)?;
        let len = format::entries_payload_len(entries);
        if len <= ARENA_PAYLOAD_BYTES_MAX {
            let mut queue = self.reserve_space(format::BATCH_HEADER_BYTES + len)?;
            check_continues(&queue.terms, entries)?;
            let ticket = self.push_entries_in_arena(&mut queue, entries);
            self.wake_appender(queue);
            return Ok(ticket);
        }
        let payload = format::encode_entries(entries);
        let mut queue = self.reserve_space(format::BATCH_HEADER_BYTES + payload.bytes.len())?;
        check_continues(&queue.terms, entries)?;
        let ticket = self.push_entries(&mut queue, entries, payload);
        self.wake_appender(queue);
        Ok(ticket)
    }

    /// Like `append`, for entries whose frames the caller already holds in the WAL's entry
    /// framing (`storage[range]`, e.g. a consensus entry batch): the queue shares those bytes
    /// instead of copying them. Frames that do not match `entries` exactly are refused.
    pub fn append_shared(
        &self,
        entries: &[EntryRef<'_>],
        storage: format::SharedBytes,
        range: std::ops::Range<usize>,
    ) -> Result<AppendTicket> {
        validate_batch(entries)?;
        let payload = format::shared_entries(entries, storage, range).ok_or_else(|| {
            WalError::InvalidArgument("shared frames do not match the entries".into())
        })?;
        let mut queue = self.reserve_space(format::BATCH_HEADER_BYTES + payload.bytes.len())?;
        check_continues(&queue.terms, entries)?;
        let ticket = self.push_entries(&mut queue, entries, payload);
        self.wake_appender(queue);
        Ok(ticket)
    }

    /// Like `append`, but never blocks: `None` when the queue is full (nothing was queued).
    /// For callers that must not block the thread they run on (e.g. one holding the GIL).
    pub fn try_append(&self, entries: &[EntryRef<'_>]) -> Result<Option<AppendTicket>> {
        validate_batch(entries)?;
        let len = format::entries_payload_len(entries);
        if len <= ARENA_PAYLOAD_BYTES_MAX {
            let Some(mut queue) = self.reserve(format::BATCH_HEADER_BYTES + len, false)? else {
                return Ok(None);
            };
            check_continues(&queue.terms, entries)?;
            let ticket = self.push_entries_in_arena(&mut queue, entries);
            self.wake_appender(queue);
            return Ok(Some(ticket));
        }
        let payload = format::encode_entries(entries);
        let Some(mut queue) =
            self.reserve(format::BATCH_HEADER_BYTES + payload.bytes.len(), false)?
        else {
            return Ok(None);
        };
        check_continues(&queue.terms, entries)?;
        let ticket = self.push_entries(&mut queue, entries, payload);
        self.wake_appender(queue);
        Ok(Some(ticket))
    }

    /// Appends and waits until the entries are durable; returns the last index.
    pub fn append_durable(&self, entries: &[EntryRef<'_>]) -> Result<OpIndex> {
        let ticket = self.append(entries)?;
        self.wait(ticket.ticket)?;
        Ok(ticket.last_index)
    }

    /// Discards every entry after `last_kept` (a follower whose suffix conflicts with the
    /// leader's), ordered after everything queued before it. Returns the ticket to wait for.
    pub fn truncate_after(&self, last_kept: OpIndex) -> Result<Ticket> {
        let mut queue =
            self.reserve_space(format::BATCH_HEADER_BYTES + format::TRUNCATE_PAYLOAD_BYTES)?;
        let ticket = self.push_truncation(&mut queue, last_kept)?;
        self.wake_appender(queue);
        Ok(ticket)
    }

    /// Truncates after `last_kept` and appends `entries` in one step, so no other append can
    /// come between the two (the follower side of AppendEntries).
    pub fn truncate_and_append(
        &self,
        last_kept: OpIndex,
        entries: &[EntryRef<'_>],
    ) -> Result<AppendTicket> {
        validate_batch(entries)?;
        let payload = format::encode_entries(entries);
        let bytes =
            2 * format::BATCH_HEADER_BYTES + format::TRUNCATE_PAYLOAD_BYTES + payload.bytes.len();
        let mut queue = self.reserve_space(bytes)?;
        let mut terms_after = OpId::new(queue.terms.term_at(last_kept).unwrap_or(0), last_kept);
        if last_kept >= queue.terms.last().index {
            terms_after = queue.terms.last();
        }
        if entries[0].index != terms_after.index + 1 {
            return Err(WalError::NonContiguous {
                expected: terms_after.index + 1,
                got: entries[0].index,
            });
        }
        if entries[0].term < terms_after.term {
            return Err(WalError::TermRegression {
                index: entries[0].index,
                term: entries[0].term,
                previous: terms_after.term,
            });
        }
        self.push_truncation(&mut queue, last_kept)?;
        let ticket = self.push_entries(&mut queue, entries, payload);
        self.wake_appender(queue);
        Ok(ticket)
    }

    /// Blocks until the append (or truncation) with `ticket`, and everything before it, is
    /// durable. Fails with the log's error if a write or sync failed before that.
    pub fn wait(&self, ticket: Ticket) -> Result<()> {
        self.wait_until(ticket, None).map(|_| ())
    }

    /// Like `wait`, giving up after `timeout`; returns whether the ticket is durable.
    pub fn wait_timeout(&self, ticket: Ticket, timeout: Duration) -> Result<bool> {
        self.wait_until(ticket, Some(Instant::now() + timeout))
    }

    fn wait_until(&self, ticket: Ticket, deadline: Option<Instant>) -> Result<bool> {
        let shared = &*self.shared;
        let durable = || shared.durable_ticket.load(Ordering::Acquire) >= ticket;
        let token = ticket_token(ticket);
        loop {
            if durable() {
                return Ok(true);
            }
            if shared.failed.load(Ordering::SeqCst) {
                return Err(shared.failure_error());
            }
            // The publisher raises `durable_ticket` (or sets `failed`) before it takes the
            // parking bucket's lock to unpark, and `validate` runs under that lock: either it
            // sees the change and this thread does not park, or the publisher finds it parked.
            let validate = || !durable() && !shared.failed.load(Ordering::SeqCst);
            // SAFETY: as in `Shared::publish_durable_change`; the callbacks neither panic nor
            // call into parking_lot.
            let parked = unsafe {
                parking_lot_core::park(
                    shared.durable_key(),
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

    /// The highest ticket that is durable.
    pub fn durable_ticket(&self) -> Ticket {
        self.shared.durable_ticket.load(Ordering::Acquire)
    }

    /// The index of the last durable entry (what a follower reports to the leader).
    pub fn durable_index(&self) -> OpIndex {
        self.shared.durable_index.load(Ordering::Acquire)
    }

    /// The (term, index) of the last appended entry, including appends not yet durable.
    pub fn last_op_id(&self) -> OpId {
        self.shared.lock_queue().terms.last()
    }

    /// The term of the entry at `index` (0 for index 0), including appends not yet durable;
    /// `None` if the log does not hold it (beyond the end, or garbage-collected).
    pub fn term_at(&self, index: OpIndex) -> Option<Term> {
        self.shared.lock_queue().terms.term_at(index)
    }

    /// The first index still in the log (entries before it were garbage-collected).
    pub fn first_index(&self) -> OpIndex {
        self.shared.lock_queue().terms.first()
    }

    /// Reads written entries `from..=to`, stopping before `max_bytes` of framed entries
    /// (payload plus the 24-byte entry header) would be exceeded (at least one entry is returned when any is available). Entries queued but
    /// not yet written are not returned; `from` below the first retained index is NotFound.
    pub fn read(&self, from: OpIndex, to: OpIndex, max_bytes: usize) -> Result<Vec<Entry>> {
        crate::reader::read_range(&self.shared, from, to, max_bytes)
    }

    /// Iterates every written entry from `from` on, reading `chunk_bytes` at a time.
    pub fn entries_from(&self, from: OpIndex, chunk_bytes: usize) -> crate::reader::EntryIter<'_> {
        crate::reader::EntryIter::new(&self.shared, from, chunk_bytes)
    }

    /// Registers an anchor: GC keeps every entry at or after `index` until it is released.
    pub fn register_anchor(&self, index: OpIndex) -> AnchorId {
        let mut anchors = self.shared.anchors.lock();
        anchors.next_id += 1;
        let id = anchors.next_id;
        anchors.by_id.insert(id, index);
        AnchorId(id)
    }

    /// Moves an anchor (e.g. after a flush made older entries unnecessary).
    pub fn update_anchor(&self, anchor: AnchorId, index: OpIndex) -> Result<()> {
        match self.shared.anchors.lock().by_id.get_mut(&anchor.0) {
            Some(slot) => {
                *slot = index;
                Ok(())
            }
            None => Err(WalError::InvalidArgument(format!(
                "unknown anchor {}",
                anchor.0
            ))),
        }
    }

    /// Releases an anchor.
    pub fn release_anchor(&self, anchor: AnchorId) -> Result<()> {
        match self.shared.anchors.lock().by_id.remove(&anchor.0) {
            Some(_) => Ok(()),
            None => Err(WalError::InvalidArgument(format!(
                "unknown anchor {}",
                anchor.0
            ))),
        }
    }

    /// The lowest registered anchor, if any.
    pub fn min_anchor(&self) -> Option<OpIndex> {
        self.shared.anchors.lock().by_id.values().min().copied()
    }

    /// Deletes (or keeps for reuse) whole closed segments whose entries all lie below the
    /// lowest anchor and below the durable index, keeping `min_segments_to_retain` closed
    /// segments and never the one holding the last entry.
    pub fn gc(&self) -> Result<GcReport> {
        crate::gc::collect(&self.shared, self.min_anchor())
    }

    /// Counters since open.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// A descriptor that becomes readable whenever the durable point moves or the log fails
    /// (for event loops: watch it, call `drain_notifications`, then check `durable_ticket`).
    pub fn notification_fd(&self) -> RawFd {
        self.shared.notify.raw_fd()
    }

    /// Clears pending readiness of `notification_fd`.
    pub fn drain_notifications(&self) {
        self.shared.notify.drain();
    }

    /// The error the log failed with, if a write or sync failed.
    pub fn failure(&self) -> Option<WalError> {
        self.shared
            .failed
            .load(Ordering::SeqCst)
            .then(|| self.shared.failure_error())
    }

    /// Test-only switches that make file operations fail (see `faults`).
    pub fn fault_injection(&self) -> &Arc<FaultInjection> {
        &self.shared.faults
    }

    /// The directory holding the segments.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Paths of the segments currently open, oldest first (the last is being appended to).
    pub fn segment_paths(&self) -> Vec<PathBuf> {
        self.shared
            .segments
            .read()
            .iter()
            .map(|s| s.path.clone())
            .collect()
    }

    /// Writes what is queued, closes the active segment with a footer and stops the threads.
    /// Later appends fail with `IllegalState`; reads keep working.
    pub fn close(&self) -> Result<()> {
        {
            let mut queue = self.shared.lock_queue();
            queue.closing = true;
            self.shared.work_ready.notify_all();
            self.shared.space_ready.notify_all();
        }
        // The last committer to stop waits for nothing in flight (each stops only after
        // its own sync returned), closes the active segment and stops the background
        // thread, so join the committers first.
        let panicked = || WalError::Failed {
            kind: ErrorKind::IllegalState,
            message: "a WAL thread panicked".into(),
        };
        if self.committers.join_all().is_err() {
            return Err(panicked());
        }
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        for thread in threads {
            if thread.join().is_err() {
                return Err(panicked());
            }
        }
        match self.failure() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }

    fn reserve_space(&self, bytes: usize) -> Result<std::sync::MutexGuard<'_, Queue>> {
        self.reserve(bytes, true)
            .map(|queue| queue.expect("a blocking reservation always succeeds"))
    }

    /// Locks the queue once it has room for `bytes`; without `block`, `None` when it has not.
    fn reserve(
        &self,
        bytes: usize,
        block: bool,
    ) -> Result<Option<std::sync::MutexGuard<'_, Queue>>> {
        let shared = &self.shared;
        let mut queue = shared.lock_queue();
        let mut waited = false;
        loop {
            if queue.closing {
                return Err(WalError::Closed);
            }
            if shared.failed.load(Ordering::SeqCst) {
                return Err(shared.failure_error());
            }
            if queue.queued_bytes == 0
                || queue.queued_bytes + bytes <= shared.options.queue_bytes_max
            {
                return Ok(Some(queue));
            }
            if !block {
                return Ok(None);
            }
            if !waited {
                waited = true;
                Metrics::add(&shared.metrics.append_backpressure_waits, 1);
            }
            queue.space_waiters += 1;
            queue = shared
                .space_ready
                .wait(queue)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            queue.space_waiters -= 1;
        }
    }

    fn push_entries(
        &self,
        queue: &mut Queue,
        entries: &[EntryRef<'_>],
        payload: EncodedPayload,
    ) -> AppendTicket {
        for e in entries {
            queue.terms.push(OpId::new(e.term, e.index));
        }
        let ticket = self.push_request(queue, payload, None, None, entries[0].index);
        AppendTicket {
            ticket,
            last_index: entries[entries.len() - 1].index,
        }
    }

    /// Like `push_entries`, framing the entries into the queue's arena.
    fn push_entries_in_arena(&self, queue: &mut Queue, entries: &[EntryRef<'_>]) -> AppendTicket {
        for e in entries {
            queue.terms.push(OpId::new(e.term, e.index));
        }
        let start = queue.arena.len();
        let crc = format::encode_entries_into(entries, &mut queue.arena);
        let payload = EncodedPayload {
            kind: format::BatchKind::Entries,
            bytes: format::PayloadBytes::Owned(Vec::new()),
            crc,
            entry_count: entries.len() as u32,
        };
        let range = start..queue.arena.len();
        let ticket = self.push_request(queue, payload, Some(range), None, entries[0].index);
        AppendTicket {
            ticket,
            last_index: entries[entries.len() - 1].index,
        }
    }

    fn push_truncation(&self, queue: &mut Queue, last_kept: OpIndex) -> Result<Ticket> {
        let last = queue.terms.last();
        if last_kept >= last.index {
            // Nothing to discard; the caller may still wait for everything queued so far.
            return Ok(queue.next_ticket - 1);
        }
        let Some(term) = queue.terms.term_at(last_kept) else {
            return Err(WalError::NotFound {
                index: last_kept,
                first: queue.terms.first(),
                last: last.index,
            });
        };
        let kept = OpId::new(term, last_kept);
        queue.terms.truncate_after(kept);
        Ok(self.push_request(queue, format::encode_truncate(kept), None, Some(kept), 0))
    }

    fn push_request(
        &self,
        queue: &mut Queue,
        payload: EncodedPayload,
        in_arena: Option<Range<usize>>,
        truncate_to: Option<OpId>,
        first_index: OpIndex,
    ) -> Ticket {
        let ticket = queue.next_ticket;
        queue.next_ticket += 1;
        let request = Request {
            ticket,
            payload,
            in_arena,
            truncate_to,
            first_index,
        };
        queue.queued_bytes += request.queued_bytes();
        queue.requests.push_back(request);
        ticket
    }

    /// Releases the queue and wakes the appender if it is idle and work is queued.
    fn wake_appender(&self, mut queue: std::sync::MutexGuard<'_, Queue>) {
        let wake = queue.appender_idle && !queue.requests.is_empty();
        if wake {
            queue.appender_idle = false;
        } else if self.shared.syncs_in_flight.load(Ordering::Relaxed) > 0 {
            queue.appends_found_busy = true;
        }
        drop(queue);
        if wake {
            self.shared.work_ready.notify_one();
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        if !self.threads.lock().is_empty() {
            let _ = self.close();
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

fn validate_options(tablet_id: &str, options: &LogOptions) -> Result<()> {
    if tablet_id.is_empty() || tablet_id.len() > format::TABLET_ID_BYTES_MAX {
        return Err(WalError::InvalidArgument(format!(
            "tablet id must be 1..={} bytes",
            format::TABLET_ID_BYTES_MAX
        )));
    }
    let segment_min = (2 * format::PAGE_BYTES) as u64;
    if options.segment_size_bytes < segment_min {
        return Err(WalError::InvalidArgument(format!(
            "segment_size_bytes must be at least {segment_min}"
        )));
    }
    if !(1..=SYNCS_IN_FLIGHT_LIMIT).contains(&options.syncs_in_flight_max) {
        return Err(WalError::InvalidArgument(format!(
            "syncs_in_flight_max must be 1..={SYNCS_IN_FLIGHT_LIMIT}"
        )));
    }
    if options.queue_bytes_max == 0 {
        return Err(WalError::InvalidArgument(
            "queue_bytes_max must be positive".into(),
        ));
    }
    Ok(())
}

/// Checks a batch on its own: non-empty, contiguous, terms not decreasing, lengths in range.
fn validate_batch(entries: &[EntryRef<'_>]) -> Result<()> {
    let Some(first) = entries.first() else {
        return Err(WalError::InvalidArgument("empty batch".into()));
    };
    if first.index == 0 {
        return Err(WalError::InvalidArgument(
            "entry index 0 is reserved".into(),
        ));
    }
    let mut frame_bytes = format::BATCH_HEADER_BYTES as u64;
    for pair in entries.windows(2) {
        if pair[1].index != pair[0].index + 1 {
            return Err(WalError::NonContiguous {
                expected: pair[0].index + 1,
                got: pair[1].index,
            });
        }
        if pair[1].term < pair[0].term {
            return Err(WalError::TermRegression {
                index: pair[1].index,
                term: pair[1].term,
                previous: pair[0].term,
            });
        }
    }
    for e in entries {
        frame_bytes += (format::ENTRY_HEADER_BYTES + e.payload.len()) as u64;
    }
    if frame_bytes > u64::from(u32::MAX) {
        return Err(WalError::InvalidArgument("batch larger than 4 GiB".into()));
    }
    Ok(())
}

/// Checks that a validated batch continues the log as reserved so far.
fn check_continues(terms: &TermRuns, entries: &[EntryRef<'_>]) -> Result<()> {
    let last = terms.last();
    let first = &entries[0];
    if first.index != last.index + 1 {
        return Err(WalError::NonContiguous {
            expected: last.index + 1,
            got: first.index,
        });
    }
    if first.term < last.term {
        return Err(WalError::TermRegression {
            index: first.index,
            term: first.term,
            previous: last.term,
        });
    }
    Ok(())
}

/// Repairs what recovery found (cut torn tails, add missing footers, remove leftovers) and
/// returns the segment to append to.
fn finish_recovery(
    shared: &Arc<Shared>,
    segments: Vec<recovery::RecoveredSegment>,
    reusable_tail: Option<(SegmentFile, Vec<u8>)>,
    leftovers: Vec<PathBuf>,
    recyclable: Vec<PathBuf>,
    next_sequence: u64,
) -> Result<ActiveSegment> {
    let mut table = shared.segments.write();
    for recovered in segments {
        let segment = recovered.segment;
        if !recovered.has_footer {
            segment::repair_segment(&segment, recovered.scan_valid_end)?;
        }
        segment.closed.store(true, Ordering::Release);
        table.push_back(Arc::new(segment));
    }
    for path in &leftovers {
        fs::remove_file(path).map_err(|e| WalError::io("remove", path, e))?;
    }
    if shared.options.preallocation == Preallocation::Recycle {
        let keep = recyclable
            .len()
            .min(shared.options.recycle_pool_segments_max);
        let (kept, extra) = recyclable.split_at(keep);
        shared.recycle_pool.lock().extend(kept.iter().cloned());
        for path in extra {
            fs::remove_file(path).map_err(|e| WalError::io("remove", path, e))?;
        }
    } else {
        for path in &recyclable {
            fs::remove_file(path).map_err(|e| WalError::io("remove", path, e))?;
        }
    }
    let active = match reusable_tail {
        Some((segment, header)) => {
            ActiveSegment::reuse(Arc::new(segment), header, shared.options.segment_size_bytes)
        }
        None => {
            let recycled = shared.take_recyclable();
            let spec = shared.prepare_spec(next_sequence, recycled);
            let segment = segment::prepare_segments(std::slice::from_ref(&spec))
                .pop()
                .expect("one result per spec")?;
            ActiveSegment::fresh(
                Arc::new(segment),
                &shared.tablet_id,
                shared.options.segment_size_bytes,
            )
        }
    };
    table.push_back(Arc::clone(active.segment()));
    segment::sync_dir(&shared.dir)?;
    // That sync covered the active segment's name too, prepared without syncs or not.
    active.segment().name_durable.store(true, Ordering::Release);
    Ok(active)
}
