//! Scan specifications and the merge-on-read machinery shared by scans and compaction.
//!
//! Sources (MemRowSets and DiskRowSets) are each sorted by key; a key's newest version wins and
//! tombstones hide it. Sources whose key ranges do not overlap need no merge at all: they are
//! read one after the other in key order, with every predicate pushed into the reader. Only
//! overlapping sources are merged, and there only key-column predicates are pushed down
//! (a non-key predicate could hide a newer version and resurrect an older one).
//!
//! Snapshot reads (`ScanSpec::snapshot_ts`) first reduce every source to the version of each
//! key visible at the snapshot (the newest with a timestamp at or below it); from there on the
//! scan is the latest scan above. A DiskRowSet holding one version per key, all visible, is
//! read exactly as by a latest scan.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch};
use arrow::compute::{filter_record_batch, interleave};
use arrow::datatypes::SchemaRef;
use nyala_common::OpIndex;

use crate::diskrowset::{output_schema, RowSetRef, READ_BATCH_ROWS};
use crate::error::{Result, StorageError};
use crate::key::{encode_keys, EncodedKeys};
use crate::memrowset::{MemRowSet, MemRows};
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
    /// Read each key's version visible at this hybrid time (None: the newest).
    pub snapshot_ts: Option<u64>,
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

/// Output batches of one group of sources, produced as they are pulled.
type Batches = Box<dyn Iterator<Item = Result<RecordBatch>> + Send>;

/// A scan in progress (Kudu's `RowwiseIterator` behind a tserver scanner): the sources of one
/// consistent view of the tablet, pinned when the cursor was opened, read in key order as
/// batches are asked for. It holds the rowsets it still has to read (their files outlive a
/// compaction until the cursor lets go), copies of the in-memory rows, and at most one
/// partly returned batch; a DiskRowSet is decoded one row group at a time.
pub struct ScanCursor {
    plan: Arc<ScanPlan>,
    schema: SchemaRef,
    /// Groups not yet opened, in key order.
    groups: VecDeque<Vec<(usize, Source)>>,
    current: Option<Batches>,
    /// The rest of a pulled batch and its bytes per row (measured on the whole batch).
    pending: Option<(RecordBatch, usize)>,
    /// Rows the limit still allows.
    remaining: usize,
    /// The last op index applied to the view the cursor reads.
    snapshot_index: OpIndex,
}

impl std::fmt::Debug for ScanCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScanCursor")
            .field("groups_left", &self.groups.len())
            .field("remaining", &self.remaining)
            .field("snapshot_index", &self.snapshot_index)
            .finish()
    }
}

impl ScanCursor {
    /// A cursor over `sources` (newest first) of the view at `snapshot_index`.
    pub(crate) fn new(plan: ScanPlan, sources: Vec<Source>, snapshot_index: OpIndex) -> Self {
        let schema = output_schema(&plan.schema, &plan.output, false);
        let groups = plan.groups(sources);
        let remaining = plan.spec.limit.unwrap_or(usize::MAX);
        ScanCursor {
            plan: Arc::new(plan),
            schema,
            groups,
            current: None,
            pending: None,
            remaining,
            snapshot_index,
        }
    }

    /// The schema of every batch the cursor returns.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The last op index applied to the tablet when the cursor was opened: it reads exactly
    /// the rows as of that op.
    pub fn snapshot_index(&self) -> OpIndex {
        self.snapshot_index
    }

    /// The next rows in key order, as one batch of about `bytes_max` bytes at most (at least
    /// one row); None once the scan is done. A batch never spans two groups of sources, so
    /// it can be smaller.
    pub fn next_batch(&mut self, bytes_max: usize) -> Result<Option<RecordBatch>> {
        if self.remaining == 0 {
            self.close();
            return Ok(None);
        }
        let (batch, row_bytes) = match self.pending.take() {
            Some(pending) => pending,
            None => match self.pull()? {
                Some(batch) => {
                    let row_bytes = batch.get_array_memory_size() / batch.num_rows().max(1);
                    (batch, row_bytes.max(1))
                }
                None => {
                    self.close();
                    return Ok(None);
                }
            },
        };
        let rows = (bytes_max / row_bytes)
            .clamp(1, batch.num_rows())
            .min(self.remaining);
        if rows < batch.num_rows() && rows < self.remaining {
            self.pending = Some((batch.slice(rows, batch.num_rows() - rows), row_bytes));
        }
        self.remaining -= rows;
        batch
            .slice(0, rows)
            .with_schema(self.schema.clone())
            .map(Some)
            .map_err(|e| StorageError::arrow_internal("scan output", e))
    }

    /// Lets go of every source: the scan returns nothing more.
    pub fn close(&mut self) {
        self.groups.clear();
        self.current = None;
        self.pending = None;
        self.remaining = 0;
    }

