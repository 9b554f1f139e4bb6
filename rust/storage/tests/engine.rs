//! End-to-end behaviour of the engine: apply statuses, flush, compaction, scans, reopen,
//! snapshots and schema changes.

mod common;

use std::sync::Arc;

use arrow::array::{Array, AsArray, Int64Array, RecordBatch};
use arrow::datatypes::Int64Type;
use common::{ids, ops, schema};
use nyala_storage::{
    ColumnSchema, DataType, Engine, EngineOptions, OpType::*, Predicate, PredicateOp, RowStatus,
    ScanSpec,
};

fn options() -> EngineOptions {
    EngineOptions {
        background_flush: false,
        ..EngineOptions::default()
    }
}

fn all(engine: &Engine) -> Vec<RecordBatch> {
    engine.scan(&ScanSpec::default()).unwrap().batches
}

fn pred(column: &str, op: PredicateOp, values: &[i64]) -> Predicate {
    Predicate {
        column: column.into(),
        op,
        values: (!values.is_empty())
            .then(|| Arc::new(Int64Array::from(values.to_vec())) as Arc<dyn Array>),
    }
}

#[test]
fn statuses_follow_kudu_semantics() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(dir.path(), schema(), options()).unwrap();
    let s = engine.schema();
    let r = engine
        .apply(
            &ops(
                &s,
                &[
                    (Insert, 1, Some(10), Some("a")),
                    (Insert, 1, Some(11), None),
                    (InsertIgnore, 1, Some(12), None),
                    (Update, 2, Some(1), None),
                    (UpdateIgnore, 2, Some(1), None),
                    (Delete, 3, None, None),
                    (DeleteIgnore, 3, None, None),
                    (Upsert, 2, Some(20), Some("b")),
                    (Update, 1, Some(13), Some("c")),
                    (Delete, 2, None, None),
                    (Insert, 2, Some(21), None),
                ],
            ),
            1,
        )
        .unwrap();
    use RowStatus::*;
    assert_eq!(
        r.statuses,
        vec![
            Ok,
            AlreadyPresent,
            Ok,
            NotFound,
            Ok,
            NotFound,
            Ok,
            Ok,
            Ok,
            Ok,
            Ok
        ]
    );
    assert_eq!(r.errors().map(|e| e.0).collect::<Vec<_>>(), vec![1, 3, 5]);
    let rows = all(&engine);
    assert_eq!(ids(&rows), vec![1, 2]);
    let v = rows[0].column(1).as_primitive::<Int64Type>();
    assert_eq!((v.value(0), v.value(1)), (13, 21));
    assert!(engine
        .apply(&ops(&s, &[(Upsert, 5, None, None)]), 1)
        .is_err());
}

#[test]
fn flush_compact_reopen_keep_newest_versions() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(dir.path(), schema(), options()).unwrap();
    let s = engine.schema();
    let first: Vec<_> = (0..100).map(|i| (Insert, i, Some(i), None)).collect();
    engine.apply(&ops(&s, &first), 1).unwrap();
    engine.flush().unwrap();
    assert_eq!(engine.last_flushed_index(), 1);
    let second: Vec<_> = (50..150).map(|i| (Upsert, i, Some(-i), None)).collect();
    engine.apply(&ops(&s, &second), 2).unwrap();
    let deletes: Vec<_> = (0..10).map(|i| (Delete, i * 10, None, None)).collect();
    engine.apply(&ops(&s, &deletes), 3).unwrap();
    let check = |engine: &Engine| {
        let rows = all(engine);
        let got = ids(&rows);
        let want: Vec<i64> = (0..150).filter(|i| !(i % 10 == 0 && *i < 100)).collect();
        assert_eq!(got, want);
        let values: Vec<i64> = rows
            .iter()
            .flat_map(|b| b.column(1).as_primitive::<Int64Type>().values().to_vec())
            .collect();
        for (id, v) in got.iter().zip(values) {
            assert_eq!(v, if *id >= 50 { -id } else { *id });
        }
    };
    check(&engine);
    engine.flush().unwrap();
    let stats = engine.stats();
    assert_eq!(stats.rowsets, 2);
    assert_eq!((stats.flushes, stats.compactions), (2, 0));
    assert!(stats.data_bytes > 0);
    check(&engine);
    assert!(engine.compact(0).unwrap());
    let compacted = engine.stats();
    assert_eq!(compacted.rowsets, 1);
    assert_eq!((compacted.flushes, compacted.compactions), (2, 1));
    assert!(compacted.data_bytes > 0);
    // A flush with nothing to write writes no rowset and is not counted.
    engine.flush().unwrap();
    assert_eq!(engine.stats().flushes, 2);
    check(&engine);
    drop(engine);
    let engine = Engine::open(dir.path(), options()).unwrap();
    assert_eq!(engine.last_flushed_index(), 3);
    check(&engine);
    // Inserting a deleted key works; inserting a flushed live key does not.
    let r = engine
        .apply(
            &ops(
                &engine.schema(),
                &[(Insert, 10, None, None), (Insert, 11, None, None)],
            ),
            4,
        )
        .unwrap();
    assert_eq!(r.statuses, vec![RowStatus::Ok, RowStatus::AlreadyPresent]);
}

