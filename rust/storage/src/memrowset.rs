//! The MemRowSet: the in-memory, key-sorted home of rows applied since the last flush.
//!
//! Rows stay in the Arrow batches they arrived in (no per-row copy or allocation of values);
//! a `BTreeMap` from the memcomparable key to the newest (batch, row) keeps them in key order.
//! A MemRowSet is mutated only by apply; flush freezes it (moves it behind an `Arc`) and
//! writes it out while a fresh one takes new writes.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow::compute::interleave;
use arrow::datatypes::{Field, Schema as ArrowSchema};

use crate::error::{Result, StorageError};
use crate::ops::{OpBatch, OpType};
use nyala_common::OpIndex;

/// Name of the tombstone flag column in sorted outputs and rowset files.
pub const DELETED_COLUMN: &str = "__deleted";

/// Where the newest version of a key lives in the MemRowSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowRef {
    batch: u32,
    row: u32,
    /// A tombstone: the key was deleted (shadows older rowsets).
    deleted: bool,
}

impl RowRef {
    /// True if this version is a deletion.
    pub fn is_deleted(&self) -> bool {
        self.deleted
    }
}

/// What a lookup in one layer found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// The newest version in this layer is a live row.
    Live,
    /// The newest version in this layer is a tombstone.
    Deleted,
    /// This layer knows nothing of the key; ask an older one.
    Unknown,
}

/// The sorted map from encoded key to newest version. Keys of at most 8 fixed bytes (integer
/// and timestamp keys) live in a `u64`-keyed map: no allocation per key, one-instruction
/// comparisons; the byte order of such keys equals the numeric order of their big-endian value.
#[derive(Debug)]
enum KeyIndex {
    Short {
        width: usize,
        map: BTreeMap<u64, RowRef>,
    },
    Long(BTreeMap<Box<[u8]>, RowRef>),
}

impl KeyIndex {
    #[inline]
    fn short(width: usize, key: &[u8]) -> u64 {
        debug_assert_eq!(key.len(), width, "fixed-width keys");
        let mut bytes = [0u8; 8];
        bytes[..width].copy_from_slice(key);
        u64::from_be_bytes(bytes)
    }

    fn len(&self) -> usize {
        match self {
            KeyIndex::Short { map, .. } => map.len(),
            KeyIndex::Long(map) => map.len(),
        }
    }

    fn get(&self, key: &[u8]) -> Option<&RowRef> {
        match self {
            KeyIndex::Short { width, map } => map.get(&Self::short(*width, key)),
            KeyIndex::Long(map) => map.get(key),
        }
    }

    /// Inserts or replaces; true if the key is new.
    #[inline]
    fn insert(&mut self, key: &[u8], entry: RowRef) -> bool {
        match self {
            KeyIndex::Short { width, map } => map.insert(Self::short(*width, key), entry).is_none(),
            // A repeated key keeps its boxed copy and drops the new one.
            KeyIndex::Long(map) => map.insert(key.into(), entry).is_none(),
        }
    }

    fn key_range(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        match self {
            KeyIndex::Short { width, map } => {
                let first = map.first_key_value()?.0.to_be_bytes()[..*width].to_vec();
                let last = map.last_key_value()?.0.to_be_bytes()[..*width].to_vec();
                Some((first, last))
            }
            KeyIndex::Long(map) => Some((
                map.first_key_value()?.0.to_vec(),
                map.last_key_value()?.0.to_vec(),
            )),
        }
    }

    /// Entries with keys in `[lower, upper)`, in key order.
    fn range<'a>(
        &'a self,
        lower: Option<&[u8]>,
        upper: Option<&[u8]>,
    ) -> Box<dyn Iterator<Item = RowRef> + 'a> {
        match self {
            KeyIndex::Short { width, map } => {
                let range = (
                    lower.map_or(Bound::Unbounded, |l| {
                        Bound::Included(Self::short(*width, l))
                    }),
                    upper.map_or(Bound::Unbounded, |u| {
                        Bound::Excluded(Self::short(*width, u))
                    }),
                );
                Box::new(map.range(range).map(|(_, r)| *r))
            }
            KeyIndex::Long(map) => {
                let range = (
                    lower.map_or(Bound::Unbounded, Bound::Included),
                    upper.map_or(Bound::Unbounded, Bound::Excluded),
                );
                Box::new(map.range::<[u8], _>(range).map(|(_, r)| *r))
            }
        }
    }
}

/// Rows applied since the last flush, sorted by key.
#[derive(Debug)]
pub struct MemRowSet {
    /// Batches as validated by `OpBatch` (storage schema); never mutated after push.
    batches: Vec<RecordBatch>,
    index: KeyIndex,
    /// Approximate bytes held (batches + keys + index nodes), for the flush threshold.
    bytes: usize,
    /// Highest op index applied into this MemRowSet (0 if none).
    last_op_index: OpIndex,
}

