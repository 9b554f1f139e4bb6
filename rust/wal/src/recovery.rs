//! Opening an existing log directory: find the segments, verify them in order, rebuild the
//! index and the terms, and decide what to repair. Nothing is changed on disk until every
//! segment has been verified, so a corruption error deletes or truncates nothing.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nyala_common::OpId;

use crate::error::{Result, WalError};
use crate::format;
use crate::index::{Location, LogIndex, TermRuns};
use crate::segment::{self, ScannedBatch, SegmentFile, SegmentScan};

/// A verified segment and what recovery must do with it.
pub(crate) struct RecoveredSegment {
    pub segment: SegmentFile,
    pub scan_valid_end: u64,
    pub has_footer: bool,
}

/// The state of the log as found on disk.
pub(crate) struct Recovered {
    /// Verified segments in sequence order.
    pub segments: Vec<RecoveredSegment>,
    /// The last segment if it is footerless and holds no batch: it becomes the active one.
    pub reusable_tail: Option<(SegmentFile, Vec<u8>)>,
    pub index: LogIndex,
    pub terms: TermRuns,
    /// The sequence number the next new segment gets.
    pub next_sequence: u64,
    /// Files that recovery will delete: unfinished preparations and unformatted tails.
    pub leftovers: Vec<PathBuf>,
    /// GC'd segment files available for reuse.
    pub recyclable: Vec<PathBuf>,
}

/// Reads every segment of `dir`. Errors name the file and offset; nothing is modified.
pub(crate) fn recover(dir: &Path, tablet_id: &str) -> Result<Recovered> {
    let listing = list_dir(dir)?;
    let mut rebuild = Rebuild::default();
    let mut recovered = Recovered {
        segments: Vec::new(),
        reusable_tail: None,
        index: LogIndex::new(1),
        terms: TermRuns::new(OpId::MIN),
        next_sequence: listing.sequences.last().map_or(1, |s| s + 1),
        leftovers: listing.leftovers,
        recyclable: listing.recyclable,
    };
    check_consecutive(dir, &listing.sequences)?;
    // A segment without a header was never made durable by a sync (the first group written
    // into a segment syncs its header page with its data): a crash while preparing it or
    // before its first group's sync returned. Nothing in it or after it was acknowledged,
    // because durability is published in log order and the log writes into a segment before
    // it moves on to the next. So such segments are dropped, from the first one on, unless
    // one of them holds data (`drop_unprepared`).
    let mut kept = listing.sequences.len();
    for (position, &sequence) in listing.sequences.iter().enumerate() {
        let path = dir.join(segment::segment_file_name(sequence));
        if segment::header_unformatted(&path)? {
            kept = position;
            break;
        }
    }
    if kept < listing.sequences.len() {
        drop_unprepared(dir, tablet_id, &listing.sequences[kept..], &mut recovered)?;
    }
    for (position, &sequence) in listing.sequences[..kept].iter().enumerate() {
        let path = dir.join(segment::segment_file_name(sequence));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| WalError::io("open", &path, e))?;
        let bytes = read_all(&file, &path)?;
        let scan = segment::scan_segment(&path, &bytes, tablet_id, sequence)?;
        let is_last = position + 1 == kept;
        let segment = SegmentFile::new(sequence, path, file);
        rebuild.apply(&segment, &scan)?;
        if let Some(footer) = scan.footer {
            check_footer(&segment, &footer)?;
        }
        if is_last && scan.footer.is_none() && scan.batches.is_empty() {
            recovered.reusable_tail = Some((segment, scan.header_bytes));
            continue;
        }
        recovered.segments.push(RecoveredSegment {
            segment,
            scan_valid_end: scan.valid_end,
            has_footer: scan.footer.is_some(),
        });
    }
    recovered.index = rebuild.index;
    recovered.terms = rebuild.terms;
    Ok(recovered)
}

/// Checks that the segments from the first one without a header on (`sequences`) hold no
/// data, and makes them leftovers: the next segment takes the first one's sequence number.
/// A valid frame in any of them, or a batch or footer in a later one, is corruption (data
/// after damage), and nothing is changed.
fn drop_unprepared(
    dir: &Path,
    tablet_id: &str,
    sequences: &[u64],
    recovered: &mut Recovered,
) -> Result<()> {
    let mut paths = Vec::with_capacity(sequences.len());
    for &sequence in sequences {
        let path = dir.join(segment::segment_file_name(sequence));
        let file = fs::File::open(&path).map_err(|e| WalError::io("open", &path, e))?;
        let bytes = read_all(&file, &path)?;
        let scan = segment::scan_segment(&path, &bytes, tablet_id, sequence)?;
        if !scan.batches.is_empty() || scan.footer.is_some() {
            let first = dir.join(segment::segment_file_name(sequences[0]));
            let reason = format!("segment has no header, and segment {sequence} holds data");
            return Err(WalError::corruption(first, 0, reason));
        }
        paths.push(path);
    }
    recovered.next_sequence = sequences[0];
    recovered.leftovers.extend(paths);
    Ok(())
}

