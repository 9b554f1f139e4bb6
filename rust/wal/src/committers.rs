//! Group commit: the committer threads.
//!
//! A committer takes the *write turn* (one holder at a time, so the order on disk is the
//! ticket order), drains everything queued, has the `Appender` frame it behind the
//! segment's partial last page, write the whole pages in one `pwrite` and register the group
//! in the *pipeline*, and gives the turn up. Only then does it call `fdatasync` for its
//! group, so the next committer writes the next group while this one's sync runs: up to
//! `LogOptions::syncs_in_flight_max` syncs overlap, which a disk that serves concurrent
//! flushes turns into more groups per second (docs/wal-format.md, "Group commit").
//!
//! Durability is published strictly in group order (see `pipeline`). A sync that fails
//! stops publication for good (no later group is ever reported durable) and fails the log.
//! Each committer syncs through its own open file description of the segment: Linux reports
//! a writeback error once per description, so with one shared description a concurrent sync
//! could consume the error of an earlier group's pages and let that group's sync return
//! success.
//!
//! The first committer starts with the log; more start (up to the limit) only when an
//! append found every committer busy, so a quiet tablet keeps one thread. The last
//! committer to stop closes the active segment, after every sync has returned. The turn
//! holder also rolls over to the segment the background thread prepared; committers are
//! the only writers of segment data and of the durable point.
//!
//! This module owns the committer threads, the write turn, the syncs and the staggering of
//! groups; what a group holds and how it is written belong to `appender` and
//! `active_segment`.

use std::collections::VecDeque;
use std::mem;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::active_segment::SyncTarget;
use crate::appender::Appender;
use crate::error::{Result, WalError};
use crate::metrics::Metrics;
use crate::options::SyncPolicy;
use crate::pipeline::{GroupToSync, Pipeline};
use crate::shared::{Request, Shared};

/// Stack of a committer thread: it keeps its buffers on the heap, and a tablet server runs
/// one or more per tablet.
const COMMITTER_STACK_BYTES: usize = 256 << 10;

/// What the write turn guards: the appending state, and how many committers there are.
struct Turn {
    appender: Appender,
    /// Committer threads started, and those not yet stopped.
    spawned: usize,
    running: usize,
}

/// What the committer threads share: the write turn (with the appending state), the
/// pipeline of written groups, and the threads' handles.
pub(crate) struct Committers {
    shared: Arc<Shared>,
    /// The write turn. Its holder alone drains the queue, writes and rolls over.
    turn: Mutex<Turn>,
    pipeline: Arc<Mutex<Pipeline>>,
    /// Signalled (with the pipeline lock) whenever a sync returns.
    sync_returned: Condvar,
    handles: Mutex<Vec<JoinHandle<()>>>,
}

impl Committers {
    /// Starts the first committer.
    pub(crate) fn start(shared: Arc<Shared>, mut appender: Appender) -> Result<Arc<Self>> {
        appender.open_sync_handles()?;
        let pipeline = Arc::clone(appender.pipeline());
        let committers = Arc::new(Committers {
            shared,
            turn: Mutex::new(Turn {
                appender,
                spawned: 1,
                running: 1,
            }),
            pipeline,
            sync_returned: Condvar::new(),
            handles: Mutex::new(Vec::new()),
        });
        let handle = committers.spawn(0)?;
        committers.handles.lock().push(handle);
        Ok(committers)
    }

    /// Waits for every committer to stop (after `closing` was set or the log failed).
    /// Committers that start meanwhile are started by one not yet joined, so this sees them.
    pub(crate) fn join_all(&self) -> std::thread::Result<()> {
        let mut outcome = Ok(());
        loop {
            let Some(handle) = self.handles.lock().pop() else {
                return outcome;
            };
            if let Err(panic) = handle.join() {
                outcome = Err(panic);
            }
        }
    }

    fn spawn(self: &Arc<Self>, slot: usize) -> Result<JoinHandle<()>> {
        let committers = Arc::clone(self);
        Metrics::add(&self.shared.metrics.sync_threads, 1);
        std::thread::Builder::new()
            .name(format!("wal-commit-{slot}"))
            .stack_size(COMMITTER_STACK_BYTES)
            .spawn(move || committers.run(slot))
            .map_err(|e| WalError::io("spawn committer thread", "", e))
    }

