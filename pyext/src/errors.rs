//! The one place where Rust errors become Python exceptions.
//!
//! Every core crate's error implements `Classify`; its kind names a class in `nyala.errors`,
//! which is looked up once per raise (errors are not on the hot path).

use nyala_common::{Classify, ErrorKind};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// Converts any classified core error into the matching `nyala.errors` exception.
#[allow(dead_code)] // The WAL and storage bindings are its first users.
pub fn to_py<E: Classify>(err: E) -> PyErr {
    let class = err.kind().python_class();
    let message = err.to_string();
    Python::attach(|py| match exception_class(py, class) {
        Ok(cls) => PyErr::from_type(
            cls.cast_into().expect("nyala.errors class is a type"),
            message,
        ),
        Err(import_error) => PyRuntimeError::new_err(format!(
            "{message} (and nyala.errors failed: {import_error})"
        )),
    })
}

#[allow(dead_code)]
fn exception_class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("nyala.errors")?.getattr(name)
}

/// The names of the `nyala.errors` classes that native errors can raise (for a consistency test).
#[pyfunction]
pub fn error_classes() -> Vec<&'static str> {
    ErrorKind::ALL
        .iter()
        .map(|kind| kind.python_class())
        .collect()
}
