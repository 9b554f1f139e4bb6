//! When a binding gives the GIL up. Releasing it lets other Python threads run while Rust
//! works, but each release and re-acquisition costs a thread switch when many threads want it:
//! 64 threads each writing one row spent six times the CPU per row of one thread, most of it in
//! the kernel handing the GIL back and forth (docs/performance.md, "Small writes from many
//! threads"). So work on a small batch keeps the GIL; only larger work gives it up.

use arrow::record_batch::RecordBatch;
use pyo3::marker::Ungil;
use pyo3::prelude::*;

/// Batches up to this size in memory are worked on with the GIL held (a few microseconds).
pub const SMALL_BATCH_BYTES_MAX: usize = 64 * 1024;

/// True if `batch` is small enough to work on with the GIL held.
pub fn is_small(batch: &RecordBatch) -> bool {
    batch.get_array_memory_size() <= SMALL_BATCH_BYTES_MAX
}

/// Runs `f` with the GIL held when `small`, without it otherwise.
pub fn detach_unless<T, F>(py: Python<'_>, small: bool, f: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    if small {
        f()
    } else {
        py.detach(f)
    }
}
