//! `EntryBatch`: a run of log entries in its wire encoding (docs/entry-batch.md).
//!
//! A batch is what a leader ships in one UpdateConsensus and what a follower appends in one
//! call. It is held as the encoded bytes plus a small per-entry index (term, index, type,
//! where the payload is), so WRITE payloads are never copied out or handed to Python one by
//! one. Every batch is validated when it is built and again when it is decoded: checksums,
//! framing, counts, contiguous indexes and non-decreasing terms.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use nyala_common::{OpId, OpIndex, Term};
use nyala_wal::format::{entries_payload_len, ENTRY_HEADER_BYTES};
use nyala_wal::{EntryRef, EntryType};

use crate::error::BatchError;

/// First bytes of every encoded batch.
pub const BATCH_MAGIC: [u8; 4] = *b"NYEB";
/// The one encoding version this build writes and reads.
pub const BATCH_FORMAT_VERSION: u8 = 1;
/// Fixed header in front of the entries.
pub const BATCH_HEADER_BYTES: usize = 24;

/// The bytes behind a batch: a `Vec` built here, or a buffer borrowed from the caller (for
/// example an immutable Python `bytes` received from gRPC), shared without copying.
pub type BatchStorage = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Where one entry sits in its batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryMeta {
    pub term: Term,
    pub index: OpIndex,
    pub entry_type: EntryType,
    /// Offset of the entry's header within the batch payload (after the batch header).
    pub offset: u32,
    pub payload_len: u32,
}

impl EntryMeta {
    /// The entry's (term, index).
    pub const fn op_id(&self) -> OpId {
        OpId::new(self.term, self.index)
    }

    /// Bytes the entry takes in a batch payload (header plus payload).
    pub const fn frame_bytes(&self) -> usize {
        ENTRY_HEADER_BYTES + self.payload_len as usize
    }

    fn frame_end(&self) -> usize {
        self.offset as usize + self.frame_bytes()
    }
}

/// A non-empty, contiguous, validated run of entries in wire encoding. Cloning is cheap
/// (two reference counts).
#[derive(Clone)]
pub struct EntryBatch {
    storage: BatchStorage,
    /// One per entry, in index order; never empty.
    metas: Arc<[EntryMeta]>,
}

impl EntryBatch {
    /// Validates `bytes` as an encoded batch and indexes its entries, keeping the bytes
    /// (no copy).
    pub fn decode<B>(bytes: B) -> Result<EntryBatch, BatchError>
    where
        B: AsRef<[u8]> + Send + Sync + 'static,
    {
        let metas = decode_metas(bytes.as_ref())?;
        Ok(EntryBatch {
            storage: Arc::new(bytes),
            metas: metas.into(),
        })
    }

    /// Encodes `entries` (contiguous, terms not decreasing, at least one).
    pub fn encode(entries: &[EntryRef<'_>]) -> Result<EntryBatch, BatchError> {
        let mut builder = BatchBuilder::with_capacity(entries_payload_len(entries));
        for entry in entries {
            builder.push(*entry)?;
        }
        builder.finish()
    }

    /// The whole encoding (header and entries), as sent on the wire.
    pub fn as_bytes(&self) -> &[u8] {
        (*self.storage).as_ref()
    }

    /// The entries part of the encoding.
    pub fn payload(&self) -> &[u8] {
        &self.as_bytes()[BATCH_HEADER_BYTES..]
    }

    /// Number of entries (at least one).
    pub fn len(&self) -> usize {
        self.metas.len()
    }

    /// Always false: batches are never empty. Present for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.metas.is_empty()
    }

    /// Encoded size in bytes, header included (what flow control counts).
    pub fn size_bytes(&self) -> usize {
        self.as_bytes().len()
    }

    pub fn first_op_id(&self) -> OpId {
        self.metas[0].op_id()
    }

    pub fn last_op_id(&self) -> OpId {
        self.metas[self.metas.len() - 1].op_id()
    }

    /// The per-entry index.
    pub fn metas(&self) -> &[EntryMeta] {
        &self.metas
    }