/// Estimated bytes of one index entry beyond its key (node overhead, `RowRef`, `Box`).
const INDEX_ENTRY_BYTES: usize = 48;

impl MemRowSet {
    /// An empty MemRowSet; `fixed_key_width` is the encoded key length when every key has
    /// the same length of at most 8 bytes (see `Schema::fixed_key_width`).
    pub fn new(fixed_key_width: Option<usize>) -> Self {
        let index = match fixed_key_width {
            Some(width) if (1..=8).contains(&width) => KeyIndex::Short {
                width,
                map: BTreeMap::new(),
            },
            _ => KeyIndex::Long(BTreeMap::new()),
        };
        MemRowSet {
            batches: Vec::new(),
            index,
            bytes: 0,
            last_op_index: 0,
        }
    }

    /// An empty MemRowSet with the same key layout.
    pub fn empty_like(&self) -> Self {
        MemRowSet::new(match &self.index {
            KeyIndex::Short { width, .. } => Some(*width),
            KeyIndex::Long(_) => None,
        })
    }

    /// The number of distinct keys (live rows and tombstones).
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True if nothing was applied.
    pub fn is_empty(&self) -> bool {
        self.index.len() == 0
    }

    /// Approximate memory held, in bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Highest op index applied here.
    pub fn last_op_index(&self) -> OpIndex {
        self.last_op_index
    }

    /// The newest version of `key` in this MemRowSet.
    pub fn presence(&self, key: &[u8]) -> Presence {
        match self.index.get(key) {
            Some(r) if r.deleted => Presence::Deleted,
            Some(_) => Presence::Live,
            None => Presence::Unknown,
        }
    }

    /// The smallest and largest key held.
    pub fn key_range(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        self.index.key_range()
    }

    /// Adds `batch` so its rows can be referenced; returns its number.
    pub(crate) fn push_batch(&mut self, batch: &OpBatch, op_index: OpIndex) -> Result<u32> {
        let number = u32::try_from(self.batches.len())
            .map_err(|_| StorageError::IllegalState("MemRowSet holds too many batches".into()))?;
        self.bytes += batch.held_bytes;
        self.batches.push(batch.rows.clone());
        debug_assert!(op_index > self.last_op_index);
        self.last_op_index = op_index;
        Ok(number)
    }

    /// Records `key` -> (batch, row) as the newest version.
    #[inline]
    pub(crate) fn put(&mut self, key: &[u8], batch: u32, row: usize, op: OpType) {
        let entry = RowRef {
            batch,
            row: row as u32,
            deleted: op.is_delete(),
        };
        if self.index.insert(key, entry) {
            self.bytes += key.len() + INDEX_ENTRY_BYTES;
        }
    }

    /// The rows whose keys fall in `[lower, upper)`, in key order, as batches of at most
    /// `chunk_rows` rows holding the columns at `columns` (positions in the storage schema)
    /// followed by the `__deleted` flag.
    pub fn sorted_batches(
        &self,
        columns: &[usize],
        lower: Option<&[u8]>,
        upper: Option<&[u8]>,
        chunk_rows: usize,
    ) -> Result<Vec<RecordBatch>> {
        let Some(first) = self.batches.first() else {
            return Ok(Vec::new());
        };
        let schema = first.schema();
        let mut fields: Vec<Field> = columns.iter().map(|c| schema.field(*c).clone()).collect();
        fields.push(Field::new(
            DELETED_COLUMN,
            arrow::datatypes::DataType::Boolean,
            false,
        ));
        let out_schema = Arc::new(ArrowSchema::new(fields));
        if let (Some(l), Some(u)) = (lower, upper) {
            if l >= u {
                return Ok(Vec::new());
            }
        }
        let sources: Vec<Vec<&dyn Array>> = columns
            .iter()
            .map(|c| self.batches.iter().map(|b| b.column(*c).as_ref()).collect())
            .collect();
        let mut out = Vec::new();
        let mut picks: Vec<(usize, usize)> = Vec::with_capacity(chunk_rows);
        let mut deleted: Vec<bool> = Vec::with_capacity(chunk_rows);
        let mut entries = self.index.range(lower, upper).peekable();
        while entries.peek().is_some() {
            picks.clear();
            deleted.clear();
            for r in entries.by_ref().take(chunk_rows) {
                picks.push((r.batch as usize, r.row as usize));
                deleted.push(r.deleted);
            }
            let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len() + 1);
            for source in &sources {
                arrays.push(
                    interleave(source, &picks)
                        .map_err(|e| StorageError::arrow_internal("MemRowSet gather", e))?,
                );
            }
            arrays.push(Arc::new(BooleanArray::from(deleted.clone())));
            out.push(
                RecordBatch::try_new(out_schema.clone(), arrays)
                    .map_err(|e| StorageError::arrow_internal("MemRowSet gather", e))?,
            );
        }
        Ok(out)
    }
}
