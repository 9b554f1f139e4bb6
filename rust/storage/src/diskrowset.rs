//! DiskRowSets: immutable Parquet files sorted by primary key, each with a key bloom filter
//! in a sidecar file, min/max keys in the Parquet footer and a sparse key index (the first row
//! of each key block, stored after the filter; the blocks are read through `key_blocks`'
//! cache).
//!
//! Files are named by rowset id (`rs-00000007.parquet`, `rs-00000007.bloom`). Columns are named
//! as in the schema at write time and carry their column id in the Arrow field metadata; the
//! hidden `__ts` column holds each row version's commit timestamp (files written before row
//! versions lack it: their rows read as timestamp 0) and the hidden `__deleted` column marks
//! tombstones. Rows are sorted by key, then by timestamp descending; a file whose footer says
//! it holds one version per key is read by latest scans exactly as before versions existed. A rowset that compaction replaced deletes its
//! files when the last reader, scan or tablet-copy snapshot holding it lets go.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use arrow::array::{ArrayRef, AsArray, BooleanArray, RecordBatch, UInt64Array};
use arrow::datatypes::UInt64Type;
use arrow::datatypes::{DataType as ArrowType, Field, Schema as ArrowSchema, SchemaRef};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;
use parquet::arrow::arrow_reader::{
    ArrowPredicate, ArrowPredicateFn, ArrowReaderMetadata, ArrowReaderOptions,
    ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder, RowFilter, RowSelection,
    RowSelector,
};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::basic::Compression;
use parquet::file::metadata::{KeyValue, RowGroupMetaData};
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use crate::error::{Result, StorageError};
use crate::key::{encode_keys, EncodedKeys, KeyBloom};
use crate::key_blocks::{self, KeyBlock, KEY_BLOCK_ROWS};
use crate::memrowset::{Presence, DELETED_COLUMN, TS_COLUMN};
use crate::predicate::{ColumnStats, Predicate};
use crate::schema::{field_column_id, ColumnSchema, DataType, Schema};

const BLOOM_MAGIC: &[u8; 4] = b"NYBF";
/// 2: the first row of each key block follows the filter (version 1 files, the filter alone,
/// are still read: their sparse index is built by a pass over the key columns).
const BLOOM_VERSION: u16 = 2;
/// Rows per Parquet row group: the unit of statistics pruning.
pub const ROW_GROUP_ROWS: usize = 128 * 1024;
/// Size at which a string or binary column chunk's dictionary falls back to plain encoding,
/// in bytes (parquet's default is 1 MiB).
pub const DICTIONARY_PAGE_BYTES_MAX: usize = 256 * 1024;
/// Rows per batch handed out by readers.
pub const READ_BATCH_ROWS: usize = 64 * 1024;

/// The data file of rowset `id`.
pub fn data_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("rs-{id:08}.parquet"))
}

/// The bloom filter file of rowset `id`.
pub fn bloom_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("rs-{id:08}.bloom"))
}

/// The rowset id a file name belongs to, if it is a rowset file.
pub fn parse_file_name(name: &str) -> Option<u64> {
    let stem = name
        .strip_prefix("rs-")?
        .strip_suffix(".parquet")
        .or_else(|| name.strip_prefix("rs-")?.strip_suffix(".bloom"))?;
    stem.parse().ok()
}

/// A row filter over one file column.
#[derive(Clone)]
enum ColumnFilter {
    /// Keep rows of file column `.0` that match the predicate.
    Matches(usize, Predicate),
    /// Keep rows whose `__deleted` (file column `.0`) is false.
    Live(usize),
}

impl ColumnFilter {
    fn column(&self) -> usize {
        match self {
            ColumnFilter::Matches(at, _) | ColumnFilter::Live(at) => *at,
        }
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<BooleanArray> {
        match self {
            ColumnFilter::Matches(_, predicate) => predicate.evaluate(batch.column(0)),
            ColumnFilter::Live(_) => arrow::compute::not(batch.column(0).as_boolean())
                .map_err(|e| StorageError::arrow_internal("tombstone filter", e)),
        }
    }
}

/// Most threads one rowset read uses (row groups are split between them).
const READ_THREADS_MAX: usize = 4;

/// Bytes every open rowset of the process holds in memory for as long as it is open: its
/// bloom filter (10 bits a key), its Parquet footer, its key range and its sparse key index
/// (once read). Not a cache: they go only when the rowset is dropped (`index_bytes`).
static OPEN_INDEX_BYTES: AtomicUsize = AtomicUsize::new(0);

/// What the process's open rowsets hold in memory besides the key block cache: their bloom
/// filters, Parquet footers, key ranges and sparse key indexes. A tablet server counts it
/// against its memory limit.
pub fn index_bytes() -> usize {
    OPEN_INDEX_BYTES.load(Ordering::Relaxed)
}

/// Where each key block of a rowset starts, and its first row: a presence check finds the
/// one block that may hold a key's newest version here, then reads that block (through the
/// process-wide `key_blocks` cache). About 1/4096 of the keys: the memory does not grow with
/// what the rowset holds as a full index did.
struct KeyIndex {
    /// Per block: its first row's key and whether that row is a tombstone (the writer keeps
    /// them in the bloom file: every `KEY_BLOCK_ROWS`-th row of the file).
    firsts: KeyBlock,
    /// Per block: (row group, first row within the group, rows).
    blocks: Vec<(usize, usize, usize)>,
}

impl KeyIndex {
    /// Heap and inline bytes of the index.
    fn bytes(&self) -> usize {
        self.firsts.bytes() + self.blocks.capacity() * std::mem::size_of::<(usize, usize, usize)>()
    }

    /// The index the writer kept, if the file's blocks start where it noted rows: every row
    /// group but the last a whole number of blocks, as the writer makes them. None otherwise
    /// (a pass over the key columns builds it); a count that disagrees is corruption.
    fn written(
        metadata: &ArrowReaderMetadata,
        firsts: KeyBlock,
        bloom_file: &Path,
    ) -> Result<Option<KeyIndex>> {
        let groups = metadata.metadata().row_groups();
        let blocks = KeyIndex::layout(groups.iter().map(|g| g.num_rows() as usize));
        let group_starts = KeyIndex::group_starts(groups);
        let aligned = blocks
            .iter()
            .enumerate()
            .all(|(i, &(group, start, _))| group_starts[group] + start == i * KEY_BLOCK_ROWS);
        if !aligned {
            return Ok(None);
        }
        if firsts.keys.len() != blocks.len() || firsts.deleted.len() != blocks.len() {
            return Err(StorageError::corruption(format!(
                "{}: {} key blocks noted for a file of {}",
                bloom_file.display(),
                firsts.keys.len(),
                blocks.len()
            )));
        }
        Ok(Some(KeyIndex { firsts, blocks }))
    }

    /// Each row group's first row in the file.
    fn group_starts(groups: &[RowGroupMetaData]) -> Vec<usize> {
        let mut starts = Vec::with_capacity(groups.len());
        let mut total = 0usize;
        for group in groups {
            starts.push(total);
            total += group.num_rows() as usize;
        }
        starts
    }

