//! Tablet copy's source reads (`nyala._native.CopyFile`): one file of a copy session with a
//! fixed length (a rowset file as it was when the session opened it, or a WAL segment's copy
//! image), read straight into the bytes of the answer.
//!
//! `read_message` builds a whole serialized FetchData answer in one `bytes`: the message
//! without its data (serialized by Python's protobuf, which stays the format's only home),
//! then the data field's tag and length, then the data, `pread` into place with the GIL
//! released and checksummed there. No other copy of the chunk is made on this side, and the
//! `bytes` is not zeroed first (the `pread` writes every byte of it).
//!
//! `write_at` is the target's write: all of a received chunk at its offset, with the GIL
//! released, then its writeback started at once, so the disk writes while later chunks
//! arrive and the file's `fsync` at the end has little left to wait for.
//!
//! `CopyDataServer` and `CopyDownload` are the two ends of the data channel
//! (`nyala_copy`): a source serves its sessions' `CopyFile`s there, and a target downloads
//! a session's files with the GIL released for the whole download.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nyala_common::{Classify, ErrorKind};
use nyala_copy::{all_bytes, DataServer, Download, DownloadOptions, ServedFile, ServerOptions};
use nyala_wal::SegmentImage;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::to_py;
use nyala_common::proto::put_len_head;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCopyFile>()?;
    m.add_class::<PyCopyDataServer>()?;
    m.add_class::<PyCopyDownload>()?;
    m.add_function(wrap_pyfunction!(write_at, m)?)?;
    Ok(())
}

/// An error reading a copy file, classified for `nyala.errors`.
#[derive(Debug)]
struct CopyFileError {
    kind: ErrorKind,
    message: String,
}

impl std::fmt::Display for CopyFileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CopyFileError {}

impl Classify for CopyFileError {
    fn kind(&self) -> ErrorKind {
        self.kind
    }
}

fn invalid(message: String) -> PyErr {
    to_py(CopyFileError {
        kind: ErrorKind::InvalidArgument,
        message,
    })
}

enum Source {
    File { file: File, path: PathBuf },
    Segment(SegmentImage),
}

/// One file a copy session serves (native part; see `nyala.tablet.copy_source`).
#[pyclass(frozen, name = "CopyFile", module = "nyala._native")]
pub struct PyCopyFile {
    inner: Arc<CopyFileData>,
}

/// The open file and the length it is served with, shared with the data channel's threads.
struct CopyFileData {
    source: Source,
    length: u64,
}

impl ServedFile for CopyFileData {
    fn length(&self) -> u64 {
        self.length
    }

    fn read_at(&self, offset: u64, dest: &mut [u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let (file, _) = self.file();
        file.read_exact_at(dest, offset)
    }
}

impl PyCopyFile {
    pub(crate) fn from_segment(image: SegmentImage) -> Self {
        PyCopyFile {
            inner: Arc::new(CopyFileData {
                length: image.length(),
                source: Source::Segment(image),
            }),
        }
    }

    /// The chunk at `offset` of at most `length_max` bytes: its length, checked.
    fn chunk_len(&self, offset: u64, length_max: u64) -> PyResult<usize> {
        let length = self.inner.length;
        if offset > length {
            return Err(invalid(format!(
                "offset {offset} is past the end of {} ({length} bytes)",
                self.name(),
            )));
        }
        Ok(length_max.min(length - offset) as usize)
    }
}

impl CopyFileData {
    fn file(&self) -> (&File, &Path) {
        match &self.source {
            Source::File { file, path } => (file, path),
            Source::Segment(image) => image.file(),
        }
    }

