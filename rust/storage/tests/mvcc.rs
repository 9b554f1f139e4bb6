//! Row versions: what each layer keeps, what a snapshot sees, and what history GC drops.

mod common;

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use common::{ops, schema};
use nyala_storage::{Engine, EngineOptions, OpType::*, ScanSpec, StorageError};

fn engine(dir: &std::path::Path) -> Engine {
    let options = EngineOptions {
        background_flush: false,
        ..EngineOptions::default()
    };
    Engine::create(dir, schema(), options).unwrap()
}

/// (id, v) of rows.
type Rows = Vec<(i64, Option<i64>)>;

/// (id, v) of every row visible at `ts` (None: latest).
fn rows_at(engine: &Engine, ts: Option<u64>) -> Rows {
    let spec = ScanSpec {
        snapshot_ts: ts,
        ..ScanSpec::default()
    };
    let result = engine.scan(&spec).unwrap();
    result.batches.iter().flat_map(pairs).collect()
}

fn pairs(batch: &RecordBatch) -> Rows {
    let ids = batch.column(0).as_primitive::<Int64Type>();
    let v = batch.column(1).as_primitive::<Int64Type>();
    (0..batch.num_rows())
        .map(|i| (ids.value(i), (!v.is_null(i)).then(|| v.value(i))))
        .collect()
}

/// Key 1: v=1 at ts 10, v=2 at 20, deleted at 30, v=4 at 40; key 2: v=7 at 10 only.
fn history(engine: &Engine, flush_between: bool) {
    let s = schema();
    let steps = [
        (
            10,
            ops(
                &s,
                &[(Insert, 1, Some(1), None), (Insert, 2, Some(7), None)],
            ),
        ),
        (20, ops(&s, &[(Update, 1, Some(2), None)])),
        (30, ops(&s, &[(Delete, 1, None, None)])),
        (40, ops(&s, &[(Insert, 1, Some(4), None)])),
    ];
    for (i, (ts, batch)) in steps.iter().enumerate() {
        let result = engine.apply_at(batch, i as u64 + 1, *ts).unwrap();
        assert!(result.errors().next().is_none());
        if flush_between {
            engine.flush().unwrap();
        }
    }
}

fn assert_history(engine: &Engine, from_ts: u64) {
    let expected: [(u64, Rows); 6] = [
        (9, vec![]),
        (10, vec![(1, Some(1)), (2, Some(7))]),
        (25, vec![(1, Some(2)), (2, Some(7))]),
        (30, vec![(2, Some(7))]),
        (39, vec![(2, Some(7))]),
        (40, vec![(1, Some(4)), (2, Some(7))]),
    ];
    for (ts, rows) in expected.iter().filter(|(ts, _)| *ts >= from_ts) {
        assert_eq!(rows_at(engine, Some(*ts)), *rows, "at {ts}");
    }
    assert_eq!(rows_at(engine, None), vec![(1, Some(4)), (2, Some(7))]);
}

#[test]
fn versions_in_memory_after_flush_and_after_compaction() {
    for flush_between in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        history(&engine, flush_between);
        assert_history(&engine, 0);
        engine.flush().unwrap();
        assert_history(&engine, 0);
        engine.compact(0).unwrap();
        assert_eq!(engine.stats().rowsets, 1);
        assert_history(&engine, 0);
    }
}

#[test]
fn history_gc_keeps_the_newest_version_at_or_before_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());
    history(&engine, true);
    // Key 1's versions at 10 and 20 are older than the newest at or before 25 (none at 25:
    // the update at 20 is it): only the one at 10 goes.
    assert!(engine.compact(25).unwrap());
    assert_eq!(engine.history_gc_mark(), 25);
    assert_history(&engine, 25);
    let disk_rows = engine.stats().disk_rows;
    assert_eq!(disk_rows, 4, "key 1 at 20, 30 (tombstone), 40; key 2 at 10");
    // At 35 the newest version of key 1 at or before the mark is the tombstone: with nothing
    // older kept, it goes too.
    assert!(engine.compact(35).unwrap());
    assert_eq!(engine.stats().disk_rows, 2);
    assert_history(&engine, 35);
    // A lower mark never moves the mark back; a read below the mark is refused.
    engine.compact(5).unwrap();
    assert_eq!(engine.history_gc_mark(), 35);
    let spec = ScanSpec {
        snapshot_ts: Some(34),
        ..ScanSpec::default()
    };
    let err = engine.scan(&spec).unwrap_err();
    assert!(
        matches!(&err, StorageError::InvalidArgument(m) if m.contains("mark 35")),
        "{err}"
    );
    // The mark survives a restart.
    drop(engine);
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    assert_eq!(engine.history_gc_mark(), 35);
    assert_history(&engine, 35);
}

