//! The on-disk format of a segment, byte by byte (docs/wal-format.md is the prose version).
//!
//! This module owns encoding and decoding only; it never touches files. All integers are
//! little-endian. Checksums are CRC32C.

use nyala_common::{OpId, OpIndex, Term};

use crate::entry::{EntryRef, EntryType};

/// First bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"NYALAWAL";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Size of the segment header; the first batch starts right after it.
pub const SEGMENT_HEADER_BYTES: usize = 128;
/// Longest tablet id a header can hold.
pub const TABLET_ID_BYTES_MAX: usize = 64;
/// First bytes of a batch frame.
pub const BATCH_MAGIC: [u8; 4] = *b"NYWB";
/// Size of a batch frame header.
pub const BATCH_HEADER_BYTES: usize = 32;
/// Size of the header in front of each entry inside a batch payload.
pub const ENTRY_HEADER_BYTES: usize = 24;
/// First bytes of the footer written when a segment is closed.
pub const FOOTER_MAGIC: [u8; 4] = *b"NYWF";
/// Last bytes of a closed segment.
pub const FOOTER_CLOSING_MAGIC: [u8; 8] = *b"NYWALEND";
/// Size of the footer.
pub const FOOTER_BYTES: usize = 48;
/// Writes cover whole pages of this size so overwriting a recycled file never reads first.
pub const PAGE_BYTES: usize = 4096;
/// Payload of a truncation record: the index kept last and its term.
pub const TRUNCATE_PAYLOAD_BYTES: usize = 16;

/// What a batch frame holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum BatchKind {
    /// Log entries.
    Entries = 1,
    /// A truncation record: every entry after the recorded index is discarded.
    Truncate = 2,
}

/// A decoded segment header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub version: u32,
    pub sequence: u64,
    pub tablet_id: String,
}

/// Encodes a segment header (exactly `SEGMENT_HEADER_BYTES`).
pub fn encode_segment_header(tablet_id: &str, sequence: u64) -> [u8; SEGMENT_HEADER_BYTES] {
    assert!(
        tablet_id.len() <= TABLET_ID_BYTES_MAX,
        "tablet id checked at open"
    );
    let mut buf = [0u8; SEGMENT_HEADER_BYTES];
    buf[0..8].copy_from_slice(&SEGMENT_MAGIC);
    buf[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    buf[12..16].copy_from_slice(&(SEGMENT_HEADER_BYTES as u32).to_le_bytes());
    buf[16..24].copy_from_slice(&sequence.to_le_bytes());
    buf[24..26].copy_from_slice(&(tablet_id.len() as u16).to_le_bytes());
    buf[26..26 + tablet_id.len()].copy_from_slice(tablet_id.as_bytes());
    let crc = crc32c::crc32c(&buf[..124]);
    buf[124..128].copy_from_slice(&crc.to_le_bytes());
    buf
}

/// Why a header could not be decoded.
#[derive(Debug, PartialEq, Eq)]
pub enum HeaderError {
    /// Shorter than a header or all zero: the file was created but never initialised.
    Unformatted,
    /// The header is present but wrong (magic, checksum, lengths).
    Invalid(&'static str),
    /// A valid header of a format version this build does not read.
    Version(u32),
}

/// Decodes a segment header from the first bytes of a file.
pub fn decode_segment_header(buf: &[u8]) -> Result<SegmentHeader, HeaderError> {
    if buf.len() < SEGMENT_HEADER_BYTES || buf[..SEGMENT_HEADER_BYTES].iter().all(|b| *b == 0) {
        return Err(HeaderError::Unformatted);
    }
    if buf[0..8] != SEGMENT_MAGIC {
        return Err(HeaderError::Invalid("bad segment magic"));
    }
    if crc32c::crc32c(&buf[..124]) != read_u32(buf, 124) {
        return Err(HeaderError::Invalid("segment header checksum mismatch"));
    }
    let version = read_u32(buf, 8);
    if version != FORMAT_VERSION {
        return Err(HeaderError::Version(version));
    }
    if read_u32(buf, 12) as usize != SEGMENT_HEADER_BYTES {
        return Err(HeaderError::Invalid("unexpected segment header length"));
    }
    let id_len = u16::from_le_bytes([buf[24], buf[25]]) as usize;
    if id_len > TABLET_ID_BYTES_MAX {
        return Err(HeaderError::Invalid("tablet id length out of range"));
    }
    let tablet_id = std::str::from_utf8(&buf[26..26 + id_len])
        .map_err(|_| HeaderError::Invalid("tablet id is not UTF-8"))?
        .to_owned();
    Ok(SegmentHeader {
        version,
        sequence: read_u64(buf, 16),
        tablet_id,
    })
}

/// A batch payload framed and checksummed by the appending thread, waiting for its header
/// (the segment sequence number in the header is only known to the committer holding the write turn).
#[derive(Debug)]
pub struct EncodedPayload {
    pub kind: BatchKind,
    pub bytes: PayloadBytes,
    pub crc: u32,
    pub entry_count: u32,
}

/// Bytes that outlive the call that hands them over, shared rather than copied.
pub type SharedBytes = std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A batch payload's bytes: framed here, or entry frames the caller already holds in this
/// format (a consensus entry batch), shared until the appender has written them.
pub enum PayloadBytes {
    Owned(Vec<u8>),
    Shared {
        storage: SharedBytes,
        range: std::ops::Range<usize>,
    },
}

impl std::ops::Deref for PayloadBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            PayloadBytes::Owned(bytes) => bytes,
            PayloadBytes::Shared { storage, range } => &(**storage).as_ref()[range.clone()],
        }
    }
}

