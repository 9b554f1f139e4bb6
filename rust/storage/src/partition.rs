//! Routing rows to partitions: the client's write hot path (docs/partitioning.md).
//!
//! A row's partition key is one 4-byte big-endian bucket per hash level followed by the
//! memcomparable encoding of its range columns; each tablet owns one interval
//! `[start, end)` of partition keys. `PartitionRouter` hashes whole columns over the Arrow
//! buffers (the FNV state of every row advances column by column, so no per-row key is
//! materialised), maps bucket combinations to tablets through a table built once when there are
//! no range columns (binary search of the tablets' sorted starts otherwise), and splits a batch
//! into size-capped, IPC-encoded requests per tablet. The Python reference (`nyala/partition.py`)
//! defines the same bytes; the golden values below were computed with it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch, RecordBatchOptions, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::{
    DataType as ArrowType, Date32Type, Decimal128Type, Int16Type, Int32Type, Int64Type, Int8Type,
    SchemaRef, TimestampMicrosecondType,
};
use arrow::ipc::writer::StreamWriter;

use crate::error::{Result, StorageError};
use crate::key::encode_keys;

/// Width of one hash bucket in an encoded partition key, in bytes.
pub const BUCKET_BYTES: usize = 4;
/// Most partitions one router may route to (the table creation limit, with room).
pub const PARTITIONS_MAX: usize = 1 << 16;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
const SEED_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// The partitioning hash: FNV-1a 64 from an offset basis mixed with `seed`, then MurmurHash3's
/// `fmix64`, because `% buckets` reads the low bits, which FNV alone mixes poorly.
pub fn hash64(data: &[u8], seed: u32) -> u64 {
    fmix64(fnv_feed(fnv_start(seed), data))
}

#[inline]
fn fnv_start(seed: u32) -> u64 {
    FNV_OFFSET ^ (seed as u64).wrapping_mul(SEED_MULTIPLIER)
}

#[inline]
fn fnv_feed(mut h: u64, data: &[u8]) -> u64 {
    for byte in data {
        h = (h ^ *byte as u64).wrapping_mul(FNV_PRIME);
    }
    h
}

#[inline]
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b93f_e53b_3f53);
    h ^ (h >> 33)
}

/// Cells of the bucket-combination lookup table at most (4 bytes each).
const BUCKET_TABLE_CELLS_MAX: u64 = 1 << 20;
/// A row position or partition index the lookup table marks as "no partition".
const NO_PARTITION: u32 = u32::MAX;

/// One hash level: bucket = `hash64(encoded columns, seed) % buckets`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashLevel {
    /// Column names, in hash order.
    pub columns: Vec<String>,
    /// At least 2.
    pub buckets: u32,
    pub seed: u32,
}

/// The rows of one partition cut out of a batch.
#[derive(Debug)]
pub struct PartitionSlice {
    /// Index of the partition in the router's (sorted) list.
    pub partition: u32,
    /// Positions of the rows in the input batch, ascending.
    pub rows: UInt32Array,
    /// Those rows, in that order.
    pub batch: RecordBatch,
}

/// Routes rows to a fixed set of partitions (one table's tablets, as the client knows them).
#[derive(Debug)]
pub struct PartitionRouter {
    hash_levels: Vec<HashLevel>,
    range_columns: Vec<String>,
    /// Ascending, distinct; `ends[i]` empty means unbounded; `starts[i] < ends[i]` otherwise.
    starts: Vec<Vec<u8>>,
    ends: Vec<Vec<u8>>,
    /// Without range columns a row's partition depends on its buckets alone: the partition of
    /// each bucket combination (mixed radix, first level most significant), or `NO_PARTITION`.
    by_buckets: Option<Vec<u32>>,
}

impl PartitionRouter {
    /// A router over partitions `[starts[i], ends[i])`; they must be sorted by start and must
    /// not overlap (gaps are allowed: a row in a gap is refused).
    pub fn new(
        hash_levels: Vec<HashLevel>,
        range_columns: Vec<String>,
        starts: Vec<Vec<u8>>,
        ends: Vec<Vec<u8>>,
    ) -> Result<Self> {
        if starts.len() != ends.len() || starts.is_empty() || starts.len() > PARTITIONS_MAX {
            return Err(StorageError::invalid(format!(
                "{} starts and {} ends: need the same count, 1..={PARTITIONS_MAX}",
                starts.len(),
                ends.len()
            )));
        }
        if let Some(level) = hash_levels
            .iter()
            .find(|l| l.buckets < 2 || l.columns.is_empty())
        {
            return Err(StorageError::invalid(format!(
                "hash level {level:?} needs columns and at least 2 buckets"
            )));
        }
        for i in 0..starts.len() {
            let bounded = !ends[i].is_empty();
            if bounded && starts[i] >= ends[i] {
                return Err(StorageError::invalid(format!("partition {i} is empty")));
            }
            let next = starts.get(i + 1);
            if next.is_some_and(|n| !bounded || *n < ends[i]) {
                return Err(StorageError::invalid(format!(
                    "partitions {i} and {} overlap or are not sorted",
                    i + 1
                )));
            }
        }
        let mut router = PartitionRouter {
            hash_levels,
            range_columns,
            starts,
            ends,
            by_buckets: None,
        };
        router.by_buckets = router.bucket_table();
        Ok(router)
    }