    /// The key blocks of a file with these row groups' row counts.
    fn layout(group_rows: impl Iterator<Item = usize>) -> Vec<(usize, usize, usize)> {
        let mut blocks = Vec::new();
        for (group, rows) in group_rows.enumerate() {
            for start in (0..rows).step_by(KEY_BLOCK_ROWS) {
                blocks.push((group, start, KEY_BLOCK_ROWS.min(rows - start)));
            }
        }
        blocks
    }
}

/// Where an output column of a rowset read comes from.
enum Slot {
    /// Column `.0` of the decoded file batch.
    File(usize),
    /// A column the file predates: its default (or null) on every row.
    Fill(ColumnSchema),
}

/// Where a read's `__ts` column comes from.
enum TsSlot {
    /// Column `.0` of the decoded file batch.
    File(usize),
    /// The file predates row versions: every row is timestamp 0.
    Zero,
}

/// How decoded file batches become a read's output batches.
struct ReadLayout {
    slots: Vec<Slot>,
    ts: Option<TsSlot>,
    with_deleted: bool,
    schema: SchemaRef,
}

impl ReadLayout {
    fn apply(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.slots.len() + 2);
        for slot in &self.slots {
            arrays.push(match slot {
                Slot::File(i) => batch.column(*i).clone(),
                Slot::Fill(column) => column.fill(batch.num_rows())?,
            });
        }
        match &self.ts {
            Some(TsSlot::File(i)) => arrays.push(batch.column(*i).clone()),
            Some(TsSlot::Zero) => {
                arrays.push(Arc::new(UInt64Array::from(vec![0u64; batch.num_rows()])))
            }
            None => {}
        }
        if self.with_deleted {
            arrays.push(batch.column(batch.num_columns() - 1).clone());
        }
        RecordBatch::try_new(self.schema.clone(), arrays)
            .map_err(|e| StorageError::arrow_internal("rowset read", e))
    }
}

/// A planned rowset read: file columns to decode, row filters, row groups, output layout.
struct ReadPlan {
    wanted: Vec<usize>,
    filters: Vec<ColumnFilter>,
    groups: Vec<usize>,
    layout: ReadLayout,
}

/// The batches of one rowset read, decoded as they are pulled (`DiskRowSet::stream`).
pub struct RowSetStream {
    /// Keeps the files from deletion by a compaction while the stream lives.
    rowset: RowSetRef,
    /// None when statistics ruled out every row.
    reader: Option<ParquetRecordBatchReader>,
    layout: Option<ReadLayout>,
}

impl Iterator for RowSetStream {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let batch = self.reader.as_mut()?.next()?;
        let layout = self.layout.as_ref().expect("a reader has a layout");
        Some(
            batch
                .map_err(|e| {
                    StorageError::arrow_internal(&self.rowset.path.display().to_string(), e)
                })
                .and_then(|b| layout.apply(b)),
        )
    }
}

/// One immutable, key-sorted rowset on disk.
pub struct DiskRowSet {
    id: u64,
    path: PathBuf,
    bloom_file: PathBuf,
    rows: u64,
    tombstones: u64,
    /// Bytes of the data and bloom files (fixed once written).
    bytes: u64,
    min_key: Vec<u8>,
    max_key: Vec<u8>,
    /// File position of `__ts` (None: the file predates row versions, every row is ts 0).
    ts_at: Option<usize>,
    /// Some key has more than one version in the file.
    multi_version: bool,
    /// Smallest and largest commit timestamp in the file.
    ts_min: u64,
    ts_max: u64,
    metadata: ArrowReaderMetadata,
    bloom: KeyBloom,
    key_count: usize,
    key_index: OnceLock<KeyIndex>,
    /// What this rowset added to `OPEN_INDEX_BYTES` (its drop takes it back).
    counted: AtomicUsize,
    /// Names this rowset's blocks in the `key_blocks` cache.
    owner: u64,
    /// Set when a compaction replaced this rowset: its files go when the last holder drops it.
    obsolete: AtomicBool,
}

impl std::fmt::Debug for DiskRowSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskRowSet")
            .field("id", &self.id)
            .field("rows", &self.rows)
            .field("tombstones", &self.tombstones)
            .finish()
    }
}

impl Drop for DiskRowSet {
    fn drop(&mut self) {
        key_blocks::forget(self.owner);
        OPEN_INDEX_BYTES.fetch_sub(*self.counted.get_mut(), Ordering::Relaxed);
        if self.obsolete.load(Ordering::Acquire) {
            // Best effort: a leftover is an orphan that the next open removes.
            let _ = std::fs::remove_file(&self.path);
            let _ = std::fs::remove_file(&self.bloom_file);
        }
    }
}