    /// Reads `len` bytes at `offset` (within the length) to `dest`, checksummed; the caller
    /// releases the GIL.
    ///
    /// # Safety
    /// `dest` must be valid for writes of `len` bytes, and nothing else may use them meanwhile.
    unsafe fn read_raw(
        &self,
        offset: u64,
        dest: *mut u8,
        len: usize,
    ) -> Result<u32, CopyFileError> {
        let (file, path) = self.file();
        let fd = file.as_raw_fd();
        // SAFETY: each read writes within `dest .. dest + len`, which the caller vouches for.
        all_bytes(len, |done| unsafe {
            let at = (offset + done as u64) as libc::off_t;
            libc::pread(fd, dest.add(done).cast(), len - done, at)
        })
        .map_err(|e| io_error("read", path, &e))?;
        // SAFETY: the reads above wrote all `len` bytes.
        let data = unsafe { std::slice::from_raw_parts(dest, len) };
        Ok(crc32c::crc32c(data))
    }
}

fn io_error(what: &str, path: &Path, e: &std::io::Error) -> CopyFileError {
    CopyFileError {
        kind: ErrorKind::of_io(e),
        message: format!("{what} {}: {e}", path.display()),
    }
}

/// A new `bytes` of `len` bytes, not zeroed: `fill` gets its buffer and must write every byte
/// (or fail, and the object is dropped unseen).
fn bytes_filled<'py>(
    py: Python<'py>,
    len: usize,
    fill: impl FnOnce(*mut u8) -> PyResult<()>,
) -> PyResult<Bound<'py, PyBytes>> {
    let size = pyo3::ffi::Py_ssize_t::try_from(len)
        .map_err(|_| invalid(format!("a chunk of {len} bytes is too large")))?;
    // SAFETY: a NULL source asks CPython for an uninitialised object of `size` bytes, which
    // we own; its buffer is valid for `len` bytes and no one else sees the object until
    // `fill` has written them.
    unsafe {
        let obj = Bound::from_owned_ptr_or_err(
            py,
            pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), size),
        )?;
        fill(pyo3::ffi::PyBytes_AsString(obj.as_ptr()).cast::<u8>())?;
        Ok(obj.cast_into_unchecked())
    }
}

#[pymethods]
impl PyCopyFile {
    /// Opens `path` read-only; its length is fixed now (rowset files never change).
    #[staticmethod]
    fn open(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let opened = py.detach(|| {
            let file = File::open(&path)?;
            let length = file.metadata()?.len();
            Ok::<_, std::io::Error>((file, length))
        });
        let (file, length) = opened.map_err(|e| {
            to_py(CopyFileError {
                kind: if e.kind() == std::io::ErrorKind::NotFound {
                    ErrorKind::NotFound
                } else {
                    ErrorKind::of_io(&e)
                },
                message: format!("open {}: {e}", path.display()),
            })
        })?;
        Ok(PyCopyFile {
            inner: Arc::new(CopyFileData {
                source: Source::File { file, path },
                length,
            }),
        })
    }

    /// The file's name (a rowset file's base name, or `wal-%09d`).
    #[getter]
    fn name(&self) -> String {
        match &self.inner.source {
            Source::File { path, .. } => path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            Source::Segment(image) => image.file_name(),
        }
    }

    /// The bytes this file serves.
    #[getter]
    fn length(&self) -> u64 {
        self.inner.length
    }

