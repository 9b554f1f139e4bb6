//! The appender: the state that turns queued requests into groups.
//!
//! Whichever commit job holds the write turn (`committers`) hands the requests it drained
//! from the queue to the `Appender`, which frames them behind the active segment's partial
//! last page, stages their index changes, writes the group (rolling over to the segment the
//! background prepared when it does not fit), applies the index changes and registers the
//! group in the pipeline. It also asks the background for segments ahead of the active one,
//! and closes the active segment when the log closes.
//!
//! This module owns the group being built, the log's last index as written and the
//! requests for prepared segments. It does not sync or publish durability (`committers`,
//! `pipeline`), start jobs, or touch the queue beyond returning the bytes it wrote.

use std::collections::VecDeque;
use std::mem;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use nyala_common::OpIndex;
use parking_lot::Mutex;

use crate::active_segment::{ActiveSegment, SyncTarget};
use crate::background::{Background, Job};
use crate::error::Result;
use crate::format;
use crate::index::Location;
use crate::metrics::Metrics;
use crate::options::SyncPolicy;
use crate::pipeline::{GroupToSync, Pipeline};
use crate::shared::{
    DataPosition, Request, Shared, Ticket, PROFILE_GROUPS_MIN, SEGMENTS_PREPARED_AHEAD,
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

/// What each of a log's buffers keeps while the log is idle (`shrink_idle`). A buffer grows
/// to fit its largest group (the group's frames, its index changes, the queue's arena and its
/// requests) and used to keep that capacity for the replica's life: 200 logs that each took
/// one burst of 400 appends of 8 KiB held 3 MiB apiece until they were dropped, about 600 MiB
/// (docs/wal-format.md, "Buffers of an idle log").
pub const IDLE_BUFFER_BYTES: usize = 64 << 10;

/// How many items of `T` an idle buffer holding `len` keeps room for.
fn idle_keep<T>(len: usize) -> usize {
    (IDLE_BUFFER_BYTES / mem::size_of::<T>().max(1)).max(len)
}

/// Gives back what `items` holds beyond `IDLE_BUFFER_BYTES` (or beyond its length, if
/// longer). Called when the log goes idle, so a busy log reallocates at most once per burst.
pub(crate) fn shrink_idle<T>(items: &mut Vec<T>) {
    let keep = idle_keep::<T>(items.len());
    if items.capacity() > keep {
        items.shrink_to(keep);
    }
}

/// `shrink_idle` for a queue of requests.
pub(crate) fn shrink_idle_queue<T>(items: &mut VecDeque<T>) {
    let keep = idle_keep::<T>(items.len());
    if items.capacity() > keep {
        items.shrink_to(keep);
    }
}

/// Bytes `items` holds in capacity.
pub(crate) fn capacity_bytes<T>(items: &Vec<T>) -> usize {
    items.capacity() * mem::size_of::<T>()
}

/// An index change of the group being built, applied once the group is written.
enum Staged {
    Push(OpIndex, Location),
    Truncate(OpIndex),
}

/// The appending state, owned by whichever committer holds the write turn.
pub(crate) struct Appender {
    shared: Arc<Shared>,
    active: ActiveSegment,
    background: Arc<Background>,
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
    /// The highest sequence number handed to the background to prepare.
    prepared_through: u64,
}

impl Appender {
    pub(crate) fn new(
        shared: Arc<Shared>,
        active: ActiveSegment,
        log_last: OpIndex,
        background: Arc<Background>,
    ) -> Self {
        let buf = active.tail().to_vec();
        let prepared_through = active.sequence();
        Appender {
            shared,
            active,
            background,
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
        }
    }

    /// The pipeline the committers publish the groups of this appender through.
    pub(crate) fn pipeline(&self) -> &Arc<Mutex<Pipeline>> {
        &self.pipeline
    }

    /// Opens the descriptions of the active segment that every committer beyond the first
    /// syncs through (before any committer starts).
    pub(crate) fn open_sync_handles(&mut self) -> Result<()> {
        let handles = self.sync_handle_count();
        self.active.open_sync_handles(handles)
    }

    /// How many extra descriptions each active segment needs.
    fn sync_handle_count(&self) -> usize {
        match self.shared.options.sync_policy {
            SyncPolicy::Group => self.shared.options.syncs_in_flight_max - 1,
            SyncPolicy::None => 0,
        }
    }

    /// Run once the log's commit jobs have stopped (every sync has returned), when the log
    /// closes: the active segment gets its footer.
    pub(crate) fn finish(&mut self) {
        if !self.shared.has_failed() {
            if let Err(err) =
                crate::segment::close_segment(self.active.segment(), self.active.write_end(), true)
            {
                self.shared.fail(&err);
            }
        }
    }

    /// Writes `requests` as one group: one write per segment it touches, then registers the
    /// group in the pipeline. Returns what the caller must sync once it gave the turn up
    /// (`None` when there is nothing to sync). Only a large group (over a quarter of a
    /// segment) crosses a roll-over; it starts writeback of each finished segment early so
    /// that segment's sync overlaps the next write.
    pub(crate) fn commit(
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
            // lets the background prepare them together, sharing those syncs; waiting
            // for roll-overs to find none ready (which doubles the count) cost two or three
            // waits of 30-40 ms in every 128 MiB run.
            self.prepared_ahead = SEGMENTS_PREPARED_AHEAD_MAX;
            self.request_preparations();
        }
        self.request_first_preparations();
        if self.active.has_batches()
            && !self.fits(group_bytes)
            && group_bytes <= segment_bytes / WHOLE_GROUP_SEGMENT_FRACTION
        {
            self.roll()?;
        }
        for request in requests.drain(..) {
            let has_data = self.active.has_batches() || self.pending_bytes() > 0;
            if has_data && !self.fits(request.queued_bytes() as u64) {
                if self.write_pending()? {
                    self.active.start_writeback();
                    written.push(self.active.sync_target(slot)?);
                }
                self.roll()?;
            }
            self.add(request, arena);
        }
        if self.write_pending()? {
            written.push(self.active.sync_target(slot)?);
        }
        Ok(self.register_group(written))
    }

    /// Whether `frame_bytes` more fit in the active segment after what is pending, leaving
    /// room for the footer.
    fn fits(&self, frame_bytes: u64) -> bool {
        self.active.fits(self.pending_bytes() + frame_bytes)
    }

    fn pending_bytes(&self) -> u64 {
        (self.buf.len() + self.external_bytes - self.active.tail().len()) as u64
    }

    /// Frames one request into the group and stages its index changes.
    fn add(&mut self, request: Request, arena: &[u8]) {
        let batch_offset = self.active.write_end() + self.pending_bytes();
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
    /// returns whether anything was written. Durability comes later: the committer syncs the
    /// group and the pipeline publishes it in order (`committers`, `pipeline`).
    fn write_pending(&mut self) -> Result<bool> {
        let data_len = self.pending_bytes();
        if data_len == 0 {
            return Ok(false);
        }
        let group_len = self.buf.len() + self.external_bytes;
        let padded = format::round_up_to_page(group_len as u64) as usize;
        self.buf.resize(self.buf.len() + padded - group_len, 0);
        let shared = &self.shared;
        self.active
            .grow_allocation(padded as u64, &shared.faults, &shared.metrics)?;
        self.active.write_group(&self.buf, &self.external)?;
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
        let end = DataPosition {
            sequence: self.active.sequence(),
            offset: self.active.write_end(),
        };
        let id = pipeline.register(
            last_ticket,
            self.log_last,
            mem::take(&mut self.group_entries),
            mem::take(&mut self.group_batches),
            end,
            !syncing,
        );
        if !syncing {
            let moved = pipeline.publish_ready(&self.shared);
            drop(pipeline);
            if moved {
                self.shared.publish_durable_change();
            }
            return None;
        }
        pipeline.note_sync_started();
        if self.shared.syncs_in_flight.fetch_add(1, Ordering::AcqRel) > 0 {
            Metrics::add(&self.shared.metrics.syncs_overlapped, 1);
        }
        Some(GroupToSync {
            id,
            targets: written,
        })
    }

    /// Gives back what the group buffers grew beyond `IDLE_BUFFER_BYTES` (the log is idle:
    /// no group is being built).
    pub(crate) fn release_idle_capacity(&mut self) {
        shrink_idle(&mut self.buf);
        shrink_idle(&mut self.staged);
        shrink_idle(&mut self.external);
    }

    /// Bytes the group buffers hold in capacity.
    pub(crate) fn retained_bytes(&self) -> usize {
        capacity_bytes(&self.buf) + capacity_bytes(&self.staged) + capacity_bytes(&self.external)
    }

    /// Moves the write position past `data_len` new bytes and keeps the new partial page.
    fn advance_tail(&mut self, data_len: u64) {
        self.active.advance(&self.buf, &self.external, data_len);
        self.buf.clear();
        self.buf.extend_from_slice(self.active.tail());
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
                        self.active.segment().note_entries(first, last);
                    }
                    index.truncate_after(last_kept);
                }
            }
        }
        if let Some((first, last)) = run {
            self.active.segment().note_entries(first, last);
        }
    }

    /// Switches to the prepared segment and hands the finished one to the background to
    /// close. Appenders keep queueing meanwhile; only this job waits, and only if the next
    /// segment is not ready yet.
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
        let segment_bytes = self.shared.options.segment_size_bytes;
        let mut fresh = ActiveSegment::fresh(
            segment,
            &self.shared.tablet_id,
            segment_bytes,
            segment_bytes,
        );
        fresh.open_sync_handles(self.sync_handle_count())?;
        let old = mem::replace(&mut self.active, fresh);
        debug_assert!(
            self.external.is_empty(),
            "a roll-over follows a written group"
        );
        self.buf.clear();
        self.buf.extend_from_slice(self.active.tail());
        // The close first (it writes no sync, so it is quick): GC can then collect the
        // finished segment as soon as the caller expects it to.
        let (segment, write_end) = old.into_written();
        // Before any group of the new segment can publish: a copy image reads it.
        segment.data_end.store(write_end, Ordering::Release);
        self.background.send(Job::Close { segment, write_end });
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
    /// three quarters of one to prepare the next.
    fn request_first_preparations(&mut self) {
        if self.prepared_through > self.active.sequence() {
            return;
        }
        let groups = self.shared.metrics.groups.load(Ordering::Relaxed);
        let quarter = self.shared.options.segment_size_bytes / 4;
        if groups >= PROFILE_GROUPS_MIN || self.active.write_end() >= quarter {
            self.request_preparations();
        }
    }

    /// Asks the background for the segments not yet requested up to
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
            self.background.send(Job::Prepare(self.prepared_through));
        }
    }
}
