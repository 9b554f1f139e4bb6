//! Crash consistency: a flush or compaction killed at each of its steps leaves the old or the
//! new rowset set, and reopening plus WAL replay after `last_flushed_index` gives the same rows.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{batch, ids, schema};
use nyala_storage::{Engine, EngineOptions, FaultPoint, OpType::*, ScanSpec, StorageError};

fn injecting(point: FaultPoint, armed: Arc<AtomicBool>) -> EngineOptions {
    EngineOptions {
        background_flush: false,
        fault_injector: Some(Arc::new(move |at| {
            if at == point && armed.load(Ordering::SeqCst) {
                Err(std::io::Error::other(format!("injected crash at {at:?}")))
            } else {
                Ok(())
            }
        })),
        ..EngineOptions::default()
    }
}

type Rows = Vec<(
    nyala_storage::OpType,
    i64,
    Option<i64>,
    Option<&'static str>,
)>;

fn wal() -> Vec<Rows> {
    vec![
        (0..50).map(|i| (Insert, i, Some(i), None)).collect(),
        (25..75).map(|i| (Upsert, i, Some(-i), Some("x"))).collect(),
        (0..10).map(|i| (Delete, i * 3, None, None)).collect(),
    ]
}

fn expected() -> Vec<i64> {
    (0..75).filter(|i| !(i % 3 == 0 && *i < 30)).collect()
}

fn replay(engine: &Engine, log: &[Rows], from: u64) {
    for (i, rows) in log.iter().enumerate() {
        let index = i as u64 + 1;
        if index > from {
            let ops = engine.validate(&batch(rows)).unwrap();
            engine.apply(&ops, index).unwrap();
        }
    }
}

/// Files in the directory that the manifest does not account for.
fn strays(dir: &std::path::Path, engine: &Engine) -> usize {
    let listed = engine.snapshot().unwrap();
    engine.release_snapshot(listed.id).unwrap();
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let path = e.as_ref().unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap().to_string();
            name != "rowset-manifest" && !listed.files.contains(&path)
        })
        .count()
}

fn crash_during(compaction: bool, point: FaultPoint) {
    let dir = tempfile::tempdir().unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let engine = Engine::create(dir.path(), schema(), injecting(point, armed.clone())).unwrap();
    let log = wal();
    replay(&engine, &log[..1], 0);
    engine.flush().unwrap();
    replay(&engine, &log[..2], 1);
    if compaction {
        engine.flush().unwrap();
    }
    replay(&engine, &log, 2);
    if compaction {
        engine.flush().unwrap();
    }
    armed.store(true, Ordering::SeqCst);
    let outcome = if compaction {
        engine.compact(0).map(|_| ())
    } else {
        engine.flush().map(|_| ())
    };
    assert!(
        matches!(outcome, Err(StorageError::Io { .. })),
        "{point:?}: {outcome:?}"
    );
    // The crash: nothing after the failed step runs.
    drop(engine);
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    let flushed = engine.last_flushed_index();
    let allowed: &[u64] = if compaction { &[3] } else { &[1, 3] };
    assert!(allowed.contains(&flushed), "{point:?}: flushed {flushed}");
    replay(&engine, &log, flushed);
    let rows = engine.scan(&ScanSpec::default()).unwrap().batches;
    assert_eq!(ids(&rows), expected(), "{point:?} compaction={compaction}");
    assert_eq!(
        strays(dir.path(), &engine),
        0,
        "{point:?}: orphans removed on open"
    );
    engine.flush().unwrap();
    engine.compact(0).unwrap();
    let rows = engine.scan(&ScanSpec::default()).unwrap().batches;
    assert_eq!(ids(&rows), expected());
}

#[test]
fn flush_crash_at_each_step() {
    for point in [
        FaultPoint::BeforeRowSetWrite,
        FaultPoint::AfterRowSetWrite,
        FaultPoint::AfterManifestWrite,
    ] {
        crash_during(false, point);
    }
}

#[test]
fn compaction_crash_at_each_step() {
    for point in [
        FaultPoint::BeforeRowSetWrite,
        FaultPoint::AfterRowSetWrite,
        FaultPoint::AfterManifestWrite,
    ] {
        crash_during(true, point);
    }
}

