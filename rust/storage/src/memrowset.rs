//! The MemRowSet: the in-memory, key-sorted home of rows applied since the last flush.
//!
//! Rows stay in the Arrow batches they arrived in (no per-row copy or allocation of values);
//! a key index (`key_index`) from the memcomparable key to the newest (batch, row) keeps them
//! in key order.
//! A MemRowSet is mutated only by apply; flush freezes it (moves it behind an `Arc`) and
//! writes it out while a fresh one takes new writes.
//!
//! Row versions (MVCC): every batch has one commit timestamp. The index points at each key's
//! newest version; the versions it replaced (with an older timestamp) stay in `history`, an
//! append-only arena where each version links to the next older one (as Kudu's MemRowSet
//! chains a row's mutations), so latest reads never look at them, snapshot reads and flush
//! follow only the chains of keys that have one, and keeping a version costs one push.

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
    /// Where the next older kept version of the key is in `MemRowSet::history` (`NO_HISTORY`:
    /// none). Chains only point at older entries, and entries are never changed once pushed.
    older: u32,
}

/// `RowRef::older` of a version with no older version kept.
const NO_HISTORY: u32 = u32::MAX;

impl RowRef {
    /// True if this version is a deletion.
    pub fn is_deleted(&self) -> bool {
        self.deleted
    }

    /// True if older versions of the key are kept behind this one.
    fn has_history(&self) -> bool {
        self.older != NO_HISTORY
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
    /// Kept older versions, each linking (`RowRef::older`) to the next older one of its key,
    /// which has a strictly older timestamp. Append-only (an apply that fails truncates what
    /// it pushed); fewer than `NO_HISTORY` entries.
    history: Vec<RowRef>,
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
            history: Vec::new(),
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
        self.older_versions(r)
            .find(|v| self.batch_ts[v.batch as usize] <= ts)
    }

    /// The versions kept behind `r`, newest first.
    fn older_versions(&self, r: RowRef) -> impl Iterator<Item = RowRef> + '_ {
        std::iter::successors(
            r.has_history().then(|| self.history[r.older as usize]),
            |v| v.has_history().then(|| self.history[v.older as usize]),
        )
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
        let history_before = self.history.len();
        if history_before + batch.len() >= NO_HISTORY as usize {
            return Err(StorageError::IllegalState(
                "MemRowSet holds too many row versions".into(),
            ));
        }
        debug_assert!(op_index > self.last_op_index);
        assert!(timestamp >= self.max_ts(), "timestamps never decrease");
        let mut added_bytes = 0;
        let batch_ts = &self.batch_ts;
        let history = &mut self.history;
        // Only an op that asks the older layers can fail. Without one nothing needs undoing
        // and nothing needs deciding: a plain insert-or-replace per row, one index lookup.
        let refused = batch.refused.as_deref();
        let is_refused = |row: usize| refused.is_some_and(|r| r[row] != RowStatus::Ok);
        if batch.ops.iter().all(|op| *op == OpType::Upsert) {
            for row in 0..batch.len() {
                if is_refused(row) {
                    continue;
                }
                let key = batch.keys.get(row);
                let slot = self.index.update(key, |current| {
                    Ok::<_, std::convert::Infallible>(Some(RowRef {
                        batch: number,
                        row: row as u32,
                        deleted: false,
                        older: current.map_or(NO_HISTORY, |old| {
                            link_older(history, batch_ts, old, number, timestamp)
                        }),
                    }))
                });
                if let Ok(Slot::Inserted) = slot {
                    added_bytes += key.len() + INDEX_ENTRY_BYTES;
                }
            }
            added_bytes += (self.history.len() - history_before) * HISTORY_ENTRY_BYTES;
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
            let slot = self.index.update(key, |current| {
                let live = match current {
                    Some(found) => !found.deleted,
                    None if *op == OpType::Upsert => false,
                    None => older_live(key)?,
                };
                let (decided, write) = decide(*op, live);
                status = decided;
                Ok(write.then(|| RowRef {
                    batch: number,
                    row: row as u32,
                    deleted: op.is_delete(),
                    older: current.map_or(NO_HISTORY, |old| {
                        link_older(history, batch_ts, old, number, timestamp)
                    }),
                }))
            });
            match slot {
                Ok(Slot::Inserted) => added_bytes += key.len() + INDEX_ENTRY_BYTES,
                // The first write of this batch over an older version: remember it for undo.
                Ok(Slot::Replaced(old)) if old.batch != number => undo.push((row, old)),
                Ok(Slot::Replaced(_) | Slot::Unchanged) => {}
                Err(e) => {
                    self.roll_back(batch, row, number, history_before, undo);
                    return Err(e);
                }
            }
            statuses.push(status);
        }
        added_bytes += (self.history.len() - history_before) * HISTORY_ENTRY_BYTES;
        self.finish_apply(batch, op_index, timestamp, added_bytes);
        Ok(statuses)
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

