//! Group-commit latency of the Rust API alone, against raw `pwrite`+`fdatasync` measured in
//! the same run on the same directory (no Python, no GIL, no event loop).
//!
//! Each run measures the raw 4 KiB sync loop right before and right after `--writers` OS
//! threads that each append one 100-byte entry and wait for it to be durable, over and
//! over. For every append it also counts the group commits that completed while it waited,
//! which tells the group-commit loop's share of the tail (a writer should wait for no more
//! than the group in flight plus its own) from the disk's (a slow sync).
//!
//! ```text
//! cargo run --release -p nyala-wal --example group_commit_latency -- \
//!     [--dir DIR] [--writers 64] [--seconds 3] [--runs 3] [--segment-bytes 8388608]
//!     [--preallocation recycle|fallocate|zero_fill] [--syncs-in-flight 1]
//!     [--added-sync-latency-us 0]
//! ```
//!
//! `--added-sync-latency-us` makes every WAL sync wait that long before the real `fdatasync`
//! (the test-only fault injection), modelling storage whose flush latency is a round trip
//! that concurrent flushes share (network block devices); the raw baseline is not slowed.
//!
//! Prints one line per run and, last, one JSON object with the medians over the runs.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nyala_wal::{EntryRef, EntryType, Log, LogOptions, Preallocation};

const RECORD_BYTES: usize = 100;
const PAGE_BYTES: usize = 4096;
/// Latencies of appends started this soon after open are dropped: the background thread is
/// still preparing the first segments then, which no steady-state append competes with.
const WARM_UP_MS: u64 = 300;

struct Args {
    dir: PathBuf,
    writers: usize,
    seconds: f64,
    runs: usize,
    segment_bytes: u64,
    preallocation: Preallocation,
    syncs_in_flight_max: usize,
    added_sync_latency_us: u64,
}

fn parse_args() -> Args {
    let mut args = Args {
        dir: std::env::temp_dir(),
        writers: 64,
        seconds: 3.0,
        runs: 3,
        segment_bytes: nyala_wal::SEGMENT_SIZE_BYTES_DEFAULT,
        preallocation: Preallocation::Recycle,
        syncs_in_flight_max: nyala_wal::SYNCS_IN_FLIGHT_MAX_DEFAULT,
        added_sync_latency_us: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => args.dir = PathBuf::from(value),
            "--writers" => args.writers = value.parse().expect("--writers N"),
            "--seconds" => args.seconds = value.parse().expect("--seconds S"),
            "--runs" => args.runs = value.parse().expect("--runs N"),
            "--segment-bytes" => args.segment_bytes = value.parse().expect("--segment-bytes B"),
            "--added-sync-latency-us" => {
                args.added_sync_latency_us = value.parse().expect("--added-sync-latency-us N")
            }
            "--syncs-in-flight" => {
                args.syncs_in_flight_max = value.parse().expect("--syncs-in-flight N")
            }
            "--preallocation" => {
                args.preallocation = match value.as_str() {
                    "recycle" => Preallocation::Recycle,
                    "fallocate" => Preallocation::Fallocate,
                    "zero_fill" => Preallocation::ZeroFill,
                    other => panic!("unknown preallocation {other}"),
                }
            }
            other => panic!("unknown flag {other}"),
        }
    }
    args
}

/// Sorted-sample quantile.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len() - 1);
    sorted[i]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    quantile(&values, 0.5)
}

struct Raw {
    mean_ms: f64,
    p99_ms: f64,
}

/// 4 KiB `pwrite` + `fdatasync` appending to a fresh file, as the Python bench does.
fn raw_syncs(dir: &Path, seconds: f64) -> Raw {
    let path = dir.join("raw-sync");
    let file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .expect("create raw file");
    let page = vec![b'r'; PAGE_BYTES];
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        file.write_all_at(&page, (samples.len() * PAGE_BYTES) as u64)
            .expect("pwrite");
        file.sync_data().expect("fdatasync");
        samples.push(t.elapsed().as_secs_f64() * 1e3);
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
    let mean_ms = samples.iter().sum::<f64>() / samples.len() as f64;
    samples.sort_by(f64::total_cmp);
    Raw {
        mean_ms,
        p99_ms: quantile(&samples, 0.99),
    }
}

/// One completed append: latency, and how many group commits finished while it waited.
struct Sample {
    ms: f64,
    groups: u64,
}

struct WalRun {
    records_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    sync_mean_ms: f64,
    sync_max_ms: f64,
    mean_group: f64,
    /// Of the appends at or above the p99 latency: the most groups any of them waited for.
    tail_groups_max: u64,
    /// Appends that waited for more than two group commits (should be none).
    over_two_groups: usize,
    /// Groups that needed more than one sync (split across a roll-over).
    split_groups: u64,
    segments: u64,
}