#[test]
fn torn_manifest_temp_and_damaged_files_are_handled() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::create(dir.path(), schema(), EngineOptions::default()).unwrap();
    replay(&engine, &wal(), 0);
    engine.flush().unwrap();
    drop(engine);
    // A crash while writing the manifest's temp file leaves junk next to the real one.
    std::fs::write(dir.path().join(".rowset-manifest.tmp"), b"half a manif").unwrap();
    let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    assert!(!dir.path().join(".rowset-manifest.tmp").exists());
    let snapshot = engine.snapshot().unwrap();
    drop(engine);
    // A damaged bloom file or a missing data file is corruption, never an empty tablet.
    let bloom = snapshot
        .files
        .iter()
        .find(|f| f.extension().unwrap() == "bloom")
        .unwrap();
    let mut image = std::fs::read(bloom).unwrap();
    let at = image.len() / 2;
    image[at] ^= 1;
    std::fs::write(bloom, &image).unwrap();
    let reopened = Engine::open(dir.path(), EngineOptions::default());
    assert!(
        matches!(reopened, Err(StorageError::Corruption(_))),
        "{reopened:?}"
    );
    let data = snapshot
        .files
        .iter()
        .find(|f| f.extension().unwrap() == "parquet")
        .unwrap();
    std::fs::remove_file(data).unwrap();
    let reopened = Engine::open(dir.path(), EngineOptions::default());
    assert!(
        matches!(reopened, Err(StorageError::Corruption(_))),
        "{reopened:?}"
    );
}

/// A flush goes on while a compaction writes its output (it used to wait for the whole
/// compaction: its MemRowSet grew meanwhile), and the compaction installs its output before
/// the rowset flushed meanwhile, on disk as in memory.
#[test]
fn a_flush_is_not_held_back_by_a_compaction() {
    use std::sync::mpsc;
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let armed = Arc::new(AtomicBool::new(false));
    let (entered, compacting) = mpsc::channel::<()>();
    let (release, released) = mpsc::channel::<()>();
    let released = std::sync::Mutex::new(released);
    let pause = armed.clone();
    let options = EngineOptions {
        background_flush: false,
        fault_injector: Some(Arc::new(move |at| {
            // The first rowset write once armed is the compaction's: it waits there.
            if at == FaultPoint::BeforeRowSetWrite && pause.swap(false, Ordering::SeqCst) {
                entered.send(()).unwrap();
                released.lock().unwrap().recv().unwrap();
            }
            Ok(())
        })),
        ..EngineOptions::default()
    };
    let engine = Arc::new(Engine::create(dir.path(), schema(), options).unwrap());
    let log = wal();
    replay(&engine, &log[..1], 0); // two rowsets to compact
    engine.flush().unwrap();
    replay(&engine, &log[..2], 1);
    engine.flush().unwrap();
    armed.store(true, Ordering::SeqCst);
    let compactor = {
        let engine = engine.clone();
        std::thread::spawn(move || engine.compact(0).unwrap())
    };
    compacting.recv_timeout(Duration::from_secs(30)).unwrap();
    replay(&engine, &log, 2); // the deletes, in memory
    let (flushed, flush_done) = mpsc::channel();
    {
        let engine = engine.clone();
        std::thread::spawn(move || flushed.send(engine.flush().unwrap()).unwrap());
    }
    let flushed_id = flush_done.recv_timeout(Duration::from_secs(30));
    release.send(()).unwrap(); // let the compaction go on either way
    assert!(compactor.join().unwrap(), "the compaction ran");
    assert!(
        matches!(flushed_id, Ok(Some(_))),
        "the flush waited for the compaction: {flushed_id:?}"
    );
    let rows = engine.scan(&ScanSpec::default()).unwrap().batches;
    assert_eq!(ids(&rows), expected());
    assert_eq!(
        engine.stats().rowsets,
        2,
        "the compaction's output, then the flushed rowset"
    );
    drop(engine);
    let reopened = Engine::open(dir.path(), EngineOptions::default()).unwrap();
    assert_eq!(reopened.stats().rowsets, 2);
    let rows = reopened.scan(&ScanSpec::default()).unwrap().batches;
    assert_eq!(ids(&rows), expected(), "the manifest names both");
}
