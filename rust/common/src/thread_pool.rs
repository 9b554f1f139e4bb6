//! A bounded pool of worker threads that run submitted jobs in submission order.
//!
//! The WAL's group commits, its segment preparations and the storage engine's flushes run on
//! pools like this one, shared by every tablet replica in the process, instead of on threads
//! of their own: a tablet server hosts thousands of replicas, most of them idle, and a few
//! threads each made thousands (Kudu moved its log appends to pooled threads for the same
//! reason). A pool starts a worker only when a job finds no idle one, never more than
//! `threads_max`, and a worker idle for `idle_exit` stops, so an idle process keeps none.
//!
//! This module owns the workers and the job queue. It knows nothing of what jobs do: callers
//! that need a job per object at a time, or ordering between jobs, keep that state themselves
//! (the WAL's committers and background queue, the engine's flush flag). A job must not wait
//! for another job of the same pool, which may be queued behind it.

use std::collections::VecDeque;
use std::io;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Work for a pool: runs once, on one of its workers.
pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// A pool's counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadPoolStats {
    /// Workers alive (running a job or idle).
    pub threads: usize,
    /// Workers waiting for a job.
    pub idle_threads: usize,
    pub threads_max: usize,
    /// Jobs submitted and not started yet.
    pub queued_jobs: usize,
    /// Workers started since the pool was made (a pool that keeps restarting workers has an
    /// idle exit shorter than the gaps between its jobs).
    pub threads_started: u64,
    /// Jobs that panicked (the worker survives; the job's owner sees the panic its own way).
    pub jobs_panicked: u64,
}

/// Bounded worker threads running queued jobs in FIFO order (see the module comment).
pub struct ThreadPool {
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    stack_bytes: Option<usize>,
    state: Mutex<State>,
    /// Idle workers wait here for a job.
    work: Condvar,
    /// Mirror of `State::jobs.len()`, readable without the lock (`has_queued_jobs`).
    queued: AtomicUsize,
}

struct State {
    jobs: VecDeque<Job>,
    /// Workers alive; at most `threads_max` except while a lowered bound takes effect (each
    /// worker above it stops after its current job).
    threads: usize,
    /// Workers waiting on `work`, counted until they wake (so a job submitted before a
    /// notified worker has taken the previous one still finds it busy and starts another).
    idle: usize,
    threads_max: usize,
    idle_exit: Duration,
    threads_started: u64,
    jobs_panicked: u64,
}

impl ThreadPool {
    /// A pool of at most `threads_max` workers (at least 1) named `name`, each stopping after
    /// `idle_exit` without work; `stack_bytes` sets their stack size (the platform's default
    /// when `None`). No worker starts before the first job.
    pub fn new(
        name: &str,
        threads_max: usize,
        idle_exit: Duration,
        stack_bytes: Option<usize>,
    ) -> ThreadPool {
        ThreadPool {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                stack_bytes,
                state: Mutex::new(State {
                    jobs: VecDeque::new(),
                    threads: 0,
                    idle: 0,
                    threads_max: threads_max.max(1),
                    idle_exit,
                    threads_started: 0,
                    jobs_panicked: 0,
                }),
                work: Condvar::new(),
                queued: AtomicUsize::new(0),
            }),
        }
    }

    /// Queues `job`; an idle worker takes it, or a new one if none is idle and the bound
    /// allows, or else the first worker to finish its job. Fails only when no worker is alive
    /// and none could be started (the job then stays queued for the next worker).
    pub fn submit(&self, job: Job) -> io::Result<()> {
        let mut state = self.inner.lock();
        state.jobs.push_back(job);
        self.inner.queued.store(state.jobs.len(), Ordering::Release);
        if state.idle >= state.jobs.len() {
            drop(state);
            self.inner.work.notify_one();
            return Ok(());
        }
        if state.threads >= state.threads_max {
            return Ok(());
        }
        state.threads += 1;
        state.threads_started += 1;
        drop(state);
        match self.spawn_worker() {
            Ok(()) => Ok(()),
            Err(err) => {
                let mut state = self.inner.lock();
                state.threads -= 1;
                state.threads_started -= 1;
                if state.threads == 0 {
                    return Err(err);
                }
                Ok(())
            }
        }
    }

    /// Whether jobs are waiting for a worker (a job that could go on with more work of its
    /// own may submit itself again instead, and so let them run first).
    pub fn has_queued_jobs(&self) -> bool {
        self.inner.queued.load(Ordering::Acquire) > 0
    }

    /// Changes the bound (at least 1) and the idle exit. Workers above a lowered bound stop
    /// after their current job; a raised bound starts workers only as jobs arrive.
    pub fn reconfigure(&self, threads_max: usize, idle_exit: Duration) {
        let mut state = self.inner.lock();
        state.threads_max = threads_max.max(1);
        state.idle_exit = idle_exit;
        drop(state);
        // Idle workers re-read the bound and their idle exit.
        self.inner.work.notify_all();
    }

    pub fn stats(&self) -> ThreadPoolStats {
        let state = self.inner.lock();
        ThreadPoolStats {
            threads: state.threads,
            idle_threads: state.idle,
            threads_max: state.threads_max,
            queued_jobs: state.jobs.len(),
            threads_started: state.threads_started,
            jobs_panicked: state.jobs_panicked,
        }
    }

    fn spawn_worker(&self) -> io::Result<()> {
        let inner = Arc::clone(&self.inner);
        let mut builder = std::thread::Builder::new().name(self.inner.name.clone());
        if let Some(bytes) = self.inner.stack_bytes {
            builder = builder.stack_size(bytes);
        }
        builder.spawn(move || inner.run_worker()).map(drop)
    }
}