/// A compaction of newer rowsets only (the background policy's usual pick) collects history
/// among them, but keeps a tombstone as a key's oldest version there: the rowset left out
/// still holds what it hides.
#[test]
fn a_compaction_of_newer_rowsets_keeps_the_tombstones_they_need() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());
    let s = schema();
    let many: Vec<_> = (0..2_000).map(|k| (Insert, k, Some(k), None)).collect();
    let steps = [
        (10, ops(&s, &many)),
        (
            20,
            ops(&s, &[(Delete, 5, None, None), (Update, 6, Some(60), None)]),
        ),
        (30, ops(&s, &[(Update, 6, Some(61), None)])),
        (40, ops(&s, &[(Update, 7, Some(70), None)])),
    ];
    for (i, (ts, batch)) in steps.iter().enumerate() {
        let result = engine.apply_at(batch, i as u64 + 1, *ts).unwrap();
        assert!(result.errors().next().is_none());
        engine.flush().unwrap();
    }
    let before = engine.stats();
    assert!(
        !engine.compact_some(35, 5).unwrap(),
        "four rowsets: below the threshold"
    );
    // The three small rowsets are much smaller than the first: they merge without it.
    assert!(engine.compact_some(35, 4).unwrap());
    let after = engine.stats();
    assert_eq!((before.rowsets, after.rowsets), (4, 2));
    assert_eq!(
        after.disk_rows,
        2_000 + 3,
        "the first rowset; then key 5's tombstone, key 6 at 30 (20 collected), key 7"
    );
    assert!(after.compaction_bytes_written > 0);
    assert_eq!(engine.history_gc_mark(), 35);
    let latest = rows_at(&engine, None);
    assert_eq!(latest.len(), 1_999, "key 5 stays deleted");
    assert!(!latest.iter().any(|(k, _)| *k == 5));
    assert!(latest.contains(&(6, Some(61))) && latest.contains(&(7, Some(70))));
    assert_eq!(rows_at(&engine, Some(35)).len(), 1_999);
    // Everything merged at a later mark: now the tombstone, the oldest of key 5, goes.
    assert!(engine.compact(45).unwrap());
    assert_eq!(engine.stats().disk_rows, 1_999);
    assert_eq!(rows_at(&engine, None), latest);
}

#[test]
fn equal_timestamps_keep_one_version_and_older_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());
    let s = schema();
    engine
        .apply_at(&ops(&s, &[(Upsert, 1, Some(1), None)]), 1, 10)
        .unwrap();
    engine
        .apply_at(&ops(&s, &[(Upsert, 1, Some(2), None)]), 2, 10)
        .unwrap();
    engine.flush().unwrap();
    // No snapshot can tell the two apart: one version is kept, a single-version rowset.
    assert_eq!(engine.stats().disk_rows, 1);
    assert_eq!(rows_at(&engine, Some(10)), vec![(1, Some(2))]);
    let err = engine
        .apply_at(&ops(&s, &[(Upsert, 1, Some(3), None)]), 3, 9)
        .unwrap_err();
    assert!(matches!(err, StorageError::IllegalState(_)), "{err}");
    assert_eq!(engine.last_applied_index(), 2);
}

/// Presence checks read one key block of 4,096 rows: a key whose versions start just before,
/// exactly at or just after a block's first row, runs of versions longer than a block, and
/// tombstones, each answer as the key's newest version says.
#[test]
fn presence_checks_find_each_key_across_key_blocks() {
    let s = schema();
    for leading in [4_095i64, 4_096, 4_097] {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let (mut op, mut ts) = (0u64, 0u64);
        let mut apply = |rows: &[(nyala_storage::OpType, i64, Option<i64>, Option<&str>)]| {
            op += 1;
            ts += 10;
            let result = engine.apply_at(&ops(&s, rows), op, ts).unwrap();
            assert!(result.errors().next().is_none());
        };
        // Keys 0..leading one version each; then key `leading` with 9,000 versions (more
        // than two blocks); then 10,000 more keys, every seventh deleted last.
        let first: Vec<_> = (0..leading).map(|k| (Insert, k, Some(k), None)).collect();
        apply(&first);
        for v in 0..9_000 {
            apply(&[(Upsert, leading, Some(v), None)]);
        }
        let rest: Vec<_> = (leading + 1..leading + 10_001)
            .map(|k| (Insert, k, Some(k), None))
            .collect();
        apply(&rest);
        let deletes: Vec<_> = (leading + 1..leading + 10_001)
            .filter(|k| k % 7 == 3)
            .map(|k| (Delete, k, None, None))
            .collect();
        apply(&deletes);
        apply(&[(Delete, 0, None, None)]);
        engine.flush().unwrap();
        assert_eq!(engine.stats().rowsets, 1);
        // An UPDATE of every key (and of keys never written) finds exactly the live ones.
        let probe: Vec<i64> = (-3..leading + 10_004).collect();
        let updates: Vec<_> = probe.iter().map(|&k| (Update, k, Some(-1), None)).collect();
        op += 1;
        let result = engine.apply_at(&ops(&s, &updates), op, ts + 10).unwrap();
        for (&key, status) in probe.iter().zip(&result.statuses) {
            let live = (1..=leading).contains(&key)
                || (key > leading && key <= leading + 10_000 && key % 7 != 3);
            let expected = if live {
                nyala_storage::RowStatus::Ok
            } else {
                nyala_storage::RowStatus::NotFound
            };
            assert_eq!(*status, expected, "key {key}, {leading} leading keys");
        }
    }
}