fn wal_writers(dir: &Path, args: &Args) -> WalRun {
    let _ = std::fs::remove_dir_all(dir);
    let options = LogOptions {
        segment_size_bytes: args.segment_bytes,
        preallocation: args.preallocation,
        syncs_in_flight_max: args.syncs_in_flight_max,
        ..LogOptions::default()
    };
    let log = Arc::new(Log::open(dir, "bench", options).expect("open log"));
    if args.added_sync_latency_us > 0 {
        let delay = Duration::from_micros(args.added_sync_latency_us);
        log.fault_injection().delay_next_syncs(u32::MAX, delay);
    }
    let next_index = Arc::new(Mutex::new(1u64));
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Instant::now();
    let threads: Vec<_> = (0..args.writers)
        .map(|_| {
            let log = Arc::clone(&log);
            let next_index = Arc::clone(&next_index);
            let stop = Arc::clone(&stop);
            thread::spawn(move || {
                let payload = [b'p'; RECORD_BYTES];
                let mut samples = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    // Indexes are assigned under a lock, as a Raft leader does; the groups
                    // counted are those completed after the append was queued.
                    let (ticket, before) = {
                        let mut next = next_index.lock().unwrap();
                        let entry = EntryRef::new(1, *next, EntryType::Write, &payload);
                        let ticket = log.append(&[entry]).expect("append");
                        *next += 1;
                        (ticket, log.metrics())
                    };
                    log.wait(ticket.ticket).expect("wait");
                    let ms = started.elapsed().as_secs_f64() * 1e3;
                    let after = log.metrics();
                    if started.duration_since(opened) >= Duration::from_millis(WARM_UP_MS) {
                        samples.push(Sample {
                            ms,
                            groups: after.groups - before.groups,
                        });
                    }
                }
                samples
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(WARM_UP_MS));
    let measure_from = Instant::now();
    let metrics_from = log.metrics();
    thread::sleep(Duration::from_secs_f64(args.seconds));
    stop.store(true, Ordering::Relaxed);
    let metrics_to = log.metrics();
    let elapsed = measure_from.elapsed().as_secs_f64();
    let mut samples: Vec<Sample> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("writer"))
        .collect();
    log.close().expect("close");
    // After close the counters are final: syncs and groups are both complete.
    let closed = log.metrics();
    let _ = std::fs::remove_dir_all(dir);
    samples.sort_by(|a, b| a.ms.total_cmp(&b.ms));
    let latencies: Vec<f64> = samples.iter().map(|s| s.ms).collect();
    let p99 = quantile(&latencies, 0.99);
    let tail = &samples[samples.partition_point(|s| s.ms < p99)..];
    let syncs = metrics_to.syncs - metrics_from.syncs;
    let groups = metrics_to.groups - metrics_from.groups;
    WalRun {
        records_per_s: (metrics_to.entries_appended - metrics_from.entries_appended) as f64
            / elapsed,
        p50_ms: quantile(&latencies, 0.5),
        p99_ms: p99,
        sync_mean_ms: (metrics_to.sync_micros_total - metrics_from.sync_micros_total) as f64
            / syncs.max(1) as f64
            / 1e3,
        sync_max_ms: metrics_to.sync_micros_max as f64 / 1e3,
        mean_group: (metrics_to.entries_appended - metrics_from.entries_appended) as f64
            / groups.max(1) as f64,
        tail_groups_max: tail.iter().map(|s| s.groups).max().unwrap_or(0),
        over_two_groups: samples.iter().filter(|s| s.groups > 2).count(),
        split_groups: closed.syncs - closed.groups,
        segments: closed.segments_created + closed.segments_recycled,
    }
}

fn main() {
    let args = parse_args();
    let root = tempfile::Builder::new()
        .prefix("wal-latency-")
        .tempdir_in(&args.dir)
        .expect("scratch directory");
    let mut in_raw = Vec::new();
    let mut in_raw_p99 = Vec::new();
    let mut in_wal_syncs = Vec::new();
    let mut speedups = Vec::new();
    for run in 1..=args.runs {
        // The disk's speed drifts on a shared machine: average a baseline taken right
        // before and right after the WAL run.
        let before = raw_syncs(root.path(), args.seconds / 4.0);
        let wal = wal_writers(&root.path().join("wal"), &args);
        let after = raw_syncs(root.path(), args.seconds / 4.0);
        let raw = Raw {
            mean_ms: (before.mean_ms + after.mean_ms) / 2.0,
            p99_ms: (before.p99_ms + after.p99_ms) / 2.0,
        };
        println!(
            "run {run}: raw {:.2} ms/sync (p99 {:.2}); {} threads: {:.0} records/s, \
             p50 {:.2} ms, p99 {:.2} ms = {:.2} raw syncs; wal sync mean {:.2} ms max {:.2}; \
             {:.1} entries/group; tail waited <= {} groups; {} appends over 2 groups; \
             {} groups split over a roll-over; {} segments",
            raw.mean_ms,
            raw.p99_ms,
            args.writers,
            wal.records_per_s,
            wal.p50_ms,
            wal.p99_ms,
            wal.p99_ms / raw.mean_ms,
            wal.sync_mean_ms,
            wal.sync_max_ms,
            wal.mean_group,
            wal.tail_groups_max,
            wal.over_two_groups,
            wal.split_groups,
            wal.segments,
        );
        in_raw.push(wal.p99_ms / raw.mean_ms);
        in_raw_p99.push(wal.p99_ms / raw.p99_ms);
        in_wal_syncs.push(wal.p99_ms / wal.sync_mean_ms);
        speedups.push(wal.records_per_s * raw.mean_ms / 1e3);
    }
    println!(
        "{{\"writers\": {}, \"runs\": {}, \"p99_in_raw_syncs\": {:.2}, \
         \"p99_in_raw_p99_syncs\": {:.2}, \"p99_in_wal_syncs\": {:.2}, \
         \"group_commit_speedup\": {:.2}}}",
        args.writers,
        args.runs,
        median(in_raw),
        median(in_raw_p99),
        median(in_wal_syncs),
        median(speedups),
    );
}
