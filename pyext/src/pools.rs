//! Bindings for the process-wide worker pools of the Rust core (`nyala._native.
//! configure_thread_pools`, `thread_pool_stats`): the WAL's commit and background pools and
//! the storage engine's flush pool, shared by every replica in the process.

use nyala_common::ThreadPoolStats;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::to_py;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(configure_thread_pools, m)?)?;
    m.add_function(wrap_pyfunction!(thread_pool_stats, m)?)?;
    Ok(())
}

/// Sets the bounds of the pools; an argument left `None` keeps its current value. Takes
/// effect for every log and engine in the process, open or opened later.
#[pyfunction]
#[pyo3(signature = (
    *,
    wal_commit_threads_max = None,
    wal_background_threads_max = None,
    storage_flush_threads_max = None,
    thread_idle_exit_ms = None,
))]
fn configure_thread_pools(
    wal_commit_threads_max: Option<usize>,
    wal_background_threads_max: Option<usize>,
    storage_flush_threads_max: Option<usize>,
    thread_idle_exit_ms: Option<u64>,
) -> PyResult<()> {
    let mut wal = nyala_wal::thread_pool_options();
    wal.commit_threads_max = wal_commit_threads_max.unwrap_or(wal.commit_threads_max);
    wal.background_threads_max = wal_background_threads_max.unwrap_or(wal.background_threads_max);
    wal.thread_idle_exit_ms = thread_idle_exit_ms.unwrap_or(wal.thread_idle_exit_ms);
    let mut flush = nyala_storage::flush_pool_options();
    flush.flush_threads_max = storage_flush_threads_max.unwrap_or(flush.flush_threads_max);
    flush.thread_idle_exit_ms = thread_idle_exit_ms.unwrap_or(flush.thread_idle_exit_ms);
    // Both are checked before either is changed.
    if flush.flush_threads_max == 0 {
        return Err(to_py(nyala_storage::StorageError::invalid(
            "storage_flush_threads_max must be positive",
        )));
    }
    nyala_wal::configure_thread_pools(wal).map_err(to_py)?;
    nyala_storage::configure_flush_pool(flush).map_err(to_py)
}

/// Counters of each pool: `{pool}_{counter}` for pools `wal_commit`, `wal_background` and
/// `storage_flush` and counters `threads`, `idle_threads`, `threads_max`, `queued_jobs`,
/// `threads_started` and `jobs_panicked`.
#[pyfunction]
fn thread_pool_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let out = PyDict::new(py);
    let wal = nyala_wal::thread_pool_stats();
    let wal_options = nyala_wal::thread_pool_options();
    let flush_options = nyala_storage::flush_pool_options();
    let pools = [
        ("wal_commit", wal.commit, wal_options.commit_threads_max),
        (
            "wal_background",
            wal.background,
            wal_options.background_threads_max,
        ),
        (
            "storage_flush",
            nyala_storage::flush_pool_stats(),
            flush_options.flush_threads_max,
        ),
    ];
    for (pool, stats, threads_max) in pools {
        put_stats(&out, pool, &stats, threads_max)?;
    }
    Ok(out)
}

/// Adds one pool's counters; `threads_max` is the configured bound (a pool not made yet
/// reports zeros for the rest).
fn put_stats(
    out: &Bound<'_, PyDict>,
    pool: &str,
    stats: &ThreadPoolStats,
    threads_max: usize,
) -> PyResult<()> {
    out.set_item(format!("{pool}_threads"), stats.threads)?;
    out.set_item(format!("{pool}_idle_threads"), stats.idle_threads)?;
    out.set_item(format!("{pool}_threads_max"), threads_max)?;
    out.set_item(format!("{pool}_queued_jobs"), stats.queued_jobs)?;
    out.set_item(format!("{pool}_threads_started"), stats.threads_started)?;
    out.set_item(format!("{pool}_jobs_panicked"), stats.jobs_panicked)?;
    Ok(())
}
