//! The process-wide pool background flushes of every engine run on.
//!
//! An engine starts no thread of its own: a tablet server hosts thousands of replicas, and a
//! flush thread each, nearly all of them asleep, made thousands (docs/storage-format.md,
//! "Flush"). Kudu's maintenance manager likewise runs flushes on a fixed, small number of
//! threads. The pool is made with the defaults below on first use; `configure_flush_pool`
//! changes its bound at any time.
//!
//! This module owns the pool and its settings; when an engine asks for a flush, and that it
//! has at most one flush job at a time, belongs to `engine`.

use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use nyala_common::thread_pool::{self, ThreadPool, ThreadPoolStats};

use crate::error::{Result, StorageError};

/// Bounds of the flush pool (process-wide; see `configure_flush_pool`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushPoolOptions {
    /// Flushes running at once, for every engine in the process. A flush encodes Parquet
    /// (CPU) and writes a file, so more than the cores would only slow each other and the
    /// server's own work. Default `max(1, cores / 2)` (Kudu's maintenance manager: 1).
    pub flush_threads_max: usize,
    /// A worker idle this long stops (the pool starts one again when a flush is due).
    pub thread_idle_exit_ms: u64,
}

/// Default idle time after which a flush worker stops.
pub const FLUSH_THREAD_IDLE_EXIT_MS_DEFAULT: u64 = 10_000;

impl Default for FlushPoolOptions {
    fn default() -> Self {
        FlushPoolOptions {
            flush_threads_max: (thread_pool::available_cores() / 2).max(1),
            thread_idle_exit_ms: FLUSH_THREAD_IDLE_EXIT_MS_DEFAULT,
        }
    }
}

static OPTIONS: Mutex<Option<FlushPoolOptions>> = Mutex::new(None);
static FLUSH_POOL: OnceLock<ThreadPool> = OnceLock::new();

/// Sets the flush pool's bound for every engine in the process, open or opened later. A
/// lowered bound takes effect as workers finish their current flushes.
pub fn configure_flush_pool(options: FlushPoolOptions) -> Result<()> {
    if options.flush_threads_max == 0 {
        return Err(StorageError::invalid("flush_threads_max must be positive"));
    }
    let mut current = OPTIONS.lock().unwrap_or_else(PoisonError::into_inner);
    *current = Some(options);
    if let Some(pool) = FLUSH_POOL.get() {
        pool.reconfigure(
            options.flush_threads_max,
            Duration::from_millis(options.thread_idle_exit_ms),
        );
    }
    Ok(())
}

/// The bound in force (the defaults until `configure_flush_pool` is called).
pub fn flush_pool_options() -> FlushPoolOptions {
    OPTIONS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .unwrap_or_default()
}

/// The pool's counters (zeros before any engine asked for a background flush).
pub fn flush_pool_stats() -> ThreadPoolStats {
    FLUSH_POOL.get().map(ThreadPool::stats).unwrap_or_default()
}

/// The pool background flushes run on.
pub(crate) fn flush_pool() -> &'static ThreadPool {
    FLUSH_POOL.get_or_init(|| {
        // Under the options lock, so a concurrent `configure_flush_pool` is not lost.
        let options = OPTIONS.lock().unwrap_or_else(PoisonError::into_inner);
        let options = options.unwrap_or_default();
        ThreadPool::new(
            "nyala-flush",
            options.flush_threads_max,
            Duration::from_millis(options.thread_idle_exit_ms),
            None,
        )
    })
}
