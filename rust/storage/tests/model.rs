//! Property test: the engine against a `BTreeMap` model under random op batches interleaved
//! with flushes, compactions, reopen (with WAL replay after `last_flushed_index`) and schema
//! changes. `PROPTEST_CASES` raises the case count (the default keeps `cargo test` quick).

use std::collections::BTreeMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int64Array, RecordBatch, StringArray, UInt8Array};
use arrow::datatypes::{DataType as ArrowType, Field, Int64Type, Schema as ArrowSchema};
use nyala_storage::{
    ColumnSchema, DataType, Engine, EngineOptions, OpBatch, OpType, Predicate, PredicateOp,
    RowStatus, ScanSpec, Schema, OP_COLUMN,
};
use proptest::prelude::*;

/// A row of the model: column id -> value rendered as text (None: null).
type Row = BTreeMap<u32, Option<String>>;

#[derive(Clone, Debug)]
enum Action {
    Apply(Vec<(u8, i64, Option<i64>)>),
    Flush,
    Compact,
    CompactSome(usize),
    CompactRun(usize, usize),
    Reopen,
    AddColumn,
    DropColumn(usize),
    RenameColumn(usize),
    ScanAtLeast(i64),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        8 => prop::collection::vec((1u8..=7, 0i64..48, prop::option::of(-50i64..50)), 1..40)
            .prop_map(Action::Apply),
        2 => Just(Action::Flush),
        1 => Just(Action::Compact),
        2 => (2usize..5).prop_map(Action::CompactSome),
        2 => (0usize..6, 0usize..4).prop_map(|(a, b)| Action::CompactRun(a, b)),
        1 => Just(Action::Reopen),
        1 => Just(Action::AddColumn),
        1 => (0usize..8).prop_map(Action::DropColumn),
        1 => (0usize..8).prop_map(Action::RenameColumn),
        2 => (-50i64..50).prop_map(Action::ScanAtLeast),
    ]
}

/// The log the test keeps in place of the WAL: everything applied, by op index.
enum Entry {
    Batch(RecordBatch),
    Alter(Schema),
}

struct Harness {
    dir: tempfile::TempDir,
    options: EngineOptions,
    engine: Option<Engine>,
    model: BTreeMap<i64, Row>,
    log: Vec<(u64, Entry)>,
    next_index: u64,
    renames: u32,
    /// Keys are `k000`-style strings instead of int64 (exercises the variable-width index).
    string_key: bool,
}

impl Harness {
    fn new(background: bool, string_key: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key_type = if string_key {
            DataType::String
        } else {
            DataType::Int64
        };
        let schema = Schema::build(
            vec![
                ("id".into(), key_type, false),
                ("v".into(), DataType::Int64, true),
                ("s".into(), DataType::String, true),
            ],
            &["id"],
        )
        .unwrap();
        let options = EngineOptions {
            flush_threshold_bytes: 16 * 1024,
            background_flush: background,
            fault_injector: None,
        };
        let engine = Engine::create(dir.path(), schema, options.clone()).unwrap();
        Harness {
            dir,
            options,
            engine: Some(engine),
            model: BTreeMap::new(),
            log: Vec::new(),
            next_index: 1,
            renames: 0,
            string_key,
        }
    }

    fn engine(&self) -> &Engine {
        self.engine.as_ref().unwrap()
    }

