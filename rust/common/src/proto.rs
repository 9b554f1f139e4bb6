//! Writing protobuf fields by hand, for the few messages built on hot paths without protobuf's
//! Python objects (a leader's AppendEntries, a client's write request). Each helper writes
//! what protobuf's serializer writes for a proto3 field: nothing for a scalar at its default,
//! the tag and the value otherwise. Callers write fields in field-number order, as protobuf
//! does, so the bytes are the ones it would produce.

use crate::OpId;

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

/// A set message field (present even when empty), its fields written by `fields`. Its
/// length is written after them: in the byte kept for it, or in as many as it needs (a
/// message of 128 bytes or more moves its bytes once).
pub fn put_message(out: &mut Vec<u8>, field: u64, fields: impl FnOnce(&mut Vec<u8>)) {
    put_tag(out, field, LEN);
    let at = out.len();
    out.push(0);
    fields(out);
    let len = out.len() - at - 1;
    if len < 0x80 {
        out[at] = len as u8;
    } else {
        let mut head = Vec::with_capacity(10);
        put_varint(&mut head, len as u64);
        out.splice(at..at + 1, head);
    }
}

/// A set `OpIdPB` field (proto/nyala/common.proto): present even when both of its own fields
/// are zero.
pub fn put_op_id(out: &mut Vec<u8>, field: u64, op_id: OpId) {
    put_message(out, field, |out| {
        put_uint(out, 1, op_id.term);
        put_uint(out, 2, op_id.index);
    });
}

/// A packed repeated varint field (left out when empty, as protobuf does).
pub fn put_packed(out: &mut Vec<u8>, field: u64, values: impl Iterator<Item = u64> + Clone) {
    let len: usize = values.clone().map(varint_len).sum();
    if len == 0 {
        return;
    }
    put_len_head(out, field, len);
    for value in values {
        put_varint(out, value);
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

    #[test]
    fn a_message_is_its_fields_behind_their_length() {
        let mut out = Vec::new();
        put_op_id(&mut out, 5, OpId::new(0, 0));
        assert_eq!(out, [(5 << 3) | 2, 0]);
        out.clear();
        put_op_id(&mut out, 5, OpId::new(3, 300));
        assert_eq!(out, [(5 << 3) | 2, 5, 1 << 3, 3, 2 << 3, 0xac, 0x02]);
        out.clear();
        let long = vec![b'x'; 200];
        put_message(&mut out, 1, |out| put_bytes(out, 2, &long));
        assert_eq!(
            out[..6],
            [(1 << 3) | 2, 0xcb, 0x01, (2 << 3) | 2, 0xc8, 0x01]
        );
        assert_eq!(out.len(), 6 + 200);
    }
}
