//! Bindings for the write-ahead log (`nyala._native.Log`).

use pyo3::prelude::*;

pub fn register(_m: &Bound<'_, PyModule>) -> PyResult<()> {
    Ok(())
}
