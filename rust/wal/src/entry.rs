//! Log entries as callers see them: (term, index, type, opaque payload).

use nyala_common::{OpId, OpIndex, Term};

/// What an entry carries. Stored as one byte; values not listed are reserved for later
/// versions and refused on append (and reported as corruption on read).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EntryType {
    /// A batch of row operations for the tablet.
    Write = 1,
    /// The no-op a new leader appends at the start of its term.
    NoOp = 2,
    /// A Raft configuration change.
    ConfigChange = 3,
}

impl EntryType {
    /// Decodes the on-disk byte; `None` for reserved values.
    pub const fn from_u8(value: u8) -> Option<EntryType> {
        match value {
            1 => Some(EntryType::Write),
            2 => Some(EntryType::NoOp),
            3 => Some(EntryType::ConfigChange),
            _ => None,
        }
    }

    /// The on-disk byte.
    pub const fn as_u8(self) -> u8 {
        self as u8
    }
}

/// An entry to append, borrowing its payload (no copy until it is framed).
#[derive(Clone, Copy, Debug)]
pub struct EntryRef<'a> {
    pub term: Term,
    pub index: OpIndex,
    pub entry_type: EntryType,
    pub payload: &'a [u8],
}

impl<'a> EntryRef<'a> {
    /// An entry borrowing `payload`.
    pub const fn new(term: Term, index: OpIndex, entry_type: EntryType, payload: &'a [u8]) -> Self {
        EntryRef {
            term,
            index,
            entry_type,
            payload,
        }
    }

    /// Bytes the entry takes framed (its header and payload), in a segment or a batch.
    pub const fn frame_bytes(&self) -> usize {
        crate::format::ENTRY_HEADER_BYTES + self.payload.len()
    }
}

/// An entry read back from the log, owning its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub term: Term,
    pub index: OpIndex,
    pub entry_type: EntryType,
    pub payload: Vec<u8>,
}

impl Entry {
    /// The entry's (term, index).
    pub const fn op_id(&self) -> OpId {
        OpId::new(self.term, self.index)
    }

    /// Borrows the entry for appending (e.g. when copying a log).
    pub fn as_ref(&self) -> EntryRef<'_> {
        EntryRef::new(self.term, self.index, self.entry_type, &self.payload)
    }
}