#[test]
fn predicates_projection_bounds_and_limit() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(dir.path(), schema(), options()).unwrap();
    let s = engine.schema();
    let rows: Vec<_> = (0..1000)
        .map(|i| (Insert, i, (i % 7 != 0).then_some(i % 100), Some("x")))
        .collect();
    engine.apply(&ops(&s, &rows), 1).unwrap();
    for flushed in [false, true] {
        if flushed {
            engine.flush().unwrap();
            // A second, overlapping rowset forces the merge path for part of the range.
            let more: Vec<_> = (990..1010)
                .map(|i| (Upsert, i, Some(i % 100), None))
                .collect();
            engine.apply(&ops(&engine.schema(), &more), 2).unwrap();
        }
        let spec = ScanSpec {
            columns: Some(vec!["v".into(), "id".into()]),
            predicates: vec![
                pred("v", PredicateOp::Eq, &[5]),
                pred("id", PredicateOp::Lt, &[500]),
            ],
            ..ScanSpec::default()
        };
        let result = engine.scan(&spec).unwrap();
        assert_eq!(result.schema.field(0).name(), "v");
        assert_eq!(
            ids(&result.batches),
            vec![5, 205, 305, 405],
            "105 % 7 == 0: null"
        );
        let nulls = ScanSpec {
            predicates: vec![pred("v", PredicateOp::IsNull, &[])],
            limit: Some(3),
            ..ScanSpec::default()
        };
        assert_eq!(ids(&engine.scan(&nulls).unwrap().batches), vec![0, 7, 14]);
        let in_list = ScanSpec {
            predicates: vec![pred("id", PredicateOp::In, &[3, 999, 1005, 4000])],
            ..ScanSpec::default()
        };
        let expect_in = if flushed {
            vec![3, 999, 1005]
        } else {
            vec![3, 999]
        };
        assert_eq!(ids(&engine.scan(&in_list).unwrap().batches), expect_in);
        let bounds = engine
            .encode_keys(
                &RecordBatch::try_from_iter([(
                    "id",
                    Arc::new(Int64Array::from(vec![100, 110])) as Arc<dyn Array>,
                )])
                .unwrap(),
            )
            .unwrap();
        let ranged = ScanSpec {
            columns: Some(vec!["id".into()]),
            lower_bound: Some(bounds[0].clone()),
            upper_bound: Some(bounds[1].clone()),
            ..ScanSpec::default()
        };
        assert_eq!(
            ids(&engine.scan(&ranged).unwrap().batches),
            (100..110).collect::<Vec<_>>()
        );
    }
    let bad = ScanSpec {
        predicates: vec![pred("s", PredicateOp::Eq, &[1])],
        ..ScanSpec::default()
    };
    assert!(matches!(
        engine.scan(&bad),
        Err(nyala_storage::StorageError::InvalidArgument(_))
    ));
}

