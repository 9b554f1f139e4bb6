//! Memcomparable primary-key encoding and the key bloom filter.
//!
//! A row's key columns encode into one byte string whose bytewise order is the key order, so
//! the MemRowSet, merges and range bounds compare plain bytes. Integers (and timestamps, dates
//! as 4-byte day numbers, decimals as their 16-byte unscaled value) are big-endian with the
//! sign bit flipped; strings and binaries are written raw when they are
//! the last key column and otherwise escaped (`00` -> `00 01`) and terminated by `00 00`, so a
//! shorter value sorts before its extensions. The format is persisted (min/max keys in rowset
//! metadata, bloom filters), so it must never change silently.

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{
    DataType as ArrowType, Date32Type, Decimal128Type, Int16Type, Int32Type, Int64Type, Int8Type,
    TimestampMicrosecondType,
};

use crate::error::{Result, StorageError};

/// The encoded keys of a batch: row `i`'s key is `bytes[offsets[i]..offsets[i + 1]]`.
#[derive(Debug, Default)]
pub struct EncodedKeys {
    bytes: Vec<u8>,
    offsets: Vec<usize>,
}

impl EncodedKeys {
    /// The number of keys.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// True if there are no keys.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Row `i`'s encoded key.
    #[inline]
    pub fn get(&self, i: usize) -> &[u8] {
        &self.bytes[self.offsets[i]..self.offsets[i + 1]]
    }