impl DiskRowSet {
    /// Opens rowset `id` in `dir`, checking the bloom file's checksum and the footer.
    pub fn open(dir: &Path, id: u64, key_count: usize) -> Result<DiskRowSet> {
        let path = data_path(dir, id);
        let bloom_file = bloom_path(dir, id);
        let (bloom, firsts) = read_bloom(&bloom_file)?;
        let file = File::open(&path).map_err(|e| open_error(&path, e))?;
        let data_bytes = file.metadata().map_err(|e| open_error(&path, e))?.len();
        let bloom_bytes = std::fs::metadata(&bloom_file)
            .map_err(|e| open_error(&bloom_file, e))?
            .len();
        let metadata = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new())
            .map_err(|e| StorageError::parquet(&path, e))?;
        let kv = |key: &str| -> Result<String> {
            metadata
                .metadata()
                .file_metadata()
                .key_value_metadata()
                .and_then(|all| all.iter().find(|kv| kv.key == key))
                .and_then(|kv| kv.value.clone())
                .ok_or_else(|| {
                    StorageError::corruption(format!("{}: footer lacks {key}", path.display()))
                })
        };
        let number = |key: &str| -> Result<u64> {
            kv(key)?.parse().map_err(|_| {
                StorageError::corruption(format!("{}: bad {key} in footer", path.display()))
            })
        };
        let rows = number("nyala.rows")?;
        let found_id = number("nyala.rowset_id")?;
        let tombstones = number("nyala.tombstones")?;
        let min_key = from_hex(&kv("nyala.min_key")?, &path)?;
        let max_key = from_hex(&kv("nyala.max_key")?, &path)?;
        let file_rows = metadata.metadata().file_metadata().num_rows() as u64;
        if found_id != id || rows != file_rows || tombstones > rows || min_key > max_key {
            return Err(StorageError::corruption(format!(
                "{}: footer disagrees with the file (id {found_id}, rows {rows}/{file_rows})",
                path.display()
            )));
        }
        let schema = metadata.schema();
        let fields = schema.fields().len();
        let ts_at =
            (fields >= 2 && schema.field(fields - 2).name() == TS_COLUMN).then_some(fields - 2);
        if fields < key_count + 1 + usize::from(ts_at.is_some())
            || schema.field(fields - 1).name() != DELETED_COLUMN
        {
            return Err(StorageError::corruption(format!(
                "{}: unexpected columns",
                path.display()
            )));
        }
        // Footer keys of row versions; absent in files written before them.
        let (multi_version, ts_min, ts_max) = if ts_at.is_some() {
            (
                number("nyala.multi_version")? != 0,
                number("nyala.ts_min")?,
                number("nyala.ts_max")?,
            )
        } else {
            (false, 0, 0)
        };
        let key_index = OnceLock::new();
        if let Some(firsts) = firsts {
            if let Some(index) = KeyIndex::written(&metadata, firsts, &bloom_file)? {
                let _ = key_index.set(index);
            }
        }
        let resident = bloom.heap_bytes()
            + metadata.metadata().memory_size()
            + min_key.capacity()
            + max_key.capacity();
        let counted = resident + key_index.get().map_or(0, KeyIndex::bytes);
        OPEN_INDEX_BYTES.fetch_add(counted, Ordering::Relaxed);
        Ok(DiskRowSet {
            id,
            path,
            bloom_file,
            rows,
            tombstones,
            bytes: data_bytes + bloom_bytes,
            min_key,
            max_key,
            ts_at,
            multi_version,
            ts_min,
            ts_max,
            metadata,
            bloom,
            key_count,
            key_index,
            counted: AtomicUsize::new(counted),
            owner: key_blocks::new_owner(),
            obsolete: AtomicBool::new(false),
        })
    }

    /// The rowset id (also its recency: higher ids hold newer data... except compaction
    /// outputs, whose place in the list, not their id, gives their recency).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Rows in the file, tombstones included.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Tombstone rows in the file.
    pub fn tombstones(&self) -> u64 {
        self.tombstones
    }

    /// Bytes of the rowset's files on disk.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The smallest and largest encoded keys.
    pub fn key_range(&self) -> (&[u8], &[u8]) {
        (&self.min_key, &self.max_key)
    }

    /// Whether some key has more than one version in this rowset.
    pub fn multi_version(&self) -> bool {
        self.multi_version
    }

    /// The smallest and largest commit timestamp of the rows in this rowset.
    pub fn ts_range(&self) -> (u64, u64) {
        (self.ts_min, self.ts_max)
    }

    /// Whether a read at `snapshot_ts` (None: latest) must pick versions
    /// (`stream_visible`) rather than read rows as they are.
    pub fn needs_versions(&self, snapshot_ts: Option<u64>) -> bool {
        self.multi_version || snapshot_ts.is_some_and(|ts| ts < self.ts_max)
    }

    /// The files making up this rowset.
    pub fn files(&self) -> [&Path; 2] {
        [&self.path, &self.bloom_file]
    }

    /// Bytes this rowset holds while open (counted in `index_bytes`): its bloom filter,
    /// footer, key range and, once read, its sparse key index.
    pub fn index_bytes(&self) -> usize {
        self.counted.load(Ordering::Relaxed)
    }

    /// Marks the rowset replaced; its files are deleted when the last `Arc` drops.
    pub(crate) fn mark_obsolete(&self) {
        self.obsolete.store(true, Ordering::Release);
    }

    /// What this rowset says about `key`: the bloom filter answers most misses without I/O;
    /// a possible hit reads the key block that may hold it (`key_blocks`), found by the
    /// sparse index (read with the bloom filter; for files written without it, built once by
    /// a pass over the key columns).
    pub fn presence(&self, key: &[u8]) -> Result<Presence> {
        if key < self.min_key.as_slice() || key > self.max_key.as_slice() {
            return Ok(Presence::Unknown);
        }
        if !self.bloom.may_contain(key) {
            return Ok(Presence::Unknown);
        }
        let index = match self.key_index.get() {
            Some(index) => index,
            None => {
                let loaded = self.load_key_index()?;
                let bytes = loaded.bytes();
                if self.key_index.set(loaded).is_ok() {
                    self.counted.fetch_add(bytes, Ordering::Relaxed);
                    OPEN_INDEX_BYTES.fetch_add(bytes, Ordering::Relaxed);
                }
                self.key_index.get().expect("set by this thread or another")
            }
        };
        // Blocks whose first key is below `key`: the last of them holds the key's newest
        // version (its first row) if the key starts there; else the key, if here, starts the
        // next block.
        let low = index.firsts.keys.lower_bound(key);
        let found = match low.checked_sub(1) {
            None => None,
            Some(block) => {
                let keys = key_blocks::get_or_load(self.owner, block, || {
                    self.read_key_block(index.blocks[block])
                })?;
                keys.find(key)
            }
        };
        let deleted = match found {
            Some(deleted) => deleted,
            None if low < index.firsts.keys.len() && index.firsts.keys.get(low) == key => {
                index.firsts.deleted[low]
            }
            None => return Ok(Presence::Unknown),
        };
        Ok(if deleted {
            Presence::Deleted
        } else {
            Presence::Live
        })
    }

    /// The first row of each key block, read a row group at a time (only those rows'
    /// keys are encoded).
    fn load_key_index(&self) -> Result<KeyIndex> {
        let groups = self.metadata.metadata().row_groups();
        let blocks = KeyIndex::layout(groups.iter().map(|g| g.num_rows() as usize));
        let group_starts = KeyIndex::group_starts(groups);
        let mut starts = blocks
            .iter()
            .map(|&(group, start, _)| group_starts[group] + start);
        let mut firsts = KeyBlock::default();
        let mut next = starts.next();
        let mut row = 0usize;
        for batch in self.reader(&self.key_columns(), &[], None, None)? {
            let batch = batch
                .map_err(|e| StorageError::arrow_internal(&self.path.display().to_string(), e))?;
            while let Some(at) = next.filter(|at| *at < row + batch.num_rows()) {
                let one = batch.slice(at - row, 1);
                firsts
                    .keys
                    .push(encode_keys(&one.columns()[..self.key_count])?.get(0));
                firsts
                    .deleted
                    .push(one.column(self.key_count).as_boolean().value(0));
                next = starts.next();
            }
            row += batch.num_rows();
        }
        if firsts.keys.len() != blocks.len() {
            return Err(StorageError::corruption(format!(
                "{}: {} rows read for {} key blocks",
                self.path.display(),
                row,
                blocks.len()
            )));
        }
        Ok(KeyIndex { firsts, blocks })
    }

    /// Block `(group, start, rows)`'s keys, each once (its first row in the block).
    fn read_key_block(&self, (group, start, rows): (usize, usize, usize)) -> Result<KeyBlock> {
        let selection =
            RowSelection::from(vec![RowSelector::skip(start), RowSelector::select(rows)]);
        let reader = self
            .builder(&self.key_columns())?
            .with_row_groups(vec![group])
            .with_row_selection(selection)
            .build()
            .map_err(|e| StorageError::parquet(&self.path, e))?;
        let mut block = KeyBlock::default();
        for batch in reader {
            let batch = batch
                .map_err(|e| StorageError::arrow_internal(&self.path.display().to_string(), e))?;
            let keys = encode_keys(&batch.columns()[..self.key_count])?;
            let flags = batch.column(self.key_count).as_boolean();
            for i in 0..keys.len() {
                let key = keys.get(i);
                if block.keys.last() != Some(key) {
                    block.keys.push(key); // the first row of a key is its newest version
                    block.deleted.push(flags.value(i));
                }
            }
        }
        block.keys.shrink_to_fit(); // cached as long as it is used: no spare capacity
        block.deleted.shrink_to_fit();
        Ok(block)
    }

    /// The file columns a key lookup reads: the key columns, then `__deleted`.
    fn key_columns(&self) -> Vec<usize> {
        let mut columns: Vec<usize> = (0..self.key_count).collect();
        columns.push(self.metadata.schema().fields().len() - 1);
        columns
    }

    /// A reader builder of the columns at `file_columns` (positions in this file's schema),
    /// in batches of at most `READ_BATCH_ROWS`.
    fn builder(&self, file_columns: &[usize]) -> Result<ParquetRecordBatchReaderBuilder<File>> {
        let file = File::open(&self.path).map_err(|e| open_error(&self.path, e))?;
        let parquet_schema = self.metadata.metadata().file_metadata().schema_descr_ptr();
        Ok(
            ParquetRecordBatchReaderBuilder::new_with_metadata(file, self.metadata.clone())
                .with_batch_size(READ_BATCH_ROWS)
                .with_projection(ProjectionMask::roots(
                    &parquet_schema,
                    file_columns.iter().copied(),
                )),
        )
    }

    /// A reader of the columns at `file_columns` (positions in this file's schema), keeping
    /// only rows that pass `filters` (each over one file column), over row groups
    /// `row_groups` (all if None), stopping after `limit` rows. It decodes one row group at a
    /// time, as it is iterated.
    fn reader(
        &self,
        file_columns: &[usize],
        filters: &[ColumnFilter],
        row_groups: Option<Vec<usize>>,
        limit: Option<usize>,
    ) -> Result<ParquetRecordBatchReader> {
        let parquet_schema = self.metadata.metadata().file_metadata().schema_descr_ptr();
        let mut builder = self.builder(file_columns)?;
        if let Some(groups) = row_groups {
            builder = builder.with_row_groups(groups);
        }
        if !filters.is_empty() {
            let predicates: Vec<Box<dyn ArrowPredicate>> = filters
                .iter()
                .map(|filter| {
                    let mask = ProjectionMask::roots(&parquet_schema, [filter.column()]);
                    let filter = filter.clone();
                    Box::new(ArrowPredicateFn::new(mask, move |batch: RecordBatch| {
                        filter
                            .evaluate(&batch)
                            .map_err(|e| arrow::error::ArrowError::ExternalError(Box::new(e)))
                    })) as Box<dyn ArrowPredicate>
                })
                .collect();
            builder = builder.with_row_filter(RowFilter::new(predicates));
        }
        if let Some(limit) = limit {
            builder = builder.with_limit(limit);
        }
        builder
            .build()
            .map_err(|e| StorageError::parquet(&self.path, e))
    }

    /// `reader` read to the end.
    fn read_raw(
        &self,
        file_columns: &[usize],
        filters: &[ColumnFilter],
        row_groups: Option<Vec<usize>>,
        limit: Option<usize>,
    ) -> Result<Vec<RecordBatch>> {
        self.reader(file_columns, filters, row_groups, limit)?
            .map(|b| {
                b.map_err(|e| StorageError::arrow_internal(&self.path.display().to_string(), e))
            })
            .collect()
    }

    /// `read_raw` over `groups`, split into contiguous runs read by parallel threads when
    /// there is no row limit (decoding Parquet is CPU-bound; order is kept by run).
    fn read_groups(
        &self,
        file_columns: &[usize],
        filters: &[ColumnFilter],
        groups: Vec<usize>,
        limit: Option<usize>,
    ) -> Result<Vec<RecordBatch>> {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(READ_THREADS_MAX)
            .min(groups.len());
        let unlimited = limit.is_none_or(|l| l as u64 >= self.rows);
        if threads < 2 || !unlimited {
            return self.read_raw(file_columns, filters, Some(groups), limit);
        }
        let per_thread = groups.len().div_ceil(threads);
        let runs: Vec<Vec<usize>> = groups.chunks(per_thread).map(|c| c.to_vec()).collect();
        let results: Vec<Result<Vec<RecordBatch>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = runs
                .into_iter()
                .map(|run| {
                    scope.spawn(move || self.read_raw(file_columns, filters, Some(run), None))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("rowset reader thread panicked"))
                .collect()
        });
        let mut out = Vec::new();
        for result in results {
            out.extend(result?);
        }
        Ok(out)
    }

    /// Plans a read of the schema's columns at `columns` (see `read`): which file columns to
    /// decode, the row filters, the row groups statistics cannot rule out, and how file
    /// batches map to the output. None if no row can match.
    fn plan_read(
        &self,
        schema: &Schema,
        columns: &[usize],
        predicates: &[Predicate],
        with_ts: bool,
        with_deleted: bool,
    ) -> Result<Option<ReadPlan>> {
        let file_schema = self.metadata.schema().clone();
        let file_index = |schema_column: usize| -> Option<usize> {
            let id = schema.columns()[schema_column].id;
            file_schema
                .fields()
                .iter()
                .position(|f| field_column_id(f) == Some(id))
        };
        let deleted_at = file_schema.fields().len() - 1;
        let mut filters: Vec<ColumnFilter> = Vec::new();
        let mut keep_groups = vec![true; self.metadata.metadata().num_row_groups()];
        for predicate in predicates {
            let position = schema.index_of(&predicate.column).ok_or_else(|| {
                StorageError::invalid(format!("no column {:?}", predicate.column))
            })?;
            let Some(at) = file_index(position) else {
                // The file predates the column: every row has the fill value.
                let fill = schema.columns()[position].fill(1)?;
                if !predicate.evaluate(fill.as_ref())?.value(0) {
                    return Ok(None);
                }
                continue;
            };
            let stats = self.column_stats(&file_schema, at)?;
            for (keep, may) in keep_groups
                .iter_mut()
                .zip(predicate.row_groups_may_match(&stats)?)
            {
                *keep &= may;
            }
            filters.push(ColumnFilter::Matches(at, predicate.clone()));
        }
        if !with_deleted && self.tombstones > 0 {
            filters.push(ColumnFilter::Live(deleted_at));
        }
        let groups: Vec<usize> = (0..keep_groups.len()).filter(|g| keep_groups[*g]).collect();
        if groups.is_empty() {
            return Ok(None);
        }
        let mut wanted: Vec<usize> = columns.iter().filter_map(|c| file_index(*c)).collect();
        if with_deleted {
            wanted.push(deleted_at);
        }
        if let Some(ts_at) = self.ts_at.filter(|_| with_ts) {
            wanted.push(ts_at);
        }
        wanted.sort_unstable();
        wanted.dedup();
        let ts = with_ts.then(|| match self.ts_at {
            Some(at) => TsSlot::File(wanted.binary_search(&at).expect("projected")),
            None => TsSlot::Zero,
        });
        let slots = columns
            .iter()
            .map(|c| match file_index(*c) {
                Some(at) => Slot::File(wanted.binary_search(&at).expect("projected")),
                None => Slot::Fill(schema.columns()[*c].clone()),
            })
            .collect();
        Ok(Some(ReadPlan {
            wanted,
            filters,
            groups,
            layout: ReadLayout {
                slots,
                ts,
                with_deleted,
                schema: if with_ts {
                    versions_schema(schema, columns)
                } else {
                    output_schema(schema, columns, with_deleted)
                },
            },
        }))
    }

    /// Reads the rows of this rowset as the schema's columns at `columns` (positions in
    /// `schema`), plus `__deleted` when `with_deleted`; tombstones are dropped otherwise.
    /// `predicates` are pushed into the reader (statistics pruning and row filters); `limit`
    /// stops early. Columns the file predates read as their default (or null).
    pub fn read(
        &self,
        schema: &Schema,
        columns: &[usize],
        predicates: &[Predicate],
        with_deleted: bool,
        limit: Option<usize>,
    ) -> Result<Vec<RecordBatch>> {
        let Some(plan) = self.plan_read(schema, columns, predicates, false, with_deleted)? else {
            return Ok(Vec::new());
        };
        let raw = self.read_groups(&plan.wanted, &plan.filters, plan.groups, limit)?;
        raw.into_iter().map(|b| plan.layout.apply(b)).collect()
    }

    /// `read` as a stream that decodes one row group at a time while it is iterated; the
    /// stream holds the rowset (its files stay until the stream is dropped).
    pub fn stream(
        self: &Arc<Self>,
        schema: &Schema,
        columns: &[usize],
        predicates: &[Predicate],
        limit: Option<usize>,
    ) -> Result<RowSetStream> {
        self.stream_rows(schema, columns, predicates, false, limit)
    }

    /// `stream`, with `__deleted` (tombstones kept) when `with_deleted`.
    pub fn stream_rows(
        self: &Arc<Self>,
        schema: &Schema,
        columns: &[usize],
        predicates: &[Predicate],
        with_deleted: bool,
        limit: Option<usize>,
    ) -> Result<RowSetStream> {
        let plan = self.plan_read(schema, columns, predicates, false, with_deleted)?;
        self.stream_plan(plan, limit)
    }

    /// Every row version of this rowset as the schema's columns at `columns`, then `__ts` and
    /// `__deleted`, in (key ascending, timestamp descending) order (what compaction merges),
    /// decoded a row group at a time as the stream is pulled; the stream holds the rowset.
    pub fn stream_versions(
        self: &Arc<Self>,
        schema: &Schema,
        columns: &[usize],
    ) -> Result<RowSetStream> {
        let plan = self.plan_read(schema, columns, &[], true, true)?;
        self.stream_plan(plan, None)
    }

    /// The stream reading `plan` (None: statistics ruled out every row, an empty stream).
    fn stream_plan(
        self: &Arc<Self>,
        plan: Option<ReadPlan>,
        limit: Option<usize>,
    ) -> Result<RowSetStream> {
        let (reader, layout) = match plan {
            Some(plan) => (
                Some(self.reader(&plan.wanted, &plan.filters, Some(plan.groups), limit)?),
                Some(plan.layout),
            ),
            None => (None, None),
        };
        Ok(RowSetStream {
            rowset: self.clone(),
            reader,
            layout,
        })
    }

    /// Per key, the version visible at `snapshot_ts` (None: the newest), as the schema's
    /// columns at `columns` (which must start with the key columns), plus `__deleted` when
    /// `with_deleted` (tombstones are dropped otherwise), decoded a row group at a time as
    /// the stream is pulled. No predicate is pushed into the reader: an older version must
    /// not match where the visible one does not.
    pub fn stream_visible(
        self: &Arc<Self>,
        schema: &Schema,
        columns: &[usize],
        snapshot_ts: Option<u64>,
        with_deleted: bool,
    ) -> Result<impl Iterator<Item = Result<RecordBatch>> + Send + 'static> {
        let stream = self.stream_versions(schema, columns)?;
        let mut visible = VisibleVersions {
            key_count: schema.key_count(),
            snapshot_ts,
            last_key: None,
            with_deleted,
        };
        Ok(stream.map(move |batch| visible.filter(batch?)))
    }

    fn column_stats(&self, file_schema: &SchemaRef, at: usize) -> Result<ColumnStats> {
        let metadata = self.metadata.metadata();
        let converter = StatisticsConverter::try_new(
            file_schema.field(at).name(),
            file_schema,
            metadata.file_metadata().schema_descr(),
        )
        .map_err(|e| StorageError::parquet(&self.path, e))?;
        let groups = metadata.row_groups();
        let err = |e| StorageError::parquet(&self.path, e);
        Ok(ColumnStats {
            mins: converter.row_group_mins(groups).map_err(err)?,
            maxes: converter.row_group_maxes(groups).map_err(err)?,
            null_counts: converter.row_group_null_counts(groups).map_err(err)?,
            row_counts: converter
                .row_group_row_counts(groups)
                .map_err(err)?
                .unwrap_or_else(|| groups.iter().map(|g| g.num_rows() as u64).collect()),
        })
    }
}

