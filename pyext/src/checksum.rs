//! CRC32C for Python callers (metadata files, tablet copy chunks) without a second library.

use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;

/// CRC32C (Castagnoli) of a bytes-like object, continuing from `initial` (0 to start).
#[pyfunction]
#[pyo3(signature = (data, initial = 0))]
pub fn crc32c(py: Python<'_>, data: &Bound<'_, PyAny>, initial: u32) -> PyResult<u32> {
    let buffer = PyBuffer::<u8>::get(data)?;
    // A read-only contiguous buffer (bytes, read-only memoryview) can be borrowed while the
    // GIL is released; anything mutable is copied first so no Python code can change it.
    if buffer.readonly() && buffer.is_c_contiguous() {
        let ptr = buffer.buf_ptr() as usize;
        let len = buffer.len_bytes();
        return Ok(py.detach(|| {
            // SAFETY: the buffer is read-only, contiguous, and kept alive by `buffer` (which
            // holds a reference to the exporter) for the duration of this closure.
            let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            ::crc32c::crc32c_append(initial, bytes)
        }));
    }
    let copy = buffer.to_vec(py)?;
    Ok(py.detach(|| ::crc32c::crc32c_append(initial, &copy)))
}