    /// How many keys sort before `key` (the keys being in order): where it is or would go.
    pub fn lower_bound(&self, key: &[u8]) -> usize {
        let (mut low, mut high) = (0usize, self.len());
        while low < high {
            let mid = (low + high) / 2;
            if self.get(mid) < key {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// The last key, if any.
    pub fn last(&self) -> Option<&[u8]> {
        (!self.is_empty()).then(|| self.get(self.len() - 1))
    }

    /// Bytes held on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + self.offsets.capacity() * std::mem::size_of::<usize>()
    }

    /// Gives back spare capacity.
    pub fn shrink_to_fit(&mut self) {
        self.bytes.shrink_to_fit();
        self.offsets.shrink_to_fit();
    }

    /// Appends `key` after the others.
    pub fn push(&mut self, key: &[u8]) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        self.bytes.extend_from_slice(key);
        self.offsets.push(self.bytes.len());
    }
}

/// Encodes the keys of `columns` (the key columns in key order, no nulls).
///
/// Works column by column so each column's type is dispatched once, not once per row.
pub fn encode_keys(columns: &[ArrayRef]) -> Result<EncodedKeys> {
    let rows = columns.first().map_or(0, |c| c.len());
    let mut lengths = vec![0usize; rows];
    for (i, column) in columns.iter().enumerate() {
        if column.null_count() > 0 {
            return Err(StorageError::invalid("key columns must not hold nulls"));
        }
        let last = i + 1 == columns.len();
        add_lengths(column, last, &mut lengths)?;
    }
    let mut offsets = Vec::with_capacity(rows + 1);
    let mut total = 0usize;
    offsets.push(0);
    for length in &lengths {
        total += length;
        offsets.push(total);
    }
    let mut bytes = vec![0u8; total];
    // `cursor[r]` is where row r's next key column goes.
    let mut cursor: Vec<usize> = offsets[..rows].to_vec();
    for (i, column) in columns.iter().enumerate() {
        let last = i + 1 == columns.len();
        write_column(column, last, &mut bytes, &mut cursor);
    }
    debug_assert!(cursor.iter().zip(&offsets[1..]).all(|(c, o)| c == o));
    Ok(EncodedKeys { bytes, offsets })
}

fn fixed_width(data_type: &ArrowType) -> Option<usize> {
    match data_type {
        ArrowType::Int8 => Some(1),
        ArrowType::Int16 => Some(2),
        ArrowType::Int32 | ArrowType::Date32 => Some(4),
        ArrowType::Int64 | ArrowType::Timestamp(_, _) => Some(8),
        ArrowType::Decimal128(_, _) => Some(16),
        _ => None,
    }
}

fn add_lengths(column: &ArrayRef, last: bool, lengths: &mut [usize]) -> Result<()> {
    if let Some(width) = fixed_width(column.data_type()) {
        lengths.iter_mut().for_each(|l| *l += width);
        return Ok(());
    }
    let add = |values: &mut dyn Iterator<Item = &[u8]>, lengths: &mut [usize]| {
        for (value, length) in values.zip(lengths.iter_mut()) {
            *length += if last {
                value.len()
            } else {
                value.len() + value.iter().filter(|b| **b == 0).count() + 2
            };
        }
    };
    match column.data_type() {
        ArrowType::Utf8 => add(
            &mut column
                .as_string::<i32>()
                .iter()
                .map(|v| v.unwrap_or("").as_bytes()),
            lengths,
        ),
        ArrowType::Binary => add(
            &mut column.as_binary::<i32>().iter().map(|v| v.unwrap_or(&[])),
            lengths,
        ),
        other => {
            return Err(StorageError::invalid(format!(
                "type {other} cannot be a key column"
            )))
        }
    }
    Ok(())
}

macro_rules! write_ints {
    ($column:expr, $arrow:ty, $unsigned:ty, $bytes:expr, $cursor:expr) => {{
        let values = $column.as_primitive::<$arrow>().values();
        let flip = 1 as $unsigned << (<$unsigned>::BITS - 1);
        let width = std::mem::size_of::<$unsigned>();
        for (value, at) in values.iter().zip($cursor.iter_mut()) {
            let encoded = ((*value as $unsigned) ^ flip).to_be_bytes();
            $bytes[*at..*at + width].copy_from_slice(&encoded);
            *at += width;
        }
    }};
}

fn write_column(column: &ArrayRef, last: bool, bytes: &mut [u8], cursor: &mut [usize]) {
    match column.data_type() {
        ArrowType::Int8 => write_ints!(column, Int8Type, u8, bytes, cursor),
        ArrowType::Int16 => write_ints!(column, Int16Type, u16, bytes, cursor),
        ArrowType::Int32 => write_ints!(column, Int32Type, u32, bytes, cursor),
        ArrowType::Int64 => write_ints!(column, Int64Type, u64, bytes, cursor),
        ArrowType::Timestamp(_, _) => {
            write_ints!(column, TimestampMicrosecondType, u64, bytes, cursor)
        }
        ArrowType::Date32 => write_ints!(column, Date32Type, u32, bytes, cursor),
        ArrowType::Decimal128(_, _) => write_ints!(column, Decimal128Type, u128, bytes, cursor),
        ArrowType::Utf8 => {
            let values = column.as_string::<i32>();
            for (value, at) in values.iter().zip(cursor.iter_mut()) {
                write_bytes(value.unwrap_or("").as_bytes(), last, bytes, at);
            }
        }
        ArrowType::Binary => {
            let values = column.as_binary::<i32>();
            for (value, at) in values.iter().zip(cursor.iter_mut()) {
                write_bytes(value.unwrap_or(&[]), last, bytes, at);
            }
        }
        other => unreachable!("add_lengths rejected key type {other}"),
    }
}

#[inline]
fn write_bytes(value: &[u8], last: bool, bytes: &mut [u8], at: &mut usize) {
    if last {
        bytes[*at..*at + value.len()].copy_from_slice(value);
        *at += value.len();
        return;
    }
    for byte in value {
        bytes[*at] = *byte;
        *at += 1;
        if *byte == 0 {
            bytes[*at] = 1;
            *at += 1;
        }
    }
    bytes[*at] = 0;
    bytes[*at + 1] = 0;
    *at += 2;
}

/// A bloom filter over encoded keys, persisted next to each DiskRowSet so that an existence
/// check for a key the rowset does not hold usually reads no data.
///
/// Hashes are CRC32C with two seeds combined by double hashing: stable across builds and
/// platforms, which a persisted filter needs (std's `DefaultHasher` promises neither).
#[derive(Clone, Debug, PartialEq)]
pub struct KeyBloom {
    bits: Vec<u64>,
    hash_count: u32,
}

/// Filter bits per key; 10 bits and 7 hashes give about 1 % false positives.
const BLOOM_BITS_PER_KEY: usize = 10;
const BLOOM_HASHES: u32 = 7;

impl KeyBloom {
    /// An empty filter sized for `keys` keys.
    pub fn with_capacity(keys: usize) -> Self {
        let words = (keys * BLOOM_BITS_PER_KEY).div_ceil(64).max(1);
        KeyBloom {
            bits: vec![0; words],
            hash_count: BLOOM_HASHES,
        }
    }

    /// The `hash_count` bit positions of `key`: `(h1 + i * h2) mod bits` for i = 0, 1, ...,
    /// stepped by modular addition so that a key costs two divisions, not one per hash.
    #[inline]
    fn positions(&self, key: &[u8]) -> impl Iterator<Item = usize> {
        let h1 = crc32c::crc32c(key) as u64;
        let h2 = (crc32c::crc32c_append(0x9e37_79b9, key) as u64) | 1;
        let bit_count = (self.bits.len() * 64) as u64;
        let step = h2 % bit_count;
        let mut bit = h1 % bit_count;
        (0..self.hash_count).map(move |_| {
            let at = bit as usize;
            // Both terms are below bit_count, so one subtraction wraps the sum.
            bit += step;
            if bit >= bit_count {
                bit -= bit_count;
            }
            at
        })
    }

    /// Bytes the filter's bits take in memory.
    pub fn heap_bytes(&self) -> usize {
        self.bits.capacity() * std::mem::size_of::<u64>()
    }