    /// The chunk at `offset` (at most `length_max` bytes, fewer at the end) and its CRC32C.
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        length_max: u64,
    ) -> PyResult<(Bound<'py, PyBytes>, u32)> {
        let len = self.chunk_len(offset, length_max)?;
        let mut crc = 0;
        let bytes = bytes_filled(py, len, |dest| {
            let dest = dest as usize; // a pointer is not Send; the address is
                                      // SAFETY: `dest` holds `len` bytes that only this read touches.
            crc = py
                .detach(|| unsafe { self.inner.read_raw(offset, dest as *mut u8, len) })
                .map_err(to_py)?;
            Ok(())
        })?;
        Ok((bytes, crc))
    }

    /// A serialized message whose field `field_number` (length-delimited) holds the chunk at
    /// `offset` (at most `length_max` bytes): `prefix(crc32c, length)` — the message's other
    /// fields, serialized, whose length must not depend on the CRC (a `fixed32` field) —
    /// then the field. Protobuf parses a message followed by one more field as the message
    /// with that field set.
    fn read_message<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        length_max: u64,
        field_number: u32,
        prefix: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let len = self.chunk_len(offset, length_max)?;
        let sized: Vec<u8> = prefix.call1((0u32, len))?.extract()?;
        let mut head = Vec::with_capacity(sized.len() + 20);
        head.extend_from_slice(&sized);
        put_len_head(&mut head, u64::from(field_number), len);
        let data_at = head.len();
        bytes_filled(py, data_at + len, |out| {
            let data = out as usize + data_at;
            // SAFETY: `out + data_at` holds the `len` bytes after the head, only ours.
            let crc = py
                .detach(|| unsafe { self.inner.read_raw(offset, data as *mut u8, len) })
                .map_err(to_py)?;
            let real: Vec<u8> = prefix.call1((crc, len))?.extract()?;
            if real.len() != sized.len() {
                return Err(invalid(format!(
                    "the message prefix is {} bytes with CRC {crc:#010x} but {} with 0",
                    real.len(),
                    sized.len()
                )));
            }
            head[..real.len()].copy_from_slice(&real);
            // SAFETY: `out` holds `data_at` bytes before the data; `head` is that long.
            unsafe { std::ptr::copy_nonoverlapping(head.as_ptr(), out, data_at) };
            Ok(())
        })
    }
}

/// Writes all of `data` at `offset` of the open file `fd`, then starts its writeback
/// (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), with the GIL released. The writeback is only
/// a head start: the file is durable once the caller has `fsync`ed it.
#[pyfunction]
pub fn write_at(py: Python<'_>, fd: i32, data: &Bound<'_, PyAny>, offset: u64) -> PyResult<()> {
    let buffer = PyBuffer::<u8>::get(data)?;
    // A read-only contiguous buffer (bytes, a read-only memoryview of them) can be borrowed
    // while the GIL is released; anything mutable is copied first.
    let copy;
    let (ptr, len) = if buffer.readonly() && buffer.is_c_contiguous() {
        (buffer.buf_ptr() as usize, buffer.len_bytes())
    } else {
        copy = buffer.to_vec(py)?;
        (copy.as_ptr() as usize, copy.len())
    };
    py.detach(|| {
        // SAFETY: `ptr` is `len` readable bytes kept alive by `buffer` (or `copy`) until the
        // end of this function.
        let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
        nyala_copy::write_at(fd, bytes, offset)
    })
    .map_err(to_py)
}

fn token_of(token: &[u8]) -> PyResult<nyala_copy::Token> {
    token.try_into().map_err(|_| {
        invalid(format!(
            "a copy session token is 16 bytes, not {}",
            token.len()
        ))
    })
}

/// The source end of tablet copy's data channel (`nyala_copy::DataServer`): serves the
/// files of registered sessions on its own threads, never touching the interpreter.
#[pyclass(frozen, name = "CopyDataServer", module = "nyala._native")]
pub struct PyCopyDataServer {
    server: DataServer,
}

#[pymethods]
impl PyCopyDataServer {
    /// Listens on `host:port` (0: any free port).
    #[new]
    #[pyo3(signature = (host, port, *, chunk_bytes_max, connections_max, idle_timeout_ms))]
    fn new(
        py: Python<'_>,
        host: &str,
        port: u16,
        chunk_bytes_max: u32,
        connections_max: usize,
        idle_timeout_ms: u64,
    ) -> PyResult<Self> {
        if chunk_bytes_max == 0 || connections_max == 0 || idle_timeout_ms == 0 {
            return Err(invalid(
                "chunk_bytes_max, connections_max and idle_timeout_ms must be positive".into(),
            ));
        }
        let options = ServerOptions {
            chunk_bytes_max,
            connections_max,
            idle_timeout: Duration::from_millis(idle_timeout_ms),
        };
        let server = py
            .detach(|| DataServer::bind((host, port), options))
            .map_err(|e| {
                to_py(CopyFileError {
                    kind: ErrorKind::of_io(&e),
                    message: format!("tablet copy data channel on {host}:{port}: {e}"),
                })
            })?;
        Ok(PyCopyDataServer { server })
    }

