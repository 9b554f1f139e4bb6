//! Applying WRITE log entries to a real engine: each entry's outcome (applied, refused as
//! malformed, duplicate or stale request), stopping at a schema change, and exactly once.

mod common;

use arrow::buffer::Buffer;
use common::{batch, ids, schema};
use nyala_storage::write_entry::{WRITE_ENTRY_FORMAT_VERSION, WRITE_ENTRY_MAGIC};
use nyala_storage::{
    apply_write_entries, encode_ipc, Engine, EngineOptions, OpType::*, RowStatus, ScanSpec,
    WriteEffect,
};

/// A WRITE payload of today's version at timestamp 0: `kind`, request id (`client`, `seq`,
/// `first`), `tail`.
fn entry(kind: u8, client: &str, seq: i64, first: i64, tail: &[u8]) -> Buffer {
    entry_at(kind, client, seq, first, 0, tail)
}

fn entry_at(kind: u8, client: &str, seq: i64, first: i64, ts: u64, tail: &[u8]) -> Buffer {
    let mut out = Vec::new();
    out.extend_from_slice(&WRITE_ENTRY_MAGIC);
    out.extend_from_slice(&[WRITE_ENTRY_FORMAT_VERSION, kind]);
    out.extend_from_slice(&(client.len() as u16).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&ts.to_le_bytes());
    out.extend_from_slice(client.as_bytes());
    out.resize(out.len().div_ceil(8) * 8, 0);
    out.extend_from_slice(tail);
    Buffer::from_vec(out)
}

fn engine(dir: &std::path::Path) -> Engine {
    let options = EngineOptions {
        background_flush: false,
        ..EngineOptions::default()
    };
    Engine::create(dir, schema(), options).unwrap()
}

fn inserts(keys: &[i64]) -> Vec<u8> {
    let rows: Vec<_> = keys.iter().map(|&k| (Insert, k, Some(k), None)).collect();
    encode_ipc(&batch(&rows)).unwrap()
}

#[test]
fn entries_are_applied_at_their_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());
    let entries = vec![
        (1, entry_at(0, "", -1, -1, 10, &inserts(&[1, 2]))),
        (2, entry_at(0, "", -1, -1, 20, &inserts(&[3]))),
    ];
    apply_write_entries(&engine, entries).unwrap();
    let at = |ts| {
        let spec = ScanSpec {
            snapshot_ts: Some(ts),
            ..ScanSpec::default()
        };
        ids(&engine.scan(&spec).unwrap().batches)
    };
    assert_eq!(at(9), Vec::<i64>::new());
    assert_eq!(at(15), vec![1, 2]);
    assert_eq!(at(20), vec![1, 2, 3]);
    // An entry whose timestamp goes back stops the replica: the log is wrong.
    let back = vec![(3, entry_at(0, "", -1, -1, 19, &inserts(&[4])))];
    let err = apply_write_entries(&engine, back).unwrap_err();
    assert!(err.to_string().contains("timestamp 19"), "{err}");
}

#[test]
fn entries_are_applied_once_in_order_until_a_schema_change() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());
    let entries = vec![
        (1, entry(0, "c", 1, 1, &inserts(&[1, 2]))),
        (2, entry(0, "c", 1, 1, &inserts(&[3]))), // the same request again
        (3, entry(0, "", -1, -1, &inserts(&[2, 4]))), // no request id; key 2 is there
        (4, entry(0, "c", 2, 1, b"not arrow")),
        (5, entry(0, "c", 3, 3, &inserts(&[5]))), // seq 1 and 2 complete
        (6, entry(0, "c", 1, 1, &inserts(&[6]))), // a stale retry of seq 1
        (7, entry(1, "", -1, -1, b"{\"schema\": 1}")),
        (8, entry(0, "c", 4, 3, &inserts(&[8]))), // after the schema change: not yet
    ];
    let applied = apply_write_entries(&engine, entries).unwrap();
    let effects: Vec<_> = applied
        .outcomes
        .iter()
        .map(|o| (o.index, &o.effect))
        .collect();
    assert_eq!(effects.len(), 6);
    assert_eq!(
        effects[0],
        (1, &WriteEffect::Applied(vec![RowStatus::Ok; 2]))
    );
    assert_eq!(effects[1], (2, &WriteEffect::Duplicate));
    let third = vec![RowStatus::AlreadyPresent, RowStatus::Ok];
    assert_eq!(effects[2], (3, &WriteEffect::Applied(third)));
    assert!(matches!(effects[3], (4, WriteEffect::Refused(_))));
    assert_eq!(effects[4], (5, &WriteEffect::Applied(vec![RowStatus::Ok])));
    assert_eq!(effects[5], (6, &WriteEffect::Stale));
    let watermarks: Vec<_> = applied.outcomes.iter().map(|o| o.watermark).collect();
    assert_eq!(watermarks, [Some(1), None, None, Some(1), Some(3), None]);
    let (index, version, doc) = applied.schema_change.unwrap();
    assert_eq!(
        (index, version, doc.as_slice()),
        (7, 0, &b"{\"schema\": 1}"[..])
    );
    assert_eq!(engine.last_applied_index(), 5);
    let rows = engine.scan(&ScanSpec::default()).unwrap().batches;
    assert_eq!(ids(&rows), [1, 2, 4, 5]);
}

