//! Diff scans (Kudu's incremental scan): what changed in a tablet between two snapshots.
//!
//! The answer is exactly the difference of the snapshots at `start_ts` and `end_ts`: per key
//! whose visible row differs, its row at `end_ts`, or, for a key present at `start_ts` and gone
//! at `end_ts`, the key alone flagged deleted. Both snapshots are read (bounds pushed down) and
//! compared row by row in key order; a key inserted and deleted within the window is in
//! neither and is not returned.

use std::sync::Arc;

use arrow::array::{new_null_array, Array, ArrayRef, BooleanArray, RecordBatch};
use arrow::compute::{concat_batches, interleave};
use arrow::datatypes::{DataType as ArrowType, Field, Schema as ArrowSchema};
use arrow::row::{RowConverter, Rows, SortField};

use crate::engine::Engine;
use crate::error::{Result, StorageError};
use crate::key::encode_keys;
use crate::predicate::and_all;
use crate::scan::{ScanPlan, ScanResult, ScanSpec};

/// The virtual column of a diff scan's output: true for a key deleted in the window.
pub const IS_DELETED_COLUMN: &str = "is_deleted";

/// Which snapshot a diff scan's output row comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pick {
    /// Row `.0` of the `end_ts` snapshot: present, changed.
    Changed(usize),
    /// Row `.0` of the `start_ts` snapshot: its key was deleted.
    Deleted(usize),
}

impl Engine {
    /// The rows whose visible version differs between the snapshots at `start_ts` and
    /// `end_ts` (see the module doc), in key order, as `spec.columns` plus `is_deleted`.
    /// `spec`'s bounds apply to keys; its predicates to a changed row's values at `end_ts`
    /// and to a deleted key's values at `start_ts`; its limit to the output rows.
    /// `spec.snapshot_ts` is ignored.
    pub fn diff_scan(&self, spec: &ScanSpec, start_ts: u64, end_ts: u64) -> Result<ScanResult> {
        if start_ts > end_ts {
            return Err(StorageError::invalid(format!(
                "diff scan start {start_ts} is after its end {end_ts}"
            )));
        }
        let schema = self.schema();
        if schema.index_of(IS_DELETED_COLUMN).is_some() {
            return Err(StorageError::invalid(format!(
                "the table has a column named {IS_DELETED_COLUMN:?}, the diff scan's flag"
            )));
        }
        let plan = ScanPlan::new(schema.clone(), spec.clone())?;
        let read = |ts: u64| -> Result<RecordBatch> {
            let full = ScanSpec {
                lower_bound: spec.lower_bound.clone(),
                upper_bound: spec.upper_bound.clone(),
                snapshot_ts: Some(ts),
                ..ScanSpec::default()
            };
            let result = self.scan(&full)?;
            concat_batches(&result.schema, &result.batches)
                .map_err(|e| StorageError::arrow_internal("diff scan", e))
        };
        let before = read(start_ts)?;
        let after = read(end_ts)?;
        let picks = diff_picks(&plan, &before, &after)?;
        build_output(&plan, &before, &after, &picks)
    }
}

/// The output rows, in key order, up to the limit.
fn diff_picks(plan: &ScanPlan, before: &RecordBatch, after: &RecordBatch) -> Result<Vec<Pick>> {
    let key_count = plan.schema.key_count();
    let keys_before = encode_keys(&before.columns()[..key_count])?;
    let keys_after = encode_keys(&after.columns()[..key_count])?;
    let fields: Vec<SortField> = before
        .schema()
        .fields()
        .iter()
        .map(|f| SortField::new(f.data_type().clone()))
        .collect();
    let converter =
        RowConverter::new(fields).map_err(|e| StorageError::arrow_internal("diff scan", e))?;
    let rows = |batch: &RecordBatch| -> Result<Rows> {
        converter
            .convert_columns(batch.columns())
            .map_err(|e| StorageError::arrow_internal("diff scan", e))
    };
    let (rows_before, rows_after) = (rows(before)?, rows(after)?);
    let (pass_before, pass_after) = (matches(plan, before)?, matches(plan, after)?);
    let limit = plan.spec.limit.unwrap_or(usize::MAX);
    let (mut i, mut j) = (0, 0);
    let mut picks = Vec::new();
    while picks.len() < limit && (i < keys_before.len() || j < keys_after.len()) {
        let order = match (i < keys_before.len(), j < keys_after.len()) {
            (true, true) => keys_before.get(i).cmp(keys_after.get(j)),
            (true, false) => std::cmp::Ordering::Less,
            _ => std::cmp::Ordering::Greater,
        };
        match order {
            std::cmp::Ordering::Less => {
                if pass_before.value(i) {
                    picks.push(Pick::Deleted(i));
                }
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                if pass_after.value(j) {
                    picks.push(Pick::Changed(j));
                }
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                if rows_before.row(i) != rows_after.row(j) && pass_after.value(j) {
                    picks.push(Pick::Changed(j));
                }
                i += 1;
                j += 1;
            }
        }
    }
    Ok(picks)
}

/// Which rows of `batch` (every column) pass the scan's predicates.
fn matches(plan: &ScanPlan, batch: &RecordBatch) -> Result<BooleanArray> {
    let masks = plan
        .spec
        .predicates
        .iter()
        .map(|p| {
            let at = plan.schema.index_of(&p.column).expect("validated");
            p.evaluate(batch.column(at).as_ref())
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(and_all(masks, batch.num_rows()))
}

/// The output batch: the chosen columns (a deleted key's non-key columns null) and
/// `is_deleted`.
fn build_output(
    plan: &ScanPlan,
    before: &RecordBatch,
    after: &RecordBatch,
    picks: &[Pick],
) -> Result<ScanResult> {
    let key_count = plan.schema.key_count();
    let indices: Vec<(usize, usize)> = picks
        .iter()
        .map(|p| match p {
            Pick::Changed(row) => (0, *row),
            Pick::Deleted(row) => (1, *row),
        })
        .collect();
    let mut fields = Vec::with_capacity(plan.output.len() + 1);
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(plan.output.len() + 1);
    for &c in &plan.output {
        let field = after.schema().field(c).clone();
        let gone: ArrayRef = if c < key_count {
            before.column(c).clone()
        } else {
            new_null_array(field.data_type(), before.num_rows())
        };
        let sources: [&dyn Array; 2] = [after.column(c).as_ref(), gone.as_ref()];
        arrays.push(
            interleave(&sources, &indices)
                .map_err(|e| StorageError::arrow_internal("diff scan", e))?,
        );
        fields.push(if c < key_count {
            field
        } else {
            field.with_nullable(true)
        });
    }
    fields.push(Field::new(IS_DELETED_COLUMN, ArrowType::Boolean, false));
    arrays.push(Arc::new(BooleanArray::from_iter(
        picks.iter().map(|p| Some(matches!(p, Pick::Deleted(_)))),
    )));
    let schema = Arc::new(ArrowSchema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), arrays)
        .map_err(|e| StorageError::arrow_internal("diff scan", e))?;
    Ok(ScanResult {
        schema,
        batches: vec![batch],
    })
}