    /// Starts one more committer if appends found every committer busy and the limit
    /// allows (called by the turn holder).
    fn maybe_grow(self: &Arc<Self>, turn: &mut Turn) {
        let options = &self.shared.options;
        if options.sync_policy != SyncPolicy::Group || turn.spawned >= options.syncs_in_flight_max {
            return;
        }
        // Without a thread the log keeps working with those it has.
        if let Ok(handle) = self.spawn(turn.spawned) {
            turn.spawned += 1;
            turn.running += 1;
            self.handles.lock().push(handle);
        }
    }

    fn run(self: Arc<Self>, slot: usize) {
        let shared = &self.shared;
        let mut requests = VecDeque::new();
        // The queue arena this committer took last (emptied), swapped in at the next drain.
        let mut arena = Vec::new();
        loop {
            let mut turn = self.turn.lock();
            // Held back before looking at the queue, without the idle flag: appends that
            // arrive meanwhile queue up and wake nobody (no system call on their path).
            self.stagger();
            let Some(contended) = self.take_queued(&mut requests, &mut arena) else {
                break;
            };
            let committed = turn.appender.commit(&mut requests, &arena, slot);
            arena.clear();
            let group = match committed {
                Ok(group) => group,
                Err(err) => {
                    self.pipeline.lock().stop();
                    shared.fail(&err);
                    break;
                }
            };
            if contended {
                self.maybe_grow(&mut turn);
            }
            drop(turn);
            if let Some(group) = group {
                if let Err(err) = self.sync_and_publish(&group) {
                    shared.fail(&err);
                    break;
                }
            }
        }
        let mut turn = self.turn.lock();
        turn.running -= 1;
        if turn.running == 0 {
            turn.appender.finish();
        }
    }

