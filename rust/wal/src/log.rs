//! `Log`: the public face of one tablet's write-ahead log.
//!
//! Appending threads frame their batch, then reserve its place in a bounded queue under one
//! lock (that order is the order on disk). The log's commit jobs (`committers`) drain the
//! queue into one write and one `fdatasync` per group, with up to
//! `LogOptions::syncs_in_flight_max` syncs overlapping, and publish the durable point in
//! order; its background work (`background`) prepares the next segment and closes finished
//! ones. Both run on process-wide pools (`pools`); they meet in `Shared` (`shared`).
//!
//! This module owns the caller-facing API: opening (recovery, then setting up the jobs),
//! appending, waiting, truncating, reading, anchors, GC and closing, and the checks of what
//! callers pass in. It is the top of the crate: the modules below never reach back into it.

use std::collections::VecDeque;
use std::fs;
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nyala_common::{ErrorKind, OpId, OpIndex, Term};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::active_segment::ActiveSegment;
use crate::appender::Appender;
use crate::background::Background;
use crate::committers::Committers;
use crate::copy_image::{self, SegmentImage};
use crate::entry::{Entry, EntryRef};
use crate::error::{Result, WalError};
use crate::faults::FaultInjection;
use crate::format;
use crate::gc::{self, GcReport};
use crate::index::TermRuns;
use crate::metrics::{Metrics, MetricsSnapshot};
use crate::notify::LogNotify;
use crate::options::{LogOptions, SYNCS_IN_FLIGHT_LIMIT};
use crate::reader::{self, EntryIter};
use crate::recovery;
use crate::segment::{self, Preallocation, SegmentFile};
use crate::shared::{
    AfterDurable, Anchors, AppendTicket, DataPosition, GroupProfile, Queue, Shared, Ticket,
    ARENA_PAYLOAD_BYTES_MAX,
};

/// A registered log anchor: GC keeps every entry at or after its index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AnchorId(pub u64);