    fn bucket_table(&self) -> Option<Vec<u32>> {
        if !self.range_columns.is_empty() || self.hash_levels.is_empty() {
            return None;
        }
        let cells = self
            .hash_levels
            .iter()
            .try_fold(1u64, |n, l| n.checked_mul(l.buckets as u64))
            .filter(|n| *n <= BUCKET_TABLE_CELLS_MAX)?;
        let mut table = Vec::with_capacity(cells as usize);
        let mut key = vec![0u8; self.hash_levels.len() * BUCKET_BYTES];
        for cell in 0..cells {
            let mut rest = cell;
            for (i, level) in self.hash_levels.iter().enumerate().rev() {
                let bucket = (rest % level.buckets as u64) as u32;
                rest /= level.buckets as u64;
                key[i * BUCKET_BYTES..(i + 1) * BUCKET_BYTES]
                    .copy_from_slice(&bucket.to_be_bytes());
            }
            table.push(self.find(&key).map_or(NO_PARTITION, |p| p as u32));
        }
        Some(table)
    }

    /// The number of partitions.
    pub fn len(&self) -> usize {
        self.starts.len()
    }

    /// Always false: a router has at least one partition.
    pub fn is_empty(&self) -> bool {
        self.starts.is_empty()
    }

    /// Every row's partition key, as `(bytes, offsets)`: row `i` is `bytes[o[i]..o[i + 1]]`.
    pub fn partition_keys(&self, batch: &RecordBatch) -> Result<(Vec<u8>, Vec<usize>)> {
        let rows = batch.num_rows();
        let buckets = self.buckets(batch)?;
        let range_keys = encode_keys(&columns(batch, &self.range_columns)?)?;
        let levels = self.hash_levels.len();
        let mut bytes = Vec::with_capacity(rows * (levels * BUCKET_BYTES + 8));
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        for row in 0..rows {
            for level in &buckets {
                bytes.extend_from_slice(&level[row].to_be_bytes());
            }
            if !range_keys.is_empty() {
                bytes.extend_from_slice(range_keys.get(row));
            }
            offsets.push(bytes.len());
        }
        Ok((bytes, offsets))
    }

    /// Each row's partition index; a row no partition covers is `InvalidArgument`.
    pub fn route(&self, batch: &RecordBatch) -> Result<Vec<u32>> {
        let routes = self.route_or_none(batch)?;
        if let Some(row) = routes.iter().position(|p| *p == NO_PARTITION) {
            let key = self.partition_keys(&batch.slice(row, 1))?.0;
            return Err(StorageError::invalid(format!(
                "row {row}: no partition covers partition key {}",
                hex(&key)
            )));
        }
        Ok(routes)
    }

    /// Each row's partition index, `NO_PARTITION` for a row no partition covers (a gap
    /// between range partitions).
    fn route_or_none(&self, batch: &RecordBatch) -> Result<Vec<u32>> {
        if let Some(table) = &self.by_buckets {
            return self.route_by_buckets(table, batch);
        }
        let (bytes, offsets) = self.partition_keys(batch)?;
        let mut out = Vec::with_capacity(batch.num_rows());
        // Sorted input (common for bulk loads) hits the same partition again: check it first.
        let mut last = 0usize;
        for row in 0..batch.num_rows() {
            let key = &bytes[offsets[row]..offsets[row + 1]];
            if !self.contains(last, key) {
                match self.find(key) {
                    Some(found) => last = found,
                    None => {
                        out.push(NO_PARTITION);
                        continue;
                    }
                }
            }
            out.push(last as u32);
        }
        Ok(out)
    }

    fn route_by_buckets(&self, table: &[u32], batch: &RecordBatch) -> Result<Vec<u32>> {
        let mut cells = vec![0u32; batch.num_rows()];
        for level in &self.hash_levels {
            let hashes = hash_columns(&columns(batch, &level.columns)?, level.seed)?;
            for (cell, h) in cells.iter_mut().zip(hashes) {
                *cell = *cell * level.buckets + (h % level.buckets as u64) as u32;
            }
        }
        for cell in &mut cells {
            *cell = table[*cell as usize];
        }
        Ok(cells)
    }

    /// The batch cut into one slice per partition that has rows, ascending by partition.
    pub fn split(&self, batch: &RecordBatch) -> Result<Vec<PartitionSlice>> {
        let routes = self.route(batch)?;
        let mut positions: Vec<Vec<u32>> = vec![Vec::new(); self.len()];
        for (row, p) in routes.iter().enumerate() {
            positions[*p as usize].push(row as u32);
        }
        let mut slices = Vec::new();
        for (partition, rows) in positions.into_iter().enumerate() {
            if rows.is_empty() {
                continue;
            }
            let rows = UInt32Array::from(rows);
            let part = if rows.len() == batch.num_rows() {
                batch.clone() // every row in one partition: no copy
            } else {
                take_record_batch(batch, &rows)
                    .map_err(|e| StorageError::invalid(format!("cannot split batch: {e}")))?
            };
            slices.push(PartitionSlice {
                partition: partition as u32,
                rows,
                batch: part,
            });
        }
        Ok(slices)
    }

