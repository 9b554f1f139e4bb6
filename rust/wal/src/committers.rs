//! Group commit: the commit jobs.
//!
//! A commit job takes the *write turn* (one holder at a time, so the order on disk is the
//! ticket order), drains everything queued, has the `Appender` frame it behind the
//! segment's partial last page, write the whole pages in one `pwrite` and register the group
//! in the *pipeline*, and gives the turn up. Only then does it call `fdatasync` for its
//! group, so the next job writes the next group while this one's sync runs: up to
//! `LogOptions::syncs_in_flight_max` syncs overlap, which a disk that serves concurrent
//! flushes turns into more groups per second (docs/wal-format.md, "Group commit").
//!
//! Durability is published strictly in group order (see `pipeline`). A sync that fails
//! stops publication for good (no later group is ever reported durable) and fails the log.
//! Each job syncs through the open file description of its *slot*: Linux reports a
//! writeback error once per description, so with one shared description a concurrent sync
//! could consume the error of an earlier group's pages and let that group's sync return
//! success.
//!
//! Jobs run on the process-wide commit pool (`pools`), not on threads of the log's own. An
//! append that finds no job of its log starts one (slot 0); more start (up to the limit,
//! each with a slot of its own) only when an append found the jobs busy while a sync was
//! running, so a quiet tablet has at most one. A job goes on while its log has work queued
//! and stops when it finds the queue empty; after each group it gives its worker up to other
//! logs' jobs waiting in the pool (submitting itself again). The turn holder also rolls
//! over to the segment the background prepared; jobs are the only writers of segment data
//! and of the durable point. `Log::close` waits for the log's jobs to stop, then has the
//! active segment closed (`Committers::finish`).
//!
//! This module owns the commit jobs, their slots, the write turn, the syncs and the
//! staggering of groups; what a group holds and how it is written belong to `appender` and
//! `active_segment`.

use std::collections::VecDeque;
use std::mem;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nyala_common::ErrorKind;
use parking_lot::{Condvar, Mutex};

use crate::active_segment::SyncTarget;
use crate::appender::{shrink_idle, shrink_idle_queue, Appender};
use crate::error::{Result, WalError};
use crate::options::SyncPolicy;
use crate::pipeline::{GroupToSync, Pipeline};
use crate::pools;
use crate::shared::{Queue, Request, Shared};

/// What the write turn guards: the appending state and the drained requests.
struct Turn {
    appender: Appender,
    /// The requests the turn holder drained last (emptied once written).
    requests: VecDeque<Request>,
    /// The queue arena taken with them (emptied), swapped in at the next drain.
    arena: Vec<u8>,
    /// The active segment got its footer (`finish`).
    finished: bool,
}

/// What a log's commit jobs share: the write turn (with the appending state) and the
/// pipeline of written groups. Which slots have a job is kept in the queue
/// (`Queue::commit_slots_busy`), under its lock, since appends decide there to start one.
pub(crate) struct Committers {
    shared: Arc<Shared>,
    /// The write turn. Its holder alone drains the queue, writes and rolls over.
    turn: Mutex<Turn>,
    pipeline: Arc<Mutex<Pipeline>>,
    /// Signalled (with the pipeline lock) whenever a sync returns.
    sync_returned: Condvar,
    /// A commit job panicked (the log has failed; `Log::close` reports it).
    panicked: AtomicBool,
}

impl Committers {
    /// The log's committers; no job runs until something is appended.
    pub(crate) fn new(shared: Arc<Shared>, mut appender: Appender) -> Result<Arc<Self>> {
        appender.open_sync_handles()?;
        // Slot 0 (`Queue::commit_slots_opened` starts at 1).
        shared.metrics.sync_threads.store(1, Ordering::Relaxed);
        let pipeline = Arc::clone(appender.pipeline());
        Ok(Arc::new(Committers {
            shared,
            turn: Mutex::new(Turn {
                appender,
                requests: VecDeque::new(),
                arena: Vec::new(),
                finished: false,
            }),
            pipeline,
            sync_returned: Condvar::new(),
            panicked: AtomicBool::new(false),
        }))
    }

