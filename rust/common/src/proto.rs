//! Writing protobuf fields by hand, for the few messages built on hot paths without protobuf's
//! Python objects (a leader's AppendEntries, a client's write request). Each helper writes
//! what protobuf's serializer writes for a proto3 field: nothing for a scalar at its default,
//! the tag and the value otherwise. Callers write fields in field-number order, as protobuf
//! does, so the bytes are the ones it would produce.

/// Wire type of varint fields.
pub const VARINT: u64 = 0;
/// Wire type of fixed64 fields.
pub const FIXED64: u64 = 1;
/// Wire type of length-delimited fields (strings, bytes, messages, packed repeated).
pub const LEN: u64 = 2;

/// Appends `value` as a protobuf base-128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Bytes of `value` as a varint.
pub fn varint_len(value: u64) -> usize {
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

/// A field's tag.
pub fn put_tag(out: &mut Vec<u8>, field: u64, wire_type: u64) {
    put_varint(out, (field << 3) | wire_type);
}

/// An unsigned (or non-negative) integer field; left out at 0.
pub fn put_uint(out: &mut Vec<u8>, field: u64, value: u64) {
    if value != 0 {
        put_tag(out, field, VARINT);
        put_varint(out, value);
    }
}

/// An `int64` field (a negative value takes ten bytes, as protobuf writes it); left out at 0.
pub fn put_int64(out: &mut Vec<u8>, field: u64, value: i64) {
    put_uint(out, field, value as u64);
}

/// A string or bytes field; left out when empty.
pub fn put_bytes(out: &mut Vec<u8>, field: u64, value: &[u8]) {
    if !value.is_empty() {
        put_len_head(out, field, value.len());
        out.extend_from_slice(value);
    }
}

/// The tag and length of a length-delimited field whose `len` bytes follow.
pub fn put_len_head(out: &mut Vec<u8>, field: u64, len: usize) {
    put_tag(out, field, LEN);
    put_varint(out, len as u64);
}

/// A `fixed64` field; left out at 0.
pub fn put_fixed64(out: &mut Vec<u8>, field: u64, value: u64) {
    if value != 0 {
        put_tag(out, field, FIXED64);
        out.extend_from_slice(&value.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_take_the_bytes_they_need() {
        for value in [0, 1, 127, 128, 16_383, 16_384, u64::MAX >> 1, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, value);
            assert_eq!(out.len(), varint_len(value), "{value}");
        }
        let mut out = Vec::new();
        put_varint(&mut out, 300);
        assert_eq!(out, [0xac, 0x02]);
    }

    #[test]
    fn defaults_are_left_out() {
        let mut out = Vec::new();
        put_uint(&mut out, 1, 0);
        put_int64(&mut out, 2, 0);
        put_bytes(&mut out, 3, b"");
        put_fixed64(&mut out, 4, 0);
        assert!(out.is_empty());
        put_int64(&mut out, 2, -1);
        assert_eq!(out.len(), 1 + 10);
        put_fixed64(&mut out, 16, 1);
        assert_eq!(&out[11..], [0x81, 0x01, 1, 0, 0, 0, 0, 0, 0, 0]);
    }
}
