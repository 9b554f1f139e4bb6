//! Malformed op batches are refused with `InvalidArgument` before anything is applied.

mod common;

use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch, StringArray, UInt8Array};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType as ArrowType, Field, Schema as ArrowSchema};
use common::{batch, schema};
use nyala_common::{Classify, ErrorKind};
use nyala_storage::{encode_ipc, DataType, OpBatch, OpType::*, Schema, StorageError, OP_COLUMN};
use proptest::prelude::*;

fn invalid(result: Result<OpBatch, StorageError>) -> String {
    match result {
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
            e.to_string()
        }
        Ok(_) => panic!("accepted a malformed batch"),
    }
}

fn make(fields: Vec<(&str, ArrowType, bool)>, columns: Vec<ArrayRef>) -> RecordBatch {
    let fields: Vec<Field> = fields
        .into_iter()
        .map(|(n, t, nullable)| Field::new(n, t, nullable))
        .collect();
    RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns).unwrap()
}

fn ids(values: &[i64]) -> ArrayRef {
    Arc::new(Int64Array::from(values.to_vec()))
}

fn op(codes: &[u8]) -> ArrayRef {
    Arc::new(UInt8Array::from(codes.to_vec()))
}

#[test]
fn rejects_bad_ipc_bytes() {
    let s = schema();
    invalid(OpBatch::decode_ipc(
        Buffer::from_vec(b"not arrow at all".to_vec()),
        &s,
    ));
    invalid(OpBatch::decode_ipc(Buffer::from_vec(Vec::<u8>::new()), &s));
    let good = encode_ipc(&batch(&[(Insert, 1, Some(1), Some("a"))])).unwrap();
    for cut in [4, 8, good.len() / 2, good.len() - 9] {
        invalid(OpBatch::decode_ipc(
            Buffer::from_vec(good[..cut].to_vec()),
            &s,
        ));
    }
    let mut two = good.clone();
    two.truncate(good.len() - 8); // drop the end-of-stream marker
    let second = encode_ipc(&batch(&[(Insert, 2, None, None)])).unwrap();
    let message_start = two.len();
    two.extend_from_slice(&second);
    let _ = message_start;
    invalid(OpBatch::decode_ipc(Buffer::from_vec(two), &s));
    OpBatch::decode_ipc(Buffer::from_vec(good), &s).unwrap();
}

#[test]
fn rejects_bad_columns_and_values() {
    let s = schema();
    let msg = invalid(OpBatch::from_record_batch(
        &make(vec![("id", ArrowType::Int64, false)], vec![ids(&[1])]),
        &s,
    ));
    assert!(msg.contains(OP_COLUMN), "{msg}");
    let wrong_op_type = make(
        vec![
            ("id", ArrowType::Int64, false),
            (OP_COLUMN, ArrowType::Int32, false),
        ],
        vec![ids(&[1]), Arc::new(Int32Array::from(vec![1]))],
    );
    invalid(OpBatch::from_record_batch(&wrong_op_type, &s));
    let bad_code = make(
        vec![
            ("id", ArrowType::Int64, false),
            (OP_COLUMN, ArrowType::UInt8, false),
        ],
        vec![ids(&[1]), op(&[9])],
    );
    assert!(invalid(OpBatch::from_record_batch(&bad_code, &s)).contains("op code"));
    let null_op = make(
        vec![
            ("id", ArrowType::Int64, false),
            (OP_COLUMN, ArrowType::UInt8, true),
        ],
        vec![ids(&[1]), Arc::new(UInt8Array::from(vec![None]))],
    );
    invalid(OpBatch::from_record_batch(&null_op, &s));
    let wrong_key_type = make(
        vec![
            ("id", ArrowType::Int32, false),
            (OP_COLUMN, ArrowType::UInt8, false),
        ],
        vec![Arc::new(Int32Array::from(vec![1])), op(&[6])],
    );
    assert!(invalid(OpBatch::from_record_batch(&wrong_key_type, &s)).contains("int64"));
    let unknown = make(
        vec![
            ("id", ArrowType::Int64, false),
            ("nope", ArrowType::Int64, false),
            (OP_COLUMN, ArrowType::UInt8, false),
        ],
        vec![ids(&[1]), ids(&[1]), op(&[6])],
    );
    assert!(invalid(OpBatch::from_record_batch(&unknown, &s)).contains("nope"));
    // An insert may leave out nullable columns (they take their default or null), but not a
    // NOT NULL column without a default, and an update must carry every column.
    let insert_without_values = make(
        vec![
            ("id", ArrowType::Int64, false),
            (OP_COLUMN, ArrowType::UInt8, false),
        ],
        vec![ids(&[1]), op(&[1])],
    );
    OpBatch::from_record_batch(&insert_without_values, &s).unwrap();
    let update_without_values = make(
        vec![
            ("id", ArrowType::Int64, false),
            (OP_COLUMN, ArrowType::UInt8, false),
        ],
        vec![ids(&[1]), op(&[4])],
    );
    assert!(invalid(OpBatch::from_record_batch(&update_without_values, &s)).contains("lacks"));
    let strict = Schema::build(
        vec![
            ("id".into(), DataType::Int64, false),
            ("name".into(), DataType::String, false),
        ],
        &["id"],
    )
    .unwrap();
    assert!(
        invalid(OpBatch::from_record_batch(&insert_without_values, &strict)).contains("\"name\"")
    );
    let no_key = make(
        vec![
            ("name", ArrowType::Utf8, false),
            (OP_COLUMN, ArrowType::UInt8, false),
        ],
        vec![Arc::new(StringArray::from(vec!["a"])), op(&[6])],
    );
    assert!(invalid(OpBatch::from_record_batch(&no_key, &strict)).contains("key column"));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Any damage to the bytes gives a valid batch or `InvalidArgument`, never a panic.
    #[test]
    fn damaged_ipc_never_panics(at in any::<prop::sample::Index>(), xor in 1u8..=255) {
        let s = schema();
        let rows: Vec<_> = (0..20).map(|i| (Upsert, i, Some(i * 7), Some("value"))).collect();
        let mut bytes = encode_ipc(&batch(&rows)).unwrap();
        let i = at.index(bytes.len());
        bytes[i] ^= xor;
        match OpBatch::decode_ipc(Buffer::from_vec(bytes), &s) {
            Ok(decoded) => prop_assert!(decoded.len() <= 20),
            Err(e) => prop_assert_eq!(e.kind(), ErrorKind::InvalidArgument),
        }
    }
}