    /// Entry `position` (0-based within the batch), borrowing its payload.
    pub fn entry(&self, position: usize) -> EntryRef<'_> {
        let meta = &self.metas[position];
        let start = meta.offset as usize + ENTRY_HEADER_BYTES;
        let payload = &self.payload()[start..start + meta.payload_len as usize];
        EntryRef::new(meta.term, meta.index, meta.entry_type, payload)
    }

    /// Entries at `positions`, borrowing their payloads (what the WAL append takes).
    pub fn entries(&self, positions: Range<usize>) -> Vec<EntryRef<'_>> {
        positions.map(|p| self.entry(p)).collect()
    }

    /// The NO_OP and CONFIG_CHANGE entries: the only ones consensus looks into.
    pub fn control_entries(&self) -> impl Iterator<Item = EntryRef<'_>> + '_ {
        (0..self.len())
            .filter(|&p| self.metas[p].entry_type != EntryType::Write)
            .map(|p| self.entry(p))
    }

    /// The encoded entries at `positions` as one contiguous byte range of the payload.
    /// The storage holding entries `positions` and where their frames lie in it: what the
    /// WAL queues without copying (`Log::append_shared`).
    pub(crate) fn shared_frames(&self, positions: Range<usize>) -> (BatchStorage, Range<usize>) {
        let frames = self.frames(positions);
        let start = frames.as_ptr() as usize - self.as_bytes().as_ptr() as usize;
        (Arc::clone(&self.storage), start..start + frames.len())
    }

    pub(crate) fn frames(&self, positions: Range<usize>) -> &[u8] {
        if positions.is_empty() {
            return &[];
        }
        let start = self.metas[positions.start].offset as usize;
        let end = self.metas[positions.end - 1].frame_end();
        &self.payload()[start..end]
    }

    /// Position of the entry with `index`, if the batch holds it.
    pub fn position_of(&self, index: OpIndex) -> Option<usize> {
        let first = self.metas[0].index;
        let position = index.checked_sub(first)? as usize;
        (position < self.metas.len()).then_some(position)
    }
}

impl fmt::Debug for EntryBatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EntryBatch")
            .field("first", &self.first_op_id())
            .field("last", &self.last_op_id())
            .field("size_bytes", &self.size_bytes())
            .finish()
    }
}

/// Builds a batch entry by entry, validating order as it goes (reads from the log cache and
/// the WAL, and `EntryBatch::encode`).
pub struct BatchBuilder {
    /// Header room followed by the entries written so far.
    buf: Vec<u8>,
    metas: Vec<EntryMeta>,
}

impl BatchBuilder {
    /// A builder expecting about `payload_bytes` of entries.
    pub fn with_capacity(payload_bytes: usize) -> Self {
        let mut buf = Vec::with_capacity(BATCH_HEADER_BYTES + payload_bytes);
        buf.resize(BATCH_HEADER_BYTES, 0);
        BatchBuilder {
            buf,
            metas: Vec::new(),
        }
    }

    /// Encoded size so far, header included.
    pub fn size_bytes(&self) -> usize {
        self.buf.len()
    }

    /// Entries pushed so far.
    pub fn len(&self) -> usize {
        self.metas.len()
    }

