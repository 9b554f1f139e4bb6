//! Group commit and roll-over under concurrent appenders.

mod common;

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    append_as_shared, assert_holds_across_reopen, entry, read_all, scratch_dir, small_options,
};
use nyala_common::{Classify, ErrorKind};
use nyala_wal::{AppendTicket, FaultInjection, Log, LogOptions};

/// `writers` threads each append `appends` single entries and wait for each to be durable.
/// Like a Raft leader: indexes are assigned under a lock, durability is awaited outside it.
fn append_concurrently(log: &Arc<Log>, writers: usize, appends: u64) {
    append_concurrently_from(log, writers, appends, 1);
}

#[test]
fn concurrent_appenders_roll_over_and_group_commit() {
    let dir = scratch_dir();
    let options = small_options(16 << 10);
    let log = Arc::new(Log::open(dir.path(), "t", options.clone()).unwrap());
    append_concurrently(&log, 8, 150);
    let metrics = log.metrics();
    assert_eq!(log.durable_index(), 1200);
    assert_eq!(metrics.entries_appended, 1200);
    assert!(metrics.segments_created >= 5, "{metrics:?}");
    assert!(
        metrics.syncs < 1200,
        "some groups held more than one append: {metrics:?}"
    );
    let expected: Vec<_> = (1..=1200).map(|i| entry(1, i)).collect();
    assert_holds_across_reopen(&log, dir.path(), options, &expected);
}

/// 64 appenders over many roll-overs: nothing lost or reordered, and every group, roll-over
/// or not, costs exactly one sync (a small group that does not fit the active segment moves
/// to the next one whole instead of being split across two segments and two syncs).
#[test]
fn sixty_four_appenders_across_roll_overs_one_sync_per_group() {
    const WRITERS: usize = 64;
    const APPENDS_PER_WRITER: u64 = 100;
    let dir = scratch_dir();
    // A group holds at most one 355-byte frame per writer (22.7 KB), under a quarter of the
    // segment, so no group is large enough to be split.
    let options = small_options(128 << 10);
    let log = Arc::new(Log::open(dir.path(), "t", options.clone()).unwrap());
    append_concurrently(&log, WRITERS, APPENDS_PER_WRITER);
    let total = WRITERS as u64 * APPENDS_PER_WRITER;
    let metrics = log.metrics();
    assert_eq!(log.durable_index(), total);
    assert_eq!(metrics.entries_appended, total);
    assert!(
        metrics.segments_created + metrics.segments_recycled >= 8,
        "{metrics:?}"
    );
    assert_eq!(metrics.syncs, metrics.groups, "{metrics:?}");
    let expected: Vec<_> = (1..=total).map(|i| entry(1, i)).collect();
    assert_holds_across_reopen(&log, dir.path(), options, &expected);
}

/// Options whose faults the test controls, with `syncs_in_flight_max` syncs allowed at once.
fn pipelined(
    segment_size_bytes: u64,
    syncs_in_flight_max: usize,
) -> (LogOptions, Arc<FaultInjection>) {
    let faults = Arc::new(FaultInjection::default());
    let options = LogOptions {
        syncs_in_flight_max,
        fault_injection: Some(Arc::clone(&faults)),
        ..small_options(segment_size_bytes)
    };
    (options, faults)
}

/// Appends from several threads while every sync is slowed, until the log runs a second
/// committer (it starts one only once appends find the first busy).
fn start_second_committer(log: &Arc<Log>, faults: &FaultInjection) {
    faults.delay_next_syncs(u32::MAX, Duration::from_millis(1));
    for _ in 0..50 {
        if log.metrics().sync_threads >= 2 {
            break;
        }
        let next = log.last_op_id().index + 1;
        append_concurrently_from(log, 4, 5, next);
    }
    faults.delay_next_syncs(0, Duration::ZERO);
    assert!(log.metrics().sync_threads >= 2, "{:?}", log.metrics());
}