/// The usual stream (a schema, one record batch) is decoded with its schema converted once
/// and then looked up by its bytes: the batch is the one arrow's stream reader gives, the
/// first time and every time after, and a damaged batch after a known schema is still refused.
#[test]
fn a_known_schema_decodes_as_the_stream_reader_does() {
    let s = schema();
    let rows: Vec<_> = (0..5)
        .map(|i| (Upsert, i, Some(i * 3), Some("v")))
        .collect();
    let bytes = encode_ipc(&batch(&rows)).unwrap();
    let expected = arrow::ipc::reader::StreamReader::try_new(std::io::Cursor::new(&bytes), None)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let wanted = OpBatch::from_record_batch(&expected, &s).unwrap();
    for _ in 0..3 {
        let decoded = OpBatch::decode_ipc(Buffer::from_vec(bytes.clone()), &s).unwrap();
        assert_eq!(decoded.len(), 5);
        // All but `held_bytes` (the last field): decoded bytes are held, a batch is not.
        let fields = |b: &OpBatch| {
            format!("{b:?}")
                .split("held_bytes")
                .next()
                .unwrap()
                .to_owned()
        };
        assert_eq!(fields(&decoded), fields(&wanted));
    }
    // The last message (the batch's buffers) cut short, its schema known by now.
    let mut damaged = bytes.clone();
    damaged.truncate(bytes.len() - 16);
    invalid(OpBatch::decode_ipc(Buffer::from_vec(damaged), &s));
}

/// A schema too large to keep (here, 100 KB of custom metadata) decodes the same every time
/// without being kept.
#[test]
fn a_large_schema_decodes_without_being_kept() {
    let s = schema();
    let rows = batch(&[(Upsert, 1, Some(2), Some("x"))]);
    let metadata: std::collections::HashMap<String, String> =
        [("note".to_owned(), "m".repeat(100_000))]
            .into_iter()
            .collect();
    let with_metadata = RecordBatch::try_new(
        Arc::new(rows.schema().as_ref().clone().with_metadata(metadata)),
        rows.columns().to_vec(),
    )
    .unwrap();
    let bytes = encode_ipc(&with_metadata).unwrap();
    assert!(bytes.len() > 100_000);
    for _ in 0..2 {
        let decoded = OpBatch::decode_ipc(Buffer::from_vec(bytes.clone()), &s).unwrap();
        assert_eq!(decoded.len(), 1);
    }
}
