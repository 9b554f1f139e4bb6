//! Many logs in one process, as on a tablet server with thousands of replicas: their group
//! commits and segment work run on the shared, bounded pools, so threads do not grow with
//! the number of logs, and a log that stays idle holds only its initial preallocation.
//! Failures and closes stay per log.
//!
//! The tests in this file count the threads of the whole process, so they run one at a time
//! (`SERIAL`), in a test binary of their own.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use common::{entry, read_all, scratch_dir};
use nyala_common::{Classify, ErrorKind};
use nyala_wal::{
    thread_pool_options, thread_pool_stats, FaultInjection, Log, LogOptions, SyncPolicy,
    INITIAL_PREALLOCATION_BYTES_DEFAULT, SEGMENT_SIZE_BYTES_DEFAULT,
};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Threads of this process now.
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// Bytes of disk the files under `dir` occupy (allocated blocks, not lengths).
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            disk_bytes(&entry.path())
        } else {
            meta.blocks() * 512
        };
    }
    total
}

/// Default options (full-size segments, as a tablet server uses), syncing each group.
fn server_options() -> LogOptions {
    LogOptions {
        sync_policy: SyncPolicy::Group,
        ..LogOptions::default()
    }
}

fn open_logs(root: &Path, count: usize, options: &LogOptions) -> Vec<Arc<Log>> {
    (0..count)
        .map(|i| {
            let dir = root.join(format!("tablet-{i}"));
            Arc::new(Log::open(&dir, &format!("tablet-{i}"), options.clone()).unwrap())
        })
        .collect()
}

/// 2,000 logs, each with an entry durable (an elected replica's NO_OP), use no thread of
/// their own: the process gains at most the pools' bounds. Each holds its initial
/// preallocation, not a whole segment.
#[test]
fn two_thousand_logs_use_bounded_threads_and_disk() {
    const LOGS: usize = 2000;
    let _serial = serial();
    let root = scratch_dir();
    let before = threads();
    let logs = open_logs(root.path(), LOGS, &server_options());
    // (Fewer is possible: pool workers of an earlier test may have stopped meanwhile.)
    assert!(threads() <= before, "opening a log starts no thread");
    let tickets: Vec<_> = logs
        .iter()
        .map(|log| log.append(&[entry(1, 1).as_ref()]).unwrap())
        .collect();
    for (log, ticket) in logs.iter().zip(&tickets) {
        log.wait(ticket.ticket).unwrap();
    }
    let pools = thread_pool_options();
    let bound = pools.commit_threads_max + pools.background_threads_max;
    let after = threads();
    assert!(
        after <= before + bound,
        "{LOGS} logs run {after} threads, {before} before; the pools allow {bound} more"
    );
    let stats = thread_pool_stats();
    assert!(
        stats.commit.threads <= pools.commit_threads_max,
        "{stats:?}"
    );
    assert!(stats.commit.threads >= 1, "{stats:?}");
    // One segment each, holding the initial preallocation (the header page included).
    let disk = disk_bytes(root.path());
    let per_log = disk / LOGS as u64;
    assert!(
        per_log <= INITIAL_PREALLOCATION_BYTES_DEFAULT + 4096,
        "{per_log} bytes of disk per idle log"
    );
    assert!(
        disk < LOGS as u64 * SEGMENT_SIZE_BYTES_DEFAULT / 64,
        "{disk}"
    );
    for log in &logs {
        assert_eq!(log.segment_paths().len(), 1);
        assert_eq!(log.durable_index(), 1);
    }
    let started = Instant::now();
    for log in &logs {
        log.close().unwrap();
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?} to close {LOGS} logs",
        started.elapsed()
    );
}

