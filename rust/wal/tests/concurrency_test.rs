//! Group commit and roll-over under concurrent appenders.

mod common;

use std::sync::{Arc, Mutex};
use std::thread;

use common::{entry, read_all, scratch_dir, small_options};
use nyala_wal::Log;

/// `writers` threads each append `appends` single entries and wait for each to be durable.
/// Like a Raft leader: indexes are assigned under a lock, durability is awaited outside it.
fn append_concurrently(log: &Arc<Log>, writers: usize, appends: u64) {
    let next_index = Arc::new(Mutex::new(1u64));
    let threads: Vec<_> = (0..writers)
        .map(|_| {
            let log = Arc::clone(log);
            let next_index = Arc::clone(&next_index);
            thread::spawn(move || {
                for _ in 0..appends {
                    let ticket = {
                        let mut next = next_index.lock().unwrap();
                        let e = entry(1, *next);
                        let ticket = log.append(&[e.as_ref()]).unwrap();
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
    assert_eq!(read_all(&log), expected);
    log.close().unwrap();
    let reopened = Log::open(dir.path(), "t", options).unwrap();
    assert_eq!(read_all(&reopened), expected);
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
    assert_eq!(read_all(&log), expected);
    log.close().unwrap();
    let reopened = Log::open(dir.path(), "t", options).unwrap();
    assert_eq!(read_all(&reopened), expected);
}
