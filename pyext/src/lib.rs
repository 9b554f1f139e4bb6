//! `nyala._native`: the only crate that knows about Python.
//!
//! Each submodule converts arguments, releases the GIL around work (`gil::detach`) and maps
//! errors through `errors::to_py`. No logic lives here that a Rust test could not reach
//! through the core crates.

use pyo3::prelude::*;

mod checksum;
mod consensus;
mod copy;
mod errors;
mod follow;
mod gil;
mod lead;
mod partition;
mod pools;
mod storage;
mod tls;
mod wake;
mod wal;
mod wal_inspect;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(errors::error_classes, m)?)?;
    m.add_function(wrap_pyfunction!(checksum::crc32c, m)?)?;
    wal::register(m)?;
    wal_inspect::register(m)?;
    storage::register(m)?;
    partition::register(m)?;
    consensus::register(m)?;
    follow::register(m)?;
    lead::register(m)?;
    pools::register(m)?;
    copy::register(m)?;
    tls::register(m)?;
    wake::register(m)?;
    Ok(())
}