    /// The next non-empty batch of the current group, opening groups as needed.
    fn pull(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if let Some(current) = self.current.as_mut() {
                match current.next() {
                    Some(Ok(batch)) if batch.num_rows() == 0 => continue,
                    Some(Ok(batch)) => return Ok(Some(batch)),
                    Some(Err(err)) => {
                        self.close();
                        return Err(err);
                    }
                    None => self.current = None,
                }
            }
            let Some(group) = self.groups.pop_front() else {
                return Ok(None);
            };
            match self.plan.open_group(group, self.remaining) {
                Ok(batches) => self.current = Some(batches),
                Err(err) => {
                    self.close();
                    return Err(err);
                }
            }
        }
    }

    /// Reads the rest of the scan.
    pub fn collect(mut self) -> Result<ScanResult> {
        let mut batches = Vec::new();
        while let Some(batch) = self.next_batch(usize::MAX)? {
            batches.push(batch);
        }
        Ok(ScanResult {
            schema: self.schema,
            batches,
        })
    }
}

/// One sorted source of a scan, newest first in the list handed to `run`.
pub(crate) enum Source {
    /// The rows of the active MemRowSet within the bounds, located under the engine's lock
    /// (`work` layout plus `__deleted` once gathered), and its smallest and largest keys.
    Mem(MemRows, Vec<u8>, Vec<u8>),
    /// A frozen MemRowSet and its smallest and largest keys.
    Frozen(Arc<MemRowSet>, Vec<u8>, Vec<u8>),
    Disk(RowSetRef),
}

impl Source {
    fn key_range(&self) -> Option<(&[u8], &[u8])> {
        match self {
            Source::Mem(rows, min, max) => {
                (!rows.is_empty()).then_some((min.as_slice(), max.as_slice()))
            }
            Source::Frozen(_, min, max) => Some((min.as_slice(), max.as_slice())),
            Source::Disk(rowset) => Some(rowset.key_range()),
        }
    }
}

/// A scan planned against one schema: which columns it outputs and which it works with.
pub(crate) struct ScanPlan {
    pub schema: Arc<Schema>,
    /// Output columns (positions in the schema).
    pub output: Vec<usize>,
    /// Output, key and predicate columns, sorted: the layout of gathered sources.
    pub work: Vec<usize>,
    pub spec: ScanSpec,
}

