//! The MemRowSet: the in-memory, key-sorted home of rows applied since the last flush.
//!
//! Rows stay in the Arrow batches they arrived in (no per-row copy or allocation of values);
//! a key index (`key_index`) from the memcomparable key to the newest (batch, row) keeps them
//! in key order.
//! A MemRowSet is mutated only by apply; flush freezes it (moves it behind an `Arc`) and
//! writes it out while a fresh one takes new writes.
//!
//! Row versions (MVCC): every batch has one commit timestamp. The index points at each key's
//! newest version; the versions it replaced (with an older timestamp) stay in `history`,
//! keyed by the newest version's place, so latest reads never look at them and snapshot reads
//! and flush look only for keys flagged `has_history`.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, UInt64Array};
use arrow::compute::interleave;
use arrow::datatypes::{Field, Schema as ArrowSchema};

use crate::error::{Result, StorageError};
use crate::ops::{OpBatch, OpType, RowStatus};
use nyala_common::OpIndex;

mod key_index;

use key_index::{KeyIndex, Slot};

/// Name of the tombstone flag column in sorted outputs and rowset files.
pub const DELETED_COLUMN: &str = "__deleted";
/// Name of the commit timestamp column of row versions (flush output and rowset files).
pub const TS_COLUMN: &str = "__ts";

/// Where a version of a key lives in the MemRowSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowRef {
    batch: u32,
    row: u32,
    /// A tombstone: the key was deleted (shadows older rowsets).
    deleted: bool,
    /// Older versions of the key are kept in `MemRowSet::history` under this version's place
    /// (meaningful on the newest version only).
    has_history: bool,
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
    /// Commit timestamp of each batch; never decreases (one batch = one WRITE entry).
    batch_ts: Vec<u64>,
    index: KeyIndex,
    /// Per key with `has_history`, keyed by its newest version's (batch, row): the versions
    /// it replaced, oldest first, each with a strictly older timestamp than the next.
    history: HashMap<(u32, u32), Vec<RowRef>>,
    /// Approximate bytes held (batches + keys + index nodes), for the flush threshold.
    bytes: usize,
    /// Highest op index applied into this MemRowSet (0 if none).
    last_op_index: OpIndex,
}

/// Estimated bytes of one index entry beyond its key (node overhead, `RowRef`, `Box`).
const INDEX_ENTRY_BYTES: usize = 48;
/// Estimated bytes of one kept older version.
const HISTORY_ENTRY_BYTES: usize = 16;