    /// Undoes the first `applied` rows of `batch` (number `number`): every key now written by
    /// the batch goes, then the versions it replaced come back (their chains of older versions
    /// were never changed), and the versions the batch pushed to `history` (at
    /// `history_before` and after) are dropped.
    fn roll_back(
        &mut self,
        batch: &OpBatch,
        applied: usize,
        number: u32,
        history_before: usize,
        undo: Vec<(usize, RowRef)>,
    ) {
        for row in 0..applied {
            let key = batch.keys.get(row);
            if self
                .index
                .get(key)
                .is_some_and(|current| current.batch == number)
            {
                self.index.remove(key);
            }
        }
        for (row, old) in undo {
            self.index.insert(batch.keys.get(row), old);
        }
        self.history.truncate(history_before);
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
            refs.extend(self.older_versions(r));
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

/// The `older` link of the version that replaces `old` in batch `number`, committed at
/// `timestamp`: `old` itself, pushed to `history`, if a snapshot can see it without its
/// replacement (it is of an earlier batch with an older timestamp); otherwise `old`'s own link
/// (a version replaced within its batch or at its timestamp is invisible to every snapshot).
fn link_older(
    history: &mut Vec<RowRef>,
    batch_ts: &[u64],
    old: RowRef,
    number: u32,
    timestamp: u64,
) -> u32 {
    if old.batch != number && batch_ts[old.batch as usize] != timestamp {
        history.push(old);
        (history.len() - 1) as u32
    } else {
        old.older
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

#[cfg(test)]
mod tests {
    use arrow::array::{AsArray, Int64Array, UInt8Array};
    use arrow::datatypes::{DataType as ArrowType, Int64Type, UInt64Type};

    use super::*;
    use crate::ops::OP_COLUMN;
    use crate::schema::{DataType, Schema};

    /// (id, v, commit timestamp, deleted) of one version.
    type Version = (i64, Option<i64>, u64, bool);

    fn schema() -> Schema {
        let columns = vec![
            ("id".into(), DataType::Int64, false),
            ("v".into(), DataType::Int64, true),
        ];
        Schema::build(columns, &["id"]).unwrap()
    }

    fn ops(rows: &[(OpType, i64, Option<i64>)]) -> OpBatch {
        let fields = vec![
            Field::new("id", ArrowType::Int64, false),
            Field::new("v", ArrowType::Int64, true),
            Field::new(OP_COLUMN, ArrowType::UInt8, false),
        ];
        let columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
            Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2))),
            Arc::new(UInt8Array::from_iter_values(rows.iter().map(|r| r.0 as u8))),
        ];
        let batch = RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns).unwrap();
        OpBatch::from_record_batch(&batch, &schema()).unwrap()
    }

    fn apply(m: &mut MemRowSet, op: OpIndex, ts: u64, rows: &[(OpType, i64, Option<i64>)]) {
        m.apply(&ops(rows), op, ts, |_| Ok(false)).unwrap();
    }

    /// Every kept version, as flush sees them.
    fn versions(m: &MemRowSet) -> Vec<Version> {
        let mut out = Vec::new();
        for chunk in m.all_versions(&[0, 1], false).into_chunks(100) {
            let chunk = chunk.unwrap();
            let ids = chunk.column(0).as_primitive::<Int64Type>();
            let v = chunk.column(1).as_primitive::<Int64Type>();
            let ts = chunk.column(2).as_primitive::<UInt64Type>();
            let deleted = chunk.column(3).as_boolean();
            for i in 0..chunk.num_rows() {
                let value = (!v.is_null(i)).then(|| v.value(i));
                out.push((ids.value(i), value, ts.value(i), deleted.value(i)));
            }
        }
        out
    }

    /// (id, v) of the rows visible at `ts`.
    fn rows_at(m: &MemRowSet, ts: u64) -> Vec<(i64, i64)> {
        let rows = m.rows_in(&[0, 1], None, None, Some(ts));
        let mut out = Vec::new();
        for chunk in rows.into_chunks(100) {
            let chunk = chunk.unwrap();
            let ids = chunk.column(0).as_primitive::<Int64Type>();
            let v = chunk.column(1).as_primitive::<Int64Type>();
            let deleted = chunk.column(2).as_boolean();
            out.extend(
                (0..chunk.num_rows())
                    .filter(|i| !deleted.value(*i))
                    .map(|i| (ids.value(i), v.value(i))),
            );
        }
        out
    }

    /// Key 1: v=1 at 10, v=2 at 20 (replaced by v=3 at 20, in a later batch), deleted at 30;
    /// key 2: v=7 at 10, then v=8 and v=9 within one batch at 30.
    fn history(m: &mut MemRowSet) {
        apply(
            m,
            1,
            10,
            &[(OpType::Upsert, 1, Some(1)), (OpType::Insert, 2, Some(7))],
        );
        apply(m, 2, 20, &[(OpType::Upsert, 1, Some(2))]);
        apply(m, 3, 20, &[(OpType::Update, 1, Some(3))]);
        let both = [(OpType::Upsert, 2, Some(8)), (OpType::Upsert, 2, Some(9))];
        apply(m, 4, 30, &[(OpType::Delete, 1, None), both[0], both[1]]);
    }

    const HISTORY: [Version; 5] = [
        (1, None, 30, true),
        (1, Some(3), 20, false),
        (1, Some(1), 10, false),
        (2, Some(9), 30, false),
        (2, Some(7), 10, false),
    ];

    #[test]
    fn versions_chain_newest_first_and_replacements_at_one_timestamp_go() {
        for upserts_only in [false, true] {
            let mut m = MemRowSet::new(Some(8));
            if upserts_only {
                // The upsert-only path: the same versions without deciding ops.
                let u = OpType::Upsert;
                apply(&mut m, 1, 10, &[(u, 1, Some(1)), (u, 2, Some(7))]);
                apply(&mut m, 2, 20, &[(u, 1, Some(2))]);
                apply(&mut m, 3, 20, &[(u, 1, Some(3))]);
                apply(&mut m, 4, 30, &[(u, 2, Some(8)), (u, 2, Some(9))]);
                let expected: Vec<Version> = [(1, Some(3), 20, false), (1, Some(1), 10, false)]
                    .into_iter()
                    .chain(HISTORY[3..].iter().copied())
                    .collect();
                assert_eq!(versions(&m), expected);
                assert_eq!(m.history.len(), 2);
            } else {
                history(&mut m);
                assert_eq!(versions(&m), HISTORY);
                assert_eq!(m.history.len(), 3);
            }
            assert_eq!(rows_at(&m, 9), vec![]);
            assert_eq!(rows_at(&m, 10), vec![(1, 1), (2, 7)]);
            assert_eq!(rows_at(&m, 25), vec![(1, 3), (2, 7)]);
        }
    }

    #[test]
    fn a_failed_apply_leaves_every_version_as_it_was() {
        let mut m = MemRowSet::new(Some(8));
        history(&mut m);
        let (bytes, kept) = (m.bytes(), m.history.len());
        // Key 1 gets a version over its tombstone (keeping it as history), key 2 is replaced
        // twice, then key 3's insert asks the older layers, which fail.
        let batch = ops(&[
            (OpType::Upsert, 1, Some(5)),
            (OpType::Upsert, 2, Some(10)),
            (OpType::Update, 2, Some(11)),
            (OpType::Insert, 3, Some(12)),
        ]);
        let failed = m.apply(&batch, 5, 40, |_| {
            Err(StorageError::IllegalState("disk".into()))
        });
        assert!(failed.is_err());
        assert_eq!(versions(&m), HISTORY);
        assert_eq!((m.bytes(), m.history.len()), (bytes, kept));
        // The next apply chains onto the restored versions.
        apply(
            &mut m,
            5,
            40,
            &[(OpType::Upsert, 1, Some(5)), (OpType::Upsert, 2, Some(10))],
        );
        let mut expected = vec![(1, Some(5), 40, false)];
        expected.extend_from_slice(&HISTORY[..3]);
        expected.push((2, Some(10), 40, false));
        expected.extend_from_slice(&HISTORY[3..]);
        assert_eq!(versions(&m), expected);
        assert_eq!(rows_at(&m, 35), vec![(2, 9)]);
    }
}