struct Listing {
    sequences: Vec<u64>,
    leftovers: Vec<PathBuf>,
    recyclable: Vec<PathBuf>,
}

fn list_dir(dir: &Path) -> Result<Listing> {
    let mut listing = Listing {
        sequences: Vec::new(),
        leftovers: Vec::new(),
        recyclable: Vec::new(),
    };
    let entries = fs::read_dir(dir).map_err(|e| WalError::io("list", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| WalError::io("list", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with(segment::RECYCLE_PREFIX) {
            listing.recyclable.push(entry.path());
        } else if name.starts_with(segment::SEGMENT_PREFIX)
            && name.ends_with(segment::PREPARING_SUFFIX)
        {
            listing.leftovers.push(entry.path());
        } else if let Some(sequence) = segment::parse_segment_name(name) {
            listing.sequences.push(sequence);
        }
    }
    listing.sequences.sort_unstable();
    listing.recyclable.sort();
    Ok(listing)
}

fn check_consecutive(dir: &Path, sequences: &[u64]) -> Result<()> {
    for pair in sequences.windows(2) {
        if pair[1] != pair[0] + 1 {
            let path = dir.join(segment::segment_file_name(pair[1]));
            let reason = format!("segment {} is missing before it", pair[0] + 1);
            return Err(WalError::corruption(path, 0, reason));
        }
    }
    Ok(())
}

fn read_all(file: &std::fs::File, path: &Path) -> Result<Vec<u8>> {
    let len = file
        .metadata()
        .map_err(|e| WalError::io("stat", path, e))?
        .len();
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, 0)
        .map_err(|e| WalError::io("read", path, e))?;
    Ok(bytes)
}

fn check_footer(segment: &SegmentFile, footer: &format::Footer) -> Result<()> {
    let scanned = segment.footer();
    if scanned != *footer {
        let reason = format!("footer says {footer:?}, the batches say {scanned:?}");
        return Err(WalError::corruption(&segment.path, 0, reason));
    }
    Ok(())
}

/// Replays batches in log order into the index and the terms, checking that indexes are
/// contiguous and terms never go backwards.
struct Rebuild {
    index: LogIndex,
    terms: TermRuns,
    /// Whether any entry or truncation has been replayed (the first one may start anywhere,
    /// because GC removes the log's beginning).
    started: bool,
}

impl Default for Rebuild {
    fn default() -> Self {
        Rebuild {
            index: LogIndex::new(1),
            terms: TermRuns::new(OpId::MIN),
            started: false,
        }
    }
}

impl Rebuild {
    fn apply(&mut self, segment: &SegmentFile, scan: &SegmentScan) -> Result<()> {
        for batch in &scan.batches {
            match batch.last_kept {
                Some(last_kept) => self.apply_truncation(segment, batch, last_kept)?,
                None => self.apply_entries(segment, batch)?,
            }
        }
        Ok(())
    }

    fn apply_truncation(
        &mut self,
        segment: &SegmentFile,
        batch: &ScannedBatch,
        last_kept: OpId,
    ) -> Result<()> {
        if self.started && last_kept.index > self.terms.last().index {
            let reason = format!(
                "truncation after {last_kept} beyond the last entry {}",
                self.terms.last()
            );
            return Err(WalError::corruption(&segment.path, batch.offset, reason));
        }
        self.started = true;
        self.terms.truncate_after(last_kept);
        self.index.truncate_after(last_kept.index);
        Ok(())
    }

    fn apply_entries(&mut self, segment: &SegmentFile, batch: &ScannedBatch) -> Result<()> {
        for meta in &batch.entries {
            let op = OpId::new(meta.term, meta.index);
            let last = self.terms.last();
            if !self.started {
                if op.index == 0 {
                    return Err(WalError::corruption(
                        &segment.path,
                        batch.offset,
                        "entry with index 0",
                    ));
                }
                self.started = true;
                self.terms.restart_at(op);
            } else if op.index != last.index + 1 {
                let reason = format!("entry {op} does not follow {last}");
                return Err(WalError::corruption(&segment.path, batch.offset, reason));
            } else if op.term < last.term {
                let reason = format!("entry {op} has a lower term than {last}");
                return Err(WalError::corruption(&segment.path, batch.offset, reason));
            } else {
                self.terms.push(op);
            }
            let location = Location {
                sequence: segment.sequence,
                batch_offset: batch.offset,
                frame_len: batch.header.frame_len() as u32,
                entry_offset: meta.offset,
                payload_len: meta.payload_len,
                term: meta.term,
            };
            self.index.truncate_after(op.index - 1);
            self.index.push(op.index, location);
        }
        if let (Some(first), Some(last)) = (batch.entries.first(), batch.entries.last()) {
            segment.note_entries(first.index, last.index);
        }
        Ok(())
    }
}
