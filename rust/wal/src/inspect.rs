//! Read-only inspection of one segment file, for offline tools (`nyala local-replica wal dump`).
//!
//! `Log::open` finishes recovery (it deletes leftovers and prepares segments), which is right
//! for a server and wrong for a tool an operator points at a damaged log. This module only
//! reads: it decodes the header, then verifies every frame with the same checks recovery uses.

use std::path::Path;

use nyala_common::OpId;

use crate::error::{Result, WalError};
use crate::format::{self, BatchKind, EntryMeta, Footer, HeaderError};
use crate::segment;

/// One verified batch of a segment.
#[derive(Debug)]
pub struct BatchDump {
    /// Byte offset of the batch frame in the file.
    pub offset: u64,
    pub kind: BatchKind,
    /// The entries of an `Entries` batch (none for a truncation record).
    pub entries: Vec<EntryMeta>,
    /// For a truncation record: the last entry it keeps.
    pub last_kept: Option<OpId>,
}

/// What a segment file holds.
#[derive(Debug)]
pub struct SegmentDump {
    /// `None` when the file was created but its header never written.
    pub tablet_id: Option<String>,
    pub sequence: u64,
    pub file_len: u64,
    /// Offset just past the last valid batch: anything after it (and before a footer) is a
    /// torn or preallocated tail.
    pub valid_end: u64,
    pub footer: Option<Footer>,
    pub batches: Vec<BatchDump>,
}

/// Reads and verifies the segment at `path` without modifying anything.
///
/// A damaged header or a bad frame followed by valid data is a corruption error naming the
/// file and offset, exactly as at recovery; a torn tail ends the batches.
pub fn dump_segment(path: &Path) -> Result<SegmentDump> {
    let bytes = std::fs::read(path).map_err(|e| WalError::io("read", path, e))?;
    let file_len = bytes.len() as u64;
    let header = match format::decode_segment_header(&bytes) {
        Ok(header) => header,
        Err(HeaderError::Unformatted) => {
            return Ok(SegmentDump {
                tablet_id: None,
                sequence: 0,
                file_len,
                valid_end: 0,
                footer: None,
                batches: Vec::new(),
            })
        }
        Err(HeaderError::Invalid(reason)) => return Err(WalError::corruption(path, 0, reason)),
        Err(HeaderError::Version(version)) => {
            return Err(WalError::UnsupportedVersion {
                path: path.to_owned(),
                version,
                supported: format::FORMAT_VERSION,
            })
        }
    };
    let scan = segment::scan_segment(path, &bytes, &header.tablet_id, header.sequence)?;
    let batches = scan
        .batches
        .into_iter()
        .map(|b| BatchDump {
            offset: b.offset,
            kind: b.header.kind,
            entries: b.entries,
            last_kept: b.last_kept,
        })
        .collect();
    Ok(SegmentDump {
        tablet_id: Some(header.tablet_id),
        sequence: header.sequence,
        file_len,
        valid_end: scan.valid_end,
        footer: scan.footer,
        batches,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EntryRef, EntryType, Log, LogOptions};

    #[test]
    fn dumps_what_was_appended_and_leaves_the_file_alone() {
        let dir = tempfile::tempdir().unwrap();
        let log = Log::open(dir.path(), "t1", LogOptions::default()).unwrap();
        let payload = [7u8; 10];
        let entries: Vec<EntryRef<'_>> = (1..=3)
            .map(|i| EntryRef {
                term: 2,
                index: i,
                entry_type: EntryType::Write,
                payload: &payload,
            })
            .collect();
        let ticket = log.append(&entries).unwrap();
        log.wait(ticket.ticket).unwrap();
        let path = dir.path().join(crate::segment_file_name(1));
        let before = std::fs::read(&path).unwrap();
        let dump = dump_segment(&path).unwrap();
        assert_eq!(dump.tablet_id.as_deref(), Some("t1"));
        assert_eq!(dump.sequence, 1);
        let indexes: Vec<u64> = dump
            .batches
            .iter()
            .flat_map(|b| b.entries.iter().map(|e| e.index))
            .collect();
        assert_eq!(indexes, vec![1, 2, 3]);
        assert!(dump.batches[0].entries.iter().all(|e| e.payload_len == 10));
        assert_eq!(std::fs::read(&path).unwrap(), before);
        drop(log);
    }

    #[test]
    fn a_damaged_header_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wal-000000001");
        let mut bytes = vec![0u8; format::SEGMENT_HEADER_BYTES];
        bytes[0] = 1;
        std::fs::write(&path, bytes).unwrap();
        let err = dump_segment(&path).unwrap_err();
        assert!(matches!(err, WalError::Corruption { .. }), "{err:?}");
    }
}
