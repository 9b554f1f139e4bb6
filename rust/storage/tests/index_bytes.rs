//! What open rowsets hold in memory while open (`diskrowset::index_bytes`): counted when a
//! rowset opens, given back when it is dropped. A process-wide figure, so this file is its own
//! test binary with one test: no other test opens rowsets meanwhile.

mod common;

use common::{ops, schema};
use nyala_storage::diskrowset::index_bytes;
use nyala_storage::{Engine, EngineOptions, OpType::*};

/// Bytes of a bloom filter over `keys` keys (10 bits a key, whole 64-bit words).
fn bloom_bytes(keys: usize) -> usize {
    (keys * 10).div_ceil(64) * 8
}

#[test]
fn open_rowsets_count_their_filters_and_footers_until_dropped() {
    assert_eq!(index_bytes(), 0);
    let dir = tempfile::tempdir().unwrap();
    let s = schema();
    let engine = Engine::create(dir.path(), s.clone(), EngineOptions::default()).unwrap();
    let keys = 50_000;
    let rows = |from: i64| -> Vec<_> {
        (from..from + keys as i64)
            .map(|id| (Insert, id, Some(id), None))
            .collect()
    };
    engine.apply(&ops(&s, &rows(0)), 1).unwrap();
    assert_eq!(index_bytes(), 0, "a MemRowSet is not a rowset");
    engine.flush().unwrap();
    let one = index_bytes();
    assert!(one >= bloom_bytes(keys), "{one} bytes for one rowset");
    assert!(
        one < bloom_bytes(keys) + (1 << 20),
        "{one} bytes for one rowset"
    );

    engine.apply(&ops(&s, &rows(keys as i64)), 2).unwrap();
    engine.flush().unwrap();
    let two = index_bytes();
    assert!(
        two >= one + bloom_bytes(keys),
        "{two} bytes for two rowsets"
    );

    // An update of a flushed key reads its rowset's key index (stored with the filter).
    engine
        .apply(&ops(&s, &[(Update, 7, Some(0), None)]), 3)
        .unwrap();
    assert_eq!(index_bytes(), two);

    // The update's own rowset makes three; compaction replaces them with one rowset of
    // their keys: one footer instead of three, and the replaced rowsets give theirs back.
    engine.flush().unwrap();
    let three = index_bytes();
    assert!(engine.compact(u64::MAX).unwrap());
    let merged = index_bytes();
    assert!(
        merged >= bloom_bytes(2 * keys),
        "{merged} bytes after compaction"
    );
    assert!(
        merged < three,
        "{merged} bytes after compaction, {three} before"
    );

    drop(engine);
    assert_eq!(index_bytes(), 0, "every rowset dropped gave its bytes back");

    let reopened = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    assert_eq!(
        index_bytes(),
        merged,
        "a reopened rowset counts what it counted"
    );
    drop(reopened);
    assert_eq!(index_bytes(), 0);
}
