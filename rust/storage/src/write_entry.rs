//! Applying committed WRITE log entries (docs/tablet-write-entry.md): the payload format's
//! reader and the step that turns one entry into storage changes and per-row statuses,
//! consulting and updating the engine's index of applied requests (`crate::requests`).
//!
//! The log side (which entries are committed, where their bytes are) is the caller's; this
//! module sees one WRITE payload at a time as an Arrow buffer, so the op batch the MemRowSet
//! keeps can be the log's own bytes. The encoder is `nyala.tablet.write_entry` (the leader
//! builds entries in Python; every replica reads them here).

use arrow::buffer::Buffer;
use nyala_common::OpIndex;

use crate::engine::Engine;
use crate::error::{Result, StorageError};
use crate::ops::RowStatus;
use crate::requests::{Admission, RequestIndex, RequestOutcome, RequestResult};

/// First bytes of every WRITE payload.
pub const WRITE_ENTRY_MAGIC: [u8; 4] = *b"NYWR";
/// The format version written today: the header carries the entry's hybrid timestamp and the
/// op batch starts 8-byte aligned.
pub const WRITE_ENTRY_FORMAT_VERSION: u8 = 3;
/// Version 2: aligned, without a timestamp; still read (as timestamp 0).
const UNTIMED_FORMAT_VERSION: u8 = 2;
/// The first version, without padding before the op batch or a timestamp; still read.
const UNPADDED_FORMAT_VERSION: u8 = 1;
/// Fixed header in front of the client id (versions 1 and 2).
const UNTIMED_HEADER_BYTES: usize = 28;
/// Fixed header in front of the client id (version 3: the timestamp follows the version 2
/// header).
pub const WRITE_ENTRY_HEADER_BYTES: usize = UNTIMED_HEADER_BYTES + 8;
/// Sequence number meaning "no request id".
pub const NO_SEQ_NO: i64 = -1;
const OPS_ALIGNMENT: usize = 8;

/// What a WRITE entry's tail holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// An op batch (Arrow IPC stream of the table's columns plus the op column).
    Rows = 0,
    /// A schema change: the tail is the new schema document (JSON), applied by the caller.
    AlterSchema = 1,
}

/// One client request (`RequestIdPB` without the attempt count).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId {
    pub client_id: String,
    pub seq_no: i64,
    pub first_incomplete_seq_no: i64,
}

/// A parsed WRITE payload header; the tail (`ops` bytes) starts at `ops_offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteEntryHeader {
    pub kind: WriteKind,
    pub request_id: Option<RequestId>,
    pub schema_version: u32,
    /// Hybrid time the leader assigned the entry; never decreases in op-index order within
    /// a tablet. 0 for entries of versions 1 and 2 (visible to every snapshot).
    pub timestamp: u64,
    pub ops_offset: usize,
}

fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("two bytes"))
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"))
}

fn le_i64(b: &[u8], at: usize) -> i64 {
    i64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
}

/// Parses a WRITE payload's header. The log's CRC covered the payload, so damage here is a
/// bug or a foreign writer: `Corruption` (or `NotSupported` for a newer version or kind),
/// never something to skip.
pub fn decode_write_entry(payload: &[u8]) -> Result<WriteEntryHeader> {
    if payload.len() < UNTIMED_HEADER_BYTES {
        return Err(StorageError::corruption(format!(
            "WRITE payload is {} bytes, shorter than its header",
            payload.len()
        )));
    }
    if payload[..4] != WRITE_ENTRY_MAGIC {
        return Err(StorageError::corruption(format!(
            "WRITE payload has magic {:?}, expected {:?}",
            String::from_utf8_lossy(&payload[..4]),
            String::from_utf8_lossy(&WRITE_ENTRY_MAGIC)
        )));
    }
    let version = payload[4];
    let header_bytes = match version {
        WRITE_ENTRY_FORMAT_VERSION => WRITE_ENTRY_HEADER_BYTES,
        UNTIMED_FORMAT_VERSION | UNPADDED_FORMAT_VERSION => UNTIMED_HEADER_BYTES,
        _ => {
            return Err(StorageError::NotSupported(format!(
                "WRITE payload format {version} is not supported"
            )))
        }
    };
    if payload.len() < header_bytes {
        return Err(StorageError::corruption(format!(
            "WRITE payload is {} bytes, shorter than its version {version} header",
            payload.len()
        )));
    }
    let timestamp = if version == WRITE_ENTRY_FORMAT_VERSION {
        le_u64(payload, UNTIMED_HEADER_BYTES)
    } else {
        0
    };
    let client_end = header_bytes + usize::from(le_u16(payload, 6));
    let ops_offset = if version == UNPADDED_FORMAT_VERSION {
        client_end
    } else {
        client_end.div_ceil(OPS_ALIGNMENT) * OPS_ALIGNMENT
    };
    if ops_offset > payload.len() {
        return Err(StorageError::corruption(
            "WRITE payload's client id overruns the payload",
        ));
    }
    let kind = match payload[5] {
        0 => WriteKind::Rows,
        1 => WriteKind::AlterSchema,
        other => {
            return Err(StorageError::NotSupported(format!(
                "WRITE payload kind {other} is not supported"
            )))
        }
    };
    let seq_no = le_i64(payload, 8);
    let request_id = if seq_no == NO_SEQ_NO {
        None
    } else {
        let client_id = std::str::from_utf8(&payload[header_bytes..client_end])
            .map_err(|e| StorageError::corruption(format!("WRITE payload's client id: {e}")))?;
        Some(RequestId {
            client_id: client_id.to_owned(),
            seq_no,
            first_incomplete_seq_no: le_i64(payload, 16),
        })
    };
    Ok(WriteEntryHeader {
        kind,
        request_id,
        schema_version: le_u32(payload, 24),
        timestamp,
        ops_offset,
    })
}