    /// Adds a key.
    pub fn insert(&mut self, key: &[u8]) {
        let positions = self.positions(key);
        for bit in positions {
            self.bits[bit / 64] |= 1 << (bit % 64);
        }
    }

    /// False means the key was certainly never inserted.
    pub fn may_contain(&self, key: &[u8]) -> bool {
        self.positions(key)
            .all(|bit| self.bits[bit / 64] & (1 << (bit % 64)) != 0)
    }

    /// The persisted form: hash count (u32 LE), word count (u32 LE), words (u64 LE).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.bits.len() * 8);
        out.extend_from_slice(&self.hash_count.to_le_bytes());
        out.extend_from_slice(&(self.bits.len() as u32).to_le_bytes());
        for word in &self.bits {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// Parses `to_bytes` output; anything malformed is `Corruption`.
    pub fn from_bytes(data: &[u8]) -> Result<Self> {
        let bad = || StorageError::corruption("malformed key bloom filter");
        if data.len() < 8 {
            return Err(bad());
        }
        let hash_count = u32::from_le_bytes(data[0..4].try_into().map_err(|_| bad())?);
        let words = u32::from_le_bytes(data[4..8].try_into().map_err(|_| bad())?) as usize;
        if hash_count == 0 || hash_count > 32 || words == 0 || data.len() != 8 + words * 8 {
            return Err(bad());
        }
        let bits = data[8..]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8")))
            .collect();
        Ok(KeyBloom { bits, hash_count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn integer_order_is_byte_order() {
        let values = vec![i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        let keys = encode_keys(&[Arc::new(Int64Array::from(values.clone()))]).unwrap();
        for i in 1..values.len() {
            assert!(keys.get(i - 1) < keys.get(i));
        }
    }

    #[test]
    fn decimal_and_date_order_is_byte_order() {
        use arrow::array::{Date32Array, Decimal128Array};
        let decimals = vec![i128::MIN + 1, -10i128.pow(37), -1, 0, 1, 10i128.pow(37) - 1];
        let array = Decimal128Array::from(decimals)
            .with_precision_and_scale(38, 2)
            .unwrap();
        let keys = encode_keys(&[Arc::new(array)]).unwrap();
        assert!((1..keys.len()).all(|i| keys.get(i - 1) < keys.get(i)));
        assert_eq!(keys.get(0).len(), 16);
        let dates = Date32Array::from(vec![-719_162, -1, 0, 1, 2_932_896]);
        let keys = encode_keys(&[Arc::new(dates)]).unwrap();
        assert!((1..keys.len()).all(|i| keys.get(i - 1) < keys.get(i)));
        assert_eq!(keys.get(0).len(), 4);
    }

    #[test]
    fn composite_order_with_strings() {
        let a = StringArray::from(vec!["a", "a\0", "a\0b", "ab", "b"]);
        let b = Int32Array::from(vec![9, 1, 1, 1, -3]);
        let keys = encode_keys(&[Arc::new(a), Arc::new(b)]).unwrap();
        for i in 1..keys.len() {
            assert!(keys.get(i - 1) < keys.get(i), "row {i}");
        }
    }

    #[test]
    fn bloom_round_trips_and_finds_members() {
        let mut bloom = KeyBloom::with_capacity(1000);
        for i in 0..1000u32 {
            bloom.insert(&i.to_be_bytes());
        }
        let back = KeyBloom::from_bytes(&bloom.to_bytes()).unwrap();
        assert_eq!(back, bloom);
        assert!((0..1000u32).all(|i| back.may_contain(&i.to_be_bytes())));
        let false_positives = (1000..11000u32)
            .filter(|i| back.may_contain(&i.to_be_bytes()))
            .count();
        assert!(false_positives < 400, "{false_positives} false positives");
        assert!(KeyBloom::from_bytes(&[1, 2, 3]).is_err());
    }

    #[test]
    fn bloom_bits_follow_the_persisted_formula() {
        // Filters on disk were written with bit i = (h1 + i * h2) mod bits; the stepped
        // computation must set and test exactly those bits.
        for keys in [1usize, 7, 1000, 12_345] {
            let mut bloom = KeyBloom::with_capacity(keys);
            let bit_count = (bloom.bits.len() * 64) as u64;
            for k in 0..300u64 {
                let key = k.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes();
                let h1 = crc32c::crc32c(&key) as u64;
                let h2 = (crc32c::crc32c_append(0x9e37_79b9, &key) as u64) | 1;
                let direct: Vec<usize> = (0..BLOOM_HASHES as u64)
                    .map(|i| ((h1 + i * h2) % bit_count) as usize)
                    .collect();
                assert_eq!(bloom.positions(&key).collect::<Vec<_>>(), direct);
                bloom.insert(&key);
                assert!(direct
                    .iter()
                    .all(|bit| bloom.bits[bit / 64] & (1 << (bit % 64)) != 0));
            }
        }
    }
}