impl ScanPlan {
    /// Validates `spec` against `schema`.
    pub fn new(schema: Arc<Schema>, spec: ScanSpec) -> Result<Self> {
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
            predicate.validate(&schema)?;
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

    /// The sources that may hold rows within the bounds, in key order, as groups of sources
    /// whose key ranges overlap (each with its rank: 0 is the newest).
    fn groups(&self, sources: Vec<Source>) -> VecDeque<Vec<(usize, Source)>> {
        let mut ranked: Vec<(usize, Source)> = sources
            .into_iter()
            .enumerate()
            .filter(|(_, s)| s.key_range().is_some_and(|r| self.overlaps_bounds(r)))
            .collect();
        ranked.sort_by(|a, b| a.1.key_range().cmp(&b.1.key_range()));
        let mut groups = VecDeque::new();
        let mut group: Vec<(usize, Source)> = Vec::new();
        let mut group_max: Vec<u8> = Vec::new();
        for (rank, source) in ranked {
            let (min, max) = source.key_range().expect("filtered");
            if !group.is_empty() && min > group_max.as_slice() {
                groups.push_back(std::mem::take(&mut group));
            }
            if group.is_empty() || max > group_max.as_slice() {
                group_max = max.to_vec();
            }
            group.push((rank, source));
        }
        if !group.is_empty() {
            groups.push_back(group);
        }
        groups
    }

    /// The output batches of one group, at most `limit` rows of them needed. A DiskRowSet
    /// alone in its key range is decoded as the batches are pulled; in-memory sources and
    /// overlapping groups are read when the group is opened.
    fn open_group(
        self: &Arc<Self>,
        mut group: Vec<(usize, Source)>,
        limit: usize,
    ) -> Result<Batches> {
        if group.len() > 1 {
            group.sort_by_key(|(rank, _)| *rank);
            let sources: Vec<Source> = group.into_iter().map(|(_, s)| s).collect();
            return self.read_merged(sources);
        }
        let source = group.pop().expect("groups are not empty").1;
        let Source::Disk(rowset) = source else {
            return self.read_single(source);
        };
        if rowset.needs_versions(self.spec.snapshot_ts) {
            return self.read_versions_single(&rowset);
        }
        let (lower, upper) = self.bounds();
        let predicates = &self.spec.predicates;
        if lower.is_none() && upper.is_none() {
            return Ok(Box::new(rowset.stream(
                &self.schema,
                &self.output,
                predicates,
                Some(limit),
            )?));
        }
        let stream = rowset.stream(&self.schema, &self.work, predicates, None)?;
        let key_positions = self.key_positions();
        let (lower, upper) = (lower.map(<[u8]>::to_vec), upper.map(<[u8]>::to_vec));
        let output = self.output_positions();
        let schema = output_schema(&self.schema, &self.output, false);
        Ok(Box::new(stream.map(move |batch| {
            let batch = clip(batch?, &key_positions, lower.as_deref(), upper.as_deref())?;
            project(&batch, &output, &schema)
        })))
    }

    /// A DiskRowSet alone in its key range whose rows need version picking: its visible
    /// versions are streamed, then bounds, predicates and projection apply to them.
    fn read_versions_single(self: &Arc<Self>, rowset: &RowSetRef) -> Result<Batches> {
        let stream =
            rowset.stream_visible(&self.schema, &self.work, self.spec.snapshot_ts, false)?;
        let plan = self.clone();
        let key_positions = self.key_positions();
        Ok(Box::new(stream.map(move |batch| {
            let (lower, upper) = plan.bounds();
            let batch = clip(batch?, &key_positions, lower, upper)?;
            let masks = plan.predicate_masks(&batch, &plan.spec.predicates)?;
            let kept = filter_record_batch(&batch, &and_all(masks, batch.num_rows()))
                .map_err(|e| StorageError::arrow_internal("scan filter", e))?;
            plan.project(&kept)
        })))
    }

    /// Positions of the key columns in the `work` layout.
    fn key_positions(&self) -> Vec<usize> {
        (0..self.schema.key_count())
            .map(|k| self.work.binary_search(&k).expect("keys are in work"))
            .collect()
    }

    /// Positions of the output columns in the `work` layout.
    fn output_positions(&self) -> Vec<usize> {
        self.output
            .iter()
            .map(|c| self.work.binary_search(c).expect("in work"))
            .collect()
    }

    /// An in-memory source alone in its key range: push every predicate, drop tombstones;
    /// values are gathered a chunk at a time as the batches are pulled.
    fn read_single(self: &Arc<Self>, source: Source) -> Result<Batches> {
        let (lower, upper) = self.bounds();
        let rows = match source {
            Source::Mem(rows, _, _) => rows,
            Source::Frozen(mem, _, _) => {
                mem.rows_in(&self.work, lower, upper, self.spec.snapshot_ts)
            }
            Source::Disk(_) => unreachable!("a lone DiskRowSet is streamed by its reader"),
        };
        let plan = self.clone();
        Ok(Box::new(rows.into_chunks(READ_BATCH_ROWS).map(
            move |batch| {
                let batch = batch?;
                let mut masks = vec![arrow::compute::not(deleted_of(&batch)).expect("boolean")];
                masks.extend(plan.predicate_masks(&batch, &plan.spec.predicates)?);
                let kept = filter_record_batch(&batch, &and_all(masks, batch.num_rows()))
                    .map_err(|e| StorageError::arrow_internal("scan filter", e))?;
                plan.project(&kept)
            },
        )))
    }

    /// Overlapping sources: each streamed (key predicates pushed), merged newest-wins as the
    /// batches are pulled, then filtered by the remaining predicates. What is held at once is
    /// a batch of each source and one output chunk (each source was read whole before: a
    /// tablet's full scan held every row of its overlapping rowsets, docs/scans.md).
    fn read_merged(self: &Arc<Self>, sources: Vec<Source>) -> Result<Batches> {
        let key_predicates: Vec<Predicate> = self
            .spec
            .predicates
            .iter()
            .filter(|p| {
                self.schema.index_of(&p.column).expect("validated") < self.schema.key_count()
            })
            .cloned()
            .collect();
        let streams = sources
            .into_iter()
            .map(|source| self.gather(source, &key_predicates))
            .collect::<Result<Vec<_>>>()?;
        let merge = VersionsMerge::newest(
            output_schema(&self.schema, &self.work, true),
            streams,
            self.key_positions(),
            READ_BATCH_ROWS,
        );
        let plan = self.clone();
        Ok(Box::new(merge.map(move |batch| {
            let batch = batch?;
            let masks = plan.predicate_masks(&batch, &plan.spec.predicates)?;
            let kept = filter_record_batch(&batch, &and_all(masks, batch.num_rows()))
                .map_err(|e| StorageError::arrow_internal("scan filter", e))?;
            plan.project(&kept)
        })))
    }

    /// A source's rows within the bounds in the `work` layout plus `__deleted`, filtered by
    /// `predicates`, as a stream. In-memory tombstones are kept regardless; callers pass only
    /// predicates under which dropping a tombstone cannot resurrect an older version.
    fn gather(self: &Arc<Self>, source: Source, predicates: &[Predicate]) -> Result<Batches> {
        let (lower, upper) = self.bounds();
        let batches: Batches = match source {
            Source::Mem(rows, _, _) => Box::new(rows.into_chunks(READ_BATCH_ROWS)),
            // Located now (it is immutable), gathered a chunk at a time as the merge pulls:
            // gathered whole, it was a copy of a MemRowSet as large as the flush threshold.
            Source::Frozen(mem, _, _) => Box::new(
                mem.rows_in(&self.work, lower, upper, self.spec.snapshot_ts)
                    .into_chunks(READ_BATCH_ROWS),
            ),
            Source::Disk(rowset) if rowset.needs_versions(self.spec.snapshot_ts) => {
                // No predicate pushed: the merge filters after picking versions.
                let stream =
                    rowset.stream_visible(&self.schema, &self.work, self.spec.snapshot_ts, true)?;
                return Ok(self.clip_stream(Box::new(stream)));
            }
            Source::Disk(rowset) => {
                // Pushed into the reader: a tombstone failing a predicate can only shadow rows
                // that fail it too (key predicates) or is dropped anyway (single source).
                let stream =
                    rowset.stream_rows(&self.schema, &self.work, predicates, true, None)?;
                return Ok(self.clip_stream(Box::new(stream)));
            }
        };
        if predicates.is_empty() {
            return Ok(batches);
        }
        let plan = self.clone();
        let predicates = predicates.to_vec();
        Ok(Box::new(batches.map(move |batch| {
            let batch = batch?;
            let masks = plan.predicate_masks(&batch, &predicates)?;
            let pass = and_all(masks, batch.num_rows());
            let keep = arrow::compute::or(&pass, deleted_of(&batch)).expect("same length");
            filter_record_batch(&batch, &keep)
                .map_err(|e| StorageError::arrow_internal("scan filter", e))
        })))
    }

    /// Drops rows outside the key bounds from a stream of batches in the `work` layout.
    fn clip_stream(self: &Arc<Self>, batches: Batches) -> Batches {
        let (lower, upper) = self.bounds();
        if lower.is_none() && upper.is_none() {
            return batches;
        }
        let plan = self.clone();
        let key_positions = self.key_positions();
        Box::new(batches.map(move |batch| {
            let (lower, upper) = plan.bounds();
            clip(batch?, &key_positions, lower, upper)
        }))
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
        project(
            batch,
            &self.output_positions(),
            &output_schema(&self.schema, &self.output, false),
        )
    }
}

/// The rows of `batch` whose keys (at `key_positions`) lie in `[lower, upper)`.
fn clip(
    batch: RecordBatch,
    key_positions: &[usize],
    lower: Option<&[u8]>,
    upper: Option<&[u8]>,
) -> Result<RecordBatch> {
    let keys = batch_keys(&batch, key_positions)?;
    let mask: BooleanArray = (0..keys.len())
        .map(|i| {
            let k = keys.get(i);
            Some(lower.is_none_or(|l| k >= l) && upper.is_none_or(|u| k < u))
        })
        .collect();
    filter_record_batch(&batch, &mask).map_err(|e| StorageError::arrow_internal("scan bounds", e))
}

/// The columns of `batch` at `positions`, as `schema`.
fn project(batch: &RecordBatch, positions: &[usize], schema: &SchemaRef) -> Result<RecordBatch> {
    let arrays: Vec<ArrayRef> = positions.iter().map(|p| batch.column(*p).clone()).collect();
    RecordBatch::try_new(schema.clone(), arrays)
        .map_err(|e| StorageError::arrow_internal("scan projection", e))
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

/// Merges row versions for compaction, all in memory (`VersionsMerge` over one batch per
/// source; for tests).
#[cfg(test)]
pub(crate) fn merge_versions(
    sources: &[RecordBatch],
    key_positions: &[usize],
    ancient_history_mark: u64,
    chunk_rows: usize,
) -> Result<Vec<RecordBatch>> {
    let Some(first) = sources.first() else {
        return Ok(Vec::new());
    };
    let streams = sources
        .iter()
        .map(|s| std::iter::once(Ok(s.clone())))
        .collect();
    VersionsMerge::new(
        first.schema(),
        streams,
        key_positions.to_vec(),
        ancient_history_mark,
        chunk_rows,
    )
    .collect()
}

/// Where one source of a `VersionsMerge` stands: its current batch (an index into the
/// merge's `live` batches), that batch's encoded keys, timestamps and tombstone flags, and
/// the row it is at. `live` is `usize::MAX` once the source is used up.
struct VersionSource<I> {
    batches: I,
    live: usize,
    keys: EncodedKeys,
    ts: arrow::array::UInt64Array,
    deleted: BooleanArray,
    at: usize,
}

impl<I> VersionSource<I> {
    fn done(&self) -> bool {
        self.live == usize::MAX
    }

    fn key(&self) -> &[u8] {
        self.keys.get(self.at)
    }
}

/// Merges row versions for compaction as a stream. Each source is a stream of batches
/// (columns, `__ts`, `__deleted`) in (key ascending, timestamp descending) order; sources
/// are given newest first. The output has the same layout and order, in batches of at most
/// `chunk_rows` rows. Per key it keeps every version newer than `ancient_history_mark` and
/// the newest at or before it; of versions with equal timestamps only the newest (no
/// snapshot can see the others); and, when the sources are every rowset of the tablet back
/// to its oldest, no tombstone as the key's oldest kept version (nothing older is left for it
/// to shadow). A merge of newer rowsets only (`keep_tombstones`) keeps such a tombstone: an
/// older rowset outside the merge may hold a version it hides.
///
/// Memory is bounded by the sources' current batches and one output chunk, whatever the
/// rowsets hold: a rowset is read a row group at a time as the merge reaches it, and a batch
/// is let go once no kept version and no source points into it. A key with more versions
/// than `chunk_rows` goes out over several chunks; only its trailing tombstones are held back
/// until the key ends (they are dropped if nothing older of the key is kept after them).
pub(crate) struct VersionsMerge<I> {
    schema: SchemaRef,
    sources: Vec<VersionSource<I>>,
    key_positions: Vec<usize>,
    mark: u64,
    chunk_rows: usize,
    /// Whether a tombstone that is a key's oldest kept version stays (see above).
    keep_tombstones: bool,
    /// Batches that picks or sources point into.
    live: Vec<RecordBatch>,
    /// How many picks point into each of `live`.
    live_picks: Vec<usize>,
    /// Versions kept, in output order: (index into `live`, row).
    picks: Vec<(usize, usize)>,
    /// The key being merged, if one is (`in_key`; the buffer is reused from key to key):
    /// the source its walk is at, the last timestamp kept, whether a version at or below the
    /// mark was kept, and where its picks start.
    key: Vec<u8>,
    in_key: bool,
    walk: usize,
    last_ts: Option<u64>,
    below_mark: bool,
    key_start: usize,
    /// Whether the batches carry `__ts` (before `__deleted`); without, every version is
    /// taken as at the mark (the newest of a key wins, a tombstone winning drops the key).
    versioned: bool,
    started: bool,
    failed: bool,
}

impl<I: Iterator<Item = Result<RecordBatch>>> VersionsMerge<I> {
    pub(crate) fn new(
        schema: SchemaRef,
        streams: Vec<I>,
        key_positions: Vec<usize>,
        ancient_history_mark: u64,
        chunk_rows: usize,
    ) -> Self {
        let sources = streams
            .into_iter()
            .map(|batches| VersionSource {
                batches,
                live: usize::MAX,
                keys: EncodedKeys::default(),
                ts: arrow::array::UInt64Array::from(Vec::<u64>::new()),
                deleted: BooleanArray::from(Vec::<bool>::new()),
                at: 0,
            })
            .collect();
        VersionsMerge {
            schema,
            sources,
            key_positions,
            mark: ancient_history_mark,
            chunk_rows: chunk_rows.max(1),
            keep_tombstones: false,
            live: Vec::new(),
            live_picks: Vec::new(),
            picks: Vec::new(),
            key: Vec::new(),
            in_key: false,
            walk: 0,
            last_ts: None,
            below_mark: false,
            key_start: 0,
            versioned: true,
            started: false,
            failed: false,
        }
    }

    /// A merge of some newer rowsets only (compaction of a range that leaves out the
    /// tablet's oldest): a tombstone stays even as a key's oldest kept version.
    pub(crate) fn keeping_tombstones(mut self) -> Self {
        self.keep_tombstones = true;
        self
    }

    /// A merge of sources holding one version per key each (a scan's, the newest visible,
    /// with `__deleted` last and no `__ts`): per key the newest source's row, and nothing for
    /// a key whose newest row is a tombstone.
    pub(crate) fn newest(
        schema: SchemaRef,
        streams: Vec<I>,
        key_positions: Vec<usize>,
        chunk_rows: usize,
    ) -> Self {
        let mut merge = Self::new(schema, streams, key_positions, u64::MAX, chunk_rows);
        merge.versioned = false;
        merge
    }

    /// Moves source `s` to its next batch with rows (or marks it used up). The batch it
    /// leaves is let go at once unless a kept version points into it (a long run of
    /// versions collected as history would otherwise pile up until the next chunk).
    fn load(&mut self, s: usize) -> Result<()> {
        let left = self.sources[s].live;
        if left != usize::MAX && self.live_picks[left] == 0 {
            self.live[left] = RecordBatch::new_empty(self.schema.clone());
        }
        let source = &mut self.sources[s];
        source.live = usize::MAX;
        for batch in source.batches.by_ref() {
            let batch = batch?;
            if batch.num_rows() == 0 {
                continue;
            }
            let batch = if batch.schema() == self.schema {
                batch
            } else {
                RecordBatch::try_new(self.schema.clone(), batch.columns().to_vec())
                    .map_err(|e| StorageError::arrow_internal("compaction merge", e))?
            };
            source.keys = batch_keys(&batch, &self.key_positions)?;
            if self.versioned {
                source.ts = batch.column(batch.num_columns() - 2).as_primitive().clone();
            }
            source.deleted = deleted_of(&batch).clone();
            source.at = 0;
            source.live = self.live.len();
            self.live.push(batch);
            self.live_picks.push(0);
            return Ok(());
        }
        Ok(())
    }

    fn advance(&mut self, s: usize) -> Result<()> {
        let source = &mut self.sources[s];
        source.at += 1;
        if source.at == source.keys.len() {
            self.load(s)?;
        }
        Ok(())
    }

    /// The source whose current key is the smallest, the newest of equals.
    fn smallest(&self) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (s, source) in self.sources.iter().enumerate() {
            if !source.done() && best.is_none_or(|b| source.key() < self.sources[b].key()) {
                best = Some(s);
            }
        }
        best
    }

    fn is_tombstone(&self, pick: (usize, usize)) -> bool {
        deleted_of(&self.live[pick.0]).value(pick.1)
    }

    /// How many picks are final: all but the current key's trailing tombstones, which go
    /// only if a version of the key is kept after them.
    fn final_picks(&self) -> usize {
        let mut end = self.picks.len();
        if self.in_key && !self.keep_tombstones {
            while end > self.key_start && self.is_tombstone(self.picks[end - 1]) {
                end -= 1;
            }
        }
        end
    }

    /// The first `n` picks as a batch; lets go of the batches nothing points into any more.
    fn emit(&mut self, n: usize) -> Result<RecordBatch> {
        let mut arrays = Vec::with_capacity(self.schema.fields().len());
        for c in 0..self.schema.fields().len() {
            let columns: Vec<&dyn Array> = self.live.iter().map(|b| b.column(c).as_ref()).collect();
            arrays.push(
                interleave(&columns, &self.picks[..n])
                    .map_err(|e| StorageError::arrow_internal("compaction merge", e))?,
            );
        }
        let out = RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| StorageError::arrow_internal("compaction merge", e))?;
        self.picks.drain(..n);
        self.key_start = self.key_start.saturating_sub(n);
        // Keep only the batches still pointed into, renumbered in order.
        let mut counts = vec![0usize; self.live.len()];
        for &(b, _) in &self.picks {
            counts[b] += 1;
        }
        let mut used: Vec<bool> = counts.iter().map(|&c| c > 0).collect();
        for source in &self.sources {
            if !source.done() {
                used[source.live] = true;
            }
        }
        let mut renumber = vec![usize::MAX; self.live.len()];
        let mut kept = Vec::with_capacity(self.live.len());
        let mut kept_picks = Vec::with_capacity(self.live.len());
        for (b, batch) in std::mem::take(&mut self.live).into_iter().enumerate() {
            if used[b] {
                renumber[b] = kept.len();
                kept.push(batch);
                kept_picks.push(counts[b]);
            }
        }
        self.live = kept;
        self.live_picks = kept_picks;
        for pick in &mut self.picks {
            pick.0 = renumber[pick.0];
        }
        for source in &mut self.sources {
            if !source.done() {
                source.live = renumber[source.live];
            }
        }
        Ok(out)
    }