/// Writers append to many logs at once, more logs than the commit pool has workers: every
/// entry of every log becomes durable, in order, and is there after reopening.
#[test]
fn concurrent_appends_to_many_logs_all_become_durable() {
    const LOGS: usize = 64;
    const WRITERS: usize = 8;
    const APPENDS_PER_WRITER: usize = 200;
    let _serial = serial();
    let root = scratch_dir();
    let options = LogOptions {
        segment_size_bytes: 32 << 10,
        ..server_options()
    };
    let logs = Arc::new(open_logs(root.path(), LOGS, &options));
    // Each log's next index, under one lock per log (a Raft leader assigns indexes so).
    let next: Arc<Vec<Mutex<u64>>> = Arc::new((0..LOGS).map(|_| Mutex::new(1)).collect());
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (logs, next) = (Arc::clone(&logs), Arc::clone(&next));
            thread::spawn(move || {
                for n in 0..APPENDS_PER_WRITER {
                    let i = (writer * 7 + n * 13) % LOGS;
                    let ticket = {
                        let mut next = next[i].lock().unwrap();
                        let ticket = logs[i].append(&[entry(1, *next).as_ref()]).unwrap();
                        *next += 1;
                        ticket
                    };
                    logs[i].wait(ticket.ticket).unwrap();
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().unwrap();
    }
    let mut total = 0;
    for (i, log) in logs.iter().enumerate() {
        let last = *next[i].lock().unwrap() - 1;
        assert_eq!(log.durable_index(), last);
        total += last;
        log.close().unwrap();
    }
    assert_eq!(total, (WRITERS * APPENDS_PER_WRITER) as u64);
    for (i, last) in next.iter().enumerate() {
        let last = *last.lock().unwrap() - 1;
        let dir = root.path().join(format!("tablet-{i}"));
        let reopened = Log::open(&dir, &format!("tablet-{i}"), options.clone()).unwrap();
        let expected: Vec<_> = (1..=last).map(|index| entry(1, index)).collect();
        assert_eq!(read_all(&reopened), expected, "log {i}");
    }
}

/// A failed sync fails its own log only: the pool worker that ran it goes on with other
/// logs, whose appends keep becoming durable.
#[test]
fn a_failed_sync_fails_only_its_log() {
    const LOGS: usize = 16;
    let _serial = serial();
    let root = scratch_dir();
    let faults = Arc::new(FaultInjection::default());
    let failing = Log::open(
        root.path().join("failing"),
        "failing",
        LogOptions {
            fault_injection: Some(Arc::clone(&faults)),
            ..server_options()
        },
    )
    .unwrap();
    let others = open_logs(root.path(), LOGS, &server_options());
    for log in &others {
        log.append_durable(&[entry(1, 1).as_ref()]).unwrap();
    }
    failing.append_durable(&[entry(1, 1).as_ref()]).unwrap();
    faults.fail_next_syncs(1, libc::EIO);
    let ticket = failing.append(&[entry(1, 2).as_ref()]).unwrap();
    let err = failing.wait(ticket.ticket).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert_eq!(failing.durable_index(), 1);
    assert!(failing.append(&[entry(1, 3).as_ref()]).is_err());
    for log in &others {
        for index in 2..=20 {
            log.append_durable(&[entry(1, index).as_ref()]).unwrap();
        }
        assert_eq!(log.durable_index(), 20);
        assert!(log.failure().is_none());
    }
    assert!(failing.close().is_err());
    for log in &others {
        log.close().unwrap();
    }
}

/// Logs closed and dropped while other logs append flat out: each close returns once its
/// own log is done (its entries durable, its files final), without waiting for the others.
#[test]
fn closing_and_dropping_logs_while_others_are_busy() {
    const BUSY: usize = 8;
    const CLOSED: usize = 40;
    let _serial = serial();
    let root = scratch_dir();
    let options = LogOptions {
        segment_size_bytes: 32 << 10,
        ..server_options()
    };
    let busy = open_logs(&root.path().join("busy"), BUSY, &options);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = busy
        .iter()
        .map(|log| {
            let (log, stop) = (Arc::clone(log), Arc::clone(&stop));
            thread::spawn(move || {
                let mut index = 1;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    log.append_durable(&[entry(1, index).as_ref()]).unwrap();
                    index += 1;
                }
                index - 1
            })
        })
        .collect();
    let closed_root = root.path().join("closed");
    for round in 0..CLOSED {
        let dir = closed_root.join(format!("tablet-{round}"));
        let log = Log::open(&dir, "t", options.clone()).unwrap();
        // Queued, not waited for: close writes them; every other log a drop closes.
        for index in 1..=30 {
            log.append(&[entry(1, index).as_ref()]).unwrap();
        }
        let started = Instant::now();
        if round % 2 == 0 {
            log.close().unwrap();
            assert_eq!(log.durable_index(), 30);
        } else {
            drop(log);
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "close took {:?}",
            started.elapsed()
        );
        let reopened = Log::open(&dir, "t", options.clone()).unwrap();
        assert_eq!(read_all(&reopened).len(), 30, "round {round}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for (log, writer) in busy.iter().zip(writers) {
        let written = writer.join().unwrap();
        assert!(written > 0);
        assert_eq!(log.durable_index(), written);
        log.close().unwrap();
    }
}

/// A log that is written fills its first segment in steps of preallocation, and rolls over
/// to full-size segments prepared ahead, like any log; what it wrote survives a reopen.
#[test]
fn a_written_log_grows_its_first_segment_and_rolls_over_to_full_ones() {
    let _serial = serial();
    let dir = scratch_dir();
    let options = LogOptions {
        segment_size_bytes: 1 << 20,
        initial_preallocation_bytes: 64 << 10,
        ..server_options()
    };
    let log = Log::open(dir.path(), "t", options.clone()).unwrap();
    let first = log.segment_paths()[0].clone();
    // `fallocate` extends the file: its length is what is preallocated.
    let allocated = |path: &Path| std::fs::metadata(path).unwrap().len();
    assert_eq!(
        allocated(&first),
        64 << 10,
        "idle: the initial preallocation"
    );
    let payload = vec![5u8; 1000];
    let write = |from: u64, to: u64| {
        for index in from..=to {
            let e = nyala_wal::EntryRef::new(1, index, nyala_wal::EntryType::Write, &payload);
            log.append_durable(&[e]).unwrap();
        }
    };
    // About 40 KiB: past half of 64 KiB, so the segment is preallocated to twice that.
    write(1, 40);
    assert!(allocated(&first) >= 128 << 10, "{}", allocated(&first));
    assert!(allocated(&first) < 1 << 20);
    // About 1.2 MiB: the first segment filled up (to its full size) and rolled over.
    write(41, 1200);
    let paths = log.segment_paths();
    assert!(paths.len() >= 2, "{paths:?}");
    log.close().unwrap();
    let reopened = Log::open(dir.path(), "t", options).unwrap();
    assert_eq!(read_all(&reopened).len(), 1200);
}

/// Pool workers idle for `thread_idle_exit_ms` stop, so an idle process keeps no WAL
/// thread; the next append starts one again.
#[test]
fn idle_pool_workers_stop_and_the_pools_regrow_on_demand() {
    let _serial = serial();
    let defaults = thread_pool_options();
    let invalid = nyala_wal::ThreadPoolOptions {
        commit_threads_max: 0,
        ..defaults
    };
    let err = nyala_wal::configure_thread_pools(invalid).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    nyala_wal::configure_thread_pools(nyala_wal::ThreadPoolOptions {
        thread_idle_exit_ms: 20,
        ..defaults
    })
    .unwrap();
    let dir = scratch_dir();
    let options = LogOptions {
        segment_size_bytes: 16 << 10,
        ..server_options()
    };
    let log = Log::open(dir.path(), "t", options).unwrap();
    let idle = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stats = thread_pool_stats();
            if stats.commit.threads == 0 && stats.background.threads == 0 {
                return;
            }
            assert!(Instant::now() < deadline, "{stats:?}");
            thread::sleep(Duration::from_millis(5));
        }
    };
    for round in 0..3u64 {
        // Enough to roll over, so background work runs too.
        for index in round * 100 + 1..=(round + 1) * 100 {
            log.append_durable(&[entry(1, index).as_ref()]).unwrap();
        }
        idle();
    }
    assert_eq!(read_all(&log).len(), 300);
    log.close().unwrap();
    nyala_wal::configure_thread_pools(defaults).unwrap();
}