/// What applying one WRITE entry did.
#[derive(Debug, PartialEq, Eq)]
pub enum WriteEffect {
    /// The op batch was applied: one status per row.
    Applied(Vec<RowStatus>),
    /// The op batch was refused whole as malformed (the same on every replica); nothing
    /// changed.
    Refused(String),
    /// A request applied before: not applied again.
    Duplicate,
    /// A stale retry of a request the client declared complete: not applied.
    Stale,
    /// A schema change, left to the caller (`header.ops_offset..` is the schema document).
    AlterSchema,
}

/// One applied WRITE entry: its index, header and effect, and the client's watermark after
/// it (for trimming the caller's outcome cache; `None` without a request id or if the
/// request was not recorded).
#[derive(Debug)]
pub struct WriteOutcome {
    pub index: OpIndex,
    pub header: WriteEntryHeader,
    pub effect: WriteEffect,
    pub watermark: Option<i64>,
    /// Bytes of the entry's op batch (or schema document): what the write carried.
    pub ops_bytes: usize,
}

/// Applies the WRITE entry whose payload is `payload` as op `index`: parses it, skips a
/// duplicate or stale request, decodes the op batch in place (the MemRowSet keeps
/// `payload`'s bytes where they are aligned) and applies it, recording its request id and
/// outcome in `requests` (the engine's own index, locked by the caller: see
/// `apply_write_entries`). A schema change is returned unapplied (`WriteEffect::AlterSchema`).
/// Errors other than a malformed op batch (which is a `Refused` outcome) stop the replica:
/// they mean damage or a broken invariant.
fn apply_write_entry(
    engine: &Engine,
    requests: &mut RequestIndex,
    index: OpIndex,
    payload: Buffer,
) -> Result<WriteOutcome> {
    let header = decode_write_entry(payload.as_slice())?;
    let ops_bytes = payload.len().saturating_sub(header.ops_offset);
    let outcome = |effect, watermark| WriteOutcome {
        index,
        header: header.clone(),
        effect,
        watermark,
        ops_bytes,
    };
    if header.kind == WriteKind::AlterSchema {
        return Ok(outcome(WriteEffect::AlterSchema, None));
    }
    if let Some(request) = &header.request_id {
        match requests.admit(request) {
            Admission::Duplicate => return Ok(outcome(WriteEffect::Duplicate, None)),
            Admission::Stale => return Ok(outcome(WriteEffect::Stale, None)),
            Admission::New => {}
        }
    }
    let ops = payload.slice(header.ops_offset);
    let effect = match engine
        .decode(ops)
        .and_then(|batch| engine.apply_unfrozen(&batch, index, header.timestamp))
    {
        Ok(result) => WriteEffect::Applied(result.statuses),
        Err(StorageError::InvalidArgument(message)) => WriteEffect::Refused(message),
        Err(other) => return Err(other),
    };
    let watermark = header.request_id.as_ref().map(|r| {
        let result = match &effect {
            WriteEffect::Applied(statuses) => RequestResult::from_statuses(statuses),
            WriteEffect::Refused(message) => RequestResult::Refused(message.clone()),
            _ => unreachable!("only applied and refused batches get here"),
        };
        let first = RequestOutcome {
            index,
            timestamp: header.timestamp,
            result,
        };
        requests.record(r, first)
    });
    // Frozen (if the MemRowSet is full) only now that the request is recorded: the image of
    // the request index a flush persists describes exactly the ops it flushes.
    engine.freeze_if_full(requests);
    Ok(outcome(effect, watermark))
}

