//! Random reads of entry ranges and an iterator over all entries.
//!
//! Reads go through the index to whole batch frames, which are verified (header checksum,
//! segment sequence, payload checksum) before any entry is returned: what was checked before
//! the write is checked again after the read.

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;

use nyala_common::OpIndex;

use crate::entry::Entry;
use crate::error::{Result, WalError};
use crate::format::{self, BatchKind};
use crate::index::Location;
use crate::segment::SegmentFile;
use crate::shared::Shared;

/// Reads entries `from..=to` (see `Log::read`).
pub(crate) fn read_range(
    shared: &Shared,
    from: OpIndex,
    to: OpIndex,
    max_bytes: usize,
) -> Result<Vec<Entry>> {
    let wanted = locate(shared, from, to, max_bytes)?;
    let segments = segments_for(shared, &wanted)?;
    let mut batches: HashMap<(u64, u64), (Vec<u8>, Vec<format::EntryMeta>)> = HashMap::new();
    let mut out = Vec::with_capacity(wanted.len());
    for (index, location) in wanted {
        let key = (location.sequence, location.batch_offset);
        if let std::collections::hash_map::Entry::Vacant(slot) = batches.entry(key) {
            let (segment, file) = &segments[&location.sequence];
            slot.insert(read_batch(segment, file, &location)?);
        }
        let (payload, metas) = &batches[&key];
        let meta = metas
            .iter()
            .find(|m| m.offset == location.entry_offset)
            .ok_or_else(|| {
                mismatch(
                    &segments[&location.sequence].0,
                    &location,
                    "no entry at the indexed offset",
                )
            })?;
        if meta.index != index || meta.term != location.term {
            return Err(mismatch(
                &segments[&location.sequence].0,
                &location,
                "entry does not match the index",
            ));
        }
        out.push(Entry {
            term: meta.term,
            index: meta.index,
            entry_type: meta.entry_type,
            payload: meta.payload(payload).to_vec(),
        });
    }
    Ok(out)
}

/// The locations of the entries to read, bounded by `max_bytes` (at least one entry).
fn locate(
    shared: &Shared,
    from: OpIndex,
    to: OpIndex,
    max_bytes: usize,
) -> Result<Vec<(OpIndex, Location)>> {
    let index = shared.index.read();
    if from < index.first() {
        return Err(WalError::NotFound {
            index: from,
            first: index.first(),
            last: index.next() - 1,
        });
    }
    let end = to.min(index.next().saturating_sub(1));
    let mut wanted = Vec::new();
    let mut bytes = 0usize;
    for i in from..=end {
        let location = *index.get(i).expect("index is contiguous");
        bytes += format::ENTRY_HEADER_BYTES + location.payload_len as usize;
        if !wanted.is_empty() && bytes > max_bytes {
            break;
        }
        wanted.push((i, location));
        if bytes >= max_bytes {
            break;
        }
    }
    Ok(wanted)
}

/// A segment with its file held open.
type PinnedSegment = (Arc<SegmentFile>, Arc<File>);

/// The segments holding `wanted`, each with its file, taken under the table's lock: GC
/// removes no segment meanwhile, so the files are still there to open if the log had closed
/// them while idle.
fn segments_for(
    shared: &Shared,
    wanted: &[(OpIndex, Location)],
) -> Result<HashMap<u64, PinnedSegment>> {
    let table = shared.segments.read();
    let mut out = HashMap::new();
    for (index, location) in wanted {
        if out.contains_key(&location.sequence) {
            continue;
        }
        let segment = table
            .iter()
            .find(|s| s.sequence == location.sequence)
            .ok_or(WalError::NotFound {
                index: *index,
                first: 0,
                last: 0,
            })?;
        out.insert(location.sequence, (Arc::clone(segment), segment.file()?));
    }
    Ok(out)
}

fn read_batch(
    segment: &SegmentFile,
    file: &File,
    location: &Location,
) -> Result<(Vec<u8>, Vec<format::EntryMeta>)> {
    let frame = segment.read_at(file, location.batch_offset, location.frame_len as usize)?;
    let header = format::decode_batch_header(&frame)
        .map_err(|reason| mismatch(segment, location, reason))?;
    if header.sequence != segment.sequence
        || header.kind != BatchKind::Entries
        || header.frame_len() != frame.len()
    {
        return Err(mismatch(
            segment,
            location,
            "batch header does not match the index",
        ));
    }
    let payload = frame[format::BATCH_HEADER_BYTES..].to_vec();
    if crc32c::crc32c(&payload) != header.payload_crc {
        return Err(mismatch(
            segment,
            location,
            "batch payload checksum mismatch",
        ));
    }
    let metas = format::decode_entries(&payload, header.entry_count)
        .map_err(|reason| mismatch(segment, location, reason))?;
    Ok((payload, metas))
}

fn mismatch(segment: &SegmentFile, location: &Location, reason: &str) -> WalError {
    WalError::corruption(&segment.path, location.batch_offset, reason)
}

/// Iterates written entries in index order, reading a chunk at a time (see
/// `Log::entries_from`). Stops at the last written entry.
pub struct EntryIter<'a> {
    shared: &'a Shared,
    next: OpIndex,
    chunk_bytes: usize,
    buffered: std::vec::IntoIter<Entry>,
    done: bool,
}

impl<'a> EntryIter<'a> {
    pub(crate) fn new(shared: &'a Shared, from: OpIndex, chunk_bytes: usize) -> Self {
        EntryIter {
            shared,
            next: from,
            chunk_bytes,
            buffered: Vec::new().into_iter(),
            done: false,
        }
    }
}

impl Iterator for EntryIter<'_> {
    type Item = Result<Entry>;

    fn next(&mut self) -> Option<Result<Entry>> {
        if let Some(entry) = self.buffered.next() {
            return Some(Ok(entry));
        }
        if self.done {
            return None;
        }
        match read_range(self.shared, self.next, OpIndex::MAX, self.chunk_bytes) {
            Ok(chunk) if chunk.is_empty() => {
                self.done = true;
                None
            }
            Ok(chunk) => {
                self.next = chunk[chunk.len() - 1].index + 1;
                self.buffered = chunk.into_iter();
                self.buffered.next().map(Ok)
            }
            Err(err) => {
                self.done = true;
                Some(Err(err))
            }
        }
    }
}