/// Descriptors this process holds open on files under `root`.
fn descriptors_under(root: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(root))
        .count()
}

/// Releases `log`'s files once it is idle. Durability reaches a writer before the committer
/// gives back its slot and before the background finishes preparing the next segment, so a
/// log that was just written becomes idle shortly after its last append returns.
fn release_once_idle(log: &Log) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !log.release_files() {
        assert!(
            std::time::Instant::now() < deadline,
            "an idle log never released its files"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

/// Idle logs close their segment files (`Log::release_files`), and every use opens what it
/// needs again: reads, appends, a copy image that GC runs under, and reopening the log.
#[test]
fn idle_logs_release_their_files_and_open_them_again_on_use() {
    let _serial = serial();
    let root = scratch_dir();
    // Small segments: each log has several, closed ones and a prepared one among them.
    let options = LogOptions {
        segment_size_bytes: 16 << 10,
        ..server_options()
    };
    let logs = open_logs(root.path(), 40, &options);
    let mut written: Vec<Vec<nyala_wal::Entry>> = Vec::new();
    for log in &logs {
        // Batches of ten entries (about 1.5 KiB): a dozen per segment.
        let batches = (0..30).flat_map(|b| common::append_range(log, 1, 10 * b + 1, 10 * b + 10));
        written.push(batches.collect());
    }
    let open_before = descriptors_under(root.path());
    assert!(open_before >= 2 * logs.len(), "{open_before} descriptors");
    for log in &logs {
        release_once_idle(log);
    }
    assert_eq!(descriptors_under(root.path()), 0);
    assert!(logs[0].release_files(), "releasing again is harmless");

    // A read opens the segments it reads.
    for (log, expected) in logs.iter().zip(&written) {
        assert_eq!(&read_all(log), expected);
    }
    assert!(descriptors_under(root.path()) > 0);
    for log in &logs {
        release_once_idle(log);
    }
    // A copy image taken now holds its files: GC of those segments meanwhile (an anchor
    // moved past them) deletes them, and the image still reads every byte.
    let image = logs[1].copy_image().unwrap();
    let lengths: Vec<u64> = image.iter().map(|s| s.length()).collect();
    let report = logs[1].gc().unwrap();
    assert!(report.segments_deleted + report.segments_recycled > 0);
    for (segment, length) in image.iter().zip(lengths) {
        let mut buf = vec![0u8; length as usize];
        segment.read_at(0, &mut buf).unwrap();
        assert_eq!(buf[..8], nyala_wal::format::SEGMENT_MAGIC);
    }
    drop(image);
    // Appends write and sync through reopened files; nothing is lost across a reopen.
    for (log, expected) in logs.iter().zip(written.iter_mut()) {
        release_once_idle(log);
        for b in 30..40 {
            expected.extend(common::append_range(log, 2, 10 * b + 1, 10 * b + 10));
        }
    }
    assert!(descriptors_under(root.path()) > 0);
    for (i, (log, expected)) in logs.iter().zip(&written).enumerate() {
        release_once_idle(log);
        log.close().unwrap();
        let dir = root.path().join(format!("tablet-{i}"));
        let reopened = Log::open(&dir, &format!("tablet-{i}"), options.clone()).unwrap();
        let first = reopened.first_index();
        let kept: Vec<_> = expected
            .iter()
            .filter(|e| e.index >= first)
            .cloned()
            .collect();
        assert_eq!(read_all(&reopened), kept);
        assert_eq!(reopened.last_op_id().index, 400);
    }
}

/// A log that is being written is not idle: `release_files` says so while work is queued or
/// running, and closing files between groups loses no append.
#[test]
fn releasing_files_while_a_writer_runs_loses_nothing() {
    let _serial = serial();
    let root = scratch_dir();
    let options = LogOptions {
        segment_size_bytes: 32 << 10,
        ..server_options()
    };
    let log = Arc::new(Log::open(root.path(), "t", options.clone()).unwrap());
    let writer = {
        let log = Arc::clone(&log);
        thread::spawn(move || {
            let mut written = Vec::new();
            for i in 1..=2_000u64 {
                let e = entry(1, i);
                if i % 4 == 0 {
                    log.append_durable(&[e.as_ref()]).unwrap();
                } else {
                    log.append(&[e.as_ref()]).unwrap();
                }
                written.push(e);
            }
            written // the last append (2,000) waited for everything before it
        })
    };
    let (mut released, mut refused) = (0u32, 0u32);
    while !writer.is_finished() {
        if log.release_files() {
            released += 1;
        } else {
            refused += 1;
        }
        thread::sleep(Duration::from_micros(200));
    }
    let written = writer.join().unwrap();
    assert!(
        refused > 0,
        "a busy log refused to release ({released} released)"
    );
    release_once_idle(&log);
    common::assert_holds_across_reopen(&log, root.path(), options, &written);
}

/// Logs given one `Notifier` signal it under their tokens: the watcher learns which logs'
/// durable points moved from one descriptor, each token once per drain, and a log that
/// signals again after its watcher drained it is queued again.
#[test]
fn logs_sharing_a_notifier_signal_under_their_tokens() {
    let _serial = serial();
    let root = scratch_dir();
    let notifier = nyala_wal::Notifier::new().unwrap();
    let logs: Vec<Log> = (0..20u64)
        .map(|i| {
            let options = LogOptions {
                notifier: Some((Arc::clone(&notifier), 100 + i)),
                ..server_options()
            };
            Log::open(root.path().join(format!("t{i}")), "t", options).unwrap()
        })
        .collect();
    assert!(logs.iter().all(|l| l.notification_fd() == notifier.fd()));
    assert!(notifier.take_ready().is_empty());
    // Durability is published to waiters before the notifier hears of it: wait for the
    // descriptor, up to ten seconds.
    let readable = || {
        let mut poll = libc::pollfd {
            fd: notifier.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut poll, 1, 10_000) == 1 }
    };
    // Two appends to each of the even logs; none to the odd ones.
    for (i, log) in logs.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
        common::append_range(log, 1, 1, 1);
        common::append_range(log, 1, 2, 2);
        assert_eq!(log.durable_index(), 2, "log {i}");
    }
    let expected: Vec<u64> = (0..20u64).filter(|i| i % 2 == 0).map(|i| 100 + i).collect();
    let mut tokens = Vec::new();
    while tokens.len() < expected.len() {
        assert!(readable(), "tokens so far: {tokens:?}");
        tokens.extend(notifier.take_ready());
    }
    tokens.sort_unstable();
    assert_eq!(tokens, expected, "each signalling log once");
    // Not drained: a log's later signals do not queue its token again...
    common::append_range(&logs[0], 1, 3, 3);
    assert!(notifier.take_ready().is_empty());
    // ...until its watcher drained it.
    logs[0].drain_notifications();
    logs[2].drain_notifications();
    common::append_range(&logs[0], 1, 4, 4);
    let mut tokens = Vec::new();
    while tokens.is_empty() {
        assert!(readable());
        tokens = notifier.take_ready();
    }
    assert_eq!(tokens, vec![100]);
}