    /// Walks the current key's versions, newest source first (timestamps descend along the
    /// walk), for at most `chunk_rows` versions; ends the key when every source is past it.
    fn walk_key(&mut self) -> Result<()> {
        if !self.versioned {
            return self.take_newest();
        }
        let key = std::mem::take(&mut self.key); // put back below
        let mut steps = 0;
        while self.walk < self.sources.len() && steps < self.chunk_rows {
            let s = self.walk;
            let source = &self.sources[s];
            if source.done() || source.key() != key.as_slice() {
                self.walk += 1;
                continue;
            }
            let (live, at) = (source.live, source.at);
            let version_ts = if self.versioned {
                source.ts.value(at)
            } else {
                0
            };
            debug_assert!(
                self.last_ts.is_none_or(|t| version_ts <= t),
                "versions descend"
            );
            if !(self.below_mark || self.last_ts == Some(version_ts)) {
                self.last_ts = Some(version_ts);
                self.below_mark = version_ts <= self.mark;
                self.picks.push((live, at));
                self.live_picks[live] += 1;
            }
            steps += 1;
            if let Err(e) = self.advance(s) {
                self.key = key;
                return Err(e);
            }
        }
        self.key = key;
        if self.walk < self.sources.len() {
            return Ok(());
        }
        self.in_key = false;
        while !self.keep_tombstones
            && self.picks.len() > self.key_start
            && self.is_tombstone(self.picks[self.picks.len() - 1])
        {
            let (b, _) = self.picks.pop().expect("checked");
            self.live_picks[b] -= 1;
        }
        Ok(())
    }