    /// Whether nothing was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.metas.is_empty()
    }

    /// The index the next entry must have (`None` before the first).
    pub fn next_index(&self) -> Option<OpIndex> {
        self.metas.last().map(|m| m.index + 1)
    }

    /// Appends one entry after the last.
    pub fn push(&mut self, entry: EntryRef<'_>) -> Result<(), BatchError> {
        check_follows(self.metas.last(), entry.term, entry.index)?;
        let payload_len = u32::try_from(entry.payload.len()).map_err(|_| BatchError::TooLarge {
            bytes: entry.payload.len(),
        })?;
        let offset = self.payload_offset()?;
        self.buf.extend_from_slice(&entry.term.to_le_bytes());
        self.buf.extend_from_slice(&entry.index.to_le_bytes());
        self.buf
            .extend_from_slice(&[entry.entry_type.as_u8(), 0, 0, 0]);
        self.buf.extend_from_slice(&payload_len.to_le_bytes());
        self.buf.extend_from_slice(entry.payload);
        self.metas.push(EntryMeta {
            term: entry.term,
            index: entry.index,
            entry_type: entry.entry_type,
            offset,
            payload_len,
        });
        Ok(())
    }

    /// Appends entries `positions` of `source` with one copy of their encoded bytes.
    pub fn push_from(
        &mut self,
        source: &EntryBatch,
        positions: Range<usize>,
    ) -> Result<(), BatchError> {
        if positions.is_empty() {
            return Ok(());
        }
        let first = &source.metas()[positions.start];
        check_follows(self.metas.last(), first.term, first.index)?;
        let base = self.payload_offset()?;
        let frames = source.frames(positions.clone());
        u32::try_from(base as usize + frames.len()).map_err(|_| BatchError::TooLarge {
            bytes: base as usize + frames.len(),
        })?;
        self.buf.extend_from_slice(frames);
        // Source offsets are relative to its payload; rebase them onto ours.
        let shift = i64::from(base) - i64::from(first.offset);
        self.metas
            .extend(source.metas()[positions].iter().map(|m| EntryMeta {
                offset: (i64::from(m.offset) + shift) as u32,
                ..*m
            }));
        Ok(())
    }

    /// Writes the header and returns the batch.
    pub fn finish(mut self) -> Result<EntryBatch, BatchError> {
        if self.metas.is_empty() {
            return Err(BatchError::Empty);
        }
        let payload_len = self.buf.len() - BATCH_HEADER_BYTES;
        let header = encode_header(
            self.metas.len() as u32,
            payload_len as u32,
            crc32c::crc32c(&self.buf[BATCH_HEADER_BYTES..]),
        );
        self.buf[..BATCH_HEADER_BYTES].copy_from_slice(&header);
        // Checked before the write (push) and after: the encoding decodes to the same index.
        debug_assert_eq!(decode_metas(&self.buf).as_deref(), Ok(&self.metas[..]));
        Ok(EntryBatch {
            storage: Arc::new(self.buf),
            metas: self.metas.into(),
        })
    }

    fn payload_offset(&self) -> Result<u32, BatchError> {
        let offset = self.buf.len() - BATCH_HEADER_BYTES;
        u32::try_from(offset).map_err(|_| BatchError::TooLarge { bytes: offset })
    }
}

/// Checks that an entry (term, index) may follow `previous` in a batch.
fn check_follows(
    previous: Option<&EntryMeta>,
    term: Term,
    index: OpIndex,
) -> Result<(), BatchError> {
    if term == 0 || index == 0 {
        return Err(BatchError::ZeroOpId { index, term });
    }
    let Some(previous) = previous else {
        return Ok(());
    };
    if index != previous.index + 1 {
        return Err(BatchError::NonContiguous {
            expected: previous.index + 1,
            got: index,
        });
    }
    if term < previous.term {
        return Err(BatchError::TermRegression {
            index,
            term,
            previous: previous.term,
        });
    }
    Ok(())
}

fn encode_header(entry_count: u32, payload_len: u32, payload_crc: u32) -> [u8; BATCH_HEADER_BYTES] {
    let mut header = [0u8; BATCH_HEADER_BYTES];
    header[0..4].copy_from_slice(&BATCH_MAGIC);
    header[4] = BATCH_FORMAT_VERSION;
    header[8..12].copy_from_slice(&entry_count.to_le_bytes());
    header[12..16].copy_from_slice(&payload_len.to_le_bytes());
    header[16..20].copy_from_slice(&payload_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&header[..20]);
    header[20..24].copy_from_slice(&header_crc.to_le_bytes());
    header
}

fn read_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

fn read_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

/// Verifies an encoded batch and returns its per-entry index.
fn decode_metas(bytes: &[u8]) -> Result<Vec<EntryMeta>, BatchError> {
    if bytes.len() < BATCH_HEADER_BYTES {
        return Err(BatchError::CutShort {
            needed: BATCH_HEADER_BYTES,
            got: bytes.len(),
        });
    }
    if bytes[0..4] != BATCH_MAGIC {
        return Err(BatchError::BadMagic);
    }
    if crc32c::crc32c(&bytes[..20]) != read_u32(bytes, 20) {
        return Err(BatchError::HeaderChecksum);
    }
    if bytes[4] != BATCH_FORMAT_VERSION {
        return Err(BatchError::UnsupportedVersion(bytes[4]));
    }
    let entry_count = read_u32(bytes, 8);
    let needed = BATCH_HEADER_BYTES + read_u32(bytes, 12) as usize;
    if bytes.len() < needed {
        return Err(BatchError::CutShort {
            needed,
            got: bytes.len(),
        });
    }
    if bytes.len() > needed {
        return Err(BatchError::TrailingBytes {
            extra: bytes.len() - needed,
        });
    }
    let payload = &bytes[BATCH_HEADER_BYTES..];
    let stored = read_u32(bytes, 16);
    let computed = crc32c::crc32c(payload);
    if stored != computed {
        return Err(BatchError::PayloadChecksum { stored, computed });
    }
    let metas = decode_entries(payload)?;
    if metas.len() != entry_count as usize {
        return Err(BatchError::CountMismatch {
            header: entry_count,
            actual: metas.len() as u32,
        });
    }
    Ok(metas)
}