    /// The port it listens on.
    #[getter]
    fn port(&self) -> u16 {
        self.server.local_addr().port()
    }

    /// Serves `files` (numbered by their place in the list) to requests naming `token`.
    fn register(&self, token: &[u8], files: Vec<PyRef<'_, PyCopyFile>>) -> PyResult<()> {
        let token = token_of(token)?;
        let served = files
            .iter()
            .map(|f| Arc::clone(&f.inner) as Arc<dyn ServedFile>)
            .collect();
        self.server.register(token, served);
        Ok(())
    }

    /// Stops serving `token`'s files; False if they were not served.
    fn unregister(&self, token: &[u8]) -> PyResult<bool> {
        Ok(self.server.unregister(&token_of(token)?))
    }

    /// Milliseconds since `token`'s last request (or its registration); None if not served.
    fn idle_ms(&self, token: &[u8]) -> PyResult<Option<u64>> {
        Ok(self.server.idle_ms(&token_of(token)?))
    }

    /// Bytes of chunks sent so far.
    #[getter]
    fn bytes_served(&self) -> u64 {
        self.server.bytes_served()
    }

    /// Connections open now.
    #[getter]
    fn connections(&self) -> usize {
        self.server.connections()
    }

    /// Tests only: the next `n` chunks leave with a flipped byte after their CRC was taken.
    fn inject_corrupt_chunks(&self, n: u32) {
        self.server.inject_corrupt_chunks(n);
    }

    /// Stops listening, shuts every connection down and forgets every session.
    fn close(&self, py: Python<'_>) {
        py.detach(|| self.server.close());
    }
}

/// The target end of the data channel: one download of a session's files
/// (`nyala_copy::download`), its progress readable and cancellable while `run` blocks.
#[pyclass(frozen, name = "CopyDownload", module = "nyala._native")]
pub struct PyCopyDownload {
    progress: Download,
}

#[pymethods]
impl PyCopyDownload {
    #[new]
    fn new() -> Self {
        PyCopyDownload {
            progress: Download::new(),
        }
    }

    /// Bytes written so far.
    #[getter]
    fn bytes_done(&self) -> u64 {
        self.progress.bytes_done()
    }

    /// Chunks that failed their checks and were fetched again.
    #[getter]
    fn chunks_refetched(&self) -> u64 {
        self.progress.chunks_refetched()
    }

    /// Makes `run` stop after the chunks it is moving and raise `AbortedError`.
    fn cancel(&self) {
        self.progress.cancel();
    }

    /// Downloads `files` — `(index in the session, open writable fd, length)` each — from the
    /// session `token` of the source at `address` (`host:port`), with the GIL released;
    /// returns once every file is written and fsynced (the caller syncs the directories).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (address, token, files, *, chunk_bytes, streams, attempts, rate_bytes_per_s, timeout_ms))]
    fn run(
        &self,
        py: Python<'_>,
        address: &str,
        token: &[u8],
        files: Vec<(u32, i32, u64)>,
        chunk_bytes: u32,
        streams: usize,
        attempts: u32,
        rate_bytes_per_s: u64,
        timeout_ms: u64,
    ) -> PyResult<()> {
        let token = token_of(token)?;
        let files: Vec<nyala_copy::TargetFile> = files
            .into_iter()
            .map(|(index, fd, length)| nyala_copy::TargetFile { index, fd, length })
            .collect();
        let options = DownloadOptions {
            chunk_bytes,
            streams,
            attempts,
            rate_bytes_per_s,
            timeout: Duration::from_millis(timeout_ms),
        };
        py.detach(|| nyala_copy::download(address, token, &files, &options, &self.progress))
            .map_err(to_py)
    }
}