/// Applies one WRITE entry inserting `keys` as op `index` at `ts` under request id
/// (client, seq no, first incomplete seq no).
fn apply_one(
    engine: &Engine,
    index: u64,
    (client, seq, first): (&str, i64, i64),
    ts: u64,
    keys: &[i64],
) {
    let payload = entry_at(0, client, seq, first, ts, &inserts(keys));
    apply_write_entries(engine, vec![(index, payload)]).unwrap();
}

fn reopen(dir: &std::path::Path, options: EngineOptions) -> Engine {
    Engine::open(dir, options).unwrap()
}

#[test]
fn request_outcomes_survive_a_flush_and_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let options = EngineOptions {
        background_flush: false,
        ..EngineOptions::default()
    };
    let engine = engine(dir.path());
    let entries = vec![
        (1, entry_at(0, "c", 1, 1, 10, &inserts(&[1, 2]))),
        (2, entry_at(0, "c", 2, 1, 20, &inserts(&[2, 3]))),
    ];
    apply_write_entries(&engine, entries).unwrap();
    engine.flush().unwrap();
    // Applied after the flush: only the WAL holds it, and replay records it again.
    apply_write_entries(
        &engine,
        vec![(3, entry_at(0, "c", 3, 1, 30, &inserts(&[4])))],
    )
    .unwrap();
    drop(engine);
    let engine = reopen(dir.path(), options.clone());
    assert_eq!(engine.last_flushed_index(), 2);
    {
        let requests = engine.requests();
        assert_eq!(requests.len(), 2, "seq 3 was applied after the flush");
        let second = requests.outcome("c", 2).unwrap();
        assert_eq!((second.index, second.timestamp), (2, 20));
        let statuses = second.result.statuses().unwrap();
        assert_eq!(statuses, [RowStatus::AlreadyPresent, RowStatus::Ok]);
    }
    // A retry of seq 1 after the restart is a duplicate, not a second insert.
    let retry = vec![
        (3, entry_at(0, "c", 3, 1, 30, &inserts(&[4]))),
        (4, entry_at(0, "c", 1, 1, 40, &inserts(&[1, 2]))),
    ];
    let applied = apply_write_entries(&engine, retry).unwrap();
    let effects: Vec<_> = applied.outcomes.iter().map(|o| &o.effect).collect();
    assert_eq!(effects[0], &WriteEffect::Applied(vec![RowStatus::Ok]));
    assert_eq!(effects[1], &WriteEffect::Duplicate);
    // A later watermark forgets seq 1 and 2 across a flush and reopen: a retry is stale.
    apply_one(&engine, 5, ("c", 4, 4), 50, &[5]);
    engine.flush().unwrap();
    drop(engine);
    let engine = reopen(dir.path(), options);
    assert_eq!(
        engine.requests().admit_seq("c", 1),
        nyala_storage::Admission::Stale
    );
    assert_eq!(engine.requests().len(), 1);
}

#[test]
fn a_background_flush_persists_the_requests_of_exactly_the_ops_it_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let options = EngineOptions {
        flush_threshold_bytes: 1,
        background_flush: true,
        ..EngineOptions::default()
    };
    let engine = Engine::create(dir.path(), schema(), options.clone()).unwrap();
    for seq in 1..=20i64 {
        let index = seq as u64;
        let payload = entry_at(0, "c", seq, 1, index, &inserts(&[seq]));
        apply_write_entries(&engine, vec![(index, payload)]).unwrap();
    }
    // Wait for the last background flush to finish.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while engine.stats().frozen_rows > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop(engine);
    let engine = reopen(dir.path(), options);
    let flushed = engine.last_flushed_index();
    assert!(flushed >= 1, "a flush ran");
    let requests = engine.requests();
    assert_eq!(
        requests.len() as u64,
        flushed,
        "one request per flushed op, no more"
    );
    for seq in 1..=flushed as i64 {
        assert_eq!(requests.outcome("c", seq).unwrap().index, seq as u64);
    }
    assert!(requests.outcome("c", flushed as i64 + 1).is_none());
}

#[test]
fn a_damaged_request_outcomes_image_fails_the_open() {
    use nyala_storage::manifest::Manifest;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());
    apply_one(&engine, 1, ("c", 1, 1), 10, &[1]);
    engine.flush().unwrap();
    drop(engine);
    let mut manifest = Manifest::read(dir.path()).unwrap();
    let mut image = manifest.request_outcomes.to_vec();
    image.truncate(image.len() - 1);
    manifest.request_outcomes = image.into();
    manifest.write(dir.path()).unwrap();
    let err = Engine::open(dir.path(), EngineOptions::default()).unwrap_err();
    assert!(
        matches!(err, nyala_storage::StorageError::Corruption(_)),
        "{err}"
    );
    assert!(err.to_string().contains("request outcomes"), "{err}");
}
