//! Group commit: the committer threads.
//!
//! A committer takes the *write turn* (one holder at a time, so the order on disk is the
//! ticket order), drains everything queued, frames it behind the segment's partial last
//! page, writes the whole pages in one `pwrite`, registers the group in the *pipeline*,
//! and gives the turn up. Only then does it call `fdatasync` for its group, so the next
//! committer writes the next group while this one's sync runs: up to
//! `LogOptions::syncs_in_flight_max` syncs overlap, which a disk that serves concurrent
//! flushes turns into more groups per second (docs/wal-format.md, "Group commit").
//!
//! Durability is published strictly in group order: a group's ticket and index become
//! durable only once its own sync and every earlier group's sync have returned. A sync that
//! fails stops publication for good (no later group is ever reported durable) and fails the
//! log. Each committer syncs through its own open file description of the segment: Linux
//! reports a writeback error once per description, so with one shared description a
//! concurrent sync could consume the error of an earlier group's pages and let that group's
//! sync return success.
//!
//! The first committer starts with the log; more start (up to the limit) only when an
//! append found every committer busy, so a quiet tablet keeps one thread. The last
//! committer to stop closes the active segment, after every sync has returned. The turn
//! holder also rolls over to the segment the background thread prepared; committers are
//! the only writers of segment data and of the durable point.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
use std::mem;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use nyala_common::OpIndex;
use parking_lot::{Condvar, Mutex};

use crate::background::Job;
use crate::error::{Result, WalError};
use crate::format::{self, PAGE_BYTES};
use crate::index::Location;
use crate::metrics::Metrics;
use crate::options::SyncPolicy;
use crate::segment::SegmentFile;
use crate::shared::{
    Request, Shared, Ticket, PROFILE_GROUPS_MIN, SEGMENTS_PREPARED_AHEAD,
    SEGMENTS_PREPARED_AHEAD_MAX,
};

/// A group of at most 1/this of a segment that does not fit in the active segment starts
/// the next one instead of being split across both. At 4, a segment is left at most a
/// quarter empty (and is cut to its length when closed, so no disk space is lost), and the
/// group always fits in the new segment (its header and footer are far below a quarter).
const WHOLE_GROUP_SEGMENT_FRACTION: u64 = 4;

/// Payloads of at least this many bytes are written straight from their own buffers (the
/// group goes out in one `pwritev`) instead of being copied into the group's buffer first.
/// Below it the copy costs less than the extra `iovec`s; a bulk writer's 1 MiB batches were
/// copied twice on the way to the disk (framed, then into the group), and the second copy,
/// some 0.25 ms per MiB, kept the committer from the disk (docs/wal-format.md, "Session 14").
const VECTORED_PAYLOAD_BYTES_MIN: usize = 64 << 10;

/// Stack of a committer thread: it keeps its buffers on the heap, and a tablet server runs
/// one or more per tablet.
const COMMITTER_STACK_BYTES: usize = 256 << 10;

/// The segment being appended to, with a copy of its partial last page so every write can
/// cover whole pages.
pub(crate) struct ActiveSegment {
    segment: Arc<SegmentFile>,
    /// Offset just past the last batch.
    write_end: u64,
    /// Page-aligned start of `tail`.
    tail_start: u64,
    /// The file's bytes `tail_start..write_end`.
    tail: Vec<u8>,
    capacity_bytes: u64,
    has_batches: bool,
    /// Further open file descriptions of the segment, one per committer beyond the first
    /// (which syncs through `segment.file`). Opened when the segment becomes active, before
    /// any data is written to it, so each sees every writeback error of that data.
    sync_handles: Vec<Arc<File>>,
}

impl ActiveSegment {
    /// A segment just prepared: header only.
    pub(crate) fn fresh(segment: Arc<SegmentFile>, tablet_id: &str, capacity_bytes: u64) -> Self {
        let header = format::encode_segment_header(tablet_id, segment.sequence);
        Self::reuse(segment, header.to_vec(), capacity_bytes)
    }

    /// An empty segment found by recovery, whose header bytes are `header`.
    pub(crate) fn reuse(segment: Arc<SegmentFile>, header: Vec<u8>, capacity_bytes: u64) -> Self {
        assert_eq!(header.len(), format::SEGMENT_HEADER_BYTES);
        ActiveSegment {
            segment,
            write_end: header.len() as u64,
            tail_start: 0,
            tail: header,
            capacity_bytes,
            has_batches: false,
            sync_handles: Vec::new(),
        }
    }

    pub(crate) fn sequence(&self) -> u64 {
        self.segment.sequence
    }

    pub(crate) fn segment(&self) -> &Arc<SegmentFile> {
        &self.segment
    }