impl std::fmt::Debug for PayloadBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PayloadBytes({} bytes)", self.len())
    }
}

/// The payload of `entries` from frames the caller holds, `storage[range]`, without copying
/// them; `None` unless those bytes are exactly what `encode_entries` would frame (each
/// entry's header and length are checked: the index is built from these bytes).
pub fn shared_entries(
    entries: &[EntryRef<'_>],
    storage: SharedBytes,
    range: std::ops::Range<usize>,
) -> Option<EncodedPayload> {
    let bytes = (*storage).as_ref().get(range.clone())?;
    let mut at = 0usize;
    for e in entries {
        let header = bytes.get(at..at + ENTRY_HEADER_BYTES)?;
        let expected_len = e.payload.len();
        if read_u64(header, 0) != e.term
            || read_u64(header, 8) != e.index
            || header[16..20] != [e.entry_type.as_u8(), 0, 0, 0]
            || read_u32(header, 20) as usize != expected_len
        {
            return None;
        }
        at += ENTRY_HEADER_BYTES + expected_len;
    }
    if at != bytes.len() {
        return None;
    }
    Some(EncodedPayload {
        kind: BatchKind::Entries,
        crc: crc32c::crc32c(bytes),
        entry_count: entries.len() as u32,
        bytes: PayloadBytes::Shared { storage, range },
    })
}

/// Bytes `entries` take framed as a batch payload (entry headers and payloads).
pub fn entries_payload_len(entries: &[EntryRef<'_>]) -> usize {
    entries.iter().map(EntryRef::frame_bytes).sum()
}

/// Frames entries into one batch payload. Callers validate lengths first.
pub fn encode_entries(entries: &[EntryRef<'_>]) -> EncodedPayload {
    let mut bytes = crate::buffers::take(entries_payload_len(entries));
    let crc = encode_entries_into(entries, &mut bytes);
    EncodedPayload {
        kind: BatchKind::Entries,
        crc,
        bytes: PayloadBytes::Owned(bytes),
        entry_count: entries.len() as u32,
    }
}

/// Appends the batch payload framing `entries` to `out` (as `encode_entries` frames them);
/// returns the CRC32C of the bytes appended.
pub fn encode_entries_into(entries: &[EntryRef<'_>], out: &mut Vec<u8>) -> u32 {
    let start = out.len();
    out.reserve(entries_payload_len(entries));
    for e in entries {
        out.extend_from_slice(&e.term.to_le_bytes());
        out.extend_from_slice(&e.index.to_le_bytes());
        out.extend_from_slice(&[e.entry_type.as_u8(), 0, 0, 0]);
        out.extend_from_slice(&(e.payload.len() as u32).to_le_bytes());
        out.extend_from_slice(e.payload);
    }
    crc32c::crc32c(&out[start..])
}

/// Frames a truncation record that keeps everything up to and including `last_kept`.
pub fn encode_truncate(last_kept: OpId) -> EncodedPayload {
    let mut bytes = Vec::with_capacity(TRUNCATE_PAYLOAD_BYTES);
    bytes.extend_from_slice(&last_kept.index.to_le_bytes());
    bytes.extend_from_slice(&last_kept.term.to_le_bytes());
    EncodedPayload {
        kind: BatchKind::Truncate,
        crc: crc32c::crc32c(&bytes),
        bytes: PayloadBytes::Owned(bytes),
        entry_count: 0,
    }
}

/// Appends the frame header for `payload` in segment `sequence` to `out`.
pub fn write_batch_header(out: &mut Vec<u8>, payload: &EncodedPayload, sequence: u64) {
    write_frame_header(
        out,
        payload.kind,
        sequence,
        payload.bytes.len(),
        payload.entry_count,
        payload.crc,
    );
}

/// Appends a frame header to `out`: `kind`, segment `sequence`, and the payload's length,
/// entry count and CRC32C.
pub fn write_frame_header(
    out: &mut Vec<u8>,
    kind: BatchKind,
    sequence: u64,
    payload_len: usize,
    entry_count: u32,
    payload_crc: u32,
) {
    let start = out.len();
    out.extend_from_slice(&BATCH_MAGIC);
    out.extend_from_slice(&[kind as u8, 0, 0, 0]);
    out.extend_from_slice(&sequence.to_le_bytes());
    out.extend_from_slice(&(payload_len as u32).to_le_bytes());
    out.extend_from_slice(&entry_count.to_le_bytes());
    out.extend_from_slice(&payload_crc.to_le_bytes());
    let crc = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(out.len() - start, BATCH_HEADER_BYTES);
}

/// A decoded, checksum-verified batch frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub kind: BatchKind,
    pub sequence: u64,
    pub payload_len: u32,
    pub entry_count: u32,
    pub payload_crc: u32,
}

impl BatchHeader {
    /// Header plus payload.
    pub const fn frame_len(&self) -> usize {
        BATCH_HEADER_BYTES + self.payload_len as usize
    }
}

/// Decodes a batch frame header; the reason is reported when it is not one.
pub fn decode_batch_header(buf: &[u8]) -> Result<BatchHeader, &'static str> {
    if buf.len() < BATCH_HEADER_BYTES {
        return Err("batch header cut short");
    }
    if buf[0..4] != BATCH_MAGIC {
        return Err("no batch magic");
    }
    if crc32c::crc32c(&buf[..28]) != read_u32(buf, 28) {
        return Err("batch header checksum mismatch");
    }
    let kind = match buf[4] {
        1 => BatchKind::Entries,
        2 => BatchKind::Truncate,
        _ => return Err("unknown batch kind"),
    };
    Ok(BatchHeader {
        kind,
        sequence: read_u64(buf, 8),
        payload_len: read_u32(buf, 16),
        entry_count: read_u32(buf, 20),
        payload_crc: read_u32(buf, 24),
    })
}

/// One entry inside a verified batch payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryMeta {
    pub term: Term,
    pub index: OpIndex,
    pub entry_type: EntryType,
    /// Offset of the entry header within the batch payload.
    pub offset: u32,
    /// Length of the entry's payload.
    pub payload_len: u32,
}

impl EntryMeta {
    /// The entry's payload bytes within its batch payload.
    pub fn payload<'a>(&self, batch_payload: &'a [u8]) -> &'a [u8] {
        let start = self.offset as usize + ENTRY_HEADER_BYTES;
        &batch_payload[start..start + self.payload_len as usize]
    }
}

