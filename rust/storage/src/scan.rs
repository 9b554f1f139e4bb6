//! Scan specifications and the merge-on-read machinery shared by scans and compaction.
//!
//! Sources (MemRowSets and DiskRowSets) are each sorted by key; a key's newest version wins and
//! tombstones hide it. Sources whose key ranges do not overlap need no merge at all: they are
//! read one after the other in key order, with every predicate pushed into the reader. Only
//! overlapping sources are merged, and there only key-column predicates are pushed down
//! (a non-key predicate could hide a newer version and resurrect an older one).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::compute::{filter_record_batch, interleave};
use arrow::datatypes::SchemaRef;

use crate::diskrowset::{output_schema, RowSetRef, READ_BATCH_ROWS};
use crate::error::{Result, StorageError};
use crate::key::{encode_keys, EncodedKeys};
use crate::memrowset::MemRowSet;
use crate::predicate::{and_all, Predicate};
use crate::schema::Schema;

/// What to read.
#[derive(Clone, Debug, Default)]
pub struct ScanSpec {
    /// Output columns by name, in this order (None: every column).
    pub columns: Option<Vec<String>>,
    /// Rows must match all of these.
    pub predicates: Vec<Predicate>,
    /// Encoded key, inclusive (see `Engine::encode_key`).
    pub lower_bound: Option<Vec<u8>>,
    /// Encoded key, exclusive.
    pub upper_bound: Option<Vec<u8>>,
    /// Stop after this many rows.
    pub limit: Option<usize>,
}

/// A scan's answer: batches in primary-key order.
#[derive(Debug)]
pub struct ScanResult {
    pub schema: SchemaRef,
    pub batches: Vec<RecordBatch>,
}

impl ScanResult {
    /// Total rows.
    pub fn num_rows(&self) -> usize {
        self.batches.iter().map(|b| b.num_rows()).sum()
    }
}

/// One sorted source of a scan, newest first in the list handed to `run`.
pub(crate) enum Source {
    /// Rows already gathered (the active MemRowSet, copied under the lock): `columns` layout
    /// plus `__deleted`.
    Gathered(Vec<RecordBatch>, Vec<u8>, Vec<u8>),
    /// A frozen MemRowSet and its smallest and largest keys.
    Frozen(Arc<MemRowSet>, Vec<u8>, Vec<u8>),
    Disk(RowSetRef),
}

impl Source {
    fn key_range(&self) -> Option<(&[u8], &[u8])> {
        match self {
            Source::Gathered(batches, min, max) => {
                (!batches.is_empty()).then_some((min.as_slice(), max.as_slice()))
            }
            Source::Frozen(_, min, max) => Some((min.as_slice(), max.as_slice())),
            Source::Disk(rowset) => Some(rowset.key_range()),
        }
    }
}

/// A scan being planned and run against one consistent set of sources.
pub(crate) struct ScanPlan<'a> {
    pub schema: &'a Schema,
    /// Output columns (positions in the schema).
    pub output: Vec<usize>,
    /// Output, key and predicate columns, sorted: the layout of gathered sources.
    pub work: Vec<usize>,
    pub spec: &'a ScanSpec,
}

impl<'a> ScanPlan<'a> {
    /// Validates `spec` against `schema`.
    pub fn new(schema: &'a Schema, spec: &'a ScanSpec) -> Result<Self> {
        let output: Vec<usize> = match &spec.columns {
            None => (0..schema.columns().len()).collect(),
            Some(names) => names
                .iter()
                .map(|n| {
                    schema
                        .index_of(n)
                        .ok_or_else(|| StorageError::invalid(format!("no column named {n:?}")))
                })
                .collect::<Result<_>>()?,
        };
        if output.is_empty() {
            return Err(StorageError::invalid(
                "a scan needs at least one column (count rows by scanning a key column)",
            ));
        }
        let mut work: Vec<usize> = output.clone();
        work.extend(0..schema.key_count());
        for predicate in &spec.predicates {
            predicate.validate(schema)?;
            work.push(schema.index_of(&predicate.column).expect("validated"));
        }
        work.sort_unstable();
        work.dedup();
        if let Some(width) = schema.fixed_key_width() {
            let bounds = [&spec.lower_bound, &spec.upper_bound];
            if bounds
                .iter()
                .any(|b| b.as_ref().is_some_and(|b| b.len() != width))
            {
                return Err(StorageError::invalid(format!(
                    "key bounds of this table are {width} bytes (use encode_keys)"
                )));
            }
        }
        Ok(ScanPlan {
            schema,
            output,
            work,
            spec,
        })
    }

