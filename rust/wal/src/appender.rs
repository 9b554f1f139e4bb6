//! The appender thread: group commit.
//!
//! It drains everything queued, frames it behind the segment's partial last page, writes the
//! whole pages in one `pwrite`, calls `fdatasync` once, and only then publishes the durable
//! ticket and index. It also rolls over to the segment the background thread prepared.
//! This thread is the only writer of segment data and of the durable point.

use std::mem;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::Sender;
use nyala_common::OpIndex;

use crate::background::Job;
use crate::error::{Result, WalError};
use crate::format::{self, PAGE_BYTES};
use crate::index::Location;
use crate::log::{Request, Shared, Ticket, SEGMENTS_PREPARED_AHEAD, SEGMENTS_PREPARED_AHEAD_MAX};
use crate::metrics::Metrics;
use crate::options::SyncPolicy;
use crate::segment::SegmentFile;

/// A group of at most 1/this of a segment that does not fit in the active segment starts
/// the next one instead of being split across both. At 4, a segment is left at most a
/// quarter empty (and is cut to its length when closed, so no disk space is lost), and the
/// group always fits in the new segment (its header and footer are far below a quarter).
const WHOLE_GROUP_SEGMENT_FRACTION: u64 = 4;

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
        }
    }

    pub(crate) fn sequence(&self) -> u64 {
        self.segment.sequence
    }

    pub(crate) fn segment(&self) -> &Arc<SegmentFile> {
        &self.segment
    }
}

enum Staged {
    Push(OpIndex, Location),
    Truncate(OpIndex),
}

/// The appender thread's state.
pub(crate) struct Appender {
    shared: Arc<Shared>,
    active: ActiveSegment,
    background_tx: Sender<Job>,
    /// Last entry index of the log as written (after truncations).
    log_last: OpIndex,
    /// The group being built: the active tail followed by new frames.
    buf: Vec<u8>,
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
}

impl Appender {
    pub(crate) fn new(
        shared: Arc<Shared>,
        active: ActiveSegment,
        log_last: OpIndex,
        background_tx: Sender<Job>,
        prepared_through: u64,
    ) -> Self {
        let buf = active.tail.clone();
        Appender {
            shared,
            active,
            background_tx,
            log_last,
            buf,
            staged: Vec::new(),
            group_entries: 0,
            group_batches: 0,
            group_queued_bytes: 0,
            group_last_ticket: None,
            prepared_ahead: SEGMENTS_PREPARED_AHEAD,
            prepared_through,
        }
    }