#[test]
fn schema_changes_resolve_columns_by_id() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(dir.path(), schema(), options()).unwrap();
    let s = engine.schema();
    engine
        .apply(&ops(&s, &[(Insert, 1, Some(1), Some("one"))]), 1)
        .unwrap();
    let mut with_default = ColumnSchema::new(0, "d", DataType::Int64, false);
    with_default.default = Some(nyala_storage::Value::Int(42));
    let s1 = s
        .add_column(with_default)
        .unwrap()
        .rename_column("s", "label")
        .unwrap();
    let s1 = nyala_storage::Schema::with_next_id(
        s1.columns().to_vec(),
        s1.key_count(),
        s.version() + 1,
        s1.next_column_id(),
    )
    .unwrap();
    engine.alter_schema(s1, 2).unwrap();
    assert_eq!(engine.last_flushed_index(), 2);
    let rows = all(&engine);
    assert_eq!(rows[0].schema().field(2).name(), "label");
    assert_eq!(rows[0].column(3).as_primitive::<Int64Type>().value(0), 42);
    let s2 = engine.schema().drop_column("v").unwrap();
    engine.alter_schema(s2, 3).unwrap();
    drop(engine);
    let engine = Engine::open(dir.path(), options()).unwrap();
    let rows = all(&engine);
    let names: Vec<_> = rows[0]
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    assert_eq!(names, vec!["id", "label", "d"]);
    assert_eq!(rows[0].column(1).as_string::<i32>().value(0), "one");
}

#[test]
fn snapshot_pins_files_against_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(dir.path(), schema(), options()).unwrap();
    let s = engine.schema();
    engine
        .apply(&ops(&s, &[(Insert, 1, None, None)]), 1)
        .unwrap();
    engine.flush().unwrap();
    engine
        .apply(&ops(&s, &[(Insert, 2, None, None)]), 2)
        .unwrap();
    engine.flush().unwrap();
    let snapshot = engine.snapshot().unwrap();
    assert_eq!(snapshot.last_flushed_index, 2);
    assert_eq!(snapshot.files.len(), 4);
    engine.compact(0).unwrap();
    assert!(
        snapshot.files.iter().all(|f| f.exists()),
        "pinned files survive compaction"
    );
    engine.release_snapshot(snapshot.id).unwrap();
    assert!(
        snapshot.files.iter().all(|f| !f.exists()),
        "released files are deleted"
    );
    assert!(engine.release_snapshot(snapshot.id).is_err());
    assert_eq!(ids(&all(&engine)), vec![1, 2]);
}

#[test]
fn background_flush_at_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(
        dir.path(),
        schema(),
        EngineOptions {
            flush_threshold_bytes: 64 * 1024,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    for op_index in 1..=20 {
        let base = op_index as i64 * 1000;
        let rows: Vec<_> = (base..base + 1000)
            .map(|i| (Upsert, i, Some(i), None))
            .collect();
        engine
            .apply(&ops(&engine.schema(), &rows), op_index)
            .unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while engine.stats().rowsets == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        engine.stats().rowsets > 0,
        "{:?}",
        engine.background_error()
    );
    assert!(engine.last_flushed_index() > 0);
    // The engine's own (size-triggered) flushes are counted like explicit ones.
    let stats = engine.stats();
    assert_eq!(stats.flushes, stats.rowsets as u64);
    assert!(stats.data_bytes > 0);
    assert_eq!(ids(&all(&engine)).len(), 20_000);
}

#[test]
fn multi_row_group_rowsets_read_in_order_and_prune() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(dir.path(), schema(), options()).unwrap();
    let total = 300_000i64;
    for (n, start) in (0..total).step_by(100_000).enumerate() {
        let rows: Vec<_> = (start..start + 100_000)
            .map(|i| (Upsert, total - 1 - i, Some(i), None))
            .collect();
        engine
            .apply(&ops(&engine.schema(), &rows), n as u64 + 1)
            .unwrap();
    }
    engine.flush().unwrap();
    let got = ids(&all(&engine));
    assert_eq!(got.len(), total as usize);
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "key order across row groups"
    );
    let spec = ScanSpec {
        columns: Some(vec!["id".into()]),
        predicates: vec![pred("id", PredicateOp::Ge, &[total - 5])],
        ..ScanSpec::default()
    };
    assert_eq!(
        ids(&engine.scan(&spec).unwrap().batches),
        (total - 5..total).collect::<Vec<_>>()
    );
}