    /// `walk_key` for sources of one row per key (`newest`): the winner's row is the key's,
    /// unless it is a tombstone; the other sources holding the key move past it.
    fn take_newest(&mut self) -> Result<()> {
        let winner = self.walk;
        let (live, at) = (self.sources[winner].live, self.sources[winner].at);
        for s in winner + 1..self.sources.len() {
            let source = &self.sources[s];
            if !source.done() && source.key() == self.key.as_slice() {
                self.advance(s)?;
            }
        }
        if !self.sources[winner].deleted.value(at) {
            self.picks.push((live, at));
            self.live_picks[live] += 1;
        }
        self.advance(winner)?;
        self.walk = self.sources.len();
        self.in_key = false;
        Ok(())
    }

    fn step(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            let ready = self.final_picks();
            if ready >= self.chunk_rows {
                return self.emit(self.chunk_rows).map(Some);
            }
            if !self.in_key {
                let Some(winner) = self.smallest() else {
                    return if self.picks.is_empty() {
                        Ok(None)
                    } else {
                        self.emit(self.picks.len()).map(Some)
                    };
                };
                self.key.clear();
                self.key.extend_from_slice(self.sources[winner].key());
                self.in_key = true;
                // Sources before the winner (newer) are past this key: `smallest` takes the
                // newest of equal keys.
                self.walk = winner;
                self.last_ts = None;
                self.below_mark = false;
                self.key_start = self.picks.len();
            }
            self.walk_key()?;
        }
    }
}

