//! The MemRowSet: the in-memory, key-sorted home of rows applied since the last flush.
//!
//! Rows stay in the Arrow batches they arrived in (no per-row copy or allocation of values);
//! a key index (`key_index`) from the memcomparable key to the newest (batch, row) keeps them
//! in key order.
//! A MemRowSet is mutated only by apply; flush freezes it (moves it behind an `Arc`) and
//! writes it out while a fresh one takes new writes.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch};
use arrow::compute::interleave;
use arrow::datatypes::{Field, Schema as ArrowSchema};

use crate::error::{Result, StorageError};
use crate::ops::{OpBatch, OpType, RowStatus};
use nyala_common::OpIndex;

mod key_index;

use key_index::{KeyIndex, Slot};

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
        MemRowSet {
            batches: Vec::new(),
            index: KeyIndex::new(fixed_key_width),
            bytes: 0,
            last_op_index: 0,
        }
    }

    /// An empty MemRowSet with the same key layout.
    pub fn empty_like(&self) -> Self {
        MemRowSet::new(self.index.fixed_width())
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

    /// Applies `batch` as op `op_index` and returns each row's status. Each op sees the newest
    /// version of its key: this MemRowSet's (which includes the batch's earlier rows), or, only
    /// when this MemRowSet does not know the key and the op depends on it, `older_live(key)`
    /// (the older layers' answer). One index lookup per row decides and writes; a row the
    /// batch refused (`OpBatch::refused`) keeps its status and is not written. All or
    /// nothing: if `older_live` fails, the rows already applied are rolled back and the error
    /// is returned.
    pub(crate) fn apply(
        &mut self,
        batch: &OpBatch,
        op_index: OpIndex,
        mut older_live: impl FnMut(&[u8]) -> Result<bool>,
    ) -> Result<Vec<RowStatus>> {
        let number = u32::try_from(self.batches.len())
            .map_err(|_| StorageError::IllegalState("MemRowSet holds too many batches".into()))?;
        debug_assert!(op_index > self.last_op_index);
        let mut added_bytes = 0;
        // Only an op that asks the older layers can fail. Without one nothing needs undoing
        // and nothing needs deciding: a plain insert-or-replace per row.
        let refused = batch.refused.as_deref();
        let is_refused = |row: usize| refused.is_some_and(|r| r[row] != RowStatus::Ok);
        if batch.ops.iter().all(|op| *op == OpType::Upsert) {
            for row in 0..batch.len() {
                if is_refused(row) {
                    continue;
                }
                let key = batch.keys.get(row);
                let entry = RowRef {
                    batch: number,
                    row: row as u32,
                    deleted: false,
                };
                if self.index.insert(key, entry) {
                    added_bytes += key.len() + INDEX_ENTRY_BYTES;
                }
            }
            self.finish_apply(batch, op_index, added_bytes);
            return Ok(refused.map_or_else(|| vec![RowStatus::Ok; batch.len()], <[_]>::to_vec));
        }
        let mut undo: Vec<(usize, RowRef)> = Vec::new();
        let mut statuses = Vec::with_capacity(batch.len());
        for (row, op) in batch.ops.iter().enumerate() {
            if let Some(status) = refused.map(|r| r[row]).filter(|s| *s != RowStatus::Ok) {
                statuses.push(status);
                continue;
            }
            let key = batch.keys.get(row);
            let mut status = RowStatus::Ok;
            let slot = self.index.update(key, |current| {
                let live = match current {
                    Some(found) => !found.deleted,
                    None if *op == OpType::Upsert => false,
                    None => older_live(key)?,
                };
                let (decided, write) = decide(*op, live);
                status = decided;
                Ok(write.then_some(RowRef {
                    batch: number,
                    row: row as u32,
                    deleted: op.is_delete(),
                }))
            });
            match slot {
                Ok(Slot::Inserted) => added_bytes += key.len() + INDEX_ENTRY_BYTES,
                // The first write of this batch over an older version: remember it for undo.
                Ok(Slot::Replaced(old)) if old.batch != number => undo.push((row, old)),
                Ok(_) => {}
                Err(e) => {
                    self.roll_back(batch, row, number, undo);
                    return Err(e);
                }
            }
            statuses.push(status);
        }
        self.finish_apply(batch, op_index, added_bytes);
        Ok(statuses)
    }

    /// Keeps the applied batch's rows (the index now points into them).
    fn finish_apply(&mut self, batch: &OpBatch, op_index: OpIndex, added_bytes: usize) {
        self.bytes += added_bytes + batch.held_bytes;
        self.batches.push(batch.rows.clone());
        self.last_op_index = op_index;
    }

    /// Undoes the first `applied` rows of `batch` (number `number`): every key now written by
    /// the batch goes, then the versions it replaced come back.
    fn roll_back(
        &mut self,
        batch: &OpBatch,
        applied: usize,
        number: u32,
        undo: Vec<(usize, RowRef)>,
    ) {
        for row in 0..applied {
            let key = batch.keys.get(row);
            if self.index.get(key).is_some_and(|r| r.batch == number) {
                self.index.remove(key);
            }
        }
        for (row, old) in undo {
            self.index.insert(batch.keys.get(row), old);
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
        self.rows_in(columns, lower, upper)
            .into_chunks(chunk_rows)
            .collect()
    }

    /// Where the rows whose keys fall in `[lower, upper)` are, in key order: one pass over
    /// the index and a clone of the batch handles, no column values copied. Batches are never
    /// mutated after they are pushed, so the result stays valid (and keeps those batches
    /// alive) while this MemRowSet takes more writes.
    pub fn rows_in(
        &self,
        columns: &[usize],
        lower: Option<&[u8]>,
        upper: Option<&[u8]>,
    ) -> MemRows {
        let empty = lower.zip(upper).is_some_and(|(l, u)| l >= u);
        let refs: Vec<RowRef> = if empty || self.batches.is_empty() {
            Vec::new()
        } else {
            self.index.collect_range(lower, upper)
        };
        let schema = self.batches.first().map(|first| {
            let schema = first.schema();
            let mut fields: Vec<Field> = columns.iter().map(|c| schema.field(*c).clone()).collect();
            fields.push(Field::new(
                DELETED_COLUMN,
                arrow::datatypes::DataType::Boolean,
                false,
            ));
            Arc::new(ArrowSchema::new(fields))
        });
        MemRows {
            columns: self
                .batches
                .iter()
                .map(|b| columns.iter().map(|c| b.column(*c).clone()).collect())
                .collect(),
            refs,
            schema,
        }
    }
}

/// Rows of a MemRowSet at one moment, in key order (`MemRowSet::rows_in`): the column arrays
/// of the batches they live in and each row's place. Their values are gathered chunk by
/// chunk when asked for.
#[derive(Debug)]
pub struct MemRows {
    /// Per batch, the chosen columns.
    columns: Vec<Vec<ArrayRef>>,
    refs: Vec<RowRef>,
    /// The chosen columns and `__deleted` (None if the MemRowSet held no batch).
    schema: Option<Arc<ArrowSchema>>,
}

impl MemRows {
    /// The number of rows (live and tombstones).
    pub fn len(&self) -> usize {
        self.refs.len()
    }

    /// True if there are no rows.
    pub fn is_empty(&self) -> bool {
        self.refs.is_empty()
    }

    /// The rows as batches of at most `chunk_rows` rows, gathered as they are pulled.
    pub fn into_chunks(
        self,
        chunk_rows: usize,
    ) -> impl Iterator<Item = Result<RecordBatch>> + Send + 'static {
        let chunk_rows = chunk_rows.max(1);
        let starts = (0..self.refs.len()).step_by(chunk_rows);
        starts.map(move |start| self.chunk(start, (start + chunk_rows).min(self.refs.len())))
    }

    fn chunk(&self, start: usize, end: usize) -> Result<RecordBatch> {
        let schema = self.schema.clone().expect("rows have a schema");
        let refs = &self.refs[start..end];
        let picks: Vec<(usize, usize)> = refs
            .iter()
            .map(|r| (r.batch as usize, r.row as usize))
            .collect();
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
        for c in 0..schema.fields().len() - 1 {
            let sources: Vec<&dyn Array> = self.columns.iter().map(|b| b[c].as_ref()).collect();
            arrays.push(
                interleave(&sources, &picks)
                    .map_err(|e| StorageError::arrow_internal("MemRowSet gather", e))?,
            );
        }
        arrays.push(Arc::new(BooleanArray::from_iter(
            refs.iter().map(|r| Some(r.deleted)),
        )));
        RecordBatch::try_new(schema, arrays)
            .map_err(|e| StorageError::arrow_internal("MemRowSet gather", e))
    }
}

/// What an op does given whether its key is live: (status, whether to write the row).
fn decide(op: OpType, live: bool) -> (RowStatus, bool) {
    match (op, live) {
        (OpType::Upsert, _) => (RowStatus::Ok, true),
        (OpType::Insert, true) => (RowStatus::AlreadyPresent, false),
        (OpType::InsertIgnore, true) => (RowStatus::Ok, false),
        (OpType::Insert | OpType::InsertIgnore, false) => (RowStatus::Ok, true),
        (OpType::Update | OpType::Delete, false) => (RowStatus::NotFound, false),
        (OpType::UpdateIgnore | OpType::DeleteIgnore, false) => (RowStatus::Ok, false),
        (OpType::Update | OpType::UpdateIgnore | OpType::Delete | OpType::DeleteIgnore, true) => {
            (RowStatus::Ok, true)
        }
    }
}