/// `append_concurrently`, continuing the log at `first`.
fn append_concurrently_from(log: &Arc<Log>, writers: usize, appends: u64, first: u64) {
    let next_index = Arc::new(Mutex::new(first));
    let threads: Vec<_> = (0..writers)
        .map(|_| {
            let log = Arc::clone(log);
            let next_index = Arc::clone(&next_index);
            thread::spawn(move || {
                for _ in 0..appends {
                    let ticket = {
                        let mut next = next_index.lock().unwrap();
                        let ticket = log.append(&[entry(1, *next).as_ref()]).unwrap();
                        *next += 1;
                        ticket
                    };
                    log.wait(ticket.ticket).unwrap();
                    assert!(log.durable_index() >= ticket.last_index);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// `writers` threads run `body(writer, log, expected)`, where `expected` is the list of
/// entries the log must hold, by index, that each writer extends (or truncates) under its
/// lock as it appends; returns that list once every writer has finished.
fn run_writers_tracking_expected(
    log: &Arc<Log>,
    writers: usize,
    body: impl Fn(usize, &Log, &Mutex<Vec<nyala_wal::Entry>>) + Send + Sync + 'static,
) -> Vec<nyala_wal::Entry> {
    let expected = Arc::new(Mutex::new(Vec::new()));
    let body = Arc::new(body);
    let threads: Vec<_> = (0..writers)
        .map(|writer| {
            let log = Arc::clone(log);
            let expected = Arc::clone(&expected);
            let body = Arc::clone(&body);
            thread::spawn(move || body(writer, &log, &expected))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let expected = expected.lock().unwrap().clone();
    expected
}

/// A WRITE entry of term 1.
fn write_entry(index: u64, payload: Vec<u8>) -> nyala_wal::Entry {
    nyala_wal::Entry {
        term: 1,
        index,
        entry_type: nyala_wal::EntryType::Write,
        payload,
    }
}

/// Polls `condition` for up to five seconds.
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

/// Appends one entry without waiting and returns once it is written (not yet durable).
fn append_written(log: &Log, index: u64) -> AppendTicket {
    let ticket = log.append(&[entry(1, index).as_ref()]).unwrap();
    eventually("the entry to be written", || {
        log.read(index, index, usize::MAX)
            .is_ok_and(|e| e.len() == 1)
    });
    ticket
}

#[test]
fn a_later_group_synced_first_waits_for_the_earlier_one() {
    let dir = scratch_dir();
    let (options, faults) = pipelined(64 << 10, 2);
    let log = Arc::new(Log::open(dir.path(), "t", options).unwrap());
    start_second_committer(&log, &faults);
    let before = log.durable_index();
    faults.delay_next_syncs(1, Duration::from_millis(1000));
    let slow = append_written(&log, before + 1);
    let synced = log.metrics().syncs;
    let fast = log.append(&[entry(1, before + 2).as_ref()]).unwrap();
    eventually("the later group's sync", || log.metrics().syncs > synced);
    // Its sync returned, but the earlier group's has not: nothing of either is durable.
    assert_eq!(log.durable_index(), before);
    assert!(log.durable_ticket() < slow.ticket);
    assert!(!log.wait_timeout(fast.ticket, Duration::ZERO).unwrap());
    log.wait(fast.ticket).unwrap();
    assert_eq!(log.durable_index(), before + 2);
    let metrics = log.metrics();
    assert!(metrics.syncs_overlapped >= 1, "{metrics:?}");
    assert_eq!(metrics.syncs, metrics.groups, "{metrics:?}");
}

#[test]
fn a_failed_sync_publishes_nothing_at_or_after_it_while_a_later_sync_succeeds() {
    let dir = scratch_dir();
    let (options, faults) = pipelined(64 << 10, 2);
    let log = Arc::new(Log::open(dir.path(), "t", options.clone()).unwrap());
    start_second_committer(&log, &faults);
    let acked = log.durable_index();
    faults.delay_next_syncs(1, Duration::from_millis(1000));
    faults.fail_next_syncs(1, libc::EIO);
    let failing = append_written(&log, acked + 1);
    let synced = log.metrics().syncs;
    let later = log.append(&[entry(1, acked + 2).as_ref()]).unwrap();
    eventually("the later group's sync", || log.metrics().syncs > synced);
    assert_eq!(log.durable_index(), acked);
    let err = log.wait(later.ticket).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(log.wait(failing.ticket).is_err());
    // The later group's sync succeeded, yet neither group was ever reported durable.
    assert_eq!(log.durable_index(), acked);
    assert!(log.durable_ticket() < failing.ticket);
    assert!(log.close().is_err());
    drop(log);
    let reopened = Log::open(dir.path(), "t", options).unwrap();
    let entries = read_all(&reopened);
    let expected: Vec<_> = (1..=acked).map(|i| entry(1, i)).collect();
    assert_eq!(
        entries[..acked as usize],
        expected[..],
        "acknowledged prefix kept"
    );
}

#[test]
fn a_truncation_behind_a_slow_group_never_shows_the_truncated_index_durable() {
    let dir = scratch_dir();
    let (options, faults) = pipelined(64 << 10, 2);
    let log = Arc::new(Log::open(dir.path(), "t", options).unwrap());
    start_second_committer(&log, &faults);
    let base = log.durable_index();
    // Group 1 (entries base+1..=base+10) syncs slowly; group 2 (truncate to base+5, append
    // base+6 in term 2) syncs even more slowly, so group 1 publishes alone.
    faults.delay_next_syncs(1, Duration::from_millis(300));
    let entries: Vec<_> = (base + 1..=base + 10).map(|i| entry(1, i)).collect();
    let refs: Vec<_> = entries.iter().map(|e| e.as_ref()).collect();
    let first = log.append(&refs).unwrap();
    eventually("group 1's delayed sync to start", || {
        faults.sync_delays_pending() == 0
    });
    faults.delay_next_syncs(1, Duration::from_millis(1500));
    let replacement = entry(2, base + 6);
    let second = log
        .truncate_and_append(base + 5, &[replacement.as_ref()])
        .unwrap();
    log.wait(first.ticket).unwrap();
    assert!(
        log.durable_ticket() < second.ticket,
        "group 2 still syncing"
    );
    assert_eq!(
        log.durable_index(),
        base + 5,
        "the truncated suffix is not durable"
    );
    log.wait(second.ticket).unwrap();
    assert_eq!(log.durable_index(), base + 6);
    assert_eq!(log.term_at(base + 6), Some(2));
}

#[test]
fn close_waits_for_syncs_in_flight() {
    let dir = scratch_dir();
    let (options, faults) = pipelined(64 << 10, 2);
    let log = Log::open(dir.path(), "t", options.clone()).unwrap();
    faults.delay_next_syncs(1, Duration::from_millis(300));
    let ticket = append_written(&log, 1);
    assert_eq!(log.durable_index(), 0);
    log.close().unwrap();
    assert_eq!(log.durable_index(), 1, "published before close returned");
    assert!(log.durable_ticket() >= ticket.ticket);
    drop(log);
    let reopened = Log::open(dir.path(), "t", options).unwrap();
    assert_eq!(read_all(&reopened), vec![entry(1, 1)]);
}

/// Many appenders over many roll-overs with up to three syncs in flight on a slow disk:
/// every entry durable once, in order, one sync per group, across reopen.
#[test]
fn pipelined_appenders_across_roll_overs() {
    const WRITERS: usize = 16;
    const APPENDS_PER_WRITER: u64 = 60;
    let dir = scratch_dir();
    let (options, faults) = pipelined(16 << 10, 3);
    let log = Arc::new(Log::open(dir.path(), "t", options.clone()).unwrap());
    faults.delay_next_syncs(u32::MAX, Duration::from_millis(1));
    append_concurrently(&log, WRITERS, APPENDS_PER_WRITER);
    let total = WRITERS as u64 * APPENDS_PER_WRITER;
    let metrics = log.metrics();
    assert_eq!(log.durable_index(), total);
    assert_eq!(metrics.entries_appended, total);
    assert!(metrics.sync_threads >= 2, "{metrics:?}");
    assert!(metrics.syncs_overlapped > 0, "{metrics:?}");
    assert_eq!(metrics.syncs, metrics.groups, "{metrics:?}");
    assert!(
        metrics.segments_created + metrics.segments_recycled >= 5,
        "{metrics:?}"
    );
    let expected: Vec<_> = (1..=total).map(|i| entry(1, i)).collect();
    assert_holds_across_reopen(&log, dir.path(), options, &expected);
}

#[test]
fn one_writer_keeps_one_committer() {
    let dir = scratch_dir();
    let (options, faults) = pipelined(64 << 10, 2);
    let log = Log::open(dir.path(), "t", options).unwrap();
    faults.delay_next_syncs(u32::MAX, Duration::from_millis(1));
    for i in 1..=20 {
        log.append_durable(&[entry(1, i).as_ref()]).unwrap();
    }
    let metrics = log.metrics();
    assert_eq!(metrics.sync_threads, 1, "{metrics:?}");
    assert_eq!(metrics.syncs_overlapped, 0, "{metrics:?}");
}

#[test]
fn syncs_in_flight_max_is_validated() {
    let dir = scratch_dir();
    for bad in [0, nyala_wal::SYNCS_IN_FLIGHT_LIMIT + 1] {
        let options = LogOptions {
            syncs_in_flight_max: bad,
            ..small_options(64 << 10)
        };
        let err = Log::open(dir.path(), "t", options).err().expect("refused");
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
}

#[test]
fn sync_none_keeps_one_committer_whatever_the_setting() {
    let dir = scratch_dir();
    let options = LogOptions {
        sync_policy: nyala_wal::SyncPolicy::None,
        syncs_in_flight_max: 3,
        ..small_options(16 << 10)
    };
    let log = Arc::new(Log::open(dir.path(), "t", options).unwrap());
    append_concurrently(&log, 8, 50);
    let metrics = log.metrics();
    assert_eq!(log.durable_index(), 400);
    assert_eq!((metrics.sync_threads, metrics.syncs), (1, 0), "{metrics:?}");
    let expected: Vec<_> = (1..=400).map(|i| entry(1, i)).collect();
    assert_eq!(read_all(&log), expected);
}

/// Small appends are framed into the queue's arena, larger ones into buffers of their own,
/// shared ones stay in the caller's storage; one group mixes all three (and truncations),
/// with a queue small enough that appenders may block on back-pressure (`back_pressure_*`
/// in log_test.rs makes sure they do). Everything comes back in order, before and after
/// reopening, and no appender is left waiting.
#[test]
fn small_large_and_shared_appends_mix_in_groups_under_back_pressure() {
    const WRITERS: usize = 6;
    const APPENDS_PER_WRITER: u64 = 60;
    let dir = scratch_dir();
    let options = LogOptions {
        queue_bytes_max: 16 << 10,
        ..small_options(256 << 10)
    };
    let log = Arc::new(Log::open(dir.path(), "t", options.clone()).unwrap());
    // A truncation replaces a suffix of the entries the log must hold.
    let expected = run_writers_tracking_expected(&log, WRITERS, |writer, log, expected| {
        for round in 0..APPENDS_PER_WRITER {
            let ticket = {
                let mut expected = expected.lock().unwrap();
                let next = expected.len() as u64 + 1;
                // Above the arena limit (4 KiB framed) every few appends.
                let len = if (round + writer as u64).is_multiple_of(5) {
                    6000
                } else {
                    (round * 13 % 200) as usize
                };
                let e = write_entry(next, vec![(next % 251) as u8; len]);
                let ticket = match round % 7 {
                    3 => append_as_shared(log, &e),
                    5 if next > 2 => {
                        // A follower replacing its last entry.
                        expected.pop();
                        let e = nyala_wal::Entry {
                            index: next - 1,
                            ..e.clone()
                        };
                        let ticket = log.truncate_and_append(next - 2, &[e.as_ref()]);
                        expected.push(e);
                        let ticket = ticket.unwrap();
                        drop(expected);
                        log.wait(ticket.ticket).unwrap();
                        continue;
                    }
                    _ => log.append(&[e.as_ref()]).unwrap(),
                };
                expected.push(e);
                ticket
            };
            log.wait(ticket.ticket).unwrap();
        }
    });
    let metrics = log.metrics();
    assert!(metrics.truncations > 0, "{metrics:?}");
    assert!(
        metrics.groups < metrics.batches_appended,
        "some groups held several appends: {metrics:?}"
    );
    assert_eq!(log.durable_index(), expected.len() as u64);
    assert_holds_across_reopen(&log, dir.path(), options, &expected);
}

/// Payloads of 64 KiB and more are written from their own buffers (or the caller's shared
/// storage) within the group's write, between frames copied into the group's buffer: odd
/// sizes put every payload and frame at a different place in its pages, groups hold
/// several of them, and segments roll over between and within groups. Everything reads
/// back in order before and after reopening, and the partial page each group leaves is
/// carried into the next.
#[test]
fn large_payloads_written_from_their_own_buffers_among_small_ones() {
    const WRITERS: usize = 4;
    const APPENDS_PER_WRITER: u64 = 40;
    let dir = scratch_dir();
    let options = small_options(1 << 20);
    let log = Arc::new(Log::open(dir.path(), "t", options.clone()).unwrap());
    let expected = run_writers_tracking_expected(&log, WRITERS, |writer, log, expected| {
        let mut tickets = Vec::new();
        for round in 0..APPENDS_PER_WRITER {
            let mut expected = expected.lock().unwrap();
            let next = expected.len() as u64 + 1;
            let len = match (round + writer as u64) % 4 {
                0 => (64 << 10) - 24 + (next * 7 % 5) as usize,
                1 => (100 << 10) + (next * 131 % 4096) as usize,
                2 => (next * 13 % 300) as usize,
                _ => 5000 + next as usize,
            };
            let e = write_entry(
                next,
                (0..len).map(|i| (i as u64 * 7 + next) as u8).collect(),
            );
            let ticket = if round % 3 == 1 {
                append_as_shared(log, &e)
            } else {
                log.append(&[e.as_ref()]).unwrap()
            };
            expected.push(e);
            drop(expected);
            // Wait only now and then, so groups gather several appends.
            tickets.push(ticket.ticket);
            if round % 5 == 4 {
                log.wait(*tickets.last().unwrap()).unwrap();
            }
        }
        for ticket in tickets {
            log.wait(ticket).unwrap();
        }
    });
    let metrics = log.metrics();
    assert!(
        metrics.groups < metrics.batches_appended,
        "some groups held several appends: {metrics:?}"
    );
    assert!(log.segment_paths().len() > 3, "roll-overs happened");
    assert_eq!(log.durable_index(), expected.len() as u64);
    assert_holds_across_reopen(&log, dir.path(), options, &expected);
}

/// Threads parked on different tickets: a durable change wakes the ones it completes, a
/// timeout returns `false` while the ticket is pending, and a failed sync wakes every one
/// with the error, whatever ticket it waits for.
#[test]
fn parked_waiters_wake_for_their_own_tickets_and_all_on_failure() {
    const TEN_SECONDS: Duration = Duration::from_secs(10);
    let dir = scratch_dir();
    let (options, faults) = pipelined(64 << 10, 1);
    let log = Arc::new(Log::open(dir.path(), "t", options).unwrap());
    // Group 1 (index 1) syncs slowly; indexes 2..=4 queue behind it as group 2.
    faults.delay_next_syncs(1, Duration::from_millis(300));
    let first = append_written(&log, 1);
    let queued: Vec<_> = (2..=4)
        .map(|i| log.append(&[entry(1, i).as_ref()]).unwrap())
        .collect();
    let first_waiter = {
        let log = Arc::clone(&log);
        thread::spawn(move || log.wait_timeout(first.ticket, TEN_SECONDS))
    };
    assert!(!log
        .wait_timeout(queued[2].ticket, Duration::from_millis(50))
        .unwrap());
    assert!(first_waiter.join().unwrap().unwrap());
    for ticket in &queued {
        log.wait(ticket.ticket).unwrap();
    }
    assert_eq!(log.durable_index(), 4);

    // The next sync waits, then fails: eight threads parked on five different tickets.
    faults.delay_next_syncs(1, Duration::from_millis(300));
    faults.fail_next_syncs(1, libc::EIO);
    let failing = append_written(&log, 5);
    let pending: Vec<_> = (6..=9)
        .map(|i| log.append(&[entry(1, i).as_ref()]).unwrap())
        .collect();
    let tickets: Vec<_> = std::iter::once(failing.ticket)
        .chain(pending.iter().map(|t| t.ticket))
        .cycle()
        .take(8)
        .collect();
    let waiters: Vec<_> = tickets
        .into_iter()
        .map(|ticket| {
            let log = Arc::clone(&log);
            thread::spawn(move || log.wait_timeout(ticket, TEN_SECONDS))
        })
        .collect();
    // A waiter the failure did not wake would time out with Ok(false).
    for waiter in waiters {
        let err = waiter.join().unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    }
    assert_eq!(log.durable_index(), 4);
}

/// What `after_durable` reports, and on which thread, sent back over a channel.
fn after_durable_probe(log: &Log) -> std::sync::mpsc::Receiver<(bool, std::thread::ThreadId)> {
    let (tx, rx) = std::sync::mpsc::channel();
    log.after_durable(Box::new(move |durable| {
        tx.send((durable, std::thread::current().id())).unwrap();
    }));
    rx
}

#[test]
fn after_durable_runs_on_the_committer_once_the_sync_returned() {
    let dir = scratch_dir();
    let (options, faults) = pipelined(64 << 10, 1);
    let log = Log::open(dir.path(), "t", options).unwrap();
    // Nothing queued: everything is durable, so it runs at once, on this thread.
    let (durable, thread) = after_durable_probe(&log).try_recv().unwrap();
    assert!(durable);
    assert_eq!(thread, std::thread::current().id());

    faults.delay_next_syncs(1, Duration::from_millis(300));
    let first = log.append(&[entry(1, 1).as_ref()]).unwrap();
    let probe = after_durable_probe(&log);
    // Not before the sync returned; then on the committer, with the append durable.
    assert!(probe.recv_timeout(Duration::from_millis(100)).is_err());
    let (durable, thread) = probe.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(durable);
    assert_ne!(thread, std::thread::current().id());
    assert!(log.durable_ticket() >= first.ticket);
    assert_eq!(log.durable_index(), 1);
}

#[test]
fn after_durable_learns_of_a_failed_sync() {
    let dir = scratch_dir();
    let (options, faults) = pipelined(64 << 10, 1);
    let log = Log::open(dir.path(), "t", options).unwrap();
    faults.delay_next_syncs(1, Duration::from_millis(200));
    faults.fail_next_syncs(1, libc::EIO);
    log.append(&[entry(1, 1).as_ref()]).unwrap();
    let probe = after_durable_probe(&log);
    let (durable, _) = probe.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(!durable);
    // Once failed, at once.
    let (durable, _) = after_durable_probe(&log).try_recv().unwrap();
    assert!(!durable);
    assert!(log.close().is_err());
}
