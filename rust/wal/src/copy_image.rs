//! Copy images: the durable bytes of a log's segments, captured at one moment with fixed
//! lengths, for a tablet copy to read piece by piece while the log keeps appending.
//!
//! A reader of a live segment may trust exactly the bytes before the durable end: they were
//! written by groups that are published durable, and a later write rewrites the partial page
//! at the write position with the bytes it already held plus new frames, so nothing before
//! that position ever changes. Bytes after it may be a page being rewritten, zeros, or old
//! data of a recycled file. This module owns the capture and the reads; it writes nothing.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::error::{Result, WalError};
use crate::segment::SegmentFile;
use crate::shared::Shared;

/// One segment of a copy image: its first `length` bytes, which never change. It holds the
/// segment's file open (taken while the segment was in the log's table), so GC removing the
/// segment meanwhile takes nothing from a copy that is reading it.
pub struct SegmentImage {
    segment: Arc<SegmentFile>,
    file: Arc<File>,
    length: u64,
}

impl SegmentImage {
    /// The segment's sequence number.
    pub fn sequence(&self) -> u64 {
        self.segment.sequence
    }

    /// The segment's file name (`wal-%09d`).
    pub fn file_name(&self) -> String {
        crate::segment::segment_file_name(self.segment.sequence)
    }

    /// Bytes of the image of this segment.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// The segment's open file and path, for readers that do their own reads within
    /// `length` (bytes past it are not part of the image).
    pub fn file(&self) -> (&File, &std::path::Path) {
        (&self.file, &self.segment.path)
    }

    /// Fills `buf` from `offset`; the range must lie within the image.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset.checked_add(buf.len() as u64);
        if end.is_none_or(|end| end > self.length) {
            return Err(WalError::InvalidArgument(format!(
                "{} bytes at {offset} run past the {} bytes of the image of {}",
                buf.len(),
                self.length,
                self.segment.path.display()
            )));
        }
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| WalError::io("read", &self.segment.path, e))
    }
}

/// The image of every segment up to the durable end (see `Log::copy_image`).
pub(crate) fn capture(shared: &Shared) -> Result<Vec<SegmentImage>> {
    let table = shared.segments.read();
    // Under the table's lock: no roll-over can add a segment, and GC removes none, while the
    // durable end is read and matched to the segments.
    let durable = *shared.durable_end.lock();
    let mut images = Vec::with_capacity(table.len());
    for segment in table.iter() {
        if segment.sequence > durable.sequence {
            break; // nothing durable in it yet
        }
        let file = segment.file()?;
        let length = if segment.sequence == durable.sequence {
            durable.offset
        } else if segment.closed.load(Ordering::Acquire) {
            // Footer written and the file cut after it: the whole file.
            file.metadata()
                .map_err(|e| WalError::io("stat", &segment.path, e))?
                .len()
        } else {
            // Rolled over, footer still to come: its data, every byte of it durable.
            segment.data_end.load(Ordering::Acquire)
        };
        assert!(length > 0, "segment {} has no data end", segment.sequence);
        images.push(SegmentImage {
            segment: Arc::clone(segment),
            file,
            length,
        });
    }
    Ok(images)
}
