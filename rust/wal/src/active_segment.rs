//! The active segment: the segment being appended to, and the writes into it.
//!
//! `ActiveSegment` keeps a copy of the segment's partial last page, so every write covers
//! whole pages: a group is written as that page followed by its new frames, padded to a page,
//! in one `pwrite` (or one `pwritev` when large payloads stay in their own buffers). It also
//! holds the further open file descriptions committers sync the segment through
//! (`SyncTarget`).
//!
//! This module owns the write position and the page-level writes. It does not decide what
//! goes into a group or when to roll over (`appender`), and it never syncs or publishes
//! durability (`committers`, `pipeline`).

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::error::{Result, WalError};
use crate::faults::FaultInjection;
use crate::format::{self, PayloadBytes, PAGE_BYTES};
use crate::metrics::Metrics;
use crate::segment::{self, SegmentFile};

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
    /// Where the segment rolls over (`LogOptions::segment_size_bytes`).
    capacity_bytes: u64,
    /// Bytes of the file preallocated so far: the capacity, except for the segment a log
    /// opens with, which starts small and grows as writes fill it (`grow_allocation`).
    allocated_bytes: u64,
    has_batches: bool,
    /// Further open file descriptions of the segment, one per committer beyond the first
    /// (which syncs through the handle the group was written with). Opened when the segment
    /// becomes active, before any data is written to it, so each sees every writeback error
    /// of that data.
    sync_handles: Vec<Arc<File>>,
    /// The handle the last group was written through, until `sync_target` hands it to the
    /// committer that syncs that group: a sync through a description opened after a write
    /// might not see the write's writeback error (the log may close idle files meanwhile,
    /// `SegmentFile::release_handle`).
    written_with: Option<Arc<File>>,
}

impl ActiveSegment {
    /// A segment just prepared (header only) with `allocated_bytes` preallocated.
    pub(crate) fn fresh(
        segment: Arc<SegmentFile>,
        tablet_id: &str,
        capacity_bytes: u64,
        allocated_bytes: u64,
    ) -> Self {
        let header = format::encode_segment_header(tablet_id, segment.sequence);
        Self::reuse(segment, header.to_vec(), capacity_bytes, allocated_bytes)
    }