/// The Arrow schema of a rowset read: the chosen schema columns (current names, nullable as
/// stored), plus `__deleted` if asked for.
pub fn output_schema(schema: &Schema, columns: &[usize], with_deleted: bool) -> SchemaRef {
    let storage = crate::ops::storage_arrow_schema(schema);
    let mut fields: Vec<Field> = columns.iter().map(|c| storage.field(*c).clone()).collect();
    if with_deleted {
        fields.push(Field::new(DELETED_COLUMN, ArrowType::Boolean, false));
    }
    Arc::new(ArrowSchema::new(fields))
}

/// The Arrow schema of row versions: the chosen schema columns, `__ts`, `__deleted` (the
/// layout of rowset files when `columns` is every column).
pub fn versions_schema(schema: &Schema, columns: &[usize]) -> SchemaRef {
    let storage = crate::ops::storage_arrow_schema(schema);
    let mut fields: Vec<Field> = columns.iter().map(|c| storage.field(*c).clone()).collect();
    fields.push(Field::new(TS_COLUMN, ArrowType::UInt64, false));
    fields.push(Field::new(DELETED_COLUMN, ArrowType::Boolean, false));
    Arc::new(ArrowSchema::new(fields))
}

/// Picks, from row versions in (key ascending, timestamp descending) order, each key's
/// version visible at a snapshot: its first with a timestamp at or below it. Batches come in
/// order, so a key's versions may straddle two of them: the previous batch's last key is
/// remembered.
struct VisibleVersions {
    key_count: usize,
    snapshot_ts: Option<u64>,
    /// The last key of the previous batch, and whether a version of it was taken.
    last_key: Option<(Vec<u8>, bool)>,
    with_deleted: bool,
}

