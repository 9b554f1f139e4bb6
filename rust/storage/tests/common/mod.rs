//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, UInt8Array};
use arrow::datatypes::{DataType as ArrowType, Field, Schema as ArrowSchema};
use nyala_storage::{DataType, FaultInjector, FaultPoint, OpBatch, OpType, Schema, OP_COLUMN};

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

/// A gate flushes block on at `BeforeRowSetWrite`, once armed, until it is opened.
#[derive(Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    armed: bool,
    open: bool,
    /// Flushes that reached the gate while it was armed.
    waiting: usize,
}

impl Gate {
    /// The engine's fault injector that blocks on this gate.
    pub fn injector(self: &Arc<Self>) -> FaultInjector {
        let gate = Arc::clone(self);
        Arc::new(move |point| {
            if point == FaultPoint::BeforeRowSetWrite {
                let mut state = gate.state.lock().unwrap();
                if state.armed {
                    state.waiting += 1;
                    gate.changed.notify_all();
                    while !state.open {
                        state = gate.changed.wait(state).unwrap();
                    }
                }
            }
            Ok(())
        })
    }

    /// Flushes from now on block until `open`.
    pub fn arm(&self) {
        self.state.lock().unwrap().armed = true;
    }

    /// How many flushes reached the armed gate.
    pub fn waiting(&self) -> usize {
        self.state.lock().unwrap().waiting
    }

    /// Waits (30 s at most) until a flush reached the armed gate.
    pub fn wait_for_a_flush(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut state = self.state.lock().unwrap();
        while state.waiting == 0 {
            assert!(Instant::now() < deadline, "no flush reached the gate");
            state = self
                .changed
                .wait_timeout(state, Duration::from_millis(50))
                .unwrap()
                .0;
        }
    }

    /// Lets every flush through.
    pub fn open(&self) {
        self.state.lock().unwrap().open = true;
        self.changed.notify_all();
    }
}