#[test]
fn scans_see_consistent_views_during_flush_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(
        Engine::create(
            dir.path(),
            schema(),
            EngineOptions {
                flush_threshold_bytes: 32 * 1024,
                ..EngineOptions::default()
            },
        )
        .unwrap(),
    );
    let batch_rows = 500i64;
    let batches = 60i64;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let maintainer = {
        let (engine, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                engine.flush().unwrap();
                engine.compact(0).unwrap();
            }
        })
    };
    let reader = {
        let (engine, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut scans = 0;
            let mut last_len = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let got = ids(&engine.scan(&ScanSpec::default()).unwrap().batches);
                // Batches add keys in ascending order, so every consistent view is 0..k for a
                // whole number of batches, and views only grow.
                assert_eq!(got.len() as i64 % batch_rows, 0, "torn batch");
                assert!(
                    got.iter().enumerate().all(|(i, id)| *id == i as i64),
                    "gap or disorder"
                );
                assert!(got.len() >= last_len, "view went back in time");
                last_len = got.len();
                scans += 1;
            }
            scans
        })
    };
    for b in 0..batches {
        let rows: Vec<_> = (b * batch_rows..(b + 1) * batch_rows)
            .map(|i| (Insert, i, Some(i), Some("x")))
            .collect();
        let result = engine
            .apply(&ops(&engine.schema(), &rows), b as u64 + 1)
            .unwrap();
        assert!(result.errors().next().is_none());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    maintainer.join().unwrap();
    assert!(reader.join().unwrap() > 0);
    assert_eq!(ids(&all(&engine)).len() as i64, batch_rows * batches);
}

#[test]
fn scan_rejects_empty_projection_and_bad_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(dir.path(), schema(), options()).unwrap();
    let empty = ScanSpec {
        columns: Some(vec![]),
        ..ScanSpec::default()
    };
    assert!(matches!(
        engine.scan(&empty),
        Err(nyala_storage::StorageError::InvalidArgument(_))
    ));
    let short_bound = ScanSpec {
        lower_bound: Some(vec![1, 2, 3]),
        ..ScanSpec::default()
    };
    assert!(matches!(
        engine.scan(&short_bound),
        Err(nyala_storage::StorageError::InvalidArgument(_))
    ));
}

#[test]
fn failed_apply_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(dir.path(), schema(), options()).unwrap();
    let s = engine.schema();
    let on_disk: Vec<_> = (0..100).map(|i| (Insert, i * 2, Some(i), None)).collect();
    engine.apply(&ops(&s, &on_disk), 1).unwrap();
    engine.flush().unwrap();
    let in_memory: Vec<_> = [300, 301, 40]
        .iter()
        .map(|k| (Upsert, *k, Some(1), Some("kept")))
        .collect();
    engine.apply(&ops(&s, &in_memory), 2).unwrap();
    let before = all(&engine);
    let stats = engine.stats();
    // The rowset's key index loads lazily on the first bloom hit: breaking its file makes
    // that lookup fail with an I/O or corruption error halfway through the batch.
    let data = rowset_file(dir.path());
    let image = std::fs::read(&data).unwrap();
    std::fs::write(&data, b"not parquet").unwrap();
    let failing = ops(
        &s,
        &[
            (Upsert, 300, Some(2), Some("replaced")),
            (Insert, 301, Some(2), None),
            (Upsert, 500, Some(2), None),
            (Insert, 500, Some(3), None),
            (Delete, 40, None, None),
            (Upsert, 40, Some(2), None),
            (Insert, 1000, Some(2), None),
            (Insert, 10, Some(2), None),
            (Upsert, 600, Some(2), None),
        ],
    );
    assert!(engine.apply(&failing, 3).is_err());
    assert_eq!(engine.stats(), stats);
    std::fs::write(&data, &image).unwrap();
    assert_eq!(all(&engine), before);
    // The same batch applies in full once the rowset reads again.
    let r = engine.apply(&failing, 3).unwrap();
    assert_eq!(
        r.errors().map(|e| e.0).collect::<Vec<_>>(),
        vec![1, 3, 7],
        "301 in memory, 500 from this batch, 10 on disk"
    );
    let mut expected: Vec<i64> = (0..100).map(|i| i * 2).collect();
    expected.extend([300, 301, 500, 600, 1000]);
    assert_eq!(ids(&all(&engine)), expected);
}