impl VisibleVersions {
    /// `batch` (columns, `__ts`, `__deleted`) to its visible rows (columns and, if asked,
    /// `__deleted`).
    fn filter(&mut self, batch: RecordBatch) -> Result<RecordBatch> {
        let n = batch.num_columns();
        let keys = encode_keys(&batch.columns()[..self.key_count])?;
        let ts = batch.column(n - 2).as_primitive::<UInt64Type>();
        let deleted = batch.column(n - 1).as_boolean();
        let limit = self.snapshot_ts.unwrap_or(u64::MAX);
        let rows = batch.num_rows();
        let mut keep = Vec::with_capacity(rows);
        let mut visible_live = Vec::with_capacity(rows);
        // Whether a version of the current key was taken; the first row continues the
        // previous batch's last key if it is the same.
        let mut taken = false;
        for i in 0..rows {
            let key = keys.get(i);
            let same_key = match i {
                0 => self.last_key.as_ref().is_some_and(|(last, _)| last == key),
                _ => keys.get(i - 1) == key,
            };
            if !same_key {
                taken = false;
            } else if i == 0 {
                taken = self.last_key.as_ref().is_some_and(|(_, t)| *t);
            }
            let take = !taken && ts.value(i) <= limit;
            taken |= take;
            keep.push(take);
            visible_live.push(take && !deleted.value(i));
        }
        if rows > 0 {
            self.last_key = Some((keys.get(rows - 1).to_vec(), taken));
        }
        let mask = if self.with_deleted {
            keep
        } else {
            visible_live
        };
        let mut columns: Vec<ArrayRef> = batch.columns()[..n - 2].to_vec();
        let mut fields: Vec<Field> = batch.schema().fields()[..n - 2]
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        if self.with_deleted {
            columns.push(batch.column(n - 1).clone());
            fields.push(batch.schema().field(n - 1).clone());
        }
        let projected = RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns)
            .map_err(|e| StorageError::arrow_internal("version filter", e))?;
        arrow::compute::filter_record_batch(&projected, &BooleanArray::from(mask))
            .map_err(|e| StorageError::arrow_internal("version filter", e))
    }
}

