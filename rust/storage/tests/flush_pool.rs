//! Background flushes of many engines run on the process-wide flush pool: engines start no
//! thread of their own, flushes run on at most `flush_threads_max` workers, and dropping an
//! engine waits for its own running flush only.
//!
//! The tests count the threads of the whole process and set the pool's bound, so they run
//! one at a time (`SERIAL`), in a test binary of their own.

mod common;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::{ids, ops, schema, Gate};
use nyala_storage::{
    configure_flush_pool, flush_pool_options, flush_pool_stats, Engine, EngineOptions,
    FlushPoolOptions, OpType::*, ScanSpec,
};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Applies `rows` upserts (ids from `base`) as op `op_index`.
fn upsert(engine: &Engine, op_index: u64, base: i64, rows: i64) {
    let rows: Vec<_> = (base..base + rows)
        .map(|i| (Upsert, i, Some(i), None))
        .collect();
    engine
        .apply(&ops(&engine.schema(), &rows), op_index)
        .unwrap();
}

fn small_threshold() -> EngineOptions {
    EngineOptions {
        flush_threshold_bytes: 16 * 1024,
        ..EngineOptions::default()
    }
}

/// 200 engines reach their flush threshold together: no engine starts a thread, the flushes
/// run on the pool's workers only, and every engine's rows end up in a rowset.
#[test]
fn many_engines_flush_on_the_bounded_pool() {
    const ENGINES: usize = 200;
    let _serial = serial();
    configure_flush_pool(FlushPoolOptions {
        flush_threads_max: 2,
        ..flush_pool_options()
    })
    .unwrap();
    let root = tempfile::tempdir().unwrap();
    let before = threads();
    let engines: Vec<Engine> = (0..ENGINES)
        .map(|i| {
            Engine::create(
                &root.path().join(i.to_string()),
                schema(),
                small_threshold(),
            )
        })
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(threads() <= before, "opening an engine starts no thread");
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for (i, engine) in engines.iter().enumerate() {
        upsert(engine, 1, i as i64 * 1000, 1000);
        most.fetch_max(threads(), std::sync::atomic::Ordering::Relaxed);
    }
    eventually("every engine flushed", || {
        engines.iter().all(|e| e.stats().rowsets == 1)
    });
    let most = most.load(std::sync::atomic::Ordering::Relaxed);
    assert!(most <= before + 2, "{most} threads, {before} before");
    assert!(flush_pool_stats().threads_started >= 1);
    for (i, engine) in engines.iter().enumerate() {
        assert!(engine.background_error().is_none());
        let rows = ids(&engine.scan(&ScanSpec::default()).unwrap().batches);
        assert_eq!(rows.len(), 1000, "engine {i}");
        assert_eq!(engine.last_flushed_index(), 1);
    }
    configure_flush_pool(FlushPoolOptions::default()).unwrap();
}

/// With one flush worker held by a slow flush, dropping another engine whose flush is
/// queued behind it returns at once (its job later finds it gone), while dropping the
/// engine whose flush runs waits for that flush, which leaves consistent files.
#[test]
fn dropping_an_engine_waits_for_its_own_running_flush_only() {
    let _serial = serial();
    configure_flush_pool(FlushPoolOptions {
        flush_threads_max: 1,
        ..flush_pool_options()
    })
    .unwrap();
    let root = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    gate.arm();
    let slow_dir = root.path().join("slow");
    let slow = Engine::create(
        &slow_dir,
        schema(),
        EngineOptions {
            fault_injector: Some(gate.injector()),
            ..small_threshold()
        },
    )
    .unwrap();
    upsert(&slow, 1, 0, 1000);
    eventually("the slow flush to start", || gate.waiting() == 1);
    let queued_dir = root.path().join("queued");
    let queued = Engine::create(&queued_dir, schema(), small_threshold()).unwrap();
    upsert(&queued, 1, 0, 1000);
    assert_eq!(flush_pool_stats().queued_jobs, 1, "behind the slow flush");
    let started = Instant::now();
    drop(queued);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "dropping an engine waited {:?} for another engine's flush",
        started.elapsed()
    );
    let (dropped_tx, dropped_rx) = std::sync::mpsc::channel();
    let dropper = std::thread::spawn(move || {
        drop(slow);
        dropped_tx.send(()).unwrap();
    });
    assert!(
        dropped_rx.recv_timeout(Duration::from_millis(200)).is_err(),
        "the drop waits for the engine's running flush"
    );
    gate.open();
    dropped_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    dropper.join().unwrap();
    // The slow engine's flush completed; the queued one's never ran (its rows were only in
    // memory, which a replica replays from its WAL).
    let slow = Engine::open(&slow_dir, EngineOptions::default()).unwrap();
    assert_eq!(slow.last_flushed_index(), 1);
    assert_eq!(
        ids(&slow.scan(&ScanSpec::default()).unwrap().batches).len(),
        1000
    );
    let queued = Engine::open(&queued_dir, EngineOptions::default()).unwrap();
    assert_eq!(queued.last_flushed_index(), 0);
    eventually("the queued job to run and find its engine gone", || {
        flush_pool_stats().queued_jobs == 0
    });
    configure_flush_pool(FlushPoolOptions::default()).unwrap();
}
