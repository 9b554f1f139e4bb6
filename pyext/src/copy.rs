//! Tablet copy's source reads (`nyala._native.CopyFile`): one file of a copy session with a
//! fixed length (a rowset file as it was when the session opened it, or a WAL segment's copy
//! image), read straight into the bytes of the answer.
//!
//! `read_message` builds a whole serialized FetchData answer in one `bytes`: the message
//! without its data (serialized by Python's protobuf, which stays the format's only home),
//! then the data field's tag and length, then the data, `pread` into place with the GIL
//! released and checksummed there. No other copy of the chunk is made on this side.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use nyala_common::{Classify, ErrorKind};
use nyala_wal::SegmentImage;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::consensus::put_varint;
use crate::errors::to_py;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCopyFile>()?;
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
    source: Source,
    length: u64,
}

impl PyCopyFile {
    pub(crate) fn from_segment(image: SegmentImage) -> Self {
        PyCopyFile {
            length: image.length(),
            source: Source::Segment(image),
        }
    }

    /// The chunk at `offset` of at most `length_max` bytes: its length, checked.
    fn chunk_len(&self, offset: u64, length_max: u64) -> PyResult<usize> {
        if offset > self.length {
            return Err(invalid(format!(
                "offset {offset} is past the end of {} ({} bytes)",
                self.name(),
                self.length
            )));
        }
        Ok(length_max.min(self.length - offset) as usize)
    }

    /// Fills `buf` from `offset` (within the length); the GIL must be released by the caller.
    fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<(), PyErrState> {
        match &self.source {
            Source::File { file, path } => file.read_exact_at(buf, offset).map_err(|e| {
                PyErrState::File(CopyFileError {
                    kind: ErrorKind::of_io(&e),
                    message: format!("read {}: {e}", path.display()),
                })
            }),
            Source::Segment(image) => image.read_at(offset, buf).map_err(PyErrState::Wal),
        }
    }
}

/// An error raised without the GIL, turned into a Python exception once it is held again.
enum PyErrState {
    File(CopyFileError),
    Wal(nyala_wal::WalError),
}

impl PyErrState {
    fn into_py(self) -> PyErr {
        match self {
            PyErrState::File(e) => to_py(e),
            PyErrState::Wal(e) => to_py(e),
        }
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
            source: Source::File { file, path },
            length,
        })
    }

    /// The file's name (a rowset file's base name, or `wal-%09d`).
    #[getter]
    fn name(&self) -> String {
        match &self.source {
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
        self.length
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
        let bytes = PyBytes::new_with(py, len, |buf| {
            crc = py
                .detach(|| {
                    self.read_into(offset, buf)?;
                    Ok(crc32c::crc32c(buf))
                })
                .map_err(PyErrState::into_py)?;
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
        put_varint(&mut head, (u64::from(field_number) << 3) | 2);
        put_varint(&mut head, len as u64);
        let data_at = head.len();
        PyBytes::new_with(py, data_at + len, |out| {
            let (front, data) = out.split_at_mut(data_at);
            let crc = py
                .detach(|| {
                    self.read_into(offset, data)?;
                    Ok(crc32c::crc32c(data))
                })
                .map_err(PyErrState::into_py)?;
            let real: Vec<u8> = prefix.call1((crc, len))?.extract()?;
            if real.len() != sized.len() {
                return Err(invalid(format!(
                    "the message prefix is {} bytes with CRC {crc:#010x} but {} with 0",
                    real.len(),
                    sized.len()
                )));
            }
            head[..real.len()].copy_from_slice(&real);
            front.copy_from_slice(&head);
            Ok(())
        })
    }
}