#[test]
fn rowsets_use_dictionaries_for_strings_only() {
    use arrow::array::{StringArray, UInt8Array};
    use arrow::datatypes::{DataType as ArrowType, Field, Schema as ArrowSchema};
    use parquet::basic::Encoding;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    let dir = tempfile::tempdir().unwrap();
    let s = nyala_storage::Schema::build(
        vec![
            ("id".into(), DataType::Int64, false),
            ("v".into(), DataType::Int64, false),
            ("category".into(), DataType::String, false),
            ("unique".into(), DataType::String, false),
        ],
        &["id"],
    )
    .unwrap();
    let engine = Engine::create(dir.path(), s, options()).unwrap();
    let rows = 40_000i64;
    let fields = vec![
        Field::new("id", ArrowType::Int64, false),
        Field::new("v", ArrowType::Int64, false),
        Field::new("category", ArrowType::Utf8, false),
        Field::new("unique", ArrowType::Utf8, false),
        Field::new(nyala_storage::OP_COLUMN, ArrowType::UInt8, false),
    ];
    let columns: Vec<Arc<dyn Array>> = vec![
        Arc::new(Int64Array::from_iter_values(0..rows)),
        Arc::new(Int64Array::from_iter_values((0..rows).map(|i| i * 7919))),
        Arc::new(StringArray::from_iter_values(
            (0..rows).map(|i| format!("c{}", i % 100)),
        )),
        Arc::new(StringArray::from_iter_values(
            (0..rows).map(|i| format!("unique-{i:08}")),
        )),
        Arc::new(UInt8Array::from(vec![Insert as u8; rows as usize])),
    ];
    let batch = RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns).unwrap();
    let ops = engine.validate(&batch).unwrap();
    engine.apply(&ops, 1).unwrap();
    engine.flush().unwrap();
    let data = rowset_file(dir.path());
    let reader = SerializedFileReader::new(std::fs::File::open(&data).unwrap()).unwrap();
    let group = reader.metadata().row_group(0);
    // (dictionary page present, some data page dictionary-encoded, some data page plain)
    let pages = |name: &str| {
        let column = group
            .columns()
            .iter()
            .find(|c| c.column_path().string() == name)
            .unwrap();
        let data_pages = column
            .page_encoding_stats_mask()
            .expect("writer records page encodings");
        (
            column.dictionary_page_offset().is_some(),
            data_pages.is_set(Encoding::RLE_DICTIONARY),
            data_pages.is_set(Encoding::PLAIN),
        )
    };
    for numeric in ["id", "v"] {
        let (dictionary, dict_pages, plain_pages) = pages(numeric);
        assert!(!dictionary && !dict_pages && plain_pages, "{numeric}");
    }
    // 100 categories: every data page dictionary-encoded.
    let (dictionary, dict_pages, plain_pages) = pages("category");
    assert!(dictionary && dict_pages && !plain_pages);
    // 40k distinct 15-byte strings (~760 KiB of dictionary, under parquet's default limit)
    // outgrow DICTIONARY_PAGE_BYTES_MAX and fall back to plain.
    let (dictionary, dict_pages, plain_pages) = pages("unique");
    assert!(dictionary && dict_pages && plain_pages);
    assert_eq!(ids(&all(&engine)).len(), rows as usize);
}

/// The (only) rowset data file in `dir`.
fn rowset_file(dir: &std::path::Path) -> std::path::PathBuf {
    dir.read_dir()
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "parquet"))
        .expect("a rowset file")
}

/// `id int64 key, name string NOT NULL, n int32 NOT NULL DEFAULT 7, b binary?`
fn strict_schema() -> nyala_storage::Schema {
    let mut n = ColumnSchema::new(2, "n", DataType::Int32, false);
    n.default = Some(nyala_storage::Value::Int(7));
    nyala_storage::Schema::new(
        vec![
            ColumnSchema::new(0, "id", DataType::Int64, false),
            ColumnSchema::new(1, "name", DataType::String, false),
            n,
            ColumnSchema::new(3, "b", DataType::Binary, true),
        ],
        1,
        0,
    )
    .unwrap()
}