impl Inner {
    /// The pool's lock. Jobs run outside it and a panic in one is caught, so a poisoned lock
    /// can only come from a bug in this module's few lines; the state stays consistent anyway.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn run_worker(&self) {
        let mut state = self.lock();
        loop {
            if state.threads > state.threads_max {
                break;
            }
            if let Some(job) = state.jobs.pop_front() {
                self.queued.store(state.jobs.len(), Ordering::Release);
                drop(state);
                let panicked = std::panic::catch_unwind(AssertUnwindSafe(job)).is_err();
                state = self.lock();
                if panicked {
                    state.jobs_panicked += 1;
                }
                continue;
            }
            state.idle += 1;
            let idle_exit = state.idle_exit;
            let (woken, waited) = self
                .work
                .wait_timeout(state, idle_exit)
                .unwrap_or_else(PoisonError::into_inner);
            state = woken;
            state.idle -= 1;
            if waited.timed_out() && state.jobs.is_empty() {
                break;
            }
        }
        state.threads -= 1;
    }
}

/// The number of cores the process may use (1 where unknown), which pools' default bounds
/// are derived from.
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Instant;

    fn wait_until(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn jobs_run_on_at_most_threads_max_workers() {
        let pool = ThreadPool::new("test-pool", 3, Duration::from_secs(60), None);
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (done_tx, done_rx) = mpsc::channel();
        for _ in 0..40 {
            let (running, most, done_tx) = (running.clone(), most.clone(), done_tx.clone());
            pool.submit(Box::new(move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(2));
                running.fetch_sub(1, Ordering::SeqCst);
                done_tx.send(()).unwrap();
            }))
            .unwrap();
        }
        for _ in 0..40 {
            done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        assert_eq!(
            most.load(Ordering::SeqCst),
            3,
            "the bound was used and kept"
        );
        let stats = pool.stats();
        assert!(stats.threads <= 3, "{stats:?}");
        assert_eq!(stats.threads_started, 3, "{stats:?}");
    }

    #[test]
    fn idle_workers_stop_and_the_pool_regrows_on_demand() {
        let pool = ThreadPool::new("test-pool", 2, Duration::from_millis(20), None);
        let (done_tx, done_rx) = mpsc::channel();
        for _ in 0..2 {
            let done_tx = done_tx.clone();
            pool.submit(Box::new(move || done_tx.send(()).unwrap()))
                .unwrap();
        }
        done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        wait_until("idle workers to stop", || pool.stats().threads == 0);
        pool.submit(Box::new(move || done_tx.send(()).unwrap()))
            .unwrap();
        done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(pool.stats().threads_started >= 2);
    }

    #[test]
    fn a_lowered_bound_stops_workers_above_it() {
        let pool = ThreadPool::new("test-pool", 4, Duration::from_secs(60), None);
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        for _ in 0..4 {
            let gate = gate.clone();
            pool.submit(Box::new(move || {
                let (open, opened) = &*gate;
                let mut open = open.lock().unwrap();
                while !*open {
                    open = opened.wait(open).unwrap();
                }
            }))
            .unwrap();
        }
        wait_until("four workers", || pool.stats().threads == 4);
        pool.reconfigure(1, Duration::from_secs(60));
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        wait_until("the bound to take effect", || pool.stats().threads == 1);
    }

    #[test]
    fn a_panicking_job_leaves_its_worker_running() {
        let pool = ThreadPool::new("test-pool", 1, Duration::from_secs(60), None);
        pool.submit(Box::new(|| panic!("job failed on purpose")))
            .unwrap();
        let (done_tx, done_rx) = mpsc::channel();
        pool.submit(Box::new(move || done_tx.send(()).unwrap()))
            .unwrap();
        done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let stats = pool.stats();
        assert_eq!(
            (stats.jobs_panicked, stats.threads_started),
            (1, 1),
            "{stats:?}"
        );
    }
}