/// Splits a verified entries payload into its entries, checking the framing.
pub fn decode_entries(payload: &[u8], entry_count: u32) -> Result<Vec<EntryMeta>, &'static str> {
    let mut out = Vec::with_capacity(entry_count as usize);
    let mut pos = 0usize;
    while pos < payload.len() {
        if payload.len() - pos < ENTRY_HEADER_BYTES {
            return Err("entry header cut short");
        }
        let entry_type = EntryType::from_u8(payload[pos + 16]).ok_or("unknown entry type")?;
        let payload_len = read_u32(payload, pos + 20);
        let end = pos + ENTRY_HEADER_BYTES + payload_len as usize;
        if end > payload.len() {
            return Err("entry overruns its batch");
        }
        out.push(EntryMeta {
            term: read_u64(payload, pos),
            index: read_u64(payload, pos + 8),
            entry_type,
            offset: pos as u32,
            payload_len,
        });
        pos = end;
    }
    if out.len() != entry_count as usize {
        return Err("entry count does not match the batch header");
    }
    Ok(out)
}

/// Decodes a truncation record's payload into the last kept OpId.
pub fn decode_truncate(payload: &[u8]) -> Result<OpId, &'static str> {
    if payload.len() != TRUNCATE_PAYLOAD_BYTES {
        return Err("truncation record has the wrong length");
    }
    Ok(OpId::new(read_u64(payload, 8), read_u64(payload, 0)))
}