    fn batch_for(&self, schema: &Schema, rows: &[(u8, i64, Option<i64>)]) -> RecordBatch {
        let only_deletes = rows.iter().all(|r| r.0 >= 6);
        let mut fields = Vec::new();
        let mut columns: Vec<ArrayRef> = Vec::new();
        for (i, column) in schema.columns().iter().enumerate() {
            if i == 0 {
                columns.push(self.key_array(&rows.iter().map(|r| r.1).collect::<Vec<_>>()));
            } else if only_deletes {
                continue;
            } else if column.data_type == DataType::String {
                columns.push(Arc::new(StringArray::from_iter(
                    rows.iter().map(|r| r.2.map(|v| format!("s{v}"))),
                )));
            } else {
                // Distinct columns get distinct values so a mix-up between them shows.
                let shift = column.id as i64 * 1000;
                columns.push(Arc::new(Int64Array::from_iter(
                    rows.iter().map(|r| r.2.map(|v| v + shift)),
                )));
            }
            fields.push(Field::new(&column.name, column.data_type.arrow(), i > 0));
        }
        fields.push(Field::new(OP_COLUMN, ArrowType::UInt8, false));
        columns.push(Arc::new(UInt8Array::from_iter_values(
            rows.iter().map(|r| r.0),
        )));
        RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns).unwrap()
    }

    fn key_array(&self, keys: &[i64]) -> ArrayRef {
        if self.string_key {
            Arc::new(StringArray::from_iter_values(
                keys.iter().map(|k| self.key_text(*k)),
            ))
        } else {
            Arc::new(Int64Array::from(keys.to_vec()))
        }
    }

    fn key_text(&self, key: i64) -> String {
        if self.string_key {
            format!("k{key:03}")
        } else {
            key.to_string()
        }
    }

    fn model_row(schema: &Schema, value: Option<i64>) -> Row {
        schema.columns()[1..]
            .iter()
            .map(|c| {
                let text = match c.data_type {
                    DataType::String => value.map(|v| format!("s{v}")),
                    _ => value.map(|v| (v + c.id as i64 * 1000).to_string()),
                };
                (c.id, text)
            })
            .collect()
    }

    fn apply(&mut self, rows: &[(u8, i64, Option<i64>)]) {
        let schema = self.engine().schema();
        let batch = self.batch_for(&schema, rows);
        // Through the IPC bytes, as the WAL payload would arrive.
        let bytes = nyala_storage::encode_ipc(&batch).unwrap();
        let ops = OpBatch::decode_ipc(arrow::buffer::Buffer::from_vec(bytes), &schema).unwrap();
        let index = self.next_index;
        self.next_index += 1;
        let result = self.engine().apply(&ops, index).unwrap();
        let mut expected = Vec::new();
        for (op, key, value) in rows {
            let live = self.model.contains_key(key);
            let op = OpType::from_code(*op).unwrap();
            use OpType::*;
            let (status, action) = match (op, live) {
                (Upsert, _) | (Insert | InsertIgnore, false) | (Update | UpdateIgnore, true) => {
                    (RowStatus::Ok, Some(true))
                }
                (Insert, true) => (RowStatus::AlreadyPresent, None),
                (Update | Delete, false) => (RowStatus::NotFound, None),
                (InsertIgnore, true) | (UpdateIgnore | DeleteIgnore, false) => {
                    (RowStatus::Ok, None)
                }
                (Delete | DeleteIgnore, true) => (RowStatus::Ok, Some(false)),
            };
            match action {
                Some(true) => {
                    self.model.insert(*key, Self::model_row(&schema, *value));
                }
                Some(false) => {
                    self.model.remove(key);
                }
                None => {}
            }
            expected.push(status);
        }
        assert_eq!(result.statuses, expected);
        self.log.push((index, Entry::Batch(batch)));
    }

    fn alter(&mut self, next: Schema) {
        let index = self.next_index;
        self.next_index += 1;
        let old = self.engine().schema();
        self.engine().alter_schema(next.clone(), index).unwrap();
        for row in self.model.values_mut() {
            row.retain(|id, _| next.columns().iter().any(|c| c.id == *id));
            for column in next.columns()[1..].iter() {
                if !old.columns().iter().any(|c| c.id == column.id) {
                    row.insert(column.id, None);
                }
            }
        }
        self.log.push((index, Entry::Alter(next)));
    }

    fn reopen(&mut self) {
        drop(self.engine.take());
        let engine = Engine::open(self.dir.path(), self.options.clone()).unwrap();
        let flushed = engine.last_flushed_index();
        for (index, entry) in self.log.iter().filter(|(i, _)| *i > flushed) {
            match entry {
                Entry::Batch(batch) => {
                    let ops = engine.validate(batch).unwrap();
                    engine.apply(&ops, *index).unwrap();
                }
                Entry::Alter(schema) => engine.alter_schema(schema.clone(), *index).unwrap(),
            }
        }
        self.engine = Some(engine);
    }

    fn step(&mut self, action: Action) {
        let schema = self.engine().schema();
        let non_key: Vec<String> = schema.columns()[1..]
            .iter()
            .map(|c| c.name.clone())
            .collect();
        match action {
            Action::Apply(rows) => self.apply(&rows),
            Action::Flush => {
                self.engine().flush().unwrap();
                assert_eq!(self.engine().last_flushed_index(), self.next_index - 1);
            }
            Action::Compact => {
                self.engine().compact(0).unwrap();
            }
            Action::CompactSome(min_rowsets) => {
                self.engine().compact_some(0, min_rowsets).unwrap();
            }
            Action::CompactRun(start, len) => {
                // A run of newer rowsets: what the policy merges when the oldest is large.
                let count = self.engine().stats().rowsets;
                let start = start.min(count);
                let end = (start + len).min(count);
                self.engine().compact_run(0, start..end).unwrap();
            }
            Action::Reopen => self.reopen(),
            Action::AddColumn if schema.columns().len() < 6 => {
                let column = ColumnSchema::new(
                    0,
                    format!("c{}", schema.next_column_id()),
                    DataType::Int64,
                    true,
                );
                self.alter(schema.add_column(column).unwrap());
            }
            Action::DropColumn(i) if !non_key.is_empty() => {
                self.alter(schema.drop_column(&non_key[i % non_key.len()]).unwrap());
            }
            Action::RenameColumn(i) if !non_key.is_empty() => {
                self.renames += 1;
                let new = format!("r{}", self.renames);
                self.alter(
                    schema
                        .rename_column(&non_key[i % non_key.len()], &new)
                        .unwrap(),
                );
            }
            Action::ScanAtLeast(t) => self.check_predicate(t),
            _ => {}
        }
        self.check_all();
    }

    fn rendered(batches: &[RecordBatch]) -> Vec<Vec<Option<String>>> {
        let mut rows = Vec::new();
        for batch in batches {
            for r in 0..batch.num_rows() {
                rows.push(
                    batch
                        .columns()
                        .iter()
                        .map(|c| {
                            (!c.is_null(r)).then(|| match c.data_type() {
                                ArrowType::Utf8 => c.as_string::<i32>().value(r).to_string(),
                                _ => c.as_primitive::<Int64Type>().value(r).to_string(),
                            })
                        })
                        .collect(),
                );
            }
        }
        rows
    }

    fn expected(&self, keep: impl Fn(&Row) -> bool) -> Vec<Vec<Option<String>>> {
        let schema = self.engine().schema();
        self.model
            .iter()
            .filter(|(_, row)| keep(row))
            .map(|(key, row)| {
                std::iter::once(Some(self.key_text(*key)))
                    .chain(schema.columns()[1..].iter().map(|c| row[&c.id].clone()))
                    .collect()
            })
            .collect()
    }

    fn check_all(&self) {
        let result = self.engine().scan(&ScanSpec::default()).unwrap();
        assert_eq!(Self::rendered(&result.batches), self.expected(|_| true));
    }

    fn check_predicate(&self, threshold: i64) {
        let from = threshold.rem_euclid(48);
        let by_key = ScanSpec {
            predicates: vec![Predicate {
                column: "id".into(),
                op: PredicateOp::Ge,
                values: Some(self.key_array(&[from])),
            }],
            ..ScanSpec::default()
        };
        let result = self.engine().scan(&by_key).unwrap();
        let from_text = self.key_text(from);
        let want: Vec<_> = self
            .expected(|_| true)
            .into_iter()
            .filter(|row| {
                let key = row[0].as_ref().unwrap();
                if self.string_key {
                    *key >= from_text
                } else {
                    key.parse::<i64>().unwrap() >= from
                }
            })
            .collect();
        assert_eq!(Self::rendered(&result.batches), want);
        let schema = self.engine().schema();
        let Some(column) = schema.columns()[1..]
            .iter()
            .find(|c| c.data_type == DataType::Int64)
        else {
            return;
        };
        let bound = threshold + column.id as i64 * 1000;
        let spec = ScanSpec {
            predicates: vec![Predicate {
                column: column.name.clone(),
                op: PredicateOp::Ge,
                values: Some(Arc::new(Int64Array::from(vec![bound])) as Arc<dyn Array>),
            }],
            limit: Some(10),
            ..ScanSpec::default()
        };
        let result = self.engine().scan(&spec).unwrap();
        let id = column.id;
        let mut want = self.expected(|row| {
            row[&id]
                .as_ref()
                .is_some_and(|v| v.parse::<i64>().unwrap() >= bound)
        });
        want.truncate(10);
        assert_eq!(Self::rendered(&result.batches), want);
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn engine_matches_btreemap_model(
        actions in prop::collection::vec(action(), 1..40),
        background in any::<bool>(),
        string_key in any::<bool>(),
    ) {
        let mut harness = Harness::new(background, string_key);
        for action in actions {
            harness.step(action);
        }
        harness.reopen();
        harness.check_all();
    }
}