impl<I: Iterator<Item = Result<RecordBatch>>> Iterator for VersionsMerge<I> {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let result = if self.started {
            self.step()
        } else {
            self.started = true;
            (0..self.sources.len())
                .try_for_each(|s| self.load(s))
                .and_then(|()| self.step())
        };
        match result {
            Ok(batch) => batch.map(Ok),
            Err(e) => {
                self.failed = true; // an error ends the stream
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, UInt64Array};
    use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
    use proptest::prelude::*;

    use super::*;

    /// One version: (key, value, ts, deleted).
    type Version = (i64, i64, u64, bool);

    fn schema() -> SchemaRef {
        Arc::new(ArrowSchema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
            Field::new("__ts", DataType::UInt64, false),
            Field::new("__deleted", DataType::Boolean, false),
        ]))
    }

    fn batch(versions: &[Version]) -> RecordBatch {
        RecordBatch::try_new(
            schema(),
            vec![
                Arc::new(Int64Array::from_iter_values(versions.iter().map(|v| v.0))),
                Arc::new(Int64Array::from_iter_values(versions.iter().map(|v| v.1))),
                Arc::new(UInt64Array::from_iter_values(versions.iter().map(|v| v.2))),
                Arc::new(BooleanArray::from_iter(versions.iter().map(|v| Some(v.3)))),
            ],
        )
        .unwrap()
    }

    fn rows(batches: &[RecordBatch]) -> Vec<Version> {
        let mut out = Vec::new();
        for b in batches {
            let k = b.column(0).as_primitive::<arrow::datatypes::Int64Type>();
            let v = b.column(1).as_primitive::<arrow::datatypes::Int64Type>();
            let ts = b.column(2).as_primitive::<arrow::datatypes::UInt64Type>();
            let d = b.column(3).as_boolean();
            for i in 0..b.num_rows() {
                out.push((k.value(i), v.value(i), ts.value(i), d.value(i)));
            }
        }
        out
    }

    /// The rule, key by key: every version newer than the mark and the newest at or before
    /// it, one per timestamp (the newest source's), no tombstone as the oldest kept unless
    /// `keep_tombstones` (a merge that leaves older rowsets out).
    fn model(sources: &[Vec<Version>], mark: u64, keep_tombstones: bool) -> Vec<Version> {
        let mut keys: Vec<i64> = sources.iter().flatten().map(|v| v.0).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut out = Vec::new();
        for key in keys {
            let start = out.len();
            let (mut last_ts, mut below) = (None, false);
            for version in sources.iter().flatten().filter(|v| v.0 == key) {
                if below || last_ts == Some(version.2) {
                    continue;
                }
                last_ts = Some(version.2);
                below = version.2 <= mark;
                out.push(*version);
            }
            while !keep_tombstones && out.len() > start && out[out.len() - 1].3 {
                out.pop();
            }
        }
        out
    }

    /// Sources newest first, each in (key ascending, ts descending) order; a newer source's
    /// timestamps are never below an older one's (they may meet at the boundary).
    fn sources() -> impl Strategy<Value = Vec<Vec<Version>>> {
        prop::collection::vec(
            prop::collection::vec((0i64..12, 0u64..10, any::<bool>(), any::<i64>()), 0..40),
            1..5,
        )
        .prop_map(|raw| {
            let n = raw.len() as u64;
            raw.into_iter()
                .enumerate()
                .map(|(i, versions)| {
                    let base = (n - 1 - i as u64) * 9; // source i spans base..=base+9
                    let mut out: Vec<Version> = versions
                        .into_iter()
                        .map(|(k, t, d, v)| (k, v, base + t, d))
                        .collect();
                    out.sort_by(|a, b| a.0.cmp(&b.0).then(b.2.cmp(&a.2)));
                    out.dedup_by(|a, b| a.0 == b.0 && a.2 == b.2); // one per (key, ts) in a file
                    out
                })
                .collect()
        })
    }

    fn merged(
        sources: &[Vec<Version>],
        piece_rows: &[usize],
        mark: u64,
        chunk_rows: usize,
        keep_tombstones: bool,
    ) -> Vec<RecordBatch> {
        let streams: Vec<_> = sources
            .iter()
            .enumerate()
            .map(|(i, versions)| {
                let size = piece_rows[i % piece_rows.len()].max(1);
                let mut pieces: Vec<Result<RecordBatch>> =
                    versions.chunks(size).map(|c| Ok(batch(c))).collect();
                pieces.insert(0, Ok(batch(&[]))); // empty batches are skipped
                pieces.into_iter()
            })
            .collect();
        let merge = VersionsMerge::new(schema(), streams, vec![0], mark, chunk_rows);
        let merge = if keep_tombstones {
            merge.keeping_tombstones()
        } else {
            merge
        };
        merge.collect::<Result<Vec<_>>>().unwrap()
    }

    proptest! {
        #[test]
        fn a_streamed_merge_keeps_what_the_rule_keeps(
            sources in sources(),
            pieces in prop::collection::vec(1usize..6, 1..4),
            mark in 0u64..45,
            chunk_rows in 1usize..8,
            keep_tombstones in any::<bool>(),
        ) {
            let expected = model(&sources, mark, keep_tombstones);
            if !keep_tombstones {
                let whole: Vec<RecordBatch> = sources.iter().map(|s| batch(s)).collect();
                let at_once = merge_versions(&whole, &[0], mark, 1 << 20).unwrap();
                prop_assert_eq!(rows(&at_once), expected.clone());
            }
            let streamed = merged(&sources, &pieces, mark, chunk_rows, keep_tombstones);
            prop_assert!(streamed.iter().all(|b| b.num_rows() <= chunk_rows && b.num_rows() > 0));
            prop_assert_eq!(rows(&streamed), expected);
        }
    }

    #[test]
    fn a_key_with_more_versions_than_a_chunk_keeps_them_all_and_holds_only_batches_in_use() {
        // One key with 1,000 versions (the newest a tombstone, the oldest too), 7-row
        // batches, 10-row chunks: the key goes out over many chunks, its oldest tombstone is
        // dropped, and the merge never holds more than a chunk's worth of batches.
        let mut versions: Vec<Version> = (0..1000u64)
            .map(|t| (1, t as i64, 2000 - t, false))
            .collect();
        versions[0].3 = true;
        versions[999].3 = true;
        let streams = vec![versions
            .chunks(7)
            .map(|c| Ok(batch(c)))
            .collect::<Vec<_>>()
            .into_iter()];
        let mut merge = VersionsMerge::new(schema(), streams, vec![0], 0, 10);
        let mut out = Vec::new();
        while let Some(b) = merge.next() {
            let held: usize = merge.live.iter().map(|b| b.num_rows()).sum();
            assert!(held <= 10 + 2 * 7, "the merge holds {held} rows of input");
            out.push(b.unwrap());
        }
        let got = rows(&out);
        assert_eq!(got.len(), 999);
        assert!(
            got[0].3,
            "a newest tombstone stays (it shadows what is older)"
        );
        assert_eq!(got[998].2, 1002);
    }

    /// Yields `versions` in `rows`-row batches, recording the most earlier batches still
    /// held by anyone (the merge) when the next one is asked for.
    struct Watched {
        pieces: std::vec::IntoIter<RecordBatch>,
        given: Vec<std::sync::Weak<dyn Array>>,
        most_held: std::rc::Rc<std::cell::Cell<usize>>,
    }

    impl Iterator for Watched {
        type Item = Result<RecordBatch>;

        fn next(&mut self) -> Option<Self::Item> {
            let held = self.given.iter().filter(|w| w.strong_count() > 0).count();
            self.most_held.set(self.most_held.get().max(held));
            let b = self.pieces.next()?;
            self.given.push(Arc::downgrade(b.column(0)));
            Some(Ok(b))
        }
    }

    #[test]
    fn history_collected_in_one_pass_is_let_go_batch_by_batch() {
        // 10,000 versions of one key in 10-row batches, all but the newest ten at or below
        // the mark: eleven are kept, and each batch read past is let go at once.
        let versions: Vec<Version> = (0..10_000u64)
            .map(|t| (7, t as i64, 20_000 - t, false))
            .collect();
        let most_held = std::rc::Rc::new(std::cell::Cell::new(0));
        let watched = Watched {
            pieces: versions
                .chunks(10)
                .map(batch)
                .collect::<Vec<_>>()
                .into_iter(),
            given: Vec::new(),
            most_held: most_held.clone(),
        };
        let out = VersionsMerge::new(schema(), vec![watched], vec![0], 19_990, 64)
            .collect::<Result<Vec<_>>>()
            .unwrap();
        let got = rows(&out);
        assert_eq!(got.first().map(|v| v.2), Some(20_000));
        assert_eq!(
            got.last().map(|v| v.2),
            Some(19_990),
            "the newest at or below the mark"
        );
        assert_eq!(got.len(), 11);
        // The two batches the kept versions are in, and the one being read.
        assert!(
            most_held.get() <= 3,
            "{} batches held at once",
            most_held.get()
        );
    }

    fn scan_batch(rows: &[(i64, i64, bool)]) -> RecordBatch {
        let schema = Arc::new(ArrowSchema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
            Field::new("__deleted", DataType::Boolean, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(BooleanArray::from_iter(rows.iter().map(|r| Some(r.2)))),
            ],
        )
        .unwrap()
    }

    proptest! {
        #[test]
        fn a_streamed_scan_merge_gives_each_key_its_newest_row(
            raw in prop::collection::vec(
                prop::collection::btree_map(0i64..30, (any::<i64>(), any::<bool>()), 0..25),
                1..5,
            ),
            piece in 1usize..6,
            chunk_rows in 1usize..8,
        ) {
            // Sources newest first, one row per key each (a scan's visible rows).
            let sources: Vec<Vec<(i64, i64, bool)>> = raw
                .iter()
                .map(|m| m.iter().map(|(k, (v, d))| (*k, *v, *d)).collect())
                .collect();
            let mut expected = Vec::new();
            for key in 0i64..30 {
                if let Some(row) = sources.iter().find_map(|s| s.iter().find(|r| r.0 == key)) {
                    if !row.2 {
                        expected.push((row.0, row.1));
                    }
                }
            }
            let schema = scan_batch(&[]).schema();
            let streams: Vec<_> = sources
                .iter()
                .map(|s| s.chunks(piece).map(|c| Ok(scan_batch(c))).collect::<Vec<_>>().into_iter())
                .collect();
            let out = VersionsMerge::newest(schema, streams, vec![0], chunk_rows)
                .collect::<Result<Vec<_>>>()
                .unwrap();
            let mut got = Vec::new();
            for b in &out {
                prop_assert!(b.num_rows() <= chunk_rows);
                let k = b.column(0).as_primitive::<arrow::datatypes::Int64Type>();
                let v = b.column(1).as_primitive::<arrow::datatypes::Int64Type>();
                prop_assert!(!b.column(2).as_boolean().values().iter().any(|d| d));
                for i in 0..b.num_rows() {
                    got.push((k.value(i), v.value(i)));
                }
            }
            prop_assert_eq!(got, expected);
        }
    }
}