    /// Waits (the caller holds the turn) until requests are queued and takes them all, with
    /// the queue's arena (swapping in `arena`, emptied). Returns whether appends found every
    /// committer busy meanwhile, or `None` when this committer is to stop: the log is closing
    /// with nothing queued, or it failed.
    fn take_queued(&self, requests: &mut VecDeque<Request>, arena: &mut Vec<u8>) -> Option<bool> {
        let shared = &self.shared;
        let mut queue = shared.lock_queue();
        let mut waited = false;
        while queue.requests.is_empty() && !queue.closing && !shared.has_failed() {
            // Set under the lock before sleeping, so an append either sees it and
            // signals, or queued its request before this check saw the queue empty.
            queue.appender_idle = true;
            waited = true;
            queue = shared
                .work_ready
                .wait(queue)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        queue.appender_idle = false;
        if queue.requests.is_empty() || shared.has_failed() {
            return None;
        }
        if waited && !queue.closing {
            // Woken by the first append: let the group gather while a sync runs.
            drop(queue);
            self.stagger();
            queue = shared.lock_queue();
            if shared.has_failed() {
                return None;
            }
        }
        mem::swap(requests, &mut queue.requests);
        mem::swap(arena, &mut queue.arena);
        Some(mem::take(&mut queue.appends_found_busy) && !queue.closing)
    }

    /// Holds the next group back while an earlier group syncs: until 1/`syncs_in_flight_max`
    /// of a sync time after the latest sync started, or until a sync returns. Syncs in
    /// flight then start evenly spaced and each group gathers the appends of one interval.
    /// A free committer that started a group with the first append to arrive would write
    /// groups of one or two entries, each costing a sync and a wake-up of the event loop.
    /// Never longer than without pipelining: a group waited for the sync in flight then.
    fn stagger(&self) {
        if self.shared.syncs_in_flight.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut pipeline = self.pipeline.lock();
        let Some(until) = pipeline.hold_back_until(self.shared.options.syncs_in_flight_max) else {
            return;
        };
        // Checked again under the lock a returning sync takes to lower it.
        if self.shared.syncs_in_flight.load(Ordering::Acquire) == 0 {
            return;
        }
        let returned = pipeline.syncs_returned();
        while pipeline.syncs_returned() == returned
            && !self
                .sync_returned
                .wait_until(&mut pipeline, until)
                .timed_out()
        {}
    }

    /// Syncs every segment the group wrote to, then publishes what is now durable in order.
    fn sync_and_publish(&self, group: &GroupToSync) -> Result<()> {
        let started = Instant::now();
        for target in &group.targets {
            if let Err(err) =
                sync(&self.shared, target).and_then(|()| sync_name(&self.shared, target))
            {
                // Stopped under the pipeline lock before the log fails, so no group at or
                // after this one (nor one whose sync overlapped it) is ever published.
                let mut pipeline = self.pipeline.lock();
                pipeline.sync_failed();
                self.shared.syncs_in_flight.fetch_sub(1, Ordering::AcqRel);
                self.sync_returned.notify_all();
                return Err(err);
            }
        }
        let micros = started.elapsed().as_micros() as u64;
        let moved = {
            let mut pipeline = self.pipeline.lock();
            self.shared.syncs_in_flight.fetch_sub(1, Ordering::AcqRel);
            pipeline.sync_returned(group.id, micros);
            self.sync_returned.notify_all();
            pipeline.publish_ready(&self.shared)
        };
        if moved {
            self.shared.publish_durable_change();
        }
        Ok(())
    }
}

/// Makes the name of a segment prepared with deferred syncs durable (see
/// `segment::prepare_segments`), once, after its first group's `fdatasync`: that sync
/// committed the journal holding the rename, so this one waits for no commit of its own.
fn sync_name(shared: &Shared, target: &SyncTarget) -> Result<()> {
    let segment = &target.segment;
    if segment.name_durable.load(Ordering::Acquire) {
        return Ok(());
    }
    crate::segment::sync_dir(&shared.dir)?;
    segment.name_durable.store(true, Ordering::Release);
    Ok(())
}

fn sync(shared: &Shared, target: &SyncTarget) -> Result<()> {
    let started = Instant::now();
    let result = match shared.faults.before_sync() {
        Some(err) => Err(err),
        None => target.file().sync_data(),
    };
    result.map_err(|e| WalError::io("fdatasync", &target.segment.path, e))?;
    shared.metrics.record_sync(started.elapsed());
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Segments `fallocate`d ahead are renamed without a directory sync; the committer that
    /// first syncs a group into one syncs the directory before the group is acknowledged.
    #[test]
    fn a_segment_prepared_without_syncs_has_its_name_synced_by_its_first_group() {
        use std::sync::atomic::Ordering;

        use crate::{EntryRef, EntryType, Log, LogOptions, Preallocation, SyncPolicy};

        let dir = tempfile::tempdir().unwrap();
        let options = LogOptions {
            segment_size_bytes: 64 << 10,
            sync_policy: SyncPolicy::Group,
            preallocation: Preallocation::Fallocate,
            ..LogOptions::default()
        };
        let log = Log::open(dir.path(), "t", options).unwrap();
        let payload = vec![7u8; 3000];
        for index in 1..=100u64 {
            let entry = EntryRef {
                term: 1,
                index,
                entry_type: EntryType::Write,
                payload: &payload,
            };
            log.append_durable(&[entry]).unwrap();
        }
        let segments = log.shared.segments.read().clone();
        let with_entries: Vec<_> = segments
            .iter()
            .filter(|s| s.entry_count.load(Ordering::Relaxed) > 0)
            .collect();
        assert!(with_entries.len() >= 4, "roll-overs happened");
        for segment in &with_entries {
            assert!(
                segment.name_durable.load(Ordering::Acquire),
                "{:?}",
                segment.path
            );
        }
        let prepared = log.shared.prepared.lock();
        assert!(!prepared.is_empty(), "segments are prepared ahead");
        for segment in prepared.iter() {
            let segment = segment.as_ref().unwrap();
            assert!(
                !segment.name_durable.load(Ordering::Acquire),
                "not synced ahead"
            );
        }
    }
}