/// One tablet's write-ahead log. Cheap to share between threads (`&Log` is enough for
/// everything but `close`, which also works through `&self`).
pub struct Log {
    pub(crate) shared: Arc<Shared>,
    committers: Arc<Committers>,
    background: Arc<Background>,
    /// Set by the first `close` (or the drop).
    closed: AtomicBool,
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
        let notify = LogNotify::new(options.notifier.clone())
            .map_err(|e| WalError::io("eventfd", &dir, e))?;
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
                commit_slots_busy: 0,
                commit_jobs_looking: 0,
                commit_slots_opened: 1,
                appends_found_busy: false,
            }),
            commit_jobs_stopped: std::sync::Condvar::new(),
            space_ready: std::sync::Condvar::new(),
            durable_ticket: AtomicU64::new(0),
            syncs_in_flight: AtomicUsize::new(0),
            durable_index: AtomicU64::new(last.index),
            durable_end: Mutex::new(DataPosition::default()),
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
            after_durable: Mutex::new(VecDeque::new()),
            quiet_durability: AtomicBool::new(false),
            durability_untold: AtomicBool::new(false),
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
        let background = Background::new(Arc::clone(&shared));
        // No segment is prepared ahead yet: the appender asks once the log has shown what its
        // groups look like (`Appender::request_first_preparations`), so those segments get
        // the preallocation that suits it, and a log that stays idle preallocates nothing
        // beyond the first part of its active segment (`Shared::opening_spec`). Nothing runs
        // on the pools until the first append.
        let appender = Appender::new(
            Arc::clone(&shared),
            active,
            last.index,
            Arc::clone(&background),
        );
        let committers = Committers::new(Arc::clone(&shared), appender)?;
        Ok(Log {
            shared,
            committers,
            background,
            closed: AtomicBool::new(false),
        })
    }

    /// Queues `entries` (contiguous, continuing the log, terms not decreasing) and returns
    /// without waiting for the disk. Blocks only while the queue is full (back-pressure).
    /// Wait for durability with `wait`.
    pub fn append(&self, entries: &[EntryRef<'_>]) -> Result<AppendTicket> {
        validate_batch(entries)?;
        let len = format::entries_payload_len(entries);
        if len <= ARENA_PAYLOAD_BYTES_MAX {
            let mut queue = self
                .shared
                .reserve_space(format::BATCH_HEADER_BYTES + len)?;
            check_continues(&queue.terms, entries)?;
            let ticket = queue.push_entries_in_arena(entries);
            self.committers.wake(queue);
            return Ok(ticket);
        }
        let payload = format::encode_entries(entries);
        let mut queue = self
            .shared
            .reserve_space(format::BATCH_HEADER_BYTES + payload.bytes.len())?;
        check_continues(&queue.terms, entries)?;
        let ticket = queue.push_entries(entries, payload);
        self.committers.wake(queue);
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
        let mut queue = self
            .shared
            .reserve_space(format::BATCH_HEADER_BYTES + payload.bytes.len())?;
        check_continues(&queue.terms, entries)?;
        let ticket = queue.push_entries(entries, payload);
        self.committers.wake(queue);
        Ok(ticket)
    }

    /// Like `append`, but never blocks: `None` when the queue is full (nothing was queued).
    /// For callers that must not block the thread they run on (e.g. one holding the GIL).
    pub fn try_append(&self, entries: &[EntryRef<'_>]) -> Result<Option<AppendTicket>> {
        validate_batch(entries)?;
        let len = format::entries_payload_len(entries);
        if len <= ARENA_PAYLOAD_BYTES_MAX {
            let Some(mut queue) = self
                .shared
                .reserve(format::BATCH_HEADER_BYTES + len, false)?
            else {
                return Ok(None);
            };
            check_continues(&queue.terms, entries)?;
            let ticket = queue.push_entries_in_arena(entries);
            self.committers.wake(queue);
            return Ok(Some(ticket));
        }
        let payload = format::encode_entries(entries);
        let Some(mut queue) = self
            .shared
            .reserve(format::BATCH_HEADER_BYTES + payload.bytes.len(), false)?
        else {
            return Ok(None);
        };
        check_continues(&queue.terms, entries)?;
        let ticket = queue.push_entries(entries, payload);
        self.committers.wake(queue);
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
        let mut queue = self
            .shared
            .reserve_space(format::BATCH_HEADER_BYTES + format::TRUNCATE_PAYLOAD_BYTES)?;
        let ticket = queue.push_truncation(last_kept)?;
        self.committers.wake(queue);
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
        let mut queue = self.shared.reserve_space(bytes)?;
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
        queue.push_truncation(last_kept)?;
        let ticket = queue.push_entries(entries, payload);
        self.committers.wake(queue);
        Ok(ticket)
    }

    /// Runs `work(true)` on the committer that makes everything queued so far durable (at
    /// once, on this thread, if it is already), or `work(false)` if the log fails or closes
    /// first. For work that must follow the durability of appends without waiting for the
    /// caller's own wake-up, e.g. a follower's answer to its leader (the work runs on a
    /// commit job's thread: it must be short and must not block).
    pub fn after_durable(&self, work: AfterDurable) {
        let ticket = self.shared.lock_queue().next_ticket - 1;
        let mut waiting = self.shared.after_durable.lock();
        let durable = self.shared.durable_ticket.load(Ordering::Acquire) >= ticket;
        let ended =
            self.shared.failed.load(Ordering::SeqCst) || self.closed.load(Ordering::Acquire);
        if durable || ended {
            drop(waiting);
            work(durable);
            return;
        }
        // In ticket order (a caller that took its ticket later may have come first).
        let at = waiting.partition_point(|(t, _)| *t <= ticket);
        waiting.insert(at, (ticket, work));
    }

    /// While `quiet`, a durable change does not signal the log's notifier (a failure still
    /// does): for an owner that has nothing to do when its appends become durable, e.g. a
    /// follower whose answers go from the committer (`after_durable`), which would otherwise
    /// be woken once per sync for nothing. Turning it off signals once if a change went
    /// unsignalled meanwhile, so the owner catches up (and only then: an owner that turns it
    /// off and on around each answer is not woken more than by the syncs).
    pub fn set_quiet_durability(&self, quiet: bool) {
        let shared = &self.shared;
        shared.quiet_durability.store(quiet, Ordering::SeqCst);
        if !quiet && shared.durability_untold.swap(false, Ordering::SeqCst) {
            shared.notify.signal();
        }
    }

    /// Blocks until the append (or truncation) with `ticket`, and everything before it, is
    /// durable. Fails with the log's error if a write or sync failed before that.
    pub fn wait(&self, ticket: Ticket) -> Result<()> {
        self.shared.wait_durable(ticket, None).map(|_| ())
    }

    /// Like `wait`, giving up after `timeout`; returns whether the ticket is durable.
    pub fn wait_timeout(&self, ticket: Ticket, timeout: Duration) -> Result<bool> {
        self.shared
            .wait_durable(ticket, Some(Instant::now() + timeout))
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
        reader::read_range(&self.shared, from, to, max_bytes)
    }

    /// Iterates every written entry from `from` on, reading `chunk_bytes` at a time.
    pub fn entries_from(&self, from: OpIndex, chunk_bytes: usize) -> EntryIter<'_> {
        EntryIter::new(&self.shared, from, chunk_bytes)
    }

    /// Registers an anchor: GC keeps every entry at or after `index` until it is released.
    pub fn register_anchor(&self, index: OpIndex) -> AnchorId {
        AnchorId(self.shared.anchors.lock().register(index))
    }

    /// Moves an anchor (e.g. after a flush made older entries unnecessary).
    pub fn update_anchor(&self, anchor: AnchorId, index: OpIndex) -> Result<()> {
        if self.shared.anchors.lock().update(anchor.0, index) {
            Ok(())
        } else {
            Err(unknown_anchor(anchor))
        }
    }

    /// Releases an anchor.
    pub fn release_anchor(&self, anchor: AnchorId) -> Result<()> {
        if self.shared.anchors.lock().release(anchor.0) {
            Ok(())
        } else {
            Err(unknown_anchor(anchor))
        }
    }

    /// Every registered anchor and the index it holds, by anchor id.
    pub fn anchors(&self) -> Vec<(AnchorId, OpIndex)> {
        let anchors = self.shared.anchors.lock().list();
        anchors
            .into_iter()
            .map(|(id, index)| (AnchorId(id), index))
            .collect()
    }

    /// The lowest registered anchor, if any.
    pub fn min_anchor(&self) -> Option<OpIndex> {
        self.shared.anchors.lock().min()
    }

    /// Deletes (or keeps for reuse) whole closed segments whose entries all lie below the
    /// lowest anchor and below the durable index, keeping `min_segments_to_retain` closed
    /// segments and never the one holding the last entry.
    pub fn gc(&self) -> Result<GcReport> {
        gc::collect(&self.shared, self.min_anchor())
    }

    /// Bytes the log's append buffers hold in capacity (its group buffers, arenas and request
    /// queues). An idle log keeps at most `IDLE_BUFFER_BYTES` of each, whatever its largest
    /// group was.
    pub fn retained_buffer_bytes(&self) -> usize {
        self.committers.retained_buffer_bytes()
    }

    /// Counters since open.
    pub fn metrics(&self) -> MetricsSnapshot {
        self.shared.metrics.snapshot()
    }

    /// A descriptor that becomes readable whenever the durable point moves or the log fails
    /// (for event loops: watch it, call `drain_notifications`, then check `durable_ticket`).
    /// With `LogOptions::notifier`, the shared notifier's descriptor: its watcher learns from
    /// `Notifier::take_ready` which logs to look at.
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

    /// A consistent image of the log's durable data, for a tablet copy: every segment up to
    /// the one holding the durable end, each with a fixed length (a closed segment whole,
    /// the others cut at their data's end, the last at the durable end). Those bytes never
    /// change while the log lives, whatever is appended meanwhile, so the image can be read
    /// piece by piece; the whole-page rewrites of the active segment's tail only rewrite
    /// bytes before the write position with what they held. The image holds its segments
    /// open: a segment GC'd meanwhile is deleted, never recycled, and stays readable. Anchor
    /// the entries the reader needs first, or GC may remove a segment before it is captured.
    pub fn copy_image(&self) -> Result<Vec<SegmentImage>> {
        copy_image::capture(&self.shared)
    }

    /// Closes the files of the log's segments while the log is idle: nothing queued, every
    /// append durable, no commit or background work running. Returns whether it was idle
    /// (nothing is closed otherwise). The next append, read, copy or close opens what it
    /// needs again. A server with thousands of quiesced replicas calls this as each one
    /// quiesces, so an idle replica holds no descriptor (docs/wal-format.md, "Idle logs").
    pub fn release_files(&self) -> bool {
        {
            let queue = self.shared.lock_queue();
            let idle = !queue.closing
                && queue.requests.is_empty()
                && queue.commit_slots_busy == 0
                && self.shared.durable_ticket.load(Ordering::Acquire) + 1 == queue.next_ticket
                && self.shared.syncs_in_flight.load(Ordering::Acquire) == 0
                && self.background.idle();
            if !idle {
                return false;
            }
        }
        // Outside the queue's lock: a group that starts meanwhile pins the file it writes
        // and syncs (`SegmentFile::file`), so closing the table's handle never loses a sync.
        for segment in self.shared.segments.read().iter() {
            segment.release_handle();
        }
        for segment in self.shared.prepared.lock().iter().flatten() {
            segment.release_handle();
        }
        true
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

    /// Writes what is queued, closes the active segment with a footer and waits for the
    /// log's jobs (its own only: other logs' jobs on the pools go on). Later appends fail
    /// with `IllegalState`; reads keep working.
    pub fn close(&self) -> Result<()> {
        self.closed.store(true, Ordering::Release);
        {
            let mut queue = self.shared.lock_queue();
            queue.closing = true;
            self.shared.space_ready.notify_all();
        }
        // Jobs stop once the queue is empty, each after its own sync returned; then nothing
        // else writes the active segment, and the work queued for the background (closes and
        // preparations) is done here unless a pool worker is already on it.
        self.committers.wait_stopped();
        self.committers.finish();
        self.background.drain();
        // Nothing becomes durable any more: the rest learns it did not.
        let durable = self.shared.durable_ticket.load(Ordering::Acquire);
        self.shared.run_after_durable(durable, true);
        if self.committers.panicked() || self.background.panicked() {
            return Err(WalError::Failed {
                kind: ErrorKind::IllegalState,
                message: "a WAL job panicked".into(),
            });
        }
        match self.failure() {
            Some(err) => Err(err),
            None => Ok(()),
        }
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::Acquire) {
            let _ = self.close();
        }
    }
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
    if options.initial_preallocation_bytes < format::PAGE_BYTES as u64 {
        return Err(WalError::InvalidArgument(format!(
            "initial_preallocation_bytes must be at least {}",
            format::PAGE_BYTES
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
        frame_bytes += e.frame_bytes() as u64;
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
        segment
            .data_end
            .store(recovered.scan_valid_end, Ordering::Release);
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
    let segment_bytes = shared.options.segment_size_bytes;
    let active = match reusable_tail {
        Some((segment, header)) => {
            let allocated = segment
                .file()?
                .metadata()
                .map_err(|e| WalError::io("stat", &segment.path, e))?
                .len();
            ActiveSegment::reuse(Arc::new(segment), header, segment_bytes, allocated)
        }
        None => {
            let recycled = shared.take_recyclable();
            let spec = shared.opening_spec(next_sequence, recycled);
            let allocated = spec.capacity_bytes;
            let segment = segment::prepare_segments(std::slice::from_ref(&spec))
                .pop()
                .expect("one result per spec")?;
            ActiveSegment::fresh(
                Arc::new(segment),
                &shared.tablet_id,
                segment_bytes,
                allocated,
            )
        }
    };
    table.push_back(Arc::clone(active.segment()));
    // Everything recovered is durable, and the active segment holds only its header.
    *shared.durable_end.lock() = DataPosition {
        sequence: active.sequence(),
        offset: active.write_end(),
    };
    segment::sync_dir(&shared.dir)?;
    // That sync covered the active segment's name too, prepared without syncs or not.
    active.segment().name_durable.store(true, Ordering::Release);
    Ok(active)
}

/// The error for an anchor id that is not registered.
fn unknown_anchor(anchor: AnchorId) -> WalError {
    WalError::InvalidArgument(format!("unknown anchor {}", anchor.0))
}