/// What `apply_write_entries` did: one outcome per entry applied or skipped, in order, and
/// the schema change that stopped it, if any, as (op index, schema version, document).
#[derive(Debug, Default)]
pub struct AppliedEntries {
    pub outcomes: Vec<WriteOutcome>,
    pub schema_change: Option<(OpIndex, u32, Buffer)>,
}

/// Applies WRITE entries `(op index, payload)` in order until the first schema change, which
/// is returned unapplied with the entries after it left alone: the caller applies it
/// (storage and tablet metadata) and goes on after its index. The engine's request index
/// (`Engine::requests`) decides which requests are new and records them with their
/// outcomes; it stays locked meanwhile, so a flush never sees an op applied and its request
/// not yet recorded.
pub fn apply_write_entries(
    engine: &Engine,
    entries: impl IntoIterator<Item = (OpIndex, Buffer)>,
) -> Result<AppliedEntries> {
    let mut applied = AppliedEntries::default();
    let mut requests = engine.requests();
    for (index, payload) in entries {
        let outcome = apply_write_entry(engine, &mut requests, index, payload.clone())?;
        if outcome.effect == WriteEffect::AlterSchema {
            let doc = payload.slice(outcome.header.ops_offset);
            applied.schema_change = Some((index, outcome.header.schema_version, doc));
            return Ok(applied);
        }
        applied.outcomes.push(outcome);
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(kind: u8, client: &str, seq: i64, first: i64, version: u8, tail: &[u8]) -> Vec<u8> {
        encode_at(kind, client, seq, first, version, 0, tail)
    }

    fn encode_at(
        kind: u8,
        client: &str,
        seq: i64,
        first: i64,
        version: u8,
        timestamp: u64,
        tail: &[u8],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&WRITE_ENTRY_MAGIC);
        out.push(version);
        out.push(kind);
        out.extend_from_slice(&(client.len() as u16).to_le_bytes());
        out.extend_from_slice(&seq.to_le_bytes());
        out.extend_from_slice(&first.to_le_bytes());
        out.extend_from_slice(&7u32.to_le_bytes());
        if version == WRITE_ENTRY_FORMAT_VERSION {
            out.extend_from_slice(&timestamp.to_le_bytes());
        }
        out.extend_from_slice(client.as_bytes());
        if version != UNPADDED_FORMAT_VERSION {
            while out.len() % OPS_ALIGNMENT != 0 {
                out.push(0);
            }
        }
        out.extend_from_slice(tail);
        out
    }

    #[test]
    fn header_round_trip_every_version() {
        for version in [1, 2, 3] {
            let payload = encode_at(0, "abc", 5, 3, version, 99, b"ops!");
            let header = decode_write_entry(&payload).unwrap();
            assert_eq!(&payload[header.ops_offset..], b"ops!");
            // Versions before 3 carry no timestamp: they read as 0, seen by every snapshot.
            assert_eq!(header.timestamp, if version == 3 { 99 } else { 0 });
            if version > 1 {
                assert_eq!(header.ops_offset % OPS_ALIGNMENT, 0);
            }
            assert_eq!(header.schema_version, 7);
            assert_eq!(header.kind, WriteKind::Rows);
            let request = header.request_id.unwrap();
            assert_eq!((request.client_id.as_str(), request.seq_no), ("abc", 5));
            assert_eq!(request.first_incomplete_seq_no, 3);
        }
        let header = decode_write_entry(&encode_at(1, "", -1, -1, 3, 1 << 40, b"{}")).unwrap();
        assert_eq!(header.kind, WriteKind::AlterSchema);
        assert_eq!(header.timestamp, 1 << 40);
        assert!(header.request_id.is_none());
        assert_eq!(header.ops_offset % OPS_ALIGNMENT, 0);
    }

    #[test]
    fn damaged_headers_are_refused() {
        let good = encode(0, "abc", 5, 3, 3, b"ops!");
        let short = decode_write_entry(&good[..10]).unwrap_err();
        assert!(matches!(short, StorageError::Corruption(_)), "{short}");
        let mut magic = good.clone();
        magic[0] = b'X';
        assert!(matches!(
            decode_write_entry(&magic),
            Err(StorageError::Corruption(_))
        ));
        let mut version = good.clone();
        version[4] = 4;
        assert!(matches!(
            decode_write_entry(&version),
            Err(StorageError::NotSupported(_))
        ));
        let mut kind = good.clone();
        kind[5] = 9;
        assert!(matches!(
            decode_write_entry(&kind),
            Err(StorageError::NotSupported(_))
        ));
        let mut overrun = good.clone();
        overrun[6] = 200;
        assert!(matches!(
            decode_write_entry(&overrun),
            Err(StorageError::Corruption(_))
        ));
        // A version 3 header cut inside its timestamp.
        let cut = decode_write_entry(&good[..30]).unwrap_err();
        assert!(matches!(cut, StorageError::Corruption(_)), "{cut}");
    }
}