/// Concatenates batches (all of one schema) into one.
pub fn concat(batches: &[RecordBatch], path: &Path) -> Result<RecordBatch> {
    let schema = batches
        .first()
        .map(|b| b.schema())
        .unwrap_or_else(|| Arc::new(ArrowSchema::empty()));
    arrow::compute::concat_batches(&schema, batches)
        .map_err(|e| StorageError::arrow_internal(&path.display().to_string(), e))
}

/// Writes one rowset: sorted batches in, a durable Parquet file and bloom file out.
pub struct RowSetWriter {
    dir: PathBuf,
    id: u64,
    key_count: usize,
    writer: Option<ArrowWriter<File>>,
    bloom: KeyBloom,
    /// Every `KEY_BLOCK_ROWS`-th row's key and tombstone flag (the sparse key index).
    firsts: KeyBlock,
    rows: u64,
    tombstones: u64,
    min_key: Option<Vec<u8>>,
    max_key: Option<Vec<u8>>,
    /// Timestamp of the last row written (versions of one key descend).
    last_ts: u64,
    multi_version: bool,
    ts_min: u64,
    ts_max: u64,
}

impl RowSetWriter {
    /// Starts rowset `id` in `dir` for row versions of `schema` (storage layout, `__ts`,
    /// `__deleted`); `expected_rows` sizes the bloom filter.
    pub fn create(
        dir: &Path,
        id: u64,
        schema: &Schema,
        expected_rows: usize,
    ) -> Result<RowSetWriter> {
        Self::with_group_rows(dir, id, schema, expected_rows, ROW_GROUP_ROWS)
    }

    /// `create` with row groups of `group_rows` rows (tests: groups that are not a whole
    /// number of key blocks).
    fn with_group_rows(
        dir: &Path,
        id: u64,
        schema: &Schema,
        expected_rows: usize,
        group_rows: usize,
    ) -> Result<RowSetWriter> {
        let path = data_path(dir, id);
        let file = File::create(&path).map_err(|e| StorageError::io(&path, e))?;
        // Dictionary pages only for strings and binaries (Kudu's default too): on numeric
        // columns of mostly distinct values the dictionary fills, falls back to plain and
        // costs a hash insert per value for nothing. A string column gives up on its
        // dictionary after DICTIONARY_PAGE_BYTES_MAX, so mostly distinct strings stop paying
        // for it early while categorical ones keep it.
        let mut props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(group_rows))
            .set_dictionary_enabled(false)
            .set_dictionary_page_size_limit(DICTIONARY_PAGE_BYTES_MAX);
        for column in schema.columns() {
            if column.data_type.is_text() || column.data_type == DataType::Binary {
                props = props
                    .set_column_dictionary_enabled(ColumnPath::from(column.name.as_str()), true);
            }
        }
        let props = props.build();
        let writer = ArrowWriter::try_new(
            file,
            versions_schema(schema, &(0..schema.columns().len()).collect::<Vec<_>>()),
            Some(props),
        )
        .map_err(|e| StorageError::parquet(&path, e))?;
        Ok(RowSetWriter {
            dir: dir.to_path_buf(),
            id,
            key_count: schema.key_count(),
            writer: Some(writer),
            bloom: KeyBloom::with_capacity(expected_rows),
            firsts: KeyBlock::default(),
            rows: 0,
            tombstones: 0,
            min_key: None,
            max_key: None,
            last_ts: 0,
            multi_version: false,
            ts_min: u64::MAX,
            ts_max: 0,
        })
    }

    /// Appends a batch of row versions (storage columns, `__ts`, `__deleted`) that follow
    /// every row written before in (key ascending, timestamp descending) order.
    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let keys = encode_keys(&batch.columns()[..self.key_count])?;
        let ts = batch
            .column(batch.num_columns() - 2)
            .as_primitive::<UInt64Type>();
        let deleted = batch.column(batch.num_columns() - 1).as_boolean();
        let first_block_row = (self.rows as usize).next_multiple_of(KEY_BLOCK_ROWS);
        for row in (first_block_row..self.rows as usize + keys.len()).step_by(KEY_BLOCK_ROWS) {
            let i = row - self.rows as usize;
            self.firsts.keys.push(keys.get(i));
            self.firsts.deleted.push(deleted.value(i));
        }
        for i in 0..keys.len() {
            let key = keys.get(i);
            let previous = match i {
                0 => self.max_key.as_deref(),
                _ => Some(keys.get(i - 1)),
            };
            let version_ts = ts.value(i);
            // Assert in pairs: sorted on the way in, checked again by readers' binary search.
            match previous.map(|p| p.cmp(key)) {
                Some(std::cmp::Ordering::Equal) => {
                    assert!(
                        version_ts < self.last_ts,
                        "versions of a key must arrive in strictly decreasing timestamp order"
                    );
                    self.multi_version = true;
                }
                Some(std::cmp::Ordering::Greater) => {
                    panic!("rowset rows must arrive in increasing key order")
                }
                _ => self.bloom.insert(key),
            }
            self.last_ts = version_ts;
            self.ts_min = self.ts_min.min(version_ts);
            self.ts_max = self.ts_max.max(version_ts);
        }
        if self.min_key.is_none() {
            self.min_key = Some(keys.get(0).to_vec());
        }
        self.max_key = Some(keys.get(keys.len() - 1).to_vec());
        self.tombstones += deleted.true_count() as u64;
        self.rows += batch.num_rows() as u64;
        let path = data_path(&self.dir, self.id);
        self.writer
            .as_mut()
            .expect("not finished")
            .write(batch)
            .map_err(|e| StorageError::parquet(&path, e))
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Closes and fsyncs both files. Returns None (and removes the file) if no row was written.
    pub fn finish(mut self) -> Result<Option<(u64, u64)>> {
        let path = data_path(&self.dir, self.id);
        let mut writer = self.writer.take().expect("finish once");
        if self.rows == 0 {
            drop(writer);
            std::fs::remove_file(&path).map_err(|e| StorageError::io(&path, e))?;
            return Ok(None);
        }
        let hex = |k: &Option<Vec<u8>>| to_hex(k.as_deref().expect("rows > 0"));
        for (key, value) in [
            ("nyala.rowset_id", self.id.to_string()),
            ("nyala.rows", self.rows.to_string()),
            ("nyala.tombstones", self.tombstones.to_string()),
            ("nyala.min_key", hex(&self.min_key)),
            ("nyala.max_key", hex(&self.max_key)),
            (
                "nyala.multi_version",
                u8::from(self.multi_version).to_string(),
            ),
            ("nyala.ts_min", self.ts_min.to_string()),
            ("nyala.ts_max", self.ts_max.to_string()),
        ] {
            writer.append_key_value_metadata(KeyValue::new(key.to_string(), value));
        }
        let file = writer
            .into_inner()
            .map_err(|e| StorageError::parquet(&path, e))?;
        file.sync_all().map_err(|e| StorageError::io(&path, e))?;
        write_bloom(&bloom_path(&self.dir, self.id), &self.bloom, &self.firsts)?;
        Ok(Some((self.rows, self.tombstones)))
    }
}