    pub(crate) fn spawn(self) -> Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("wal-appender".into())
            .spawn(move || self.run())
            .map_err(|e| WalError::io("spawn appender thread", "", e))
    }

    fn run(mut self) {
        let mut requests = Vec::new();
        loop {
            {
                let mut queue = self.shared.lock_queue();
                while queue.requests.is_empty() && !queue.closing && !self.failed() {
                    // Set under the lock before sleeping, so an append either sees it and
                    // signals, or queued its request before this check saw the queue empty.
                    queue.appender_idle = true;
                    queue = self
                        .shared
                        .work_ready
                        .wait(queue)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                queue.appender_idle = false;
                if queue.requests.is_empty() || self.failed() {
                    break;
                }
                requests.extend(queue.requests.drain(..));
            }
            if let Err(err) = self.commit(&mut requests) {
                self.shared.fail(&err);
                break;
            }
        }
        if !self.failed() {
            if let Err(err) =
                crate::segment::close_segment(&self.active.segment, self.active.write_end, true)
            {
                self.shared.fail(&err);
            }
        }
        let _ = self.background_tx.send(Job::Stop);
    }

    fn failed(&self) -> bool {
        self.shared.failed.load(Ordering::SeqCst)
    }

    /// Writes `requests` as one group: one write per segment it touches, then one sync per
    /// such segment, then the durable point moves once. Only a large group (over a quarter
    /// of a segment) crosses a roll-over; it starts writeback of each finished segment early
    /// so that segment's sync overlaps the next write.
    fn commit(&mut self, requests: &mut Vec<Request>) -> Result<()> {
        let mut written: Vec<Arc<SegmentFile>> = Vec::new();
        // A small group that does not fit in what is left of the active segment moves to the
        // next segment whole: the finished segment's data was synced by earlier groups, so
        // this group needs one write and one sync, not two of each back to back (which put
        // a roll-over's waiters at three sync times). Large groups (bulk appends) still fill
        // the segment first, so segments stay nearly full and roll-overs rare.
        let group_bytes: u64 = requests.iter().map(|r| r.queued_bytes() as u64).sum();
        let segment_bytes = self.shared.options.segment_size_bytes;
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
                    written.push(Arc::clone(&self.active.segment));
                }
                self.roll()?;
            }
            self.add(request);
        }
        if self.write_pending()? {
            written.push(Arc::clone(&self.active.segment));
        }
        self.finish_group(&written)
    }

    /// Whether `frame_bytes` more fit in the active segment after what is pending, leaving
    /// room for the footer.
    fn fits(&self, frame_bytes: u64) -> bool {
        self.active.write_end + self.pending_bytes() + frame_bytes + format::FOOTER_BYTES as u64
            <= self.active.capacity_bytes
    }

    fn pending_bytes(&self) -> u64 {
        (self.buf.len() - self.active.tail.len()) as u64
    }

    /// Frames one request into the group and stages its index changes.
    fn add(&mut self, request: Request) {
        let batch_offset = self.active.write_end + self.pending_bytes();
        let frame_len = request.queued_bytes() as u32;
        format::write_batch_header(&mut self.buf, &request.payload, self.active.sequence());
        self.buf.extend_from_slice(&request.payload.bytes);
        match request.truncate_to {
            Some(kept) => {
                self.staged.push(Staged::Truncate(kept.index));
                self.log_last = kept.index;
                // Lowering the durable index early is always safe; raising waits for a sync.
                self.shared
                    .durable_index
                    .fetch_min(kept.index, Ordering::AcqRel);
                Metrics::add(&self.shared.metrics.truncations, 1);
            }
            None => {
                let mut offset = 0usize;
                let bytes = &request.payload.bytes;
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
    }

    /// Writes the frames pending for the active segment (whole pages) and updates the index;
    /// returns whether anything was written. Durability comes later, in `finish_group`.
    fn write_pending(&mut self) -> Result<bool> {
        let data_len = self.pending_bytes();
        if data_len == 0 {
            return Ok(false);
        }
        let padded = format::round_up_to_page(self.buf.len() as u64) as usize;
        self.buf.resize(padded, 0);
        let segment = Arc::clone(&self.active.segment);
        segment
            .file
            .write_all_at(&self.buf, self.active.tail_start)
            .map_err(|e| WalError::io("write", &segment.path, e))?;
        Metrics::add(&self.shared.metrics.bytes_written, padded as u64);
        self.advance_tail(data_len);
        self.apply_staged();
        {
            let mut queue = self.shared.lock_queue();
            queue.queued_bytes -= self.group_queued_bytes;
            self.shared.space_ready.notify_all();
        }
        self.group_queued_bytes = 0;
        Ok(true)
    }

    /// Syncs every segment the group wrote to, then publishes the durable ticket and index.
    fn finish_group(&mut self, written: &[Arc<SegmentFile>]) -> Result<()> {
        let Some(last_ticket) = self.group_last_ticket else {
            return Ok(());
        };
        if self.shared.options.sync_policy == SyncPolicy::Group {
            for segment in written {
                self.sync(segment)?;
            }
        }
        // Counters first, so whoever sees the entries durable also sees them counted.
        let metrics = &self.shared.metrics;
        metrics.record_group(self.group_entries);
        Metrics::add(&metrics.entries_appended, self.group_entries);
        Metrics::add(&metrics.batches_appended, self.group_batches);
        self.shared
            .durable_index
            .store(self.log_last, Ordering::Release);
        self.shared
            .durable_ticket
            .store(last_ticket, Ordering::Release);
        self.shared.publish_durable_change();
        self.group_entries = 0;
        self.group_batches = 0;
        self.group_last_ticket = None;
        Ok(())
    }

    fn sync(&self, segment: &SegmentFile) -> Result<()> {
        let started = Instant::now();
        let result = match self.shared.faults.take_sync_failure() {
            Some(err) => Err(err),
            None => segment.file.sync_data(),
        };
        result.map_err(|e| WalError::io("fdatasync", &segment.path, e))?;
        self.shared.metrics.record_sync(started.elapsed());
        Ok(())
    }

    /// Moves the write position past `data_len` new bytes and keeps the new partial page.
    fn advance_tail(&mut self, data_len: u64) {
        let active = &mut self.active;
        let new_end = active.write_end + data_len;
        let new_tail_start = new_end / PAGE_BYTES as u64 * PAGE_BYTES as u64;
        let from = (new_tail_start - active.tail_start) as usize;
        let to = (new_end - active.tail_start) as usize;
        active.tail.clear();
        active.tail.extend_from_slice(&self.buf[from..to]);
        active.tail_start = new_tail_start;
        active.write_end = new_end;
        active.has_batches |= data_len > 0;
        self.buf.clear();
        self.buf.extend_from_slice(&active.tail);
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
        let fresh = ActiveSegment::fresh(
            segment,
            &self.shared.tablet_id,
            self.shared.options.segment_size_bytes,
        );
        let old = mem::replace(&mut self.active, fresh);
        self.buf.clear();
        self.buf.extend_from_slice(&self.active.tail);
        // The close first (it writes no sync, so it is quick): GC can then collect the
        // finished segment as soon as the caller expects it to.
        let _ = self.background_tx.send(Job::Close {
            segment: old.segment,
            write_end: old.write_end,
        });
        while self.prepared_through < active_sequence + self.prepared_ahead {
            self.prepared_through += 1;
            let _ = self.background_tx.send(Job::Prepare(self.prepared_through));
        }
        Ok(())
    }
}

/// Asks the kernel to start writing a finished segment's dirty pages now, so the sync at the
/// end of the group waits less. Best effort: the sync that follows is what makes the data
/// durable, so an error here changes nothing and is ignored.
fn start_writeback(segment: &SegmentFile) {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a descriptor we own; (0, 0) means the whole file.
    unsafe {
        libc::sync_file_range(segment.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}