    fn bounds(&self) -> (Option<&[u8]>, Option<&[u8]>) {
        (
            self.spec.lower_bound.as_deref(),
            self.spec.upper_bound.as_deref(),
        )
    }

    fn overlaps_bounds(&self, range: (&[u8], &[u8])) -> bool {
        let (lower, upper) = self.bounds();
        lower.is_none_or(|l| range.1 >= l) && upper.is_none_or(|u| range.0 < u)
    }

    /// Runs the scan over `sources` (newest first).
    pub fn run(&self, sources: Vec<Source>) -> Result<ScanResult> {
        let schema = output_schema(self.schema, &self.output, false);
        let mut ranked: Vec<(usize, Source)> = sources
            .into_iter()
            .enumerate()
            .filter(|(_, s)| s.key_range().is_some_and(|r| self.overlaps_bounds(r)))
            .collect();
        ranked.sort_by(|a, b| a.1.key_range().cmp(&b.1.key_range()));
        let mut batches = Vec::new();
        let mut remaining = self.spec.limit.unwrap_or(usize::MAX);
        let mut group: Vec<(usize, Source)> = Vec::new();
        let mut group_max: Vec<u8> = Vec::new();
        for (rank, source) in ranked {
            let (min, max) = source.key_range().expect("filtered");
            if !group.is_empty() && min > group_max.as_slice() {
                self.emit(std::mem::take(&mut group), &mut batches, &mut remaining)?;
            }
            if group.is_empty() || max > group_max.as_slice() {
                group_max = max.to_vec();
            }
            group.push((rank, source));
            if remaining == 0 {
                break;
            }
        }
        if !group.is_empty() && remaining > 0 {
            self.emit(group, &mut batches, &mut remaining)?;
        }
        let batches = batches
            .into_iter()
            .map(|b| b.with_schema(schema.clone()))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| StorageError::arrow_internal("scan output", e))?;
        Ok(ScanResult { schema, batches })
    }

    fn emit(
        &self,
        mut group: Vec<(usize, Source)>,
        out: &mut Vec<RecordBatch>,
        remaining: &mut usize,
    ) -> Result<()> {
        if *remaining == 0 {
            return Ok(());
        }
        let produced = if group.len() == 1 {
            self.read_single(group.pop().expect("one").1, *remaining)?
        } else {
            group.sort_by_key(|(rank, _)| *rank);
            let sources: Vec<Source> = group.into_iter().map(|(_, s)| s).collect();
            self.read_merged(sources)?
        };
        for batch in produced {
            if *remaining == 0 {
                break;
            }
            let take = batch.num_rows().min(*remaining);
            *remaining -= take;
            out.push(batch.slice(0, take));
        }
        Ok(())
    }

    /// One source alone in its key range: push every predicate, drop tombstones.
    fn read_single(&self, source: Source, limit: usize) -> Result<Vec<RecordBatch>> {
        let (lower, upper) = self.bounds();
        if let Source::Disk(rowset) = &source {
            if lower.is_none() && upper.is_none() {
                return rowset.read(
                    self.schema,
                    &self.output,
                    &self.spec.predicates,
                    false,
                    Some(limit),
                );
            }
        }
        let gathered = self.gather(&source, &self.spec.predicates)?;
        let mut out = Vec::new();
        for batch in gathered {
            let mut masks = vec![arrow::compute::not(deleted_of(&batch)).expect("boolean")];
            masks.extend(self.predicate_masks(&batch, &self.spec.predicates)?);
            let kept = filter_record_batch(&batch, &and_all(masks, batch.num_rows()))
                .map_err(|e| StorageError::arrow_internal("scan filter", e))?;
            out.push(self.project(&kept)?);
        }
        Ok(out)
    }

    /// Overlapping sources: gather each (key predicates pushed), merge newest-wins, then
    /// filter by the remaining predicates.
    fn read_merged(&self, sources: Vec<Source>) -> Result<Vec<RecordBatch>> {
        let key_predicates: Vec<Predicate> = self
            .spec
            .predicates
            .iter()
            .filter(|p| {
                self.schema.index_of(&p.column).expect("validated") < self.schema.key_count()
            })
            .cloned()
            .collect();
        let mut loaded = Vec::with_capacity(sources.len());
        for source in &sources {
            let batches = self.gather(source, &key_predicates)?;
            let schema = output_schema(self.schema, &self.work, true);
            let batch = arrow::compute::concat_batches(&schema, &batches)
                .map_err(|e| StorageError::arrow_internal("scan merge", e))?;
            loaded.push(batch);
        }
        let key_positions: Vec<usize> = (0..self.schema.key_count())
            .map(|k| self.work.binary_search(&k).expect("keys are in work"))
            .collect();
        let merged = merge_sorted(&loaded, &key_positions, true, READ_BATCH_ROWS)?;
        let mut out = Vec::new();
        for batch in merged {
            let masks = self.predicate_masks(&batch, &self.spec.predicates)?;
            let kept = filter_record_batch(&batch, &and_all(masks, batch.num_rows()))
                .map_err(|e| StorageError::arrow_internal("scan filter", e))?;
            out.push(self.project(&kept)?);
        }
        Ok(out)
    }

    /// A source's rows within the bounds in the `work` layout plus `__deleted`, filtered by
    /// `predicates`. In-memory tombstones are kept regardless; callers pass only predicates
    /// under which dropping a tombstone cannot resurrect an older version.
    fn gather(&self, source: &Source, predicates: &[Predicate]) -> Result<Vec<RecordBatch>> {
        let (lower, upper) = self.bounds();
        let batches = match source {
            Source::Gathered(batches, _, _) => batches.clone(),
            Source::Frozen(mem, _, _) => {
                mem.sorted_batches(&self.work, lower, upper, READ_BATCH_ROWS)?
            }
            Source::Disk(rowset) => {
                // Pushed into the reader: a tombstone failing a predicate can only shadow rows
                // that fail it too (key predicates) or is dropped anyway (single source).
                let raw = rowset.read(self.schema, &self.work, predicates, true, None)?;
                return self.clip(raw);
            }
        };
        if predicates.is_empty() {
            return Ok(batches);
        }
        batches
            .into_iter()
            .map(|batch| {
                let mut masks = self.predicate_masks(&batch, predicates)?;
                let pass = and_all(std::mem::take(&mut masks), batch.num_rows());
                let keep = arrow::compute::or(&pass, deleted_of(&batch)).expect("same length");
                filter_record_batch(&batch, &keep)
                    .map_err(|e| StorageError::arrow_internal("scan filter", e))
            })
            .collect()
    }

    /// Drops rows outside the key bounds (batches in the `work` layout).
    fn clip(&self, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
        let (lower, upper) = self.bounds();
        if lower.is_none() && upper.is_none() {
            return Ok(batches);
        }
        let key_positions: Vec<usize> = (0..self.schema.key_count())
            .map(|k| self.work.binary_search(&k).expect("keys are in work"))
            .collect();
        batches
            .into_iter()
            .map(|batch| {
                let keys = batch_keys(&batch, &key_positions)?;
                let mask: BooleanArray = (0..keys.len())
                    .map(|i| {
                        let k = keys.get(i);
                        Some(lower.is_none_or(|l| k >= l) && upper.is_none_or(|u| k < u))
                    })
                    .collect();
                filter_record_batch(&batch, &mask)
                    .map_err(|e| StorageError::arrow_internal("scan bounds", e))
            })
            .collect()
    }

    fn predicate_masks(
        &self,
        batch: &RecordBatch,
        predicates: &[Predicate],
    ) -> Result<Vec<BooleanArray>> {
        predicates
            .iter()
            .map(|p| {
                let position = self.schema.index_of(&p.column).expect("validated");
                let at = self.work.binary_search(&position).expect("in work");
                p.evaluate(batch.column(at).as_ref())
            })
            .collect()
    }

    /// From the `work` layout to the output columns.
    fn project(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let arrays: Vec<ArrayRef> = self
            .output
            .iter()
            .map(|c| {
                batch
                    .column(self.work.binary_search(c).expect("in work"))
                    .clone()
            })
            .collect();
        RecordBatch::try_new(output_schema(self.schema, &self.output, false), arrays)
            .map_err(|e| StorageError::arrow_internal("scan projection", e))
    }
}

