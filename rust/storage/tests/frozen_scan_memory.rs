//! A scan that meets a MemRowSet being flushed (frozen) whose keys overlap a DiskRowSet
//! gathers the frozen rows a chunk at a time, as it does the active MemRowSet's: it used to
//! gather them all when the cursor reached them, a copy of every projected value of a
//! MemRowSet as large as the flush threshold (up to 1 GiB), per scanner.
//!
//! The test counts the heap's live bytes with a global allocator of its own, so it runs in a
//! test binary of its own.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::{ids, ops, schema, Gate};
use nyala_storage::{Engine, EngineOptions, OpType::*, ScanSpec};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(bytes: usize) {
    let now = LIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is passed on to the system allocator unchanged; only counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        unsafe { System.dealloc(p, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const ROWS: i64 = 1_000_000;
const BATCH_ROWS: usize = 100_000;
/// The newest value of every key: 100 bytes.
const NEWEST: &str = "the newest value of the key, a hundred bytes long, so that its copy dwarfs what locating rows takes.";

/// Upserts every `step`-th key below `ROWS` with `text`, as ops from `first_op`.
fn upsert_every(engine: &Engine, step: i64, first_op: u64, text: &str) {
    let keys: Vec<i64> = (0..ROWS).step_by(step as usize).collect();
    for (n, chunk) in keys.chunks(BATCH_ROWS).enumerate() {
        let rows: Vec<_> = chunk
            .iter()
            .map(|&i| (Upsert, i, Some(i), Some(text)))
            .collect();
        engine
            .apply(&ops(&engine.schema(), &rows), first_op + n as u64)
            .unwrap();
    }
}

#[test]
fn a_scan_gathers_a_frozen_memrowset_a_chunk_at_a_time() {
    let root = tempfile::tempdir().unwrap();
    let gate = Arc::new(Gate::default());
    let engine = Arc::new(
        Engine::create(
            root.path(),
            schema(),
            EngineOptions {
                flush_threshold_bytes: 1 << 30,
                fault_injector: Some(gate.injector()),
                ..EngineOptions::default()
            },
        )
        .unwrap(),
    );
    // A small DiskRowSet whose keys span the range, then a MemRowSet upserting every key,
    // frozen by a flush held at the gate: their key ranges overlap, so the scan merges them.
    upsert_every(&engine, 1_000, 1, "older");
    engine.flush().unwrap();
    upsert_every(&engine, 1, 100, NEWEST);
    gate.arm();
    let flushing = Arc::clone(&engine);
    let flush = std::thread::spawn(move || flushing.flush().map(|_| ()));
    gate.wait_for_a_flush();
    let frozen_bytes = engine.stats().frozen_bytes;
    assert!(frozen_bytes > 40 << 20, "frozen {frozen_bytes} bytes");

    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let mut cursor = engine.open_scan(ScanSpec::default()).unwrap();
    let mut next = 0; // every key once, in order (checked without keeping them)
    let mut first_page_peak = 0;
    while let Some(batch) = cursor.next_batch(4 << 20).unwrap() {
        if first_page_peak == 0 {
            first_page_peak = PEAK.load(Ordering::Relaxed) - before;
        }
        for id in ids(&[batch]) {
            assert_eq!(id, next);
            next += 1;
        }
    }
    let peak = PEAK.load(Ordering::Relaxed) - before;
    drop(cursor);
    gate.open();
    flush.join().unwrap().unwrap();

    eprintln!(
        "scan peak {} MiB ({} MiB by its first page), {} MiB frozen",
        peak >> 20,
        first_page_peak >> 20,
        frozen_bytes >> 20
    );
    assert_eq!(next, ROWS);
    // The frozen rows' values are about 120 MB; locating them takes 16 bytes a row, and a
    // chunk of 64 Ki rows and a page take a few MB.
    assert!(
        peak < frozen_bytes / 4,
        "the scan held {} MiB at its peak ({} MiB by its first page) with {} MiB frozen",
        peak >> 20,
        first_page_peak >> 20,
        frozen_bytes >> 20
    );
}