    /// The batch cut into requests: each partition's rows in input order, in pieces of at most
    /// `rows_max` rows and `bytes_max` bytes (each row measured: its fixed-width cells' widths
    /// plus its string and binary values and their offsets; a single larger row goes alone),
    /// as equal as those limits allow, each piece gathered and IPC-encoded on up to `threads`
    /// threads. Only the rows at `selection` (ascending positions) are routed when it is given;
    /// every row otherwise. Rows no partition covers are not sent: their positions come back in
    /// `unrouted`. Requests are ascending by partition, then by position.
    pub fn split_requests(
        &self,
        batch: &RecordBatch,
        rows_max: usize,
        bytes_max: usize,
        threads: usize,
        selection: Option<&UInt32Array>,
    ) -> Result<SplitRequests> {
        let (pieces, unrouted) = self.pieces(batch, rows_max, bytes_max, selection)?;
        let whole = pieces.len() == 1 && pieces[0].1.len() == batch.num_rows();
        let encode = |rows: &UInt32Array| -> Result<Vec<u8>> {
            if whole {
                return encode_stream(batch); // one piece holding every row: no gather
            }
            let part = take_record_batch(batch, rows)
                .map_err(|e| StorageError::invalid(format!("cannot split batch: {e}")))?;
            encode_stream(&part)
        };
        let encoded: Vec<Mutex<Option<Result<Vec<u8>>>>> =
            pieces.iter().map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some((_, rows)) = pieces.get(i) else {
                return;
            };
            *encoded[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(encode(rows));
        };
        let helpers = threads.clamp(1, pieces.len().max(1)) - 1;
        std::thread::scope(|scope| {
            for _ in 0..helpers {
                scope.spawn(work);
            }
            work();
        });
        let requests = pieces
            .into_iter()
            .zip(encoded)
            .map(|((partition, rows), ipc)| {
                let ipc = ipc.into_inner().unwrap_or_else(|e| e.into_inner());
                Ok(EncodedRequest {
                    partition,
                    rows,
                    ipc: ipc.expect("every piece was encoded")?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(SplitRequests {
            requests,
            unrouted: UInt32Array::from(unrouted),
        })
    }

    /// `split_requests` for a few rows on the caller's thread, encoding through `encoder`
    /// (which keeps the encoded schema and the writer's buffers from one call to the next).
    pub fn split_requests_with(
        &self,
        batch: &RecordBatch,
        rows_max: usize,
        bytes_max: usize,
        encoder: &mut StreamEncoder,
    ) -> Result<SplitRequests> {
        let (pieces, unrouted) = self.pieces(batch, rows_max, bytes_max, None)?;
        let mut requests = Vec::with_capacity(pieces.len());
        for (partition, rows) in pieces {
            let ipc = if rows.len() == batch.num_rows() {
                encoder.encode(batch)?
            } else {
                let part = take_record_batch(batch, &rows)
                    .map_err(|e| StorageError::invalid(format!("cannot split batch: {e}")))?;
                encoder.encode(&part)?
            };
            requests.push(EncodedRequest {
                partition,
                rows,
                ipc,
            });
        }
        Ok(SplitRequests {
            requests,
            unrouted: UInt32Array::from(unrouted),
        })
    }

    /// The requests' rows (`split_requests`): (partition, positions) per request, and the
    /// positions no partition covers.
    #[allow(clippy::type_complexity)]
    fn pieces(
        &self,
        batch: &RecordBatch,
        rows_max: usize,
        bytes_max: usize,
        selection: Option<&UInt32Array>,
    ) -> Result<(Vec<(u32, UInt32Array)>, Vec<u32>)> {
        if rows_max == 0 || bytes_max == 0 {
            return Err(StorageError::invalid("request limits must be positive"));
        }
        let (positions, unrouted) = self.positions(batch, selection)?;
        let sizes = (batch_bytes(batch) > bytes_max).then(|| row_sizes(batch));
        let mut pieces: Vec<(u32, UInt32Array)> = Vec::new();
        for (partition, rows) in positions.into_iter().enumerate() {
            for piece in cut(&rows, rows_max, bytes_max, sizes.as_deref()) {
                pieces.push((partition as u32, UInt32Array::from(piece.to_vec())));
            }
        }
        Ok((pieces, unrouted))
    }

    /// Each partition's row positions, ascending, and the positions no partition covers. Only
    /// the rows at `selection` are routed when it is given (their key columns gathered first,
    /// so rows left out may hold anything, nulls included).
    fn positions(
        &self,
        batch: &RecordBatch,
        selection: Option<&UInt32Array>,
    ) -> Result<(Vec<Vec<u32>>, Vec<u32>)> {
        if batch.num_rows() > u32::MAX as usize {
            return Err(StorageError::invalid("a batch holds at most 2^32 - 1 rows"));
        }
        let routes = match selection {
            None => self.route_or_none(batch)?,
            Some(rows) => self.route_or_none(&self.routing_columns(batch, rows)?)?,
        };
        let position = |i: usize| selection.map_or(i as u32, |rows| rows.value(i));
        let mut counts = vec![0usize; self.len()];
        for p in routes.iter().filter(|p| **p != NO_PARTITION) {
            counts[*p as usize] += 1;
        }
        let mut positions: Vec<Vec<u32>> = counts.iter().map(|c| Vec::with_capacity(*c)).collect();
        let mut unrouted = Vec::new();
        for (i, p) in routes.iter().enumerate() {
            match *p {
                NO_PARTITION => unrouted.push(position(i)),
                p => positions[p as usize].push(position(i)),
            }
        }
        Ok((positions, unrouted))
    }

    /// The columns routing reads (hash and range columns) of the rows at `rows`.
    fn routing_columns(&self, batch: &RecordBatch, rows: &UInt32Array) -> Result<RecordBatch> {
        if rows.null_count() > 0
            || rows
                .values()
                .iter()
                .any(|r| *r as usize >= batch.num_rows())
        {
            return Err(StorageError::invalid("a selected row is outside the batch"));
        }
        let mut names: Vec<&String> = self
            .hash_levels
            .iter()
            .flat_map(|l| &l.columns)
            .chain(&self.range_columns)
            .collect();
        names.sort();
        names.dedup();
        let schema = batch.schema();
        let mut fields = Vec::with_capacity(names.len());
        let mut arrays = Vec::with_capacity(names.len());
        for name in names {
            let (index, field) = schema
                .column_with_name(name)
                .ok_or_else(|| StorageError::invalid(format!("batch lacks column {name:?}")))?;
            fields.push(field.clone());
            arrays.push(
                arrow::compute::take(batch.column(index), rows, None)
                    .map_err(|e| StorageError::invalid(format!("cannot select rows: {e}")))?,
            );
        }
        // A table with one unbounded partition routes by no column at all.
        let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
        RecordBatch::try_new_with_options(
            Arc::new(arrow::datatypes::Schema::new(fields)),
            arrays,
            &options,
        )
        .map_err(|e| StorageError::invalid(format!("cannot select rows: {e}")))
    }

    fn buckets(&self, batch: &RecordBatch) -> Result<Vec<Vec<u32>>> {
        self.hash_levels
            .iter()
            .map(|level| {
                let hashes = hash_columns(&columns(batch, &level.columns)?, level.seed)?;
                Ok(hashes
                    .into_iter()
                    .map(|h| (h % level.buckets as u64) as u32)
                    .collect())
            })
            .collect()
    }

    fn contains(&self, i: usize, key: &[u8]) -> bool {
        self.starts[i].as_slice() <= key && (self.ends[i].is_empty() || key < &self.ends[i][..])
    }

    fn find(&self, key: &[u8]) -> Option<usize> {
        let after = self.starts.partition_point(|s| s.as_slice() <= key);
        let i = after.checked_sub(1)?;
        self.contains(i, key).then_some(i)
    }
}

fn columns(batch: &RecordBatch, names: &[String]) -> Result<Vec<ArrayRef>> {
    names
        .iter()
        .map(|name| {
            batch
                .column_by_name(name)
                .map(Arc::clone)
                .ok_or_else(|| StorageError::invalid(format!("batch lacks column {name:?}")))
        })
        .collect()
}

/// One request cut out of a batch by `PartitionRouter::split_requests`.
#[derive(Debug)]
pub struct EncodedRequest {
    /// Index of the partition in the router's (sorted) list.
    pub partition: u32,
    /// Positions of the rows in the input batch, ascending.
    pub rows: UInt32Array,
    /// Those rows as one Arrow IPC stream.
    pub ipc: Vec<u8>,
}

/// What `PartitionRouter::split_requests` makes of a batch.
#[derive(Debug)]
pub struct SplitRequests {
    /// Ascending by partition, then by position.
    pub requests: Vec<EncodedRequest>,
    /// Positions of the rows no partition covers, ascending (they are in no request).
    pub unrouted: UInt32Array,
}

/// Cuts one partition's `rows` (positions) into pieces of at most `rows_max` rows and, when
/// `sizes` gives each position's bytes, at most `bytes_max` bytes (a larger row alone). Pieces
/// are as equal as the limits allow: 250k rows at 200k a request go as 2 x 125k, not 200k +
/// 50k.
fn cut<'a>(
    rows: &'a [u32],
    rows_max: usize,
    bytes_max: usize,
    sizes: Option<&[usize]>,
) -> Vec<&'a [u32]> {
    if rows.is_empty() {
        return Vec::new();
    }
    let total: usize = sizes.map_or(0, |s| rows.iter().map(|r| s[*r as usize]).sum());
    let count = rows
        .len()
        .div_ceil(rows_max)
        .max(total.div_ceil(bytes_max))
        .max(1);
    let rows_each = rows.len().div_ceil(count);
    let Some(sizes) = sizes else {
        return rows.chunks(rows_each).collect();
    };
    let bytes_each = total.div_ceil(count).max(1);
    let mut pieces = Vec::with_capacity(count);
    let (mut start, mut bytes) = (0usize, 0usize);
    for (i, row) in rows.iter().enumerate() {
        let size = sizes[*row as usize];
        // Cut at the equal share, or before a row that would overrun the limit.
        let full = i - start == rows_each || bytes >= bytes_each || bytes + size > bytes_max;
        if i > start && full {
            pieces.push(&rows[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    pieces.push(&rows[start..]);
    pieces
}

/// Each row's bytes in `batch`, measured as `batch_bytes` measures the batch.
fn row_sizes(batch: &RecordBatch) -> Vec<usize> {
    let mut sizes = vec![0usize; batch.num_rows()];
    for column in batch.columns() {
        let offsets: Option<&[i32]> = match column.data_type() {
            ArrowType::Utf8 => Some(column.as_string::<i32>().value_offsets()),
            ArrowType::Binary => Some(column.as_binary::<i32>().value_offsets()),
            _ => None,
        };
        match offsets {
            Some(offsets) => {
                for (size, w) in sizes.iter_mut().zip(offsets.windows(2)) {
                    *size += (w[1] - w[0]) as usize + 4;
                }
            }
            None => {
                let width = column_width(column);
                sizes.iter_mut().for_each(|s| *s += width);
            }
        }
    }
    sizes
}

/// Bytes of one row of a fixed-width column (a boolean counts one).
fn column_width(column: &ArrayRef) -> usize {
    match column.data_type() {
        ArrowType::Boolean => 1,
        other => other.primitive_width().unwrap_or(8),
    }
}

/// `hash64(encoded key of each row, seed)` without materialising the keys: each row's FNV state
/// takes the memcomparable bytes of one column after the other (rust/storage/src/key.rs), read
/// straight from the Arrow buffers.
fn hash_columns(columns: &[ArrayRef], seed: u32) -> Result<Vec<u64>> {
    let rows = columns.first().map_or(0, |c| c.len());
    let mut state = vec![fnv_start(seed); rows];
    for (i, column) in columns.iter().enumerate() {
        if column.null_count() > 0 {
            return Err(StorageError::invalid("key columns must not hold nulls"));
        }
        let last = i + 1 == columns.len();
        macro_rules! ints {
            ($arrow:ty, $unsigned:ty) => {{
                let flip = 1 as $unsigned << (<$unsigned>::BITS - 1);
                let values = column.as_primitive::<$arrow>().values();
                for (h, v) in state.iter_mut().zip(values.iter()) {
                    *h = fnv_feed(*h, &((*v as $unsigned) ^ flip).to_be_bytes());
                }
            }};
        }
        match column.data_type() {
            ArrowType::Int8 => ints!(Int8Type, u8),
            ArrowType::Int16 => ints!(Int16Type, u16),
            ArrowType::Int32 => ints!(Int32Type, u32),
            ArrowType::Int64 => ints!(Int64Type, u64),
            ArrowType::Timestamp(_, _) => ints!(TimestampMicrosecondType, u64),
            ArrowType::Date32 => ints!(Date32Type, u32),
            ArrowType::Decimal128(_, _) => ints!(Decimal128Type, u128),
            ArrowType::Utf8 => {
                let values = column.as_string::<i32>();
                for (h, v) in state.iter_mut().zip(values.iter()) {
                    *h = feed_bytes(*h, v.unwrap_or("").as_bytes(), last);
                }
            }
            ArrowType::Binary => {
                let values = column.as_binary::<i32>();
                for (h, v) in state.iter_mut().zip(values.iter()) {
                    *h = feed_bytes(*h, v.unwrap_or(&[]), last);
                }
            }
            other => {
                return Err(StorageError::invalid(format!(
                    "type {other} cannot be a key column"
                )))
            }
        }
    }
    Ok(state.into_iter().map(fmix64).collect())
}

/// A string or binary key part: raw when last, else `00` escaped as `00 01` and `00 00` after.
#[inline]
fn feed_bytes(mut h: u64, value: &[u8], last: bool) -> u64 {
    if last {
        return fnv_feed(h, value);
    }
    for byte in value {
        h = fnv_feed(h, &[*byte]);
        if *byte == 0 {
            h = fnv_feed(h, &[1]);
        }
    }
    fnv_feed(h, &[0, 0])
}

/// Average Arrow bytes of one row of `batch` (see `batch_bytes`).
fn row_bytes(batch: &RecordBatch) -> usize {
    batch_bytes(batch).div_ceil(batch.num_rows().max(1))
}

/// Arrow bytes of `batch`'s rows (value buffers; offsets of variable-width columns count their
/// 4 bytes), so that a slice of a larger batch is measured by its own rows.
fn batch_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|column| match column.data_type() {
            ArrowType::Utf8 => {
                let offsets = column.as_string::<i32>().value_offsets();
                (offsets[offsets.len() - 1] - offsets[0]) as usize + 4 * column.len()
            }
            ArrowType::Binary => {
                let offsets = column.as_binary::<i32>().value_offsets();
                (offsets[offsets.len() - 1] - offsets[0]) as usize + 4 * column.len()
            }
            ArrowType::Boolean => column.len().div_ceil(8),
            other => match other.primitive_width() {
                Some(width) => width * column.len(),
                None => column.get_array_memory_size(),
            },
        })
        .sum()
}

/// The Arrow IPC stream of `batch`, into a buffer sized up front (no regrowth copies).
fn encode_stream(batch: &RecordBatch) -> Result<Vec<u8>> {
    let invalid =
        |e: arrow::error::ArrowError| StorageError::invalid(format!("cannot encode batch: {e}"));
    let mut out = Vec::with_capacity(row_bytes(batch) * batch.num_rows() + 4096);
    let mut writer = StreamWriter::try_new(&mut out, &batch.schema()).map_err(invalid)?;
    writer.write(batch).map_err(invalid)?;
    writer.finish().map_err(invalid)?;
    drop(writer);
    Ok(out)
}

/// Encodes batches as Arrow IPC streams (the bytes `encode_stream` makes), keeping the last
/// schema's encoded message and the writer's buffers: a stream of one or a few rows otherwise
/// spends most of its time building the schema's flatbuffer and allocating (a write of one
/// row from Python, `split_requests_with`).
#[derive(Default)]
pub struct StreamEncoder {
    /// The schema, its writer (holding the encoded schema message, then the last batch) and
    /// the length of that message.
    state: Option<(SchemaRef, StreamWriter<Vec<u8>>, usize)>,
}

/// The end of a stream: a continuation marker and a zero length (`StreamWriter::finish`).
const STREAM_END: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];

impl StreamEncoder {
    /// `batch` as one IPC stream: schema, batch, end.
    pub fn encode(&mut self, batch: &RecordBatch) -> Result<Vec<u8>> {
        let invalid = |e: arrow::error::ArrowError| {
            StorageError::invalid(format!("cannot encode batch: {e}"))
        };
        let schema = batch.schema();
        let same = matches!(&self.state, Some((known, _, _)) if **known == *schema);
        if !same {
            let writer =
                StreamWriter::try_new(Vec::with_capacity(4096), &schema).map_err(invalid)?;
            let header = writer.get_ref().len();
            self.state = Some((schema, writer, header));
        }
        let (_, writer, header) = self.state.as_mut().expect("made above");
        writer.get_mut().truncate(*header);
        if let Err(e) = writer.write(batch) {
            self.state = None; // whatever it left in its buffer is not to be reused
            return Err(invalid(e));
        }
        let written = writer.get_ref();
        let mut out = Vec::with_capacity(written.len() + STREAM_END.len());
        out.extend_from_slice(written);
        out.extend_from_slice(&STREAM_END);
        Ok(out)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use proptest::prelude::*;

    /// `(input, seed, hash64)` computed by `nyala.partition.hash64`, the reference.
    const GOLDEN: [(&[u8], u32, u64); 3] = [
        (b"", 0, 405_106_097_271_480_442),
        (b"", 1, 8_943_998_598_477_063_313),
        (b"abc", 7, 17_135_544_496_587_520_663),
    ];

    #[test]
    fn hash_matches_the_python_reference() {
        for (data, seed, want) in GOLDEN {
            assert_eq!(hash64(data, seed), want, "{data:?} seed {seed}");
        }
    }

    fn batch(ids: Vec<i64>, names: Vec<String>) -> RecordBatch {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, false),
        ]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(StringArray::from(names)),
            ],
        )
        .unwrap()
    }

