//! Background work of one log: preparing segments before they are needed and closing
//! finished ones (footer, cut to length), off the committers' critical path.
//!
//! The work runs on the process-wide background pool (`pools`), one job of a log at a time
//! and in the order sent: a log's `Background` queues its work and has at most one pool job
//! draining it. Closing the log drains what is left in the closing thread rather than
//! waiting for the pool to get to it, so a log's close waits for its own work only.
//!
//! This module owns that queue and the work items; preparing and closing a file belong to
//! `segment`, and what is prepared when to the `appender`.

use std::collections::VecDeque;
use std::sync::Arc;

use nyala_common::ErrorKind;
use parking_lot::{Condvar, Mutex};

use crate::error::WalError;
use crate::pools;
use crate::segment::{self, SegmentFile};
use crate::shared::Shared;

/// Work for the background, done in the order sent.
pub(crate) enum Job {
    /// Prepare segment `sequence` and leave it in the prepared slot.
    Prepare(u64),
    /// Write the footer of a segment the appender left, whose data ends at `write_end`.
    Close {
        segment: Arc<SegmentFile>,
        write_end: u64,
    },
}

/// Who drains the queue now.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Drainer {
    /// Nobody: the queue is empty.
    Nobody,
    /// A pool job was submitted and has not started yet (whoever starts first drains).
    Submitted,
    /// A pool job, or the thread closing the log, is working through the queue.
    Running,
}

struct Queue {
    jobs: VecDeque<Job>,
    drainer: Drainer,
    /// A job panicked (the log has failed; `Log::close` reports it).
    panicked: bool,
}

/// One log's background work queue (see the module comment).
pub(crate) struct Background {
    shared: Arc<Shared>,
    queue: Mutex<Queue>,
    /// Signalled when a drainer stops (the queue is then empty).
    drained: Condvar,
}

impl Background {
    pub(crate) fn new(shared: Arc<Shared>) -> Arc<Self> {
        Arc::new(Background {
            shared,
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                drainer: Drainer::Nobody,
                panicked: false,
            }),
            drained: Condvar::new(),
        })
    }

    /// Queues `job`, submitting a pool job to drain the queue if none is on it.
    pub(crate) fn send(self: &Arc<Self>, job: Job) {
        let mut queue = self.queue.lock();
        queue.jobs.push_back(job);
        if queue.drainer != Drainer::Nobody {
            return;
        }
        queue.drainer = Drainer::Submitted;
        drop(queue);
        let background = Arc::clone(self);
        if let Err(err) = pools::background_pool().submit(Box::new(move || background.run())) {
            // No worker could start: the log fails (a roll-over waiting for a segment gets the
            // error), and `drain` at close does what is queued.
            self.shared
                .fail(&WalError::io("start a WAL background worker", "", err));
        }
    }

    /// Does everything queued in the calling thread (after a pool job draining it stops),
    /// so the log's files are final. For `Log::close`, once nothing sends any more.
    pub(crate) fn drain(&self) {
        let mut queue = self.queue.lock();
        while queue.drainer == Drainer::Running {
            self.drained.wait(&mut queue);
        }
        // A pool job submitted and not started finds the queue taken over and returns.
        queue.drainer = Drainer::Running;
        drop(queue);
        self.work_through();
    }

    /// Whether nothing is queued or running.
    pub(crate) fn idle(&self) -> bool {
        self.queue.lock().drainer == Drainer::Nobody
    }

    /// Whether a background job panicked.
    pub(crate) fn panicked(&self) -> bool {
        self.queue.lock().panicked
    }

    /// The pool job: drains the queue unless `drain` took it over first.
    fn run(self: Arc<Self>) {
        {
            let mut queue = self.queue.lock();
            if queue.drainer != Drainer::Submitted {
                return;
            }
            queue.drainer = Drainer::Running;
        }
        self.work_through();
    }

    /// Does the queued work until the queue is empty (the caller made itself the drainer).
    fn work_through(&self) {
        let _guard = PanicGuard { background: self };
        loop {
            let jobs = {
                let mut queue = self.queue.lock();
                if queue.jobs.is_empty() {
                    queue.drainer = Drainer::Nobody;
                    self.drained.notify_all();
                    break;
                }
                std::mem::take(&mut queue.jobs)
            };
            do_jobs(&self.shared, jobs);
        }
    }
}

/// Does `jobs` in order. Consecutive preparations are done together, sharing their syncs
/// (see `segment::prepare_segments`).
fn do_jobs(shared: &Shared, jobs: VecDeque<Job>) {
    let mut sequences = Vec::new();
    for job in jobs {
        match job {
            Job::Prepare(sequence) => sequences.push(sequence),
            Job::Close { segment, write_end } => {
                prepare(shared, &mut sequences);
                // No sync: the data was synced by the committers, and a footer or cut that a
                // crash loses is rebuilt by recovery (a footerless segment is scanned).
                if let Err(err) = segment::close_segment(&segment, write_end, false) {
                    shared.fail(&err);
                }
            }
        }
    }
    prepare(shared, &mut sequences);
}

/// Prepares segments `sequences` (taken) and hands them to the appender.
fn prepare(shared: &Shared, sequences: &mut Vec<u64>) {
    if sequences.is_empty() {
        return;
    }
    let specs: Vec<_> = sequences
        .drain(..)
        .map(|sequence| shared.prepare_spec(sequence, shared.take_recyclable()))
        .collect();
    let results = segment::prepare_segments(&specs);
    shared.prepared.lock().extend(results);
    shared.prepared_ready.notify_all();
}

/// Fails the log and gives the queue up if a job panics, so `Log::close` neither waits for
/// a drainer that is gone nor reports success.
struct PanicGuard<'a> {
    background: &'a Background,
}

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let background = self.background;
        background.shared.fail(&WalError::Failed {
            kind: ErrorKind::IllegalState,
            message: "a WAL background job panicked".into(),
        });
        let mut queue = background.queue.lock();
        queue.panicked = true;
        queue.jobs.clear();
        queue.drainer = Drainer::Nobody;
        background.drained.notify_all();
    }
}
