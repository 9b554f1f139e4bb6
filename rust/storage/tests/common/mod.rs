//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt8Array};
use arrow::datatypes::{DataType as ArrowType, Field, Schema as ArrowSchema};
use nyala_storage::{DataType, OpBatch, OpType, Schema, OP_COLUMN};

/// `id int64 key, v int64?, s string?`
pub fn schema() -> Schema {
    Schema::build(
        vec![
            ("id".into(), DataType::Int64, false),
            ("v".into(), DataType::Int64, true),
            ("s".into(), DataType::String, true),
        ],
        &["id"],
    )
    .unwrap()
}

/// An op batch of (op, id, v, s) rows for `schema()`.
pub fn batch(rows: &[(OpType, i64, Option<i64>, Option<&str>)]) -> RecordBatch {
    let fields = vec![
        Field::new("id", ArrowType::Int64, false),
        Field::new("v", ArrowType::Int64, true),
        Field::new("s", ArrowType::Utf8, true),
        Field::new(OP_COLUMN, ArrowType::UInt8, false),
    ];
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(Int64Array::from_iter(rows.iter().map(|r| r.2))),
        Arc::new(StringArray::from_iter(rows.iter().map(|r| r.3))),
        Arc::new(UInt8Array::from_iter_values(rows.iter().map(|r| r.0 as u8))),
    ];
    RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns).unwrap()
}

/// Validates `batch(rows)` against `schema`.
pub fn ops(schema: &Schema, rows: &[(OpType, i64, Option<i64>, Option<&str>)]) -> OpBatch {
    OpBatch::from_record_batch(&batch(rows), schema).unwrap()
}

/// The ids of a scan's rows in order.
pub fn ids(batches: &[RecordBatch]) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| {
            b.column_by_name("id")
                .unwrap()
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect()
}

/// A double column for tests needing floats.
pub fn doubles(values: &[f64]) -> ArrayRef {
    Arc::new(Float64Array::from(values.to_vec()))
}