    /// Opens the descriptions committers 1..=`count` sync through.
    pub(crate) fn open_sync_handles(&mut self, count: usize) -> Result<()> {
        let path = &self.segment.path;
        while self.sync_handles.len() < count {
            let file = OpenOptions::new()
                .read(true)
                .open(path)
                .map_err(|e| WalError::io("open for sync", path, e))?;
            self.sync_handles.push(Arc::new(file));
        }
        Ok(())
    }

    /// What committer `slot` syncs to make this segment's data durable.
    fn sync_target(&self, slot: usize) -> SyncTarget {
        SyncTarget {
            segment: Arc::clone(&self.segment),
            handle: slot
                .checked_sub(1)
                .map(|i| Arc::clone(&self.sync_handles[i])),
        }
    }
}

/// One segment a group wrote to, and the description its committer syncs it through.
struct SyncTarget {
    segment: Arc<SegmentFile>,
    /// `None`: `segment.file`.
    handle: Option<Arc<File>>,
}

impl SyncTarget {
    fn file(&self) -> &File {
        self.handle.as_deref().unwrap_or(&self.segment.file)
    }
}

enum Staged {
    Push(OpIndex, Location),
    Truncate(OpIndex),
}

/// A written group whose durability is not published yet.
struct PendingGroup {
    id: u64,
    last_ticket: Ticket,
    /// The log's last index once this group is durable (lowered by later truncations).
    log_last: OpIndex,
    entries: u64,
    batches: u64,
    synced: bool,
}

/// Written groups in write order whose durability is not published yet.
#[derive(Default)]
pub(crate) struct Pipeline {
    groups: VecDeque<PendingGroup>,
    next_id: u64,
    /// When the latest group's sync started (about: when it was registered).
    last_sync_started: Option<Instant>,
    /// Moving average of recent sync times (0 until the first sync returned).
    sync_estimate_micros: u64,
    /// Syncs returned so far (a committer holding a group back watches it).
    syncs_returned: u64,
    /// A write or sync failed: nothing is published any more.
    stopped: bool,
}

impl Pipeline {
    /// Publishes the durable point of every leading group whose sync has returned; returns
    /// whether it moved. Runs under the pipeline lock, so groups publish one after another.
    fn publish_ready(&mut self, shared: &Shared) -> bool {
        let mut moved = false;
        while !self.stopped && self.groups.front().is_some_and(|g| g.synced) {
            let group = self.groups.pop_front().expect("a leading group");
            // Counters first, so whoever sees the entries durable also sees them counted.
            let metrics = &shared.metrics;
            metrics.record_group(group.entries);
            Metrics::add(&metrics.entries_appended, group.entries);
            Metrics::add(&metrics.batches_appended, group.batches);
            shared
                .durable_index
                .store(group.log_last, Ordering::Release);
            shared
                .durable_ticket
                .store(group.last_ticket, Ordering::Release);
            moved = true;
        }
        moved
    }

    /// A truncation to `kept` was framed: no group before it may publish a later index.
    fn cap_log_last(&mut self, kept: OpIndex) {
        for group in &mut self.groups {
            group.log_last = group.log_last.min(kept);
        }
    }
}

/// A written group its committer still has to sync.
struct GroupToSync {
    id: u64,
    targets: Vec<SyncTarget>,
}

