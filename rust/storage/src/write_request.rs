//! A client's `WriteRequestPB` (proto/nyala/tserver.proto) without its rows, encoded here
//! rather than through protobuf's Python objects: the client builds one per single-row
//! write, on the path a lone writer waits on. The rows follow as the `ops` field, appended
//! by the caller (protobuf parses a message followed by one more field as the message with
//! that field). The bytes are what protobuf serializes for the same fields.

use nyala_common::proto::{put_bytes, put_fixed64, put_int64, put_message, put_uint};

// Field numbers of WriteRequestPB.
const DEST_UUID: u64 = 1;
const TABLET_ID: u64 = 2;
const REQUEST_ID: u64 = 3;
const SCHEMA_VERSION: u64 = 4;
const AUTHZ_TOKEN: u64 = 6;
const PROPAGATED_TIMESTAMP: u64 = 7;

// Field numbers of RequestIdPB.
const CLIENT_ID: u64 = 1;
const SEQ_NO: u64 = 2;
const FIRST_INCOMPLETE_SEQ_NO: u64 = 3;
const ATTEMPT_NO: u64 = 4;

/// A write request's fields other than its rows.
#[derive(Clone, Debug)]
pub struct WriteRequestHead<'a> {
    pub dest_uuid: &'a str,
    pub tablet_id: &'a str,
    pub client_id: &'a str,
    pub seq_no: i64,
    pub first_incomplete_seq_no: i64,
    pub attempt_no: u32,
    pub schema_version: u32,
    pub authz_token: &'a [u8],
    pub propagated_timestamp: u64,
}

/// The serialized `WriteRequestPB` of `head`, without `ops` (its `request_id` always set).
pub fn write_request_head(head: &WriteRequestHead<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        64 + head.dest_uuid.len()
            + head.tablet_id.len()
            + head.client_id.len()
            + head.authz_token.len(),
    );
    put_bytes(&mut out, DEST_UUID, head.dest_uuid.as_bytes());
    put_bytes(&mut out, TABLET_ID, head.tablet_id.as_bytes());
    put_message(&mut out, REQUEST_ID, |out| {
        put_bytes(out, CLIENT_ID, head.client_id.as_bytes());
        put_int64(out, SEQ_NO, head.seq_no);
        put_int64(out, FIRST_INCOMPLETE_SEQ_NO, head.first_incomplete_seq_no);
        put_uint(out, ATTEMPT_NO, u64::from(head.attempt_no));
    });
    put_uint(&mut out, SCHEMA_VERSION, u64::from(head.schema_version));
    put_bytes(&mut out, AUTHZ_TOKEN, head.authz_token);
    put_fixed64(&mut out, PROPAGATED_TIMESTAMP, head.propagated_timestamp);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_head_is_its_fields_in_order() {
        let head = WriteRequestHead {
            dest_uuid: "d",
            tablet_id: "t",
            client_id: "c",
            seq_no: 300,
            first_incomplete_seq_no: 0,
            attempt_no: 1,
            schema_version: 2,
            authz_token: b"",
            propagated_timestamp: 7,
        };
        let bytes = write_request_head(&head);
        let expected: &[u8] = &[
            0x0a, 1, b'd', // dest_uuid
            0x12, 1, b't', // tablet_id
            0x1a, 8, 0x0a, 1, b'c', 0x10, 0xac, 0x02, 0x20, 1, // request_id
            0x20, 2, // schema_version
            0x39, 7, 0, 0, 0, 0, 0, 0, 0, // propagated_timestamp
        ];
        assert_eq!(bytes, expected);
    }

    #[test]
    fn an_empty_request_id_is_still_set() {
        let head = WriteRequestHead {
            dest_uuid: "",
            tablet_id: "",
            client_id: "",
            seq_no: 0,
            first_incomplete_seq_no: -1,
            attempt_no: 0,
            schema_version: 0,
            authz_token: b"token",
            propagated_timestamp: 0,
        };
        let bytes = write_request_head(&head);
        assert_eq!(&bytes[..2], [0x1a, 11]); // first_incomplete_seq_no -1: tag and 10 bytes
        assert_eq!(&bytes[13..], b"\x32\x05token");
    }
}