    fn prefix(bucket: u32) -> Vec<u8> {
        bucket.to_be_bytes().to_vec()
    }

    /// 4 hash buckets over `id` × ranges over `name` split at "m" (as `create_partitions`).
    fn router() -> PartitionRouter {
        let mut starts = Vec::new();
        let mut ends = Vec::new();
        for b in 0..4u32 {
            starts.push(prefix(b));
            ends.push([prefix(b), b"m".to_vec()].concat());
            starts.push([prefix(b), b"m".to_vec()].concat());
            ends.push(if b == 3 { vec![] } else { prefix(b + 1) });
        }
        let level = HashLevel {
            columns: vec!["id".into()],
            buckets: 4,
            seed: 0,
        };
        PartitionRouter::new(vec![level], vec!["name".into()], starts, ends).unwrap()
    }

    #[test]
    fn the_reusing_encoder_makes_the_same_streams() {
        let names = |n: i64| (0..n).map(|i| format!("n{i}")).collect::<Vec<_>>();
        let one = batch(vec![7], names(1));
        let three = batch(vec![1, 2, 3], names(3));
        let other = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, true)])),
            vec![Arc::new(Int64Array::from(vec![Some(5), None]))],
        )
        .unwrap();
        let mut encoder = StreamEncoder::default();
        // Larger, smaller, another schema and back: each stream is encode_stream's, and reads.
        for input in [&three, &one, &one, &other, &three, &one] {
            let encoded = encoder.encode(input).unwrap();
            assert_eq!(encoded, encode_stream(input).unwrap());
            let mut reader =
                arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(encoded), None)
                    .unwrap();
            assert_eq!(&reader.next().unwrap().unwrap(), input);
            assert!(reader.next().is_none());
        }
        // Split through it, one row per request: the same requests as split_requests makes.
        let r = router();
        let input = batch((0..40).collect(), (0..40).map(|i| format!("{i}")).collect());
        let with = r
            .split_requests_with(&input, 3, 1 << 20, &mut encoder)
            .unwrap();
        let plain = r.split_requests(&input, 3, 1 << 20, 1, None).unwrap();
        assert_eq!(with.requests.len(), plain.requests.len());
        for (a, b) in with.requests.iter().zip(&plain.requests) {
            assert_eq!(
                (a.partition, &a.rows, &a.ipc),
                (b.partition, &b.rows, &b.ipc)
            );
        }
    }

    #[test]
    fn split_keeps_every_row_once_in_its_partition() {
        let ids: Vec<i64> = (0..1000).collect();
        // Letters on both sides of the "m" split.
        let names: Vec<String> = ids
            .iter()
            .map(|i| char::from(b'a' + (i % 26) as u8).to_string())
            .collect();
        let input = batch(ids, names);
        let r = router();
        let routes = r.route(&input).unwrap();
        let slices = r.split(&input).unwrap();
        let total: usize = slices.iter().map(|s| s.batch.num_rows()).sum();
        assert_eq!(total, 1000);
        for slice in &slices {
            for (j, row) in slice.rows.values().iter().enumerate() {
                assert_eq!(routes[*row as usize], slice.partition);
                let id = slice.batch.column(0).as_any().downcast_ref::<Int64Array>();
                assert_eq!(id.unwrap().value(j), *row as i64);
            }
        }
        assert!(slices.len() > 4, "rows spread over buckets and ranges");
    }

    #[test]
    fn a_row_in_a_gap_is_refused_and_bad_bounds_are_invalid() {
        let level = HashLevel {
            columns: vec!["id".into()],
            buckets: 2,
            seed: 0,
        };
        // Only bucket 0 is covered.
        let r = PartitionRouter::new(
            vec![level.clone()],
            vec![],
            vec![prefix(0)],
            vec![prefix(1)],
        )
        .unwrap();
        let input = batch((0..64).collect(), (0..64).map(|i| i.to_string()).collect());
        assert!(r.route(&input).is_err());
        let overlapping = PartitionRouter::new(
            vec![level],
            vec![],
            vec![prefix(0), prefix(0)],
            vec![vec![]; 2],
        );
        assert!(overlapping.is_err());
    }

    /// 4 hash buckets over `id`, no range columns (the bucket-table path).
    fn hash_router() -> PartitionRouter {
        let level = HashLevel {
            columns: vec!["id".into()],
            buckets: 4,
            seed: 0,
        };
        let starts = (0..4).map(prefix).collect();
        let ends = (1..4).map(prefix).chain([vec![]]).collect();
        PartitionRouter::new(vec![level], vec![], starts, ends).unwrap()
    }

    #[test]
    fn split_requests_caps_rows_and_keeps_order() {
        let ids: Vec<i64> = (0..10_000).map(|i| i * 7_919 - 5_000).collect();
        let names: Vec<String> = ids.iter().map(|i| format!("n{i}")).collect();
        let input = batch(ids, names);
        for r in [router(), hash_router()] {
            let routes = r.route(&input).unwrap();
            for threads in [1, 3] {
                let split = r
                    .split_requests(&input, 700, 1 << 30, threads, None)
                    .unwrap();
                assert!(split.unrouted.is_empty());
                let requests = split.requests;
                let mut seen = vec![false; input.num_rows()];
                let mut last = (0u32, 0u32);
                for request in &requests {
                    let rows = request.rows.values();
                    assert!(!rows.is_empty() && rows.len() <= 700);
                    assert!((request.partition, rows[0]) >= last, "ascending");
                    last = (request.partition, rows[rows.len() - 1]);
                    let mut reader =
                        arrow::ipc::reader::StreamReader::try_new(&request.ipc[..], None).unwrap();
                    let part = reader.next().unwrap().unwrap();
                    let id = part.column(0).as_primitive::<Int64Type>();
                    for (j, row) in rows.iter().enumerate() {
                        assert_eq!(routes[*row as usize], request.partition);
                        assert_eq!(id.value(j), 7_919 * *row as i64 - 5_000);
                        assert!(!std::mem::replace(&mut seen[*row as usize], true));
                    }
                }
                assert!(seen.iter().all(|s| *s));
            }
        }
        assert!(router().split_requests(&input, 0, 1, 1, None).is_err());
    }

    #[test]
    fn split_requests_measures_each_row_and_sends_a_large_one_alone() {
        // 100 small rows and one of ~3 MB: with a 1 MB cap the large row goes alone and the
        // small ones share the other requests; no request but the large row's overruns the cap.
        let ids: Vec<i64> = (0..101).collect();
        let names: Vec<String> = ids
            .iter()
            .map(|i| {
                if *i == 50 {
                    "x".repeat(3 << 20)
                } else {
                    format!("n{i}")
                }
            })
            .collect();
        let input = batch(ids, names);
        let r = hash_router();
        let split = r.split_requests(&input, 1 << 20, 1 << 20, 1, None).unwrap();
        let mut rows = 0;
        for request in &split.requests {
            rows += request.rows.len();
            if request.rows.values().contains(&50) {
                assert_eq!(request.rows.len(), 1, "the large row goes alone");
            } else {
                assert!(request.ipc.len() < 1 << 20);
            }
        }
        assert_eq!(rows, 101);
    }

    #[test]
    fn split_requests_routes_only_the_selection_and_returns_rows_in_gaps() {
        let level = HashLevel {
            columns: vec!["id".into()],
            buckets: 2,
            seed: 0,
        };
        // Only bucket 0 is covered: bucket 1's rows are unrouted, not an error.
        let r =
            PartitionRouter::new(vec![level], vec![], vec![prefix(0)], vec![prefix(1)]).unwrap();
        let input = batch((0..64).collect(), (0..64).map(|i| i.to_string()).collect());
        let routes = hash_router().route(&input).unwrap(); // the same hash, 4 buckets
        let selection = UInt32Array::from((0..64).filter(|i| i % 3 != 0).collect::<Vec<u32>>());
        let split = r
            .split_requests(&input, 1000, 1 << 20, 1, Some(&selection))
            .unwrap();
        let sent: Vec<u32> = split
            .requests
            .iter()
            .flat_map(|q| q.rows.values().to_vec())
            .collect();
        let unrouted = split.unrouted.values().to_vec();
        let mut all: Vec<u32> = sent.iter().chain(&unrouted).copied().collect();
        all.sort_unstable();
        assert_eq!(
            all,
            selection.values().to_vec(),
            "each selected row once, no other"
        );
        for row in &unrouted {
            // 4 buckets mod 2: bucket 1 or 3 of the 4-bucket router is bucket 1 of 2.
            assert_eq!(routes[*row as usize] % 2, 1);
        }
        assert!(!unrouted.is_empty() && !sent.is_empty());
        let outside = UInt32Array::from(vec![64]);
        assert!(r.split_requests(&input, 10, 10, 1, Some(&outside)).is_err());
        // One unbounded partition routes by no column: a selection still works.
        let single = PartitionRouter::new(vec![], vec![], vec![vec![]], vec![vec![]]).unwrap();
        let split = single
            .split_requests(&input, 1000, 1 << 20, 1, Some(&selection))
            .unwrap();
        assert_eq!(split.requests.len(), 1);
        assert_eq!(split.requests[0].rows.values(), selection.values());
    }

    proptest! {
        /// Hashing columns in place equals hashing each row's encoded key.
        #[test]
        fn column_hash_equals_hash_of_encoded_key(
            ids in proptest::collection::vec(any::<i64>(), 1..100),
            names in proptest::collection::vec("[a-z\\x00]{0,4}", 100),
            seed in any::<u32>(),
        ) {
            let names: Vec<String> = names.into_iter().take(ids.len()).collect();
            let input = batch(ids, names);
            for columns in [vec![0, 1], vec![1, 0], vec![1]] {
                let cols: Vec<ArrayRef> = columns.iter().map(|c| input.column(*c).clone()).collect();
                let keys = encode_keys(&cols).unwrap();
                let hashes = hash_columns(&cols, seed).unwrap();
                for (row, h) in hashes.iter().enumerate() {
                    prop_assert_eq!(*h, hash64(keys.get(row), seed));
                }
            }
        }

        /// Routing by the router equals routing each row's key by a linear scan of partitions.
        #[test]
        fn route_equals_linear_scan(ids in proptest::collection::vec(any::<i64>(), 1..200),
                                    names in proptest::collection::vec("[a-z\\x00]{0,4}", 200)) {
            let names: Vec<String> = names.into_iter().take(ids.len()).collect();
            let input = batch(ids.clone(), names);
            let r = router();
            let routes = r.route(&input).unwrap();
            let (bytes, offsets) = r.partition_keys(&input).unwrap();
            for row in 0..ids.len() {
                let key = &bytes[offsets[row]..offsets[row + 1]];
                let linear = (0..r.len()).find(|i| r.contains(*i, key)).unwrap();
                prop_assert_eq!(routes[row] as usize, linear);
                let bucket = u32::from_be_bytes(key[..4].try_into().unwrap());
                prop_assert_eq!(bucket as u64, hash64(&(ids[row] as u64 ^ (1 << 63)).to_be_bytes(), 0) % 4);
            }
        }
    }
}