fn strict_batch(
    ids: Vec<Option<i64>>,
    names: Vec<Option<&str>>,
    blobs: Vec<Option<Vec<u8>>>,
    ops: Vec<u8>,
) -> RecordBatch {
    use arrow::array::{ArrayRef, BinaryArray, StringArray, UInt8Array};
    use arrow::datatypes::{DataType as ArrowType, Field, Schema as ArrowSchema};
    let fields = vec![
        Field::new("id", ArrowType::Int64, true),
        Field::new("name", ArrowType::Utf8, true),
        Field::new("b", ArrowType::Binary, true),
        Field::new(nyala_storage::OP_COLUMN, ArrowType::UInt8, false),
    ];
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(ids)),
        Arc::new(StringArray::from(names)),
        Arc::new(BinaryArray::from_iter(blobs)),
        Arc::new(UInt8Array::from(ops)),
    ];
    RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), columns).unwrap()
}

#[test]
fn row_problems_refuse_only_their_rows_the_same_way_everywhere() {
    use nyala_storage::{check_op_batch, OpBatch, CELL_BYTES_MAX, ROW_BYTES_MAX};
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(dir.path(), strict_schema(), options()).unwrap();
    let big = vec![b'x'; CELL_BYTES_MAX + 1];
    let input = strict_batch(
        vec![Some(1), Some(2), None, Some(4), Some(5), Some(6)],
        vec![Some("a"), None, Some("c"), Some("d"), None, Some("f")],
        vec![None, None, None, Some(big), None, Some(vec![b'y'; 10])],
        // insert, insert (null name), insert (null key), upsert (cell too large),
        // delete (null name is fine on a delete), insert
        vec![1, 1, 1, 3, 6, 1],
    );
    let problems = check_op_batch(&input, &engine.schema()).unwrap();
    let found: Vec<(usize, RowStatus)> = problems.iter().map(|p| (p.row, p.status)).collect();
    assert_eq!(
        found,
        vec![
            (1, RowStatus::NullInNotNull),
            (2, RowStatus::NullInNotNull),
            (3, RowStatus::TooLarge)
        ]
    );
    assert!(
        problems[0].message.contains("\"name\""),
        "{}",
        problems[0].message
    );
    assert!(
        problems[2].message.contains("\"b\""),
        "{}",
        problems[2].message
    );
    let batch = OpBatch::from_record_batch(&input, &engine.schema()).unwrap();
    let result = engine.apply(&batch, 1).unwrap();
    assert_eq!(
        result.statuses,
        vec![
            RowStatus::Ok,
            RowStatus::NullInNotNull,
            RowStatus::NullInNotNull,
            RowStatus::TooLarge,
            RowStatus::NotFound,
            RowStatus::Ok
        ]
    );
    let rows = all(&engine);
    assert_eq!(ids(&rows), vec![1, 6]);
    // The omitted NOT NULL column took its default.
    let n = rows[0].column_by_name("n").unwrap();
    assert_eq!(
        n.as_primitive::<arrow::datatypes::Int32Type>().values(),
        &[7, 7]
    );
    // A row over the row limit, made of cells within the cell limit, in an all-upsert batch.
    let cells = ROW_BYTES_MAX / CELL_BYTES_MAX + 1;
    let mut columns = vec![
        ColumnSchema::new(0, "id", DataType::Int64, false),
        ColumnSchema::new(1, "name", DataType::String, false),
    ];
    columns.extend(
        (0..cells)
            .map(|i| ColumnSchema::new(2 + i as u32, format!("c{i}"), DataType::Binary, true)),
    );
    let wide = nyala_storage::Schema::new(columns, 1, 0).unwrap();
    let wide_dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(wide_dir.path(), wide.clone(), options()).unwrap();
    let mut fields = vec![
        arrow::datatypes::Field::new("id", arrow::datatypes::DataType::Int64, false),
        arrow::datatypes::Field::new("name", arrow::datatypes::DataType::Utf8, false),
    ];
    let mut arrays: Vec<arrow::array::ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![1, 2])),
        Arc::new(arrow::array::StringArray::from(vec!["a", "b"])),
    ];
    for i in 0..cells {
        fields.push(arrow::datatypes::Field::new(
            format!("c{i}"),
            arrow::datatypes::DataType::Binary,
            true,
        ));
        let cell = vec![b'z'; CELL_BYTES_MAX];
        arrays.push(Arc::new(arrow::array::BinaryArray::from_iter(vec![
            None,
            Some(cell.as_slice()),
        ])));
    }
    fields.push(arrow::datatypes::Field::new(
        nyala_storage::OP_COLUMN,
        arrow::datatypes::DataType::UInt8,
        false,
    ));
    arrays.push(Arc::new(arrow::array::UInt8Array::from(vec![3, 3])));
    let input =
        RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), arrays).unwrap();
    let problems = check_op_batch(&input, &wide).unwrap();
    assert_eq!(problems.len(), 1);
    assert_eq!(
        (problems[0].row, problems[0].status),
        (1, RowStatus::TooLarge)
    );
    let batch = OpBatch::from_record_batch(&input, &wide).unwrap();
    let result = engine.apply(&batch, 1).unwrap();
    assert_eq!(result.statuses, vec![RowStatus::Ok, RowStatus::TooLarge]);
    assert_eq!(ids(&all(&engine)), vec![1]);
}