/// What the committer threads share: the write turn (with the appending state), the
/// pipeline of written groups, and the threads' handles.
pub(crate) struct Committers {
    shared: Arc<Shared>,
    /// The write turn. Its holder alone drains the queue, writes and rolls over.
    turn: Mutex<Appender>,
    pipeline: Arc<Mutex<Pipeline>>,
    /// Signalled (with the pipeline lock) whenever a sync returns.
    sync_returned: Condvar,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Committers {
    /// Starts the first committer.
    pub(crate) fn start(shared: Arc<Shared>, mut appender: Appender) -> Result<Arc<Self>> {
        let handles = appender.sync_handle_count();
        appender.active.open_sync_handles(handles)?;
        appender.running = 1;
        appender.spawned = 1;
        let pipeline = Arc::clone(&appender.pipeline);
        let committers = Arc::new(Committers {
            shared,
            turn: Mutex::new(appender),
            pipeline,
            sync_returned: Condvar::new(),
            handles: Mutex::new(Vec::new()),
        });
        let handle = committers.spawn(0)?;
        committers.handles.lock().push(handle);
        Ok(committers)
    }

    /// Waits for every committer to stop (after `closing` was set or the log failed).
    /// Committers that start meanwhile are started by one not yet joined, so this sees them.
    pub(crate) fn join_all(&self) -> std::thread::Result<()> {
        let mut outcome = Ok(());
        loop {
            let Some(handle) = self.handles.lock().pop() else {
                return outcome;
            };
            if let Err(panic) = handle.join() {
                outcome = Err(panic);
            }
        }
    }

    fn spawn(self: &Arc<Self>, slot: usize) -> Result<JoinHandle<()>> {
        let committers = Arc::clone(self);
        Metrics::add(&self.shared.metrics.sync_threads, 1);
        std::thread::Builder::new()
            .name(format!("wal-commit-{slot}"))
            .stack_size(COMMITTER_STACK_BYTES)
            .spawn(move || committers.run(slot))
            .map_err(|e| WalError::io("spawn committer thread", "", e))
    }

    /// Starts one more committer if appends found every committer busy and the limit
    /// allows (called by the turn holder).
    fn maybe_grow(self: &Arc<Self>, turn: &mut Appender) {
        let options = &self.shared.options;
        if options.sync_policy != SyncPolicy::Group || turn.spawned >= options.syncs_in_flight_max {
            return;
        }
        // Without a thread the log keeps working with those it has.
        if let Ok(handle) = self.spawn(turn.spawned) {
            turn.spawned += 1;
            turn.running += 1;
            self.handles.lock().push(handle);
        }
    }

    fn run(self: Arc<Self>, slot: usize) {
        let shared = &self.shared;
        let mut requests = VecDeque::new();
        // The queue arena this committer took last (emptied), swapped in at the next drain.
        let mut arena = Vec::new();
        loop {
            let mut turn = self.turn.lock();
            // Held back before looking at the queue, without the idle flag: appends that
            // arrive meanwhile queue up and wake nobody (no system call on their path).
            self.stagger();
            let contended = {
                let mut queue = shared.lock_queue();
                let mut waited = false;
                while queue.requests.is_empty() && !queue.closing && !shared.has_failed() {
                    // Set under the lock before sleeping, so an append either sees it and
                    // signals, or queued its request before this check saw the queue empty.
                    queue.appender_idle = true;
                    waited = true;
                    queue = shared
                        .work_ready
                        .wait(queue)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                queue.appender_idle = false;
                if queue.requests.is_empty() || shared.has_failed() {
                    break;
                }
                if waited && !queue.closing {
                    // Woken by the first append: let the group gather while a sync runs.
                    drop(queue);
                    self.stagger();
                    queue = shared.lock_queue();
                    if shared.has_failed() {
                        break;
                    }
                }
                mem::swap(&mut requests, &mut queue.requests);
                mem::swap(&mut arena, &mut queue.arena);
                mem::take(&mut queue.appends_found_busy) && !queue.closing
            };
            let committed = turn.commit(&mut requests, &arena, slot);
            arena.clear();
            let group = match committed {
                Ok(group) => group,
                Err(err) => {
                    self.pipeline.lock().stopped = true;
                    shared.fail(&err);
                    break;
                }
            };
            if contended {
                self.maybe_grow(&mut turn);
            }
            drop(turn);
            if let Some(group) = group {
                if let Err(err) = self.sync_and_publish(&group) {
                    shared.fail(&err);
                    break;
                }
            }
        }
        let mut turn = self.turn.lock();
        turn.running -= 1;
        if turn.running == 0 {
            turn.finish();
        }
    }

    /// Holds the next group back while an earlier group syncs: until 1/`syncs_in_flight_max`
    /// of a sync time after the latest sync started, or until a sync returns. Syncs in
    /// flight then start evenly spaced and each group gathers the appends of one interval.
    /// A free committer that started a group with the first append to arrive would write
    /// groups of one or two entries, each costing a sync and a wake-up of the event loop.
    /// Never longer than without pipelining: a group waited for the sync in flight then.
    fn stagger(&self) {
        if self.shared.syncs_in_flight.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut pipeline = self.pipeline.lock();
        let Some(started) = pipeline.last_sync_started else {
            return;
        };
        // Checked again under the lock a returning sync takes to lower it.
        if self.shared.syncs_in_flight.load(Ordering::Acquire) == 0 {
            return;
        }
        let spacing_micros =
            pipeline.sync_estimate_micros / self.shared.options.syncs_in_flight_max as u64;
        let until = started + Duration::from_micros(spacing_micros);
        let returned = pipeline.syncs_returned;
        while pipeline.syncs_returned == returned
            && !self
                .sync_returned
                .wait_until(&mut pipeline, until)
                .timed_out()
        {}
    }

    /// Syncs every segment the group wrote to, then publishes what is now durable in order.
    fn sync_and_publish(&self, group: &GroupToSync) -> Result<()> {
        let started = Instant::now();
        for target in &group.targets {
            if let Err(err) =
                sync(&self.shared, target).and_then(|()| sync_name(&self.shared, target))
            {
                // Stopped under the pipeline lock before the log fails, so no group at or
                // after this one (nor one whose sync overlapped it) is ever published.
                let mut pipeline = self.pipeline.lock();
                pipeline.stopped = true;
                pipeline.syncs_returned += 1;
                self.shared.syncs_in_flight.fetch_sub(1, Ordering::AcqRel);
                self.sync_returned.notify_all();
                return Err(err);
            }
        }
        let micros = started.elapsed().as_micros() as u64;
        let moved = {
            let mut pipeline = self.pipeline.lock();
            self.shared.syncs_in_flight.fetch_sub(1, Ordering::AcqRel);
            pipeline.syncs_returned += 1;
            pipeline.sync_estimate_micros = match pipeline.sync_estimate_micros {
                0 => micros,
                estimate => (estimate * 7 + micros) / 8,
            };
            self.sync_returned.notify_all();
            let front = pipeline.groups.front().map_or(group.id, |g| g.id);
            if let Some(pending) = pipeline.groups.get_mut((group.id - front) as usize) {
                debug_assert_eq!(pending.id, group.id);
                pending.synced = true;
            }
            pipeline.publish_ready(&self.shared)
        };
        if moved {
            self.shared.publish_durable_change();
        }
        Ok(())
    }
}

/// Makes the name of a segment prepared with deferred syncs durable (see
/// `segment::prepare_segments`), once, after its first group's `fdatasync`: that sync
/// committed the journal holding the rename, so this one waits for no commit of its own.
fn sync_name(shared: &Shared, target: &SyncTarget) -> Result<()> {
    let segment = &target.segment;
    if segment.name_durable.load(Ordering::Acquire) {
        return Ok(());
    }
    crate::segment::sync_dir(&shared.dir)?;
    segment.name_durable.store(true, Ordering::Release);
    Ok(())
}

fn sync(shared: &Shared, target: &SyncTarget) -> Result<()> {
    let started = Instant::now();
    let result = match shared.faults.before_sync() {
        Some(err) => Err(err),
        None => target.file().sync_data(),
    };
    result.map_err(|e| WalError::io("fdatasync", &target.segment.path, e))?;
    shared.metrics.record_sync(started.elapsed());
    Ok(())
}

/// The appending state, owned by whichever committer holds the write turn.
pub(crate) struct Appender {
    shared: Arc<Shared>,
    active: ActiveSegment,
    background_tx: Sender<Job>,
    pipeline: Arc<Mutex<Pipeline>>,
    /// Last entry index of the log as written (after truncations).
    log_last: OpIndex,
    /// The group being built: the active tail followed by new frames, except the payloads
    /// in `external`.
    buf: Vec<u8>,
    /// Large payloads written from their own buffers: each belongs at its position in `buf`
    /// (in order), so the group is `buf[..at0] ++ payload0 ++ buf[at0..at1] ++ ...`.
    external: Vec<(usize, format::PayloadBytes)>,
    /// Bytes of the payloads in `external`.
    external_bytes: usize,
    staged: Vec<Staged>,
    group_entries: u64,
    group_batches: u64,
    group_queued_bytes: usize,
    group_last_ticket: Option<Ticket>,
    /// How many segments to keep prepared beyond the active one (grows when a roll-over
    /// finds none ready).
    prepared_ahead: u64,
    /// The highest sequence number handed to the background thread to prepare.
    prepared_through: u64,
    /// Committer threads started, and those not yet stopped.
    spawned: usize,
    running: usize,
}

impl Appender {
    pub(crate) fn new(
        shared: Arc<Shared>,
        active: ActiveSegment,
        log_last: OpIndex,
        background_tx: Sender<Job>,
    ) -> Self {
        let buf = active.tail.clone();
        let prepared_through = active.sequence();
        Appender {
            shared,
            active,
            background_tx,
            pipeline: Arc::default(),
            log_last,
            buf,
            external: Vec::new(),
            external_bytes: 0,
            staged: Vec::new(),
            group_entries: 0,
            group_batches: 0,
            group_queued_bytes: 0,
            group_last_ticket: None,
            prepared_ahead: SEGMENTS_PREPARED_AHEAD,
            prepared_through,
            spawned: 0,
            running: 0,
        }
    }

    /// How many extra descriptions each active segment needs.
    fn sync_handle_count(&self) -> usize {
        match self.shared.options.sync_policy {
            SyncPolicy::Group => self.shared.options.syncs_in_flight_max - 1,
            SyncPolicy::None => 0,
        }
    }

    /// Run by the last committer to stop: every sync has returned, so the active segment
    /// can get its footer; then the background thread stops.
    fn finish(&mut self) {
        if !self.shared.has_failed() {
            if let Err(err) =
                crate::segment::close_segment(&self.active.segment, self.active.write_end, true)
            {
                self.shared.fail(&err);
            }
        }
        let _ = self.background_tx.send(Job::Stop);
    }

    /// Writes `requests` as one group: one write per segment it touches, then registers the
    /// group in the pipeline. Returns what the caller must sync once it gave the turn up
    /// (`None` when there is nothing to sync). Only a large group (over a quarter of a
    /// segment) crosses a roll-over; it starts writeback of each finished segment early so
    /// that segment's sync overlaps the next write.
    fn commit(
        &mut self,
        requests: &mut VecDeque<Request>,
        arena: &[u8],
        slot: usize,
    ) -> Result<Option<GroupToSync>> {
        let mut written: Vec<SyncTarget> = Vec::new();
        // A small group that does not fit in what is left of the active segment moves to the
        // next segment whole: the finished segment's data was synced by earlier groups, so
        // this group needs one write and one sync, not two of each back to back (which put
        // a roll-over's waiters at three sync times). Large groups (bulk appends) still fill
        // the segment first, so segments stay nearly full and roll-overs rare.
        let group_bytes: u64 = requests.iter().map(|r| r.queued_bytes() as u64).sum();
        let segment_bytes = self.shared.options.segment_size_bytes;
        if group_bytes > segment_bytes / WHOLE_GROUP_SEGMENT_FRACTION
            && self.prepared_ahead < SEGMENTS_PREPARED_AHEAD_MAX
        {
            // A bulk writer: it fills segments faster than one preparation's syncs (a journal
            // commit each, 5-20 ms under its writeback). Asking for the most segments now
            // lets the background thread prepare them together, sharing those syncs; waiting
            // for roll-overs to find none ready (which doubles the count) cost two or three
            // waits of 30-40 ms in every 128 MiB run.
            self.prepared_ahead = SEGMENTS_PREPARED_AHEAD_MAX;
            self.request_preparations();
        }
        self.request_first_preparations();
        if self.active.has_batches
            && !self.fits(group_bytes)
            && group_bytes <= segment_bytes / WHOLE_GROUP_SEGMENT_FRACTION
        {
            self.roll()?;
        }
        for request in requests.drain(..) {
            let has_data = self.active.has_batches || self.pending_bytes() > 0;
            if has_data && !self.fits(request.queued_bytes() as u64) {
                if self.write_pending()? {
                    start_writeback(&self.active.segment);
                    written.push(self.active.sync_target(slot));
                }
                self.roll()?;
            }
            self.add(request, arena);
        }
        if self.write_pending()? {
            written.push(self.active.sync_target(slot));
        }
        Ok(self.register_group(written))
    }

    /// Whether `frame_bytes` more fit in the active segment after what is pending, leaving
    /// room for the footer.
    fn fits(&self, frame_bytes: u64) -> bool {
        self.active.write_end + self.pending_bytes() + frame_bytes + format::FOOTER_BYTES as u64
            <= self.active.capacity_bytes
    }

    fn pending_bytes(&self) -> u64 {
        (self.buf.len() + self.external_bytes - self.active.tail.len()) as u64
    }

    /// Frames one request into the group and stages its index changes.
    fn add(&mut self, request: Request, arena: &[u8]) {
        let batch_offset = self.active.write_end + self.pending_bytes();
        let frame_len = request.queued_bytes() as u32;
        let bytes = request.payload_bytes(arena);
        let payload = &request.payload;
        format::write_frame_header(
            &mut self.buf,
            payload.kind,
            self.active.sequence(),
            bytes.len(),
            payload.entry_count,
            payload.crc,
        );
        let external = request.in_arena.is_none() && bytes.len() >= VECTORED_PAYLOAD_BYTES_MIN;
        if !external {
            self.buf.extend_from_slice(bytes);
        }
        match request.truncate_to {
            Some(kept) => {
                self.staged.push(Staged::Truncate(kept.index));
                self.log_last = kept.index;
                // Lowering the durable index early is always safe; raising waits for a sync.
                // Under the pipeline lock, so a group written before the truncation and
                // published after it cannot raise the index past the kept entry again.
                let mut pipeline = self.pipeline.lock();
                pipeline.cap_log_last(kept.index);
                self.shared
                    .durable_index
                    .fetch_min(kept.index, Ordering::AcqRel);
                drop(pipeline);
                Metrics::add(&self.shared.metrics.truncations, 1);
            }
            None => {
                let mut offset = 0usize;
                let mut index = request.first_index;
                while offset < bytes.len() {
                    let term =
                        u64::from_le_bytes(bytes[offset..offset + 8].try_into().expect("8 bytes"));
                    let len = u32::from_le_bytes(
                        bytes[offset + 20..offset + 24].try_into().expect("4 bytes"),
                    );
                    let location = Location {
                        sequence: self.active.sequence(),
                        batch_offset,
                        frame_len,
                        entry_offset: offset as u32,
                        payload_len: len,
                        term,
                    };
                    self.staged.push(Staged::Push(index, location));
                    offset += format::ENTRY_HEADER_BYTES + len as usize;
                    index += 1;
                }
                self.log_last = index - 1;
                self.group_entries += u64::from(request.payload.entry_count);
                self.group_batches += 1;
            }
        }
        self.group_queued_bytes += request.queued_bytes();
        self.group_last_ticket = Some(request.ticket);
        if external {
            self.external_bytes += request.payload_len();
            self.external.push((self.buf.len(), request.payload.bytes));
        } else {
            // Copied into the group's buffer above: a payload's own buffer can be reused.
            request.recycle();
        }
    }

    /// Writes the frames pending for the active segment (whole pages) and updates the index;
    /// returns whether anything was written. Durability comes later, in `finish_group`.
    fn write_pending(&mut self) -> Result<bool> {
        let data_len = self.pending_bytes();
        if data_len == 0 {
            return Ok(false);
        }
        let group_len = self.buf.len() + self.external_bytes;
        let padded = format::round_up_to_page(group_len as u64) as usize;
        self.buf.resize(self.buf.len() + padded - group_len, 0);
        let segment = Arc::clone(&self.active.segment);
        let written = if self.external.is_empty() {
            segment.file.write_all_at(&self.buf, self.active.tail_start)
        } else {
            let mut slices = Vec::with_capacity(2 * self.external.len() + 1);
            let mut from = 0;
            for (at, payload) in &self.external {
                slices.push(IoSlice::new(&self.buf[from..*at]));
                slices.push(IoSlice::new(payload));
                from = *at;
            }
            slices.push(IoSlice::new(&self.buf[from..]));
            write_all_vectored_at(&segment.file, &mut slices, self.active.tail_start)
        };
        written.map_err(|e| WalError::io("write", &segment.path, e))?;
        Metrics::add(&self.shared.metrics.bytes_written, padded as u64);
        self.advance_tail(data_len);
        self.apply_staged();
        let space_waited = {
            let mut queue = self.shared.lock_queue();
            queue.queued_bytes -= self.group_queued_bytes;
            queue.space_waiters > 0
        };
        // After the unlock, and only for a waiter: appends queueing meanwhile never find the
        // lock held across a system call.
        if space_waited {
            self.shared.space_ready.notify_all();
        }
        self.group_queued_bytes = 0;
        Ok(true)
    }

    /// Registers the group just written in the pipeline (in write order, under the turn).
    /// Without syncs it is durable now and published at once; otherwise its committer
    /// syncs `written` next and publishes then.
    fn register_group(&mut self, written: Vec<SyncTarget>) -> Option<GroupToSync> {
        let last_ticket = self.group_last_ticket.take()?;
        let syncing = self.shared.options.sync_policy == SyncPolicy::Group && !written.is_empty();
        let mut pipeline = self.pipeline.lock();
        let id = pipeline.next_id;
        pipeline.next_id += 1;
        pipeline.groups.push_back(PendingGroup {
            id,
            last_ticket,
            log_last: self.log_last,
            entries: mem::take(&mut self.group_entries),
            batches: mem::take(&mut self.group_batches),
            synced: !syncing,
        });
        if !syncing {
            let moved = pipeline.publish_ready(&self.shared);
            drop(pipeline);
            if moved {
                self.shared.publish_durable_change();
            }
            return None;
        }
        pipeline.last_sync_started = Some(Instant::now());
        if self.shared.syncs_in_flight.fetch_add(1, Ordering::AcqRel) > 0 {
            Metrics::add(&self.shared.metrics.syncs_overlapped, 1);
        }
        Some(GroupToSync {
            id,
            targets: written,
        })
    }

    /// Moves the write position past `data_len` new bytes and keeps the new partial page.
    fn advance_tail(&mut self, data_len: u64) {
        let active = &mut self.active;
        let new_end = active.write_end + data_len;
        let new_tail_start = new_end / PAGE_BYTES as u64 * PAGE_BYTES as u64;
        let from = (new_tail_start - active.tail_start) as usize;
        let to = (new_end - active.tail_start) as usize;
        active.tail.clear();
        copy_group_range(&self.buf, &self.external, from..to, &mut active.tail);
        active.tail_start = new_tail_start;
        active.write_end = new_end;
        active.has_batches |= data_len > 0;
        self.buf.clear();
        self.buf.extend_from_slice(&active.tail);
        self.external_bytes = 0;
        for (_, payload) in self.external.drain(..) {
            if let format::PayloadBytes::Owned(bytes) = payload {
                crate::buffers::give_back(bytes);
            }
        }
    }

    fn apply_staged(&mut self) {
        let mut index = self.shared.index.write();
        let mut run: Option<(OpIndex, OpIndex)> = None;
        for staged in self.staged.drain(..) {
            match staged {
                Staged::Push(op_index, location) => {
                    index.truncate_after(op_index - 1);
                    index.push(op_index, location);
                    run = Some(run.map_or((op_index, op_index), |(first, _)| (first, op_index)));
                }
                Staged::Truncate(last_kept) => {
                    if let Some((first, last)) = run.take() {
                        self.active.segment.note_entries(first, last);
                    }
                    index.truncate_after(last_kept);
                }
            }
        }
        if let Some((first, last)) = run {
            self.active.segment.note_entries(first, last);
        }
    }

    /// Switches to the prepared segment and hands the finished one to the background
    /// thread to close. Appenders keep queueing meanwhile; only this thread waits, and only
    /// if the next segment is not ready yet.
    fn roll(&mut self) -> Result<()> {
        let started = Instant::now();
        // Asks for the next segment if `request_first_preparations` had not fired yet (a no-op
        // when enough segments are already requested).
        self.request_preparations();
        let prepared = {
            let mut ready = self.shared.prepared.lock();
            if ready.is_empty() {
                Metrics::add(&self.shared.metrics.rollover_waits, 1);
                // The writer outruns the preparation: keep more segments ready from now on.
                self.prepared_ahead = (self.prepared_ahead * 2).min(SEGMENTS_PREPARED_AHEAD_MAX);
            }
            while ready.is_empty() {
                self.shared.prepared_ready.wait(&mut ready);
            }
            ready.pop_front().expect("a prepared segment")
        };
        let micros = started.elapsed().as_micros() as u64;
        Metrics::add(&self.shared.metrics.rollover_wait_micros_total, micros);
        let segment = Arc::new(prepared?);
        let active_sequence = segment.sequence;
        self.shared.segments.write().push_back(Arc::clone(&segment));
        let mut fresh = ActiveSegment::fresh(
            segment,
            &self.shared.tablet_id,
            self.shared.options.segment_size_bytes,
        );
        fresh.open_sync_handles(self.sync_handle_count())?;
        let old = mem::replace(&mut self.active, fresh);
        debug_assert!(
            self.external.is_empty(),
            "a roll-over follows a written group"
        );
        self.buf.clear();
        self.buf.extend_from_slice(&self.active.tail);
        // The close first (it writes no sync, so it is quick): GC can then collect the
        // finished segment as soon as the caller expects it to.
        let _ = self.background_tx.send(Job::Close {
            segment: old.segment,
            write_end: old.write_end,
        });
        debug_assert_eq!(active_sequence, self.active.sequence());
        self.request_preparations();
        Ok(())
    }

    /// The first request for segments ahead of a newly opened log, once it has committed
    /// `PROFILE_GROUPS_MIN` groups or filled a quarter of its active segment: by then
    /// `Shared::fresh_segment_preallocation` knows whether its groups are small, so a log of
    /// small groups gets zero-filled segments from its second one on (requested at open,
    /// they were `fallocate`d before the log had committed anything, and a short-lived
    /// writer spent most of its life in them). A quarter of a segment leaves the background
    /// thread three quarters of one to prepare the next.
    fn request_first_preparations(&mut self) {
        if self.prepared_through > self.active.sequence() {
            return;
        }
        let groups = self.shared.metrics.groups.load(Ordering::Relaxed);
        let quarter = self.shared.options.segment_size_bytes / 4;
        if groups >= PROFILE_GROUPS_MIN || self.active.write_end >= quarter {
            self.request_preparations();
        }
    }

    /// Asks the background thread for the segments not yet requested up to
    /// `prepared_ahead` beyond the active one, once at most half of them are left: requests
    /// sent together are prepared together, sharing their syncs (one at a time, each roll-over
    /// of a bulk writer cost a journal commit of 5-20 ms, slower than the writer filled a
    /// segment). With two ahead (the default) this is still one request per roll-over.
    fn request_preparations(&mut self) {
        let target = self.active.sequence() + self.prepared_ahead;
        if self.prepared_through > target - self.prepared_ahead.div_ceil(2) {
            return;
        }
        while self.prepared_through < target {
            self.prepared_through += 1;
            let _ = self.background_tx.send(Job::Prepare(self.prepared_through));
        }
    }
}

/// Appends `group[range]` to `out`, where the group is `buf` with each of `external`'s
/// payloads in its place (see `Appender::external`).
fn copy_group_range(
    buf: &[u8],
    external: &[(usize, format::PayloadBytes)],
    range: std::ops::Range<usize>,
    out: &mut Vec<u8>,
) {
    let mut start = 0; // where the next piece starts in the group
    let mut from = 0; // where the next piece starts in `buf`
    let take = |piece: &[u8], start: usize, out: &mut Vec<u8>| {
        let end = start + piece.len();
        if end > range.start && start < range.end {
            let lo = range.start.max(start) - start;
            let hi = range.end.min(end) - start;
            out.extend_from_slice(&piece[lo..hi]);
        }
        end
    };
    for (at, payload) in external {
        start = take(&buf[from..*at], start, out);
        start = take(payload, start, out);
        from = *at;
    }
    take(&buf[from..], start, out);
}

/// `pwritev` of all of `slices` at `offset`, resumed after short writes and interruptions,
/// at most `IOV_MAX` slices per call.
fn write_all_vectored_at(
    file: &File,
    mut slices: &mut [IoSlice<'_>],
    mut offset: u64,
) -> io::Result<()> {
    const IOV_MAX: usize = 1024;
    while !slices.is_empty() {
        let count = slices.len().min(IOV_MAX);
        // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix, and the `count` slices
        // stay borrowed for the call; the descriptor is open for as long as `file` lives.
        let n = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                slices.as_ptr().cast::<libc::iovec>(),
                count as libc::c_int,
                offset as libc::off_t,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        offset += n as u64;
        IoSlice::advance_slices(&mut slices, n as usize);
    }
    Ok(())
}

/// Asks the kernel to start writing a finished segment's dirty pages now, so the sync at the
/// end of the group waits less. Best effort: the sync that follows is what makes the data
/// durable, so an error here changes nothing and is ignored.
fn start_writeback(segment: &SegmentFile) {
    // SAFETY: plain syscall on a descriptor we own; (0, 0) means the whole file.
    unsafe {
        libc::sync_file_range(segment.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(test)]
mod tests {
    use std::io::IoSlice;

    use super::{copy_group_range, write_all_vectored_at};
    use crate::format::PayloadBytes;

    #[test]
    fn group_ranges_span_the_buffer_and_external_payloads() {
        // The group is "ab" ++ "XYZ" ++ "cd" ++ "" ++ "e" ++ "W" (one payload per position).
        let buf = b"abcde".to_vec();
        let external = vec![
            (2, PayloadBytes::Owned(b"XYZ".to_vec())),
            (4, PayloadBytes::Owned(Vec::new())),
            (5, PayloadBytes::Owned(b"W".to_vec())),
        ];
        let group = b"abXYZcdeW";
        for start in 0..=group.len() {
            for end in start..=group.len() {
                let mut out = vec![b'_'];
                copy_group_range(&buf, &external, start..end, &mut out);
                assert_eq!(&out[1..], &group[start..end], "{start}..{end}");
            }
        }
    }

    /// Segments `fallocate`d ahead are renamed without a directory sync; the committer that
    /// first syncs a group into one syncs the directory before the group is acknowledged.
    #[test]
    fn a_segment_prepared_without_syncs_has_its_name_synced_by_its_first_group() {
        use std::sync::atomic::Ordering;

        use crate::{EntryRef, EntryType, Log, LogOptions, Preallocation, SyncPolicy};

        let dir = tempfile::tempdir().unwrap();
        let options = LogOptions {
            segment_size_bytes: 64 << 10,
            sync_policy: SyncPolicy::Group,
            preallocation: Preallocation::Fallocate,
            ..LogOptions::default()
        };
        let log = Log::open(dir.path(), "t", options).unwrap();
        let payload = vec![7u8; 3000];
        for index in 1..=100u64 {
            let entry = EntryRef {
                term: 1,
                index,
                entry_type: EntryType::Write,
                payload: &payload,
            };
            log.append_durable(&[entry]).unwrap();
        }
        let segments = log.shared.segments.read().clone();
        let with_entries: Vec<_> = segments
            .iter()
            .filter(|s| s.entry_count.load(Ordering::Relaxed) > 0)
            .collect();
        assert!(with_entries.len() >= 4, "roll-overs happened");
        for segment in &with_entries {
            assert!(
                segment.name_durable.load(Ordering::Acquire),
                "{:?}",
                segment.path
            );
        }
        let prepared = log.shared.prepared.lock();
        assert!(!prepared.is_empty(), "segments are prepared ahead");
        for segment in prepared.iter() {
            let segment = segment.as_ref().unwrap();
            assert!(
                !segment.name_durable.load(Ordering::Acquire),
                "not synced ahead"
            );
        }
    }

    #[test]
    fn vectored_writes_of_more_slices_than_one_call_takes_land_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("f"))
            .unwrap();
        // 3000 slices (over IOV_MAX) of 1..=7 bytes, some empty.
        let pieces: Vec<Vec<u8>> = (0..3000u32)
            .map(|i| vec![(i % 251) as u8; (i % 8) as usize])
            .collect();
        let mut slices: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
        write_all_vectored_at(&file, &mut slices, 100).unwrap();
        let written = std::fs::read(dir.path().join("f")).unwrap();
        let expected: Vec<u8> = std::iter::repeat_n(0, 100).chain(pieces.concat()).collect();
        assert_eq!(written, expected);
    }
}