/// The bloom file's body: the filter, then the key blocks' first rows (u32 count; per block
/// u8 tombstone flag, u32 key length, the encoded key; little-endian).
fn bloom_body(bloom: &KeyBloom, firsts: &KeyBlock) -> Vec<u8> {
    let mut body = bloom.to_bytes();
    body.extend_from_slice(&(firsts.keys.len() as u32).to_le_bytes());
    for (i, deleted) in firsts.deleted.iter().enumerate() {
        let key = firsts.keys.get(i);
        body.push(u8::from(*deleted));
        body.extend_from_slice(&(key.len() as u32).to_le_bytes());
        body.extend_from_slice(key);
    }
    body
}

/// `bloom_body`'s key blocks (what follows the filter); anything malformed is None.
fn parse_firsts(mut data: &[u8]) -> Option<KeyBlock> {
    fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = data.split_at_checked(n)?;
        *data = rest;
        Some(head)
    }
    let u32_at = |data: &mut &[u8]| -> Option<usize> {
        Some(u32::from_le_bytes(take(data, 4)?.try_into().ok()?) as usize)
    };
    let count = u32_at(&mut data)?;
    let mut firsts = KeyBlock {
        keys: EncodedKeys::default(),
        deleted: Vec::with_capacity(count.min(data.len() / 5)),
    };
    for _ in 0..count {
        let deleted = match take(&mut data, 1)?[0] {
            0 => false,
            1 => true,
            _ => return None,
        };
        let len = u32_at(&mut data)?;
        firsts.keys.push(take(&mut data, len)?);
        firsts.deleted.push(deleted);
    }
    firsts.keys.shrink_to_fit();
    data.is_empty().then_some(firsts)
}

fn write_bloom(path: &Path, bloom: &KeyBloom, firsts: &KeyBlock) -> Result<()> {
    let body = bloom_body(bloom, firsts);
    let mut image = Vec::with_capacity(12 + body.len());
    image.extend_from_slice(BLOOM_MAGIC);
    image.extend_from_slice(&BLOOM_VERSION.to_le_bytes());
    image.extend_from_slice(&0u16.to_le_bytes());
    image.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    image.extend_from_slice(&body);
    let mut file = File::create(path).map_err(|e| StorageError::io(path, e))?;
    file.write_all(&image)
        .map_err(|e| StorageError::io(path, e))?;
    file.sync_all().map_err(|e| StorageError::io(path, e))
}

/// The filter and, in a version 2 file, the key blocks' first rows.
fn read_bloom(path: &Path) -> Result<(KeyBloom, Option<KeyBlock>)> {
    let image = std::fs::read(path).map_err(|e| open_error(path, e))?;
    let bad = |what: &str| StorageError::corruption(format!("{}: {what}", path.display()));
    if image.len() < 12 || &image[0..4] != BLOOM_MAGIC {
        return Err(bad("not a bloom filter file"));
    }
    let version = u16::from_le_bytes([image[4], image[5]]);
    if version != 1 && version != BLOOM_VERSION {
        return Err(StorageError::NotSupported(format!(
            "{}: bloom format version {version}",
            path.display()
        )));
    }
    let crc = u32::from_le_bytes(image[8..12].try_into().expect("4 bytes"));
    let body = &image[12..];
    if crc32c::crc32c(body) != crc {
        return Err(bad("bloom filter checksum mismatch"));
    }
    if version == 1 {
        let bloom = KeyBloom::from_bytes(body).map_err(|_| bad("malformed bloom filter"))?;
        return Ok((bloom, None));
    }
    // The filter's own length: its header (hash count, word count) and the words.
    let words = body
        .get(4..8)
        .map(|w| u32::from_le_bytes(w.try_into().expect("4 bytes")) as usize);
    let filter_len = words.and_then(|w| w.checked_mul(8)?.checked_add(8));
    let Some((filter, rest)) = filter_len.and_then(|n| body.split_at_checked(n)) else {
        return Err(bad("malformed bloom filter"));
    };
    let bloom = KeyBloom::from_bytes(filter).map_err(|_| bad("malformed bloom filter"))?;
    let firsts = parse_firsts(rest).ok_or_else(|| bad("malformed key block index"))?;
    Ok((bloom, Some(firsts)))
}

fn open_error(path: &Path, err: std::io::Error) -> StorageError {
    if err.kind() == std::io::ErrorKind::NotFound {
        // A rowset listed in the manifest is missing: the tablet's data is damaged.
        StorageError::corruption(format!("{}: rowset file missing", path.display()))
    } else {
        StorageError::io(path, err)
    }
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str, path: &Path) -> Result<Vec<u8>> {
    let bad = || StorageError::corruption(format!("{}: bad hex key in footer", path.display()));
    if !text.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad()))
        .collect()
}

