//! Routing rows to partitions: the client's write hot path (docs/partitioning.md).
//!
//! A row's partition key is one 4-byte big-endian bucket per hash level followed by the
//! memcomparable encoding of its range columns; each tablet owns one interval
//! `[start, end)` of partition keys. `PartitionRouter` computes every row's partition key column
//! by column over Arrow arrays, binary-searches the tablets' sorted starts, and splits a batch
//! into one sub-batch per tablet. The Python reference (`nyala/partition.py`) defines the same
//! bytes; the golden values below were computed with it.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;

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
    let mut h = FNV_OFFSET ^ (seed as u64).wrapping_mul(SEED_MULTIPLIER);
    for byte in data {
        h = (h ^ *byte as u64).wrapping_mul(FNV_PRIME);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b93f_e53b_3f53);
    h ^ (h >> 33)
}

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
        Ok(PartitionRouter {
            hash_levels,
            range_columns,
            starts,
            ends,
        })
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
        let (bytes, offsets) = self.partition_keys(batch)?;
        let mut out = Vec::with_capacity(batch.num_rows());
        // Sorted input (common for bulk loads) hits the same partition again: check it first.
        let mut last = 0usize;
        for row in 0..batch.num_rows() {
            let key = &bytes[offsets[row]..offsets[row + 1]];
            if !self.contains(last, key) {
                last = self.find(key).ok_or_else(|| {
                    StorageError::invalid(format!(
                        "row {row}: no partition covers partition key {}",
                        hex(key)
                    ))
                })?;
            }
            out.push(last as u32);
        }
        Ok(out)
    }

    /// The batch cut into one slice per partition that has rows, ascending by partition.
    pub fn split(&self, batch: &RecordBatch) -> Result<Vec<PartitionSlice>> {
        let routes = self.route(batch)?;
        let mut counts = vec![0u32; self.len()];
        for p in &routes {
            counts[*p as usize] += 1;
        }
        let mut positions: Vec<Vec<u32>> = counts
            .iter()
            .map(|c| Vec::with_capacity(*c as usize))
            .collect();
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

    fn buckets(&self, batch: &RecordBatch) -> Result<Vec<Vec<u32>>> {
        self.hash_levels
            .iter()
            .map(|level| {
                let keys = encode_keys(&columns(batch, &level.columns)?)?;
                Ok((0..keys.len())
                    .map(|i| (hash64(keys.get(i), level.seed) % level.buckets as u64) as u32)
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

    proptest! {
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