fn deleted_of(batch: &RecordBatch) -> &BooleanArray {
    batch.column(batch.num_columns() - 1).as_boolean()
}

fn batch_keys(batch: &RecordBatch, key_positions: &[usize]) -> Result<EncodedKeys> {
    let columns: Vec<ArrayRef> = key_positions
        .iter()
        .map(|p| batch.column(*p).clone())
        .collect();
    encode_keys(&columns)
}

/// Merges key-sorted sources (newest first; each one batch whose last column is `__deleted`)
/// into key-sorted batches of at most `chunk_rows` rows, keeping each key's newest version.
/// With `drop_tombstones` a winning tombstone yields no row (and the `__deleted` column is
/// kept, all false); otherwise winning tombstones are kept so they can shadow older data.
pub(crate) fn merge_sorted(
    sources: &[RecordBatch],
    key_positions: &[usize],
    drop_tombstones: bool,
    chunk_rows: usize,
) -> Result<Vec<RecordBatch>> {
    let keys: Vec<EncodedKeys> = sources
        .iter()
        .map(|s| batch_keys(s, key_positions))
        .collect::<Result<_>>()?;
    let deleted: Vec<&BooleanArray> = sources.iter().map(deleted_of).collect();
    let mut cursor = vec![0usize; sources.len()];
    let mut picks: Vec<(usize, usize)> = Vec::new();
    loop {
        let mut best: Option<usize> = None;
        for s in 0..sources.len() {
            if cursor[s] < keys[s].len()
                && best.is_none_or(|b| keys[s].get(cursor[s]) < keys[b].get(cursor[b]))
            {
                best = Some(s);
            }
        }
        let Some(winner) = best else { break };
        let key = keys[winner].get(cursor[winner]);
        if !(drop_tombstones && deleted[winner].value(cursor[winner])) {
            picks.push((winner, cursor[winner]));
        }
        for s in winner + 1..sources.len() {
            if cursor[s] < keys[s].len() && keys[s].get(cursor[s]) == key {
                cursor[s] += 1;
            }
        }
        cursor[winner] += 1;
    }
    let Some(first) = sources.first() else {
        return Ok(Vec::new());
    };
    let schema = first.schema();
    let mut out = Vec::new();
    for chunk in picks.chunks(chunk_rows.max(1)) {
        let mut arrays = Vec::with_capacity(schema.fields().len());
        for c in 0..schema.fields().len() {
            let columns: Vec<&dyn Array> = sources.iter().map(|s| s.column(c).as_ref()).collect();
            arrays.push(
                interleave(&columns, chunk)
                    .map_err(|e| StorageError::arrow_internal("merge", e))?,
            );
        }
        out.push(
            RecordBatch::try_new(schema.clone(), arrays)
                .map_err(|e| StorageError::arrow_internal("merge", e))?,
        );
    }
    Ok(out)
}