    /// Releases the queue (after a request was queued) and starts a commit job if none will
    /// look at the queue: the log has no job, or (a log whose appends have overlapped syncs
    /// before, see `maybe_grow`) every job is syncing and it had more at once before, as a
    /// committer thread used to wait for work while another synced. Otherwise notes whether
    /// appends overlap a sync. The job is submitted after the unlock: appends queueing
    /// meanwhile never find the lock held across a system call.
    pub(crate) fn wake(self: &Arc<Self>, mut queue: std::sync::MutexGuard<'_, Queue>) {
        let busy = queue.commit_slots_busy;
        let start = !queue.requests.is_empty()
            && (busy == 0
                || (queue.commit_jobs_looking == 0
                    && (busy.count_ones() as usize) < queue.commit_slots_opened));
        let slot = (!busy).trailing_zeros() as usize;
        if start {
            queue.commit_slots_busy |= 1 << slot;
            queue.commit_jobs_looking += 1;
        } else if self.shared.syncs_in_flight.load(Ordering::Relaxed) > 0 {
            queue.appends_found_busy = true;
        }
        drop(queue);
        if start {
            self.submit(slot, Start::Woken);
        }
    }

    /// Blocks until the log has no commit job (for `Log::close`, after `closing` was set
    /// or the log failed: jobs then stop once the queue is empty, and none starts).
    pub(crate) fn wait_stopped(&self) {
        let mut queue = self.shared.lock_queue();
        while queue.commit_slots_busy != 0 {
            queue = self
                .shared
                .commit_jobs_stopped
                .wait(queue)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Writes the active segment's footer, once every job has stopped (every sync has
    /// returned); nothing more is written after it. Idempotent.
    pub(crate) fn finish(&self) {
        let mut turn = self.turn.lock();
        if !mem::replace(&mut turn.finished, true) {
            turn.appender.finish();
        }
    }

    /// Whether a commit job panicked.
    pub(crate) fn panicked(&self) -> bool {
        self.panicked.load(Ordering::Acquire)
    }

    /// Submits the job of `slot` (already marked busy) to the commit pool.
    fn submit(self: &Arc<Self>, slot: usize, start: Start) {
        let committers = Arc::clone(self);
        let job = Box::new(move || committers.run(slot, start));
        if let Err(err) = pools::commit_pool().submit(job) {
            // No worker alive and none could start: fail the log rather than leave its
            // appends waiting. The job stays queued and stops at once if it ever runs.
            self.shared
                .fail(&WalError::io("start a WAL commit worker", "", err));
            let mut queue = self.shared.lock_queue();
            if start != Start::Resumed {
                queue.commit_jobs_looking -= 1;
            }
            release_slot(&self.shared, &mut queue, slot);
        }
    }

    /// Marks `slot` free; the last job to stop wakes `wait_stopped`.
    fn release(&self, slot: usize) {
        let mut queue = self.shared.lock_queue();
        release_slot(&self.shared, &mut queue, slot);
    }

    /// Starts one more job if appends found every job busy and the limit allows (called by
    /// the turn holder).
    fn maybe_grow(self: &Arc<Self>) {
        let options = &self.shared.options;
        if options.sync_policy != SyncPolicy::Group {
            return;
        }
        let mut queue = self.shared.lock_queue();
        let busy = queue.commit_slots_busy;
        if busy.count_ones() as usize >= options.syncs_in_flight_max || queue.closing {
            return;
        }
        let slot = (!busy).trailing_zeros() as usize;
        queue.commit_slots_busy |= 1 << slot;
        queue.commit_jobs_looking += 1;
        if slot >= queue.commit_slots_opened {
            queue.commit_slots_opened = slot + 1;
            let opened = queue.commit_slots_opened as u64;
            self.shared
                .metrics
                .sync_threads
                .store(opened, Ordering::Relaxed);
        }
        drop(queue);
        self.submit(slot, Start::Grown);
    }

    /// Bytes the log's buffers hold in capacity: the group buffers, both arenas and both
    /// request queues (waits for a group being written).
    pub(crate) fn retained_buffer_bytes(&self) -> usize {
        let turn = self.turn.lock();
        let mut bytes = turn.appender.retained_bytes()
            + turn.arena.capacity()
            + turn.requests.capacity() * mem::size_of::<Request>();
        drop(turn);
        let queue = self.shared.lock_queue();
        bytes += queue.arena.capacity() + queue.requests.capacity() * mem::size_of::<Request>();
        bytes
    }

    /// The commit job of `slot`: groups until the queue is found empty or the log fails.
    fn run(self: Arc<Self>, slot: usize, mut start: Start) {
        let _guard = PanicGuard {
            committers: &self,
            slot,
        };
        let shared = &self.shared;
        loop {
            let mut turn = self.turn.lock();
            // Held back before looking at the queue: appends that arrive meanwhile queue up
            // and start nothing (no system call on their path).
            self.stagger();
            let Turn {
                appender,
                requests,
                arena,
                ..
            } = &mut *turn;
            let Some(contended) = self.take_queued(requests, arena, slot, start) else {
                // The log is idle: what its largest group grew goes back (the queue's own
                // arena and requests in `take_queued`).
                appender.release_idle_capacity();
                shrink_idle(arena);
                shrink_idle_queue(requests);
                return;
            };
            start = Start::Resumed;
            let committed = appender.commit(requests, arena, slot);
            arena.clear();
            let group = match committed {
                Ok(group) => group,
                Err(err) => {
                    self.pipeline.lock().stop();
                    shared.fail(&err);
                    self.release(slot);
                    return;
                }
            };
            if contended {
                self.maybe_grow();
            }
            drop(turn);
            if let Some(group) = group {
                if let Err(err) = self.sync_and_publish(&group) {
                    shared.fail(&err);
                    self.release(slot);
                    return;
                }
            }
            if pools::commit_pool().has_queued_jobs() {
                // Other logs' jobs wait for a worker: this one queues behind them, keeping its
                // slot (it looks at the queue again when it runs).
                let committers = Arc::clone(&self);
                let job = Box::new(move || committers.run(slot, Start::Resumed));
                if pools::commit_pool().submit(job).is_ok() {
                    return;
                }
            }
        }
    }

    /// Takes everything queued (the caller holds the turn), with the queue's arena
    /// (swapping in `arena`, emptied). Returns whether appends found the jobs busy
    /// meanwhile, or `None` when this job is to stop: the queue is empty or the log failed
    /// (the slot is then free, under the same lock an append checks it under, so every
    /// request queued finds a job that will take it).
    fn take_queued(
        &self,
        requests: &mut VecDeque<Request>,
        arena: &mut Vec<u8>,
        slot: usize,
        start: Start,
    ) -> Option<bool> {
        let shared = &self.shared;
        let mut queue = shared.lock_queue();
        if start != Start::Resumed {
            queue.commit_jobs_looking -= 1;
        }
        if queue.requests.is_empty() || shared.has_failed() {
            shrink_idle(&mut queue.arena);
            shrink_idle_queue(&mut queue.requests);
            release_slot(shared, &mut queue, slot);
            return None;
        }
        if start == Start::Woken && !queue.closing {
            // Started by an append: let the group gather while a sync runs.
            drop(queue);
            self.stagger();
            queue = shared.lock_queue();
            if shared.has_failed() {
                release_slot(shared, &mut queue, slot);
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

/// How a commit job came to run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Started by an append that found no job looking at the queue.
    Woken,
    /// Started by the turn holder because appends overlap syncs (`maybe_grow`).
    Grown,
    /// Went on after a group (it submitted itself again to let other logs' jobs run).
    Resumed,
}

/// Marks `slot` free in `queue`; wakes `Committers::wait_stopped` once none is busy.
fn release_slot(shared: &Shared, queue: &mut Queue, slot: usize) {
    queue.commit_slots_busy &= !(1 << slot);
    if queue.commit_slots_busy == 0 {
        shared.commit_jobs_stopped.notify_all();
    }
}

/// Fails the log and frees the job's slot if a commit job panics, so `Log::close` neither
/// waits for a job that is gone nor reports success.
struct PanicGuard<'a> {
    committers: &'a Committers,
    slot: usize,
}

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let committers = self.committers;
        committers.panicked.store(true, Ordering::Release);
        committers.pipeline.lock().stop();
        committers.shared.fail(&WalError::Failed {
            kind: ErrorKind::IllegalState,
            message: "a WAL commit job panicked".into(),
        });
        committers.release(self.slot);
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