impl MemRowSet {
    /// An empty MemRowSet; `fixed_key_width` is the encoded key length when every key has
    /// the same length of at most 8 bytes (see `Schema::fixed_key_width`).
    pub fn new(fixed_key_width: Option<usize>) -> Self {
        MemRowSet {
            batches: Vec::new(),
            batch_ts: Vec::new(),
            index: KeyIndex::new(fixed_key_width),
            history: HashMap::new(),
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

    /// The newest commit timestamp applied here (0 if none).
    pub fn max_ts(&self) -> u64 {
        self.batch_ts.last().copied().unwrap_or(0)
    }

    /// The version of `r`'s key visible at `ts`: the newest with a timestamp <= `ts`.
    fn visible_at(&self, r: RowRef, ts: u64) -> Option<RowRef> {
        if self.batch_ts[r.batch as usize] <= ts {
            return Some(r);
        }
        if !r.has_history {
            return None;
        }
        self.history[&(r.batch, r.row)]
            .iter()
            .rev()
            .find(|v| self.batch_ts[v.batch as usize] <= ts)
            .copied()
    }

    /// Moves the key's older versions from `old`'s place to (`number`, `row`), after `old`
    /// itself when it becomes history (`keep_old`); returns the bytes added.
    fn move_history(&mut self, old: RowRef, number: u32, row: u32, keep_old: bool) -> usize {
        if !old.has_history && !keep_old {
            return 0;
        }
        let mut older = if old.has_history {
            self.history
                .remove(&(old.batch, old.row))
                .expect("has_history has an entry")
        } else {
            Vec::new()
        };
        if keep_old {
            older.push(RowRef {
                has_history: false,
                ..old
            });
        }
        self.history.insert((number, row), older);
        if keep_old {
            HISTORY_ENTRY_BYTES
        } else {
            0
        }
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

    /// Applies `batch` as op `op_index`, committed at `timestamp` (not below any earlier
    /// batch's), and returns each row's status. Each op sees the newest
    /// version of its key: this MemRowSet's (which includes the batch's earlier rows), or, only
    /// when this MemRowSet does not know the key and the op depends on it, `older_live(key)`
    /// (the older layers' answer). One index lookup per row decides and writes; a row the
    /// batch refused (`OpBatch::refused`) keeps its status and is not written. A version
    /// replaced by one with a newer timestamp is kept as history (one with the same timestamp
    /// is invisible to every snapshot and goes). All or
    /// nothing: if `older_live` fails, the rows already applied are rolled back and the error
    /// is returned.
    pub(crate) fn apply(
        &mut self,
        batch: &OpBatch,
        op_index: OpIndex,
        timestamp: u64,
        mut older_live: impl FnMut(&[u8]) -> Result<bool>,
    ) -> Result<Vec<RowStatus>> {
        let number = u32::try_from(self.batches.len())
            .map_err(|_| StorageError::IllegalState("MemRowSet holds too many batches".into()))?;
        debug_assert!(op_index > self.last_op_index);
        assert!(timestamp >= self.max_ts(), "timestamps never decrease");
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
                    has_history: false,
                };
                match self.index.replace(key, entry) {
                    None => added_bytes += key.len() + INDEX_ENTRY_BYTES,
                    Some(old) => {
                        let keep_old = self.keeps(old, number, timestamp);
                        if old.has_history || keep_old {
                            added_bytes += self.move_history(old, number, row as u32, keep_old);
                            self.index.replace(
                                key,
                                RowRef {
                                    has_history: true,
                                    ..entry
                                },
                            );
                        }
                    }
                }
            }
            self.finish_apply(batch, op_index, timestamp, added_bytes);
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
            let batch_ts = &self.batch_ts;
            let slot = self.index.update(key, |current| {
                let live = match current {
                    Some(found) => !found.deleted,
                    None if *op == OpType::Upsert => false,
                    None => older_live(key)?,
                };
                let (decided, write) = decide(*op, live);
                status = decided;
                let has_history = current.is_some_and(|c| {
                    c.has_history || (c.batch != number && batch_ts[c.batch as usize] != timestamp)
                });
                Ok(write.then_some(RowRef {
                    batch: number,
                    row: row as u32,
                    deleted: op.is_delete(),
                    has_history,
                }))
            });
            match slot {
                Ok(Slot::Inserted) => added_bytes += key.len() + INDEX_ENTRY_BYTES,
                Ok(Slot::Replaced(old)) => {
                    // The first write of this batch over an older version: remember it for undo.
                    if old.batch != number {
                        undo.push((row, old));
                    }
                    let keep_old = self.keeps(old, number, timestamp);
                    added_bytes += self.move_history(old, number, row as u32, keep_old);
                }
                Ok(Slot::Unchanged) => {}
                Err(e) => {
                    self.roll_back(batch, row, number, timestamp, undo);
                    return Err(e);
                }
            }
            statuses.push(status);
        }
        self.finish_apply(batch, op_index, timestamp, added_bytes);
        Ok(statuses)
    }

    /// Whether `old`, replaced by a row of batch `number` committed at `timestamp`, stays as
    /// history: only a version of an earlier batch with an older timestamp can be seen by a
    /// snapshot that does not see its replacement.
    fn keeps(&self, old: RowRef, number: u32, timestamp: u64) -> bool {
        old.batch != number && self.batch_ts[old.batch as usize] != timestamp
    }

    /// Keeps the applied batch's rows (the index now points into them).
    fn finish_apply(
        &mut self,
        batch: &OpBatch,
        op_index: OpIndex,
        timestamp: u64,
        added_bytes: usize,
    ) {
        self.bytes += added_bytes + batch.held_bytes;
        self.batches.push(batch.rows.clone());
        self.batch_ts.push(timestamp);
        self.last_op_index = op_index;
    }

    /// Undoes the first `applied` rows of `batch` (number `number`, committed at
    /// `timestamp`): every key now written by the batch goes, then the versions it replaced
    /// come back with their history.
    fn roll_back(
        &mut self,
        batch: &OpBatch,
        applied: usize,
        number: u32,
        timestamp: u64,
        undo: Vec<(usize, RowRef)>,
    ) {
        let mut taken: HashMap<Vec<u8>, Vec<RowRef>> = HashMap::new();
        for row in 0..applied {
            let key = batch.keys.get(row);
            let Some(current) = self.index.get(key).copied() else {
                continue;
            };
            if current.batch != number {
                continue;
            }
            if current.has_history {
                let older = self
                    .history
                    .remove(&(current.batch, current.row))
                    .expect("has_history has an entry");
                taken.insert(key.to_vec(), older);
            }
            self.index.remove(key);
        }
        for (row, old) in undo {
            let key = batch.keys.get(row);
            let mut older = taken.remove(key).unwrap_or_default();
            if self.keeps(old, number, timestamp) {
                older.pop();
            }
            if !older.is_empty() {
                self.history.insert((old.batch, old.row), older);
            }
            self.index.insert(key, old);
        }
    }