/// Shared handle to a rowset.
pub type RowSetRef = Arc<DiskRowSet>;

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::Int64Array;

    /// Rows of a rowset past two row groups: keys 0..150,000, key 70,000 with 6,000
    /// versions (block starts fall among a key's versions), every 11th key's newest version
    /// a tombstone; written in batches of 9,999 rows (block starts fall inside batches).
    const KEYS: i64 = 150_000;
    const HOT_KEY: i64 = 70_000;

    fn schema() -> Schema {
        Schema::build(
            vec![
                ("id".into(), DataType::Int64, false),
                ("v".into(), DataType::Int64, true),
            ],
            &["id"],
        )
        .unwrap()
    }

    fn write_rowset(dir: &Path) {
        write_rowset_in_groups(dir, ROW_GROUP_ROWS);
    }

    fn write_rowset_in_groups(dir: &Path, group_rows: usize) {
        let schema = schema();
        let arrow_schema = versions_schema(&schema, &[0, 1]);
        let mut rows: Vec<(i64, u64, bool)> = Vec::new();
        for key in 0..KEYS {
            let versions = if key == HOT_KEY { 6_000 } else { 1 };
            for v in 0..versions {
                let deleted = v == 0 && key % 11 == 0;
                rows.push((key, 1_000_000 - v as u64, deleted));
            }
        }
        let mut writer =
            RowSetWriter::with_group_rows(dir, 1, &schema, rows.len(), group_rows).unwrap();
        for chunk in rows.chunks(9_999) {
            let columns: Vec<ArrayRef> = vec![
                Arc::new(Int64Array::from_iter_values(chunk.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter(
                    chunk.iter().map(|r| (!r.2).then_some(r.0)),
                )),
                Arc::new(UInt64Array::from_iter_values(chunk.iter().map(|r| r.1))),
                Arc::new(BooleanArray::from_iter(chunk.iter().map(|r| Some(r.2)))),
            ];
            let batch = RecordBatch::try_new(arrow_schema.clone(), columns).unwrap();
            writer.write(&batch).unwrap();
        }
        writer.finish().unwrap().unwrap();
    }

    fn key(k: i64) -> Vec<u8> {
        let column: ArrayRef = Arc::new(Int64Array::from(vec![k]));
        encode_keys(&[column]).unwrap().get(0).to_vec()
    }

    /// Every key's answer, and a few keys around the hot key and past the ends.
    fn check_presence(rowset: &DiskRowSet) {
        for k in (-2..KEYS + 2).step_by(7).chain(HOT_KEY - 2..HOT_KEY + 3) {
            let expected = if !(0..KEYS).contains(&k) {
                Presence::Unknown
            } else if k % 11 == 0 {
                Presence::Deleted
            } else {
                Presence::Live
            };
            assert_eq!(rowset.presence(&key(k)).unwrap(), expected, "key {k}");
        }
    }

    fn rewrite_bloom(dir: &Path, version: u16, body: &[u8]) {
        let mut image = BLOOM_MAGIC.to_vec();
        image.extend_from_slice(&version.to_le_bytes());
        image.extend_from_slice(&0u16.to_le_bytes());
        image.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
        image.extend_from_slice(body);
        std::fs::write(bloom_path(dir, 1), image).unwrap();
    }

    #[test]
    fn the_key_index_comes_with_the_bloom_file_and_is_the_one_a_pass_builds() {
        let dir = tempfile::tempdir().unwrap();
        write_rowset(dir.path());
        let rowset = DiskRowSet::open(dir.path(), 1, 1).unwrap();
        assert!(rowset.metadata.metadata().num_row_groups() >= 2);
        let written = rowset.key_index.get().expect("read with the bloom filter");
        let counted = rowset.index_bytes();
        assert!(counted >= rowset.bloom.heap_bytes() + written.bytes());
        let built = rowset.load_key_index().unwrap();
        assert_eq!(written.blocks, built.blocks);
        assert_eq!(written.firsts.deleted, built.firsts.deleted);
        assert_eq!(written.firsts.keys.len(), built.firsts.keys.len());
        for i in 0..built.firsts.keys.len() {
            assert_eq!(
                written.firsts.keys.get(i),
                built.firsts.keys.get(i),
                "block {i}"
            );
        }
        check_presence(&rowset);
    }

    #[test]
    fn a_version_1_bloom_file_opens_and_a_pass_builds_the_key_index() {
        let dir = tempfile::tempdir().unwrap();
        write_rowset(dir.path());
        let (bloom, _) = read_bloom(&bloom_path(dir.path(), 1)).unwrap();
        rewrite_bloom(dir.path(), 1, &bloom.to_bytes());
        let rowset = DiskRowSet::open(dir.path(), 1, 1).unwrap();
        assert!(rowset.key_index.get().is_none());
        let before = rowset.index_bytes();
        assert!(before >= rowset.bloom.heap_bytes() + rowset.metadata.metadata().memory_size());
        check_presence(&rowset);
        let index = rowset
            .key_index
            .get()
            .expect("built by the first possible hit");
        // The index a pass built counts from then on, once.
        assert_eq!(rowset.index_bytes(), before + index.bytes());
        check_presence(&rowset);
        assert_eq!(rowset.index_bytes(), before + index.bytes());
    }

    #[test]
    fn row_groups_that_are_not_whole_key_blocks_get_their_index_from_a_pass() {
        let dir = tempfile::tempdir().unwrap();
        write_rowset_in_groups(dir.path(), 5_000);
        let rowset = DiskRowSet::open(dir.path(), 1, 1).unwrap();
        assert!(rowset.metadata.metadata().num_row_groups() > 30);
        assert!(rowset.key_index.get().is_none());
        check_presence(&rowset);
    }

    #[test]
    fn a_damaged_key_block_index_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        write_rowset(dir.path());
        let path = bloom_path(dir.path(), 1);
        let image = std::fs::read(&path).unwrap();
        let corrupt = |dir: &Path| match DiskRowSet::open(dir, 1, 1) {
            Err(StorageError::Corruption(message)) => message,
            other => panic!("expected corruption, got {:?}", other.map(|r| r.id())),
        };
        // A flipped bit in the index: the checksum.
        let mut flipped = image.clone();
        *flipped.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        assert!(corrupt(dir.path()).contains("checksum"));
        // Checksummed but cut short, or with a block fewer than the file has.
        let (bloom, firsts) = read_bloom_image(&image);
        let body = bloom_body(&bloom, &firsts);
        rewrite_bloom(dir.path(), 2, &body[..body.len() - 1]);
        assert!(corrupt(dir.path()).contains("malformed key block index"));
        let fewer = KeyBlock {
            keys: {
                let mut keys = EncodedKeys::default();
                (0..firsts.keys.len() - 1).for_each(|i| keys.push(firsts.keys.get(i)));
                keys
            },
            deleted: firsts.deleted[..firsts.deleted.len() - 1].to_vec(),
        };
        rewrite_bloom(dir.path(), 2, &bloom_body(&bloom, &fewer));
        assert!(corrupt(dir.path()).contains("key blocks noted"));
        // A version from the future is refused as such.
        rewrite_bloom(dir.path(), 3, &body);
        assert!(matches!(
            DiskRowSet::open(dir.path(), 1, 1),
            Err(StorageError::NotSupported(_))
        ));
    }

    fn read_bloom_image(image: &[u8]) -> (KeyBloom, KeyBlock) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b");
        std::fs::write(&path, image).unwrap();
        let (bloom, firsts) = read_bloom(&path).unwrap();
        (bloom, firsts.unwrap())
    }
}