#[test]
fn cursor_pages_are_bounded_and_keep_their_view() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(dir.path(), schema(), options()).unwrap();
    let total = 200_000i64;
    for (n, start) in (0..total).step_by(50_000).enumerate() {
        let rows: Vec<_> = (start..start + 50_000)
            .map(|i| (Insert, i, Some(i), None))
            .collect();
        engine
            .apply(&ops(&engine.schema(), &rows), n as u64 + 1)
            .unwrap();
        engine.flush().unwrap();
    }
    let mut cursor = engine.open_scan(ScanSpec::default()).unwrap();
    assert_eq!(cursor.snapshot_index(), 4);
    let first = cursor.next_batch(64 * 1024).unwrap().unwrap();
    assert!(first.num_rows() > 0);
    let sent = nyala_storage::encode_ipc(&first).unwrap().len();
    assert!(
        sent <= 2 * 64 * 1024,
        "a page is about bytes_max: {sent} bytes"
    );
    // The view stays: later writes, a compaction that replaces every rowset file.
    engine
        .apply(&ops(&engine.schema(), &[(Delete, 7, None, None)]), 5)
        .unwrap();
    engine.flush().unwrap();
    engine.compact(0).unwrap();
    let mut got = ids(&[first]);
    while let Some(batch) = cursor.next_batch(1024 * 1024).unwrap() {
        got.extend(ids(&[batch]));
    }
    assert_eq!(got, (0..total).collect::<Vec<_>>());
    assert!(cursor.next_batch(1024).unwrap().is_none());
    assert_eq!(ids(&all(&engine)).len(), total as usize - 1);
}

#[test]
fn cursor_applies_bounds_and_limit_to_streamed_rowsets() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(dir.path(), schema(), options()).unwrap();
    let rows: Vec<_> = (0..100_000i64)
        .map(|i| (Insert, i, Some(i), None))
        .collect();
    engine.apply(&ops(&engine.schema(), &rows), 1).unwrap();
    engine.flush().unwrap();
    let key = |id: i64| {
        let keys = RecordBatch::try_from_iter([(
            "id",
            Arc::new(Int64Array::from(vec![id])) as Arc<dyn Array>,
        )])
        .unwrap();
        engine.encode_keys(&keys).unwrap().remove(0)
    };
    let spec = ScanSpec {
        columns: Some(vec!["v".into()]),
        lower_bound: Some(key(70_000)),
        upper_bound: Some(key(90_000)),
        limit: Some(15_000),
        ..ScanSpec::default()
    };
    let mut cursor = engine.open_scan(spec).unwrap();
    let mut values = Vec::new();
    while let Some(batch) = cursor.next_batch(16 * 1024).unwrap() {
        assert_eq!(batch.num_columns(), 1, "projection");
        values.extend(
            batch
                .column(0)
                .as_primitive::<Int64Type>()
                .values()
                .to_vec(),
        );
    }
    assert_eq!(values, (70_000..85_000).collect::<Vec<_>>());
    let mut closed = engine.open_scan(ScanSpec::default()).unwrap();
    closed.close();
    assert!(closed.next_batch(1024).unwrap().is_none());
}