    /// The rows whose keys fall in `[lower, upper)`, in key order, as batches of at most
    /// `chunk_rows` rows holding the columns at `columns` (positions in the storage schema)
    /// followed by the `__deleted` flag.
    /// The version visible at `snapshot_ts` of each key (None: the newest).
    pub fn sorted_batches(
        &self,
        columns: &[usize],
        lower: Option<&[u8]>,
        upper: Option<&[u8]>,
        chunk_rows: usize,
        snapshot_ts: Option<u64>,
    ) -> Result<Vec<RecordBatch>> {
        self.rows_in(columns, lower, upper, snapshot_ts)
            .into_chunks(chunk_rows)
            .collect()
    }

    /// Every kept version of every key, in (key ascending, timestamp descending) order, as
    /// `rows_in` does it plus a `__ts` column before `__deleted` (what flush writes). With
    /// `drop_oldest_tombstones` (nothing older exists on disk) a key's oldest versions that are
    /// tombstones are left out: they shadow nothing at any timestamp.
    pub fn all_versions(&self, columns: &[usize], drop_oldest_tombstones: bool) -> MemRows {
        let mut refs = Vec::with_capacity(self.index.len());
        for r in self.index.range(None, None) {
            let start = refs.len();
            refs.push(r);
            if r.has_history {
                refs.extend(self.history[&(r.batch, r.row)].iter().rev().copied());
            }
            while drop_oldest_tombstones && refs.len() > start && refs[refs.len() - 1].deleted {
                refs.pop();
            }
        }
        let mut rows = self.rows_of(columns, refs, true);
        rows.ts = Some(self.batch_ts.clone());
        rows
    }

    /// Where the rows whose keys fall in `[lower, upper)` are, in key order: one pass over
    /// the index and a clone of the batch handles, no column values copied. Batches are never
    /// mutated after they are pushed, so the result stays valid (and keeps those batches
    /// alive) while this MemRowSet takes more writes. With `snapshot_ts`, each key's version
    /// visible at that timestamp (keys with none are left out); otherwise the newest.
    pub fn rows_in(
        &self,
        columns: &[usize],
        lower: Option<&[u8]>,
        upper: Option<&[u8]>,
        snapshot_ts: Option<u64>,
    ) -> MemRows {
        let empty = lower.zip(upper).is_some_and(|(l, u)| l >= u);
        let refs: Vec<RowRef> = if empty || self.batches.is_empty() {
            Vec::new()
        } else {
            match snapshot_ts.filter(|ts| *ts < self.max_ts()) {
                // Every version here is visible: the newest wins, as for a latest read.
                None => self.index.collect_range(lower, upper),
                Some(ts) => self
                    .index
                    .range(lower, upper)
                    .filter_map(|r| self.visible_at(r, ts))
                    .collect(),
            }
        };
        self.rows_of(columns, refs, false)
    }

    fn rows_of(&self, columns: &[usize], refs: Vec<RowRef>, with_ts: bool) -> MemRows {
        let schema = self.batches.first().map(|first| {
            let schema = first.schema();
            let mut fields: Vec<Field> = columns.iter().map(|c| schema.field(*c).clone()).collect();
            if with_ts {
                fields.push(Field::new(
                    TS_COLUMN,
                    arrow::datatypes::DataType::UInt64,
                    false,
                ));
            }
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
            ts: None,
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
    /// The chosen columns, `__ts` if `ts` is set, and `__deleted` (None if the MemRowSet
    /// held no batch).
    schema: Option<Arc<ArrowSchema>>,
    /// Each batch's commit timestamp, when the rows carry a `__ts` column.
    ts: Option<Vec<u64>>,
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
        let gathered = schema.fields().len() - 1 - usize::from(self.ts.is_some());
        for c in 0..gathered {
            let sources: Vec<&dyn Array> = self.columns.iter().map(|b| b[c].as_ref()).collect();
            arrays.push(
                interleave(&sources, &picks)
                    .map_err(|e| StorageError::arrow_internal("MemRowSet gather", e))?,
            );
        }
        if let Some(ts) = &self.ts {
            arrays.push(Arc::new(UInt64Array::from_iter_values(
                refs.iter().map(|r| ts[r.batch as usize]),
            )));
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