/// Splits a checksum-verified payload into entries, checking framing and order.
fn decode_entries(payload: &[u8]) -> Result<Vec<EntryMeta>, BatchError> {
    let mut metas: Vec<EntryMeta> = Vec::new();
    let mut offset = 0usize;
    while offset < payload.len() {
        if payload.len() - offset < ENTRY_HEADER_BYTES {
            return Err(BatchError::EntryOverrun { offset });
        }
        let term = read_u64(payload, offset);
        let index = read_u64(payload, offset + 8);
        let code = payload[offset + 16];
        let entry_type =
            EntryType::from_u8(code).ok_or(BatchError::UnknownEntryType { index, code })?;
        let payload_len = read_u32(payload, offset + 20);
        let end = offset + ENTRY_HEADER_BYTES + payload_len as usize;
        if end > payload.len() {
            return Err(BatchError::EntryOverrun { offset });
        }
        check_follows(metas.last(), term, index)?;
        metas.push(EntryMeta {
            term,
            index,
            entry_type,
            offset: offset as u32,
            payload_len,
        });
        offset = end;
    }
    if metas.is_empty() {
        return Err(BatchError::Empty);
    }
    Ok(metas)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> EntryBatch {
        EntryBatch::encode(&[
            EntryRef::new(1, 5, EntryType::NoOp, b""),
            EntryRef::new(1, 6, EntryType::Write, b"rows"),
            EntryRef::new(2, 7, EntryType::ConfigChange, b"cfg"),
            EntryRef::new(2, 8, EntryType::Write, b"more rows"),
        ])
        .unwrap()
    }

    /// Re-seals a (modified) encoding with valid checksums, to reach the checks behind them.
    fn reseal(mut bytes: Vec<u8>) -> Vec<u8> {
        let crc = crc32c::crc32c(&bytes[BATCH_HEADER_BYTES..]);
        bytes[16..20].copy_from_slice(&crc.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..20]);
        bytes[20..24].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn encode_then_decode_round_trips() {
        let batch = sample();
        assert_eq!(batch.first_op_id(), OpId::new(1, 5));
        assert_eq!(batch.last_op_id(), OpId::new(2, 8));
        assert_eq!(batch.len(), 4);
        let decoded = EntryBatch::decode(batch.as_bytes().to_vec()).unwrap();
        assert_eq!(decoded.metas(), batch.metas());
        assert_eq!(decoded.entry(3).payload, b"more rows");
        assert_eq!(
            decoded.size_bytes(),
            BATCH_HEADER_BYTES + 4 * 24 + 4 + 3 + 9
        );
    }

    #[test]
    fn control_entries_skip_writes() {
        let batch = sample();
        let control: Vec<_> = batch
            .control_entries()
            .map(|e| (e.index, e.entry_type, e.payload.to_vec()))
            .collect();
        assert_eq!(
            control,
            vec![
                (5, EntryType::NoOp, vec![]),
                (7, EntryType::ConfigChange, b"cfg".to_vec())
            ]
        );
    }

    #[test]
    fn encode_refuses_gaps_regressions_zero_and_empty() {
        let gap = EntryBatch::encode(&[
            EntryRef::new(1, 1, EntryType::Write, b""),
            EntryRef::new(1, 3, EntryType::Write, b""),
        ]);
        assert_eq!(
            gap.unwrap_err(),
            BatchError::NonContiguous {
                expected: 2,
                got: 3
            }
        );
        let regression = EntryBatch::encode(&[
            EntryRef::new(2, 1, EntryType::Write, b""),
            EntryRef::new(1, 2, EntryType::Write, b""),
        ]);
        assert!(matches!(
            regression.unwrap_err(),
            BatchError::TermRegression { index: 2, .. }
        ));
        let zero = EntryBatch::encode(&[EntryRef::new(0, 1, EntryType::Write, b"")]);
        assert!(matches!(zero.unwrap_err(), BatchError::ZeroOpId { .. }));
        assert_eq!(EntryBatch::encode(&[]).unwrap_err(), BatchError::Empty);
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let bytes = sample().as_bytes().to_vec();
        for byte in 0..bytes.len() {
            for bit in 0..8 {
                let mut damaged = bytes.clone();
                damaged[byte] ^= 1 << bit;
                // Reserved header bytes (5..8) are covered by the header checksum too.
                assert!(
                    EntryBatch::decode(damaged).is_err(),
                    "byte {byte} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn truncated_and_padded_encodings_are_refused() {
        let bytes = sample().as_bytes().to_vec();
        for len in 0..bytes.len() {
            assert!(EntryBatch::decode(bytes[..len].to_vec()).is_err(), "{len}");
        }
        let mut padded = bytes.clone();
        padded.push(0);
        assert_eq!(
            EntryBatch::decode(padded).unwrap_err(),
            BatchError::TrailingBytes { extra: 1 }
        );
    }

    #[test]
    fn validly_sealed_bad_entries_get_typed_errors() {
        let bytes = sample().as_bytes().to_vec();
        // Second entry's index 6 -> 9: a gap.
        let mut gap = bytes.clone();
        let at = BATCH_HEADER_BYTES + 24 + 8;
        gap[at..at + 8].copy_from_slice(&9u64.to_le_bytes());
        assert_eq!(
            EntryBatch::decode(reseal(gap)).unwrap_err(),
            BatchError::NonContiguous {
                expected: 6,
                got: 9
            }
        );
        // Third entry's term 2 -> 0 (after term 1): a regression... of a zero term.
        let mut lower = bytes.clone();
        let third = BATCH_HEADER_BYTES + 24 + (24 + 4);
        lower[third..third + 8].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            EntryBatch::decode(reseal(lower)).unwrap_err(),
            BatchError::ZeroOpId { index: 7, .. }
        ));
        // Fourth entry's term 2 -> 1 after term 2.
        let mut regress = bytes.clone();
        let fourth = third + 24 + 3;
        regress[fourth..fourth + 8].copy_from_slice(&1u64.to_le_bytes());
        assert!(matches!(
            EntryBatch::decode(reseal(regress)).unwrap_err(),
            BatchError::TermRegression { index: 8, .. }
        ));
        let mut count = bytes.clone();
        count[8..12].copy_from_slice(&5u32.to_le_bytes());
        assert_eq!(
            EntryBatch::decode(reseal(count)).unwrap_err(),
            BatchError::CountMismatch {
                header: 5,
                actual: 4
            }
        );
        let mut kind = bytes.clone();
        kind[BATCH_HEADER_BYTES + 16] = 9;
        assert_eq!(
            EntryBatch::decode(reseal(kind)).unwrap_err(),
            BatchError::UnknownEntryType { index: 5, code: 9 }
        );
        let mut overrun = bytes.clone();
        overrun[BATCH_HEADER_BYTES + 20..BATCH_HEADER_BYTES + 24]
            .copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(
            EntryBatch::decode(reseal(overrun)).unwrap_err(),
            BatchError::EntryOverrun { offset: 0 }
        );
        let mut version = bytes.clone();
        version[4] = 2;
        assert_eq!(
            EntryBatch::decode(reseal(version)).unwrap_err(),
            BatchError::UnsupportedVersion(2)
        );
        let empty = reseal(encode_header(0, 0, 0).to_vec());
        assert_eq!(EntryBatch::decode(empty).unwrap_err(), BatchError::Empty);
    }

    #[test]
    fn push_from_copies_a_sub_run_and_rebases_offsets() {
        let batch = sample();
        let mut builder = BatchBuilder::with_capacity(0);
        builder
            .push(EntryRef::new(1, 4, EntryType::Write, b"before"))
            .unwrap();
        builder.push_from(&batch, 0..2).unwrap();
        assert!(builder.push_from(&batch, 3..4).is_err()); // would skip index 7
        let built = builder.finish().unwrap();
        assert_eq!(built.first_op_id(), OpId::new(1, 4));
        assert_eq!(built.last_op_id(), OpId::new(1, 6));
        assert_eq!(built.entry(2).payload, b"rows");
        let decoded = EntryBatch::decode(built.as_bytes().to_vec()).unwrap();
        assert_eq!(decoded.metas(), built.metas());
        assert_eq!(batch.position_of(7), Some(2));
        assert_eq!(batch.position_of(4), None);
        assert_eq!(batch.position_of(9), None);
    }
}