    /// An empty segment found by recovery, whose header bytes are `header` and whose file
    /// is `allocated_bytes` long.
    pub(crate) fn reuse(
        segment: Arc<SegmentFile>,
        header: Vec<u8>,
        capacity_bytes: u64,
        allocated_bytes: u64,
    ) -> Self {
        assert_eq!(header.len(), format::SEGMENT_HEADER_BYTES);
        ActiveSegment {
            segment,
            write_end: header.len() as u64,
            tail_start: 0,
            tail: header,
            capacity_bytes,
            allocated_bytes,
            has_batches: false,
            sync_handles: Vec::new(),
            written_with: None,
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

    /// What committer `slot` syncs to make the group just written durable.
    pub(crate) fn sync_target(&mut self, slot: usize) -> Result<SyncTarget> {
        let written_with = self.written_with.take();
        let file = match slot.checked_sub(1) {
            Some(i) => Arc::clone(&self.sync_handles[i]),
            None => match written_with {
                Some(file) => file,
                None => self.segment.file()?,
            },
        };
        Ok(SyncTarget {
            segment: Arc::clone(&self.segment),
            file,
        })
    }

    /// Offset just past the last batch.
    pub(crate) fn write_end(&self) -> u64 {
        self.write_end
    }

    /// The file's bytes from the page holding `write_end` up to it: what the next group's
    /// write starts with.
    pub(crate) fn tail(&self) -> &[u8] {
        &self.tail
    }

    /// Whether any batch was written to the segment.
    pub(crate) fn has_batches(&self) -> bool {
        self.has_batches
    }

    /// Whether `bytes` more after `write_end` fit, leaving room for the footer.
    pub(crate) fn fits(&self, bytes: u64) -> bool {
        self.write_end + bytes + format::FOOTER_BYTES as u64 <= self.capacity_bytes
    }

    /// Before writing `write_len` bytes at the start of the tail's page: once the write
    /// reaches past half of the space preallocated, preallocates twice as much as it reaches
    /// (at least double, at most the capacity), ahead of the writes that follow. Only the
    /// segment a log opens with starts below its capacity; a log whose writes fill it thus
    /// preallocates it in a few steps (64 KiB to 8 MiB in seven), and an idle one never.
    pub(crate) fn grow_allocation(
        &mut self,
        write_len: u64,
        faults: &FaultInjection,
        metrics: &Metrics,
    ) -> Result<()> {
        let end = self.tail_start + write_len;
        if self.allocated_bytes >= self.capacity_bytes || end <= self.allocated_bytes / 2 {
            return Ok(());
        }
        let wanted = (2 * end)
            .max(2 * self.allocated_bytes)
            .min(self.capacity_bytes);
        segment::preallocate(
            &*self.segment.file()?,
            &self.segment.path,
            wanted,
            faults,
            metrics,
        )?;
        self.allocated_bytes = wanted;
        Ok(())
    }

    /// Writes a group at the start of the tail's page: `buf` (the tail followed by the new
    /// frames, padded to whole pages) with each of `external`'s payloads in its place (see
    /// `Appender::external`). Durability comes later, from the committer's sync.
    pub(crate) fn write_group(
        &mut self,
        buf: &[u8],
        external: &[(usize, PayloadBytes)],
    ) -> Result<()> {
        let segment = &self.segment;
        let file = segment.file()?;
        let written = if external.is_empty() {
            file.write_all_at(buf, self.tail_start)
        } else {
            let mut slices = Vec::with_capacity(2 * external.len() + 1);
            let mut from = 0;
            for (at, payload) in external {
                slices.push(IoSlice::new(&buf[from..*at]));
                slices.push(IoSlice::new(payload));
                from = *at;
            }
            slices.push(IoSlice::new(&buf[from..]));
            write_all_vectored_at(&file, &mut slices, self.tail_start)
        };
        // Kept for the sync even when the write failed: the log fails then, and nothing
        // more is written.
        self.written_with = Some(file);
        written.map_err(|e| WalError::io("write", &segment.path, e))
    }

    /// Moves the write position past `data_len` new bytes of the group just written (`buf`
    /// and `external` as in `write_group`) and keeps the new partial page.
    pub(crate) fn advance(
        &mut self,
        buf: &[u8],
        external: &[(usize, PayloadBytes)],
        data_len: u64,
    ) {
        let new_end = self.write_end + data_len;
        let new_tail_start = new_end / PAGE_BYTES as u64 * PAGE_BYTES as u64;
        let from = (new_tail_start - self.tail_start) as usize;
        let to = (new_end - self.tail_start) as usize;
        self.tail.clear();
        copy_group_range(buf, external, from..to, &mut self.tail);
        self.tail_start = new_tail_start;
        self.write_end = new_end;
        self.has_batches |= data_len > 0;
    }

    /// Asks the kernel to start writing the segment's dirty pages now, so the sync at the
    /// end of the group waits less. Best effort: the sync that follows is what makes the data
    /// durable, so an error here changes nothing and is ignored.
    pub(crate) fn start_writeback(&self) {
        let Some(file) = &self.written_with else {
            return;
        };
        // SAFETY: plain syscall on a descriptor we hold open; (0, 0) means the whole file.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }

    /// Gives the segment up (at a roll-over): the segment and the offset just past its last
    /// batch, for closing it.
    pub(crate) fn into_written(self) -> (Arc<SegmentFile>, u64) {
        (self.segment, self.write_end)
    }
}

/// One segment a group wrote to, and the description its committer syncs it through.
pub(crate) struct SyncTarget {
    pub(crate) segment: Arc<SegmentFile>,
    file: Arc<File>,
}

impl SyncTarget {
    pub(crate) fn file(&self) -> &File {
        &self.file
    }
}

/// Appends `group[range]` to `out`, where the group is `buf` with each of `external`'s
/// payloads in its place (see `Appender::external`).
fn copy_group_range(
    buf: &[u8],
    external: &[(usize, PayloadBytes)],
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
