//! The process-wide worker pools every log in the process shares: one for group commits
//! (`committers`), one for segment preparation and closing (`background`).
//!
//! A log starts no thread of its own: a tablet server with thousands of replicas would
//! otherwise run two or more WAL threads per replica, nearly all of them asleep
//! (docs/wal-format.md, "Threads"). The pools are made with the defaults below on first use;
//! `configure_thread_pools` changes their bounds at any time.
//!
//! This module owns the two pools and their settings; what runs on them, and how a log keeps
//! its own jobs ordered and bounded, belongs to `committers` and `background`.

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use nyala_common::thread_pool::{self, ThreadPool, ThreadPoolStats};

use crate::error::{Result, WalError};

/// Stack of a commit worker: it keeps its buffers on the heap, and the pool may run many.
const COMMIT_STACK_BYTES: usize = 256 << 10;

/// Bounds of the WAL's worker pools (process-wide; see `configure_thread_pools`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadPoolOptions {
    /// Workers that write and sync group commits, for every log in the process. A worker
    /// spends most of a group in `fdatasync`, so more workers than cores keep the disk busy
    /// for more logs at once. Default `max(4, 2 × cores)`.
    pub commit_threads_max: usize,
    /// Workers that prepare segments ahead and close finished ones. Default `max(2, cores)`.
    pub background_threads_max: usize,
    /// A worker idle this long stops (the pool starts one again when work arrives).
    pub thread_idle_exit_ms: u64,
}

/// Default idle time after which a pool worker stops.
pub const THREAD_IDLE_EXIT_MS_DEFAULT: u64 = 10_000;

impl Default for ThreadPoolOptions {
    fn default() -> Self {
        ThreadPoolOptions {
            commit_threads_max: (2 * thread_pool::available_cores()).max(4),
            background_threads_max: thread_pool::available_cores().max(2),
            thread_idle_exit_ms: THREAD_IDLE_EXIT_MS_DEFAULT,
        }
    }
}

/// The pools' counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadPoolsStats {
    pub commit: ThreadPoolStats,
    pub background: ThreadPoolStats,
}

static OPTIONS: Mutex<Option<ThreadPoolOptions>> = Mutex::new(None);
static COMMIT_POOL: OnceLock<ThreadPool> = OnceLock::new();
static BACKGROUND_POOL: OnceLock<ThreadPool> = OnceLock::new();

/// Sets the bounds of the WAL's pools for every log in the process, open or opened later.
/// A lowered bound takes effect as workers finish their current jobs.
pub fn configure_thread_pools(options: ThreadPoolOptions) -> Result<()> {
    if options.commit_threads_max == 0 || options.background_threads_max == 0 {
        return Err(WalError::InvalidArgument(
            "commit_threads_max and background_threads_max must be positive".into(),
        ));
    }
    let mut current = OPTIONS.lock().unwrap_or_else(PoisonError::into_inner);
    *current = Some(options);
    let idle_exit = Duration::from_millis(options.thread_idle_exit_ms);
    if let Some(pool) = COMMIT_POOL.get() {
        pool.reconfigure(options.commit_threads_max, idle_exit);
    }
    if let Some(pool) = BACKGROUND_POOL.get() {
        pool.reconfigure(options.background_threads_max, idle_exit);
    }
    Ok(())
}

/// The bounds in force (the defaults until `configure_thread_pools` is called).
pub fn thread_pool_options() -> ThreadPoolOptions {
    OPTIONS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .unwrap_or_default()
}

/// Counters of both pools (zeros for a pool no log has used yet).
pub fn thread_pool_stats() -> ThreadPoolsStats {
    ThreadPoolsStats {
        commit: COMMIT_POOL.get().map(ThreadPool::stats).unwrap_or_default(),
        background: BACKGROUND_POOL
            .get()
            .map(ThreadPool::stats)
            .unwrap_or_default(),
    }
}

/// The pool group commits run on.
pub(crate) fn commit_pool() -> &'static ThreadPool {
    COMMIT_POOL.get_or_init(|| {
        // Under the options lock, so a concurrent `configure_thread_pools` is not lost.
        let options = OPTIONS.lock().unwrap_or_else(PoisonError::into_inner);
        let options = options.unwrap_or_default();
        ThreadPool::new(
            "wal-commit",
            options.commit_threads_max,
            Duration::from_millis(options.thread_idle_exit_ms),
            Some(COMMIT_STACK_BYTES),
        )
    })
}

/// The pool segment preparations and closes run on.
pub(crate) fn background_pool() -> &'static ThreadPool {
    BACKGROUND_POOL.get_or_init(|| {
        let options = OPTIONS.lock().unwrap_or_else(PoisonError::into_inner);
        let options = options.unwrap_or_default();
        ThreadPool::new(
            "wal-background",
            options.background_threads_max,
            Duration::from_millis(options.thread_idle_exit_ms),
            None,
        )
    })
}