/// The summary written when a segment is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footer {
    pub entry_count: u64,
    /// Lowest and highest entry index in the segment (0 when it has no entries).
    pub min_index: OpIndex,
    pub max_index: OpIndex,
    pub sequence: u64,
}

/// Encodes a footer (exactly `FOOTER_BYTES`).
pub fn encode_footer(footer: &Footer) -> [u8; FOOTER_BYTES] {
    let mut buf = [0u8; FOOTER_BYTES];
    buf[0..4].copy_from_slice(&FOOTER_MAGIC);
    buf[8..16].copy_from_slice(&footer.entry_count.to_le_bytes());
    buf[16..24].copy_from_slice(&footer.min_index.to_le_bytes());
    buf[24..32].copy_from_slice(&footer.max_index.to_le_bytes());
    buf[32..40].copy_from_slice(&footer.sequence.to_le_bytes());
    buf[40..48].copy_from_slice(&FOOTER_CLOSING_MAGIC);
    let crc = crc32c::crc32c(&buf[8..48]);
    buf[4..8].copy_from_slice(&crc.to_le_bytes());
    buf
}

/// Decodes a footer; the reason is reported when it is not one.
pub fn decode_footer(buf: &[u8]) -> Result<Footer, &'static str> {
    if buf.len() < FOOTER_BYTES {
        return Err("footer cut short");
    }
    if buf[0..4] != FOOTER_MAGIC || buf[40..48] != FOOTER_CLOSING_MAGIC {
        return Err("no footer magic");
    }
    if crc32c::crc32c(&buf[8..48]) != read_u32(buf, 4) {
        return Err("footer checksum mismatch");
    }
    Ok(Footer {
        entry_count: read_u64(buf, 8),
        min_index: read_u64(buf, 16),
        max_index: read_u64(buf, 24),
        sequence: read_u64(buf, 32),
    })
}

/// Rounds `n` up to a whole number of pages.
pub const fn round_up_to_page(n: u64) -> u64 {
    n.div_ceil(PAGE_BYTES as u64) * PAGE_BYTES as u64
}

fn read_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

fn read_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_detects_damage() {
        let mut buf = encode_segment_header("t1", 7);
        let header = decode_segment_header(&buf).unwrap();
        assert_eq!(header.sequence, 7);
        assert_eq!(header.tablet_id, "t1");
        buf[20] ^= 1;
        assert!(matches!(
            decode_segment_header(&buf),
            Err(HeaderError::Invalid(_))
        ));
        assert_eq!(
            decode_segment_header(&[0u8; 128]),
            Err(HeaderError::Unformatted)
        );
    }

    #[test]
    fn batch_round_trips() {
        let entries = [
            EntryRef::new(1, 1, EntryType::Write, b"abc"),
            EntryRef::new(1, 2, EntryType::NoOp, b""),
        ];
        let payload = encode_entries(&entries);
        let mut frame = Vec::new();
        write_batch_header(&mut frame, &payload, 3);
        let header = decode_batch_header(&frame).unwrap();
        assert_eq!(header.sequence, 3);
        assert_eq!(header.payload_crc, crc32c::crc32c(&payload.bytes));
        let metas = decode_entries(&payload.bytes, header.entry_count).unwrap();
        assert_eq!(metas.len(), 2);
        assert_eq!(metas[0].payload(&payload.bytes), b"abc");
        assert_eq!(metas[1].entry_type, EntryType::NoOp);
        assert_eq!(metas[1].index, 2);
    }

    #[test]
    fn footer_round_trips() {
        let footer = Footer {
            entry_count: 3,
            min_index: 4,
            max_index: 6,
            sequence: 2,
        };
        let mut buf = encode_footer(&footer);
        assert_eq!(decode_footer(&buf), Ok(footer));
        buf[9] ^= 0x10;
        assert!(decode_footer(&buf).is_err());
    }
}
