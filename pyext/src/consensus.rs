//! Bindings for the replicated log (`nyala._native.ReplicatedLog`, `nyala._native.EntryBatch`);
//! the typed API is `nyala.consensus.wal_log`.
//!
//! Conversion and GIL handling only. Every call that touches the WAL, decodes or builds a
//! batch runs with the GIL released. A batch crosses as one object holding its bytes:
//! decoding borrows the caller's immutable `bytes` (no copy), and no Python object is made
//! per entry except for NO_OP and CONFIG_CHANGE entries when asked.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nyala_common::OpId;
use nyala_consensus::{
    AnswerSink, ConsensusError, DurableAnswer, EntryBatch, ReplicatedLog, ReplicatedLogOptions,
};
use nyala_wal::{AnchorId, EntryType, LogOptions, SyncPolicy};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyBaseException, PyConnectionResetError, PyOSError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyDict};

use crate::copy::PyCopyFile;
use crate::errors::to_py;
use crate::wal::PyWalNotifier;

/// How long one blocking wait sleeps before checking for KeyboardInterrupt.
const WAIT_SLICE_MS: u64 = 100;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEntryBatch>()?;
    m.add_class::<PyReplicatedLog>()?;
    m.add_class::<PyAnswerSink>()?;
    m.add_class::<PyDurableAnswer>()?;
    m.add_function(wrap_pyfunction!(split_proto_field, m)?)?;
    m.add_function(wrap_pyfunction!(split_proto_repeated, m)?)?;
    Ok(())
}

/// `(term, index)` as Python sees an OpId.
type OpIdTuple = (u64, u64);

/// `(term, index, wal entry type, payload)` of a NO_OP or CONFIG_CHANGE entry.
type ControlEntry<'py> = (u64, u64, u8, Bound<'py, PyBytes>);

/// What `split_proto_field` returns: the message without the field, and the field's range.
type SplitField<'py> = (Bound<'py, PyBytes>, Option<(usize, usize)>);

/// A byte range `start..end` of a message.
type Span = (usize, usize);

/// What `split_proto_repeated` returns: the message without the field, and every range of it.
type SplitRepeated<'py> = (Bound<'py, PyBytes>, Vec<Span>);

/// What `append_replicated` returns to Python.
type AppendOutcomeTuple = (bool, OpIdTuple, u64, Option<u64>, u64);

fn op_tuple(op: OpId) -> OpIdTuple {
    (op.term, op.index)
}

fn invalid(message: String) -> PyErr {
    to_py(ConsensusError::InvalidArgument(message))
}

/// A run of log entries in wire encoding (native part; see `nyala.consensus.wal_log`).
#[pyclass(frozen, name = "EntryBatch", module = "nyala._native")]
pub struct PyEntryBatch {
    pub(crate) batch: EntryBatch,
}

#[pymethods]
impl PyEntryBatch {
    /// Validates an encoded batch (checksums, framing, order) and keeps its bytes: all of
    /// `data`, or `data[start:end]` (still without a copy: the batch holds `data`).
    #[staticmethod]
    #[pyo3(signature = (data, start = 0, end = None))]
    fn decode(
        py: Python<'_>,
        data: PyBackedBytes,
        start: usize,
        end: Option<usize>,
    ) -> PyResult<Self> {
        let end = end.unwrap_or(data.len());
        if start > end || end > data.len() {
            return Err(invalid(format!(
                "range {start}..{end} is outside the {} bytes given",
                data.len()
            )));
        }
        let batch = if start == 0 && end == data.len() {
            py.detach(|| EntryBatch::decode(data))
        } else {
            py.detach(|| EntryBatch::decode(ByteRange { data, start, end }))
        }
        .map_err(to_py)?;
        Ok(PyEntryBatch { batch })
    }

    /// The wire encoding.
    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.batch.as_bytes())
    }

    /// The wire encoding without a copy (`memoryview(batch)`); read-only, and valid while
    /// the view lives, as the batch's bytes never change.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        let data = slf.get().batch.as_bytes();
        // SAFETY: `view` comes from the interpreter; the memory belongs to `slf`, which the
        // view keeps alive (FillInfo takes a reference) and which is immutable (frozen, and
        // the batch's storage is never written after it is built).
        let status = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                data.as_ptr() as *mut std::os::raw::c_void,
                data.len() as pyo3::ffi::Py_ssize_t,
                1,
                flags,
            )
        };
        if status == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {}

    #[getter]
    fn first_op_id(&self) -> OpIdTuple {
        op_tuple(self.batch.first_op_id())
    }

    #[getter]
    fn last_op_id(&self) -> OpIdTuple {
        op_tuple(self.batch.last_op_id())
    }

    #[getter]
    fn size_bytes(&self) -> usize {
        self.batch.size_bytes()
    }

    fn __len__(&self) -> usize {
        self.batch.len()
    }

    /// The NO_OP and CONFIG_CHANGE entries as `(term, index, wal entry type, payload)`.
    fn control_entries<'py>(&self, py: Python<'py>) -> Vec<ControlEntry<'py>> {
        self.batch
            .control_entries()
            .map(|e| {
                (
                    e.term,
                    e.index,
                    e.entry_type.as_u8(),
                    PyBytes::new(py, e.payload),
                )
            })
            .collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "EntryBatch({}..{}, {} entries, {} bytes)",
            self.batch.first_op_id(),
            self.batch.last_op_id(),
            self.batch.len(),
            self.batch.size_bytes()
        )
    }
}

/// One replica's log: the WAL plus a log cache (native part; see `nyala.consensus.wal_log`).
#[pyclass(frozen, name = "ReplicatedLog", module = "nyala._native")]
pub struct PyReplicatedLog {
    pub(crate) log: ReplicatedLog,
}

#[pymethods]
impl PyReplicatedLog {
    #[new]
    #[pyo3(signature = (
        directory,
        tablet_id,
        *,
        cache_bytes_max = nyala_consensus::CACHE_BYTES_MAX_DEFAULT,
        segment_size_bytes = nyala_wal::SEGMENT_SIZE_BYTES_DEFAULT,
        sync = "group",
        queue_bytes_max = nyala_wal::QUEUE_BYTES_MAX_DEFAULT,
        min_segments_to_retain = 1,
        notifier = None,
        notifier_token = 0,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        directory: PathBuf,
        tablet_id: &str,
        cache_bytes_max: usize,
        segment_size_bytes: u64,
        sync: &str,
        queue_bytes_max: usize,
        min_segments_to_retain: usize,
        notifier: Option<PyRef<'_, PyWalNotifier>>,
        notifier_token: u64,
    ) -> PyResult<Self> {
        let sync_policy = match sync {
            "group" => SyncPolicy::Group,
            "none" => SyncPolicy::None,
            other => {
                return Err(invalid(format!(
                    "sync must be 'group' or 'none', not {other:?}"
                )))
            }
        };
        let wal_options = LogOptions {
            segment_size_bytes,
            sync_policy,
            queue_bytes_max,
            min_segments_to_retain,
            notifier: notifier.map(|n| (std::sync::Arc::clone(&n.inner), notifier_token)),
            ..LogOptions::default()
        };
        let options = ReplicatedLogOptions { cache_bytes_max };
        let log = py
            .detach(|| ReplicatedLog::open(&directory, tablet_id, wal_options, options))
            .map_err(to_py)?;
        Ok(PyReplicatedLog { log })
    }

    /// Appends one entry after the last (leader side); returns its `(term, index)`.
    fn append(
        &self,
        py: Python<'_>,
        term: u64,
        entry_type: u8,
        payload: &[u8],
    ) -> PyResult<OpIdTuple> {
        let entry_type = EntryType::from_u8(entry_type)
            .ok_or_else(|| invalid(format!("unknown entry type {entry_type}")))?;
        py.detach(|| self.log.append(term, entry_type, payload))
            .map(op_tuple)
            .map_err(to_py)
    }

    /// Appends one entry per payload after the last (leader side), as batches of at most
    /// `batch_bytes_max` encoded bytes; returns the last one's `(term, index)`.
    fn append_many(
        &self,
        py: Python<'_>,
        term: u64,
        entry_type: u8,
        payloads: Vec<PyBackedBytes>,
        batch_bytes_max: usize,
    ) -> PyResult<OpIdTuple> {
        let entry_type = EntryType::from_u8(entry_type)
            .ok_or_else(|| invalid(format!("unknown entry type {entry_type}")))?;
        if payloads.is_empty() {
            return Err(invalid("append_many of no payload".to_string()));
        }
        py.detach(|| {
            self.log
                .append_many(term, entry_type, &payloads, batch_bytes_max)
        })
        .map(op_tuple)
        .map_err(to_py)
    }

    /// The entries after `after_index` (none after `last_index`), at most `bytes_max`
    /// encoded bytes (at least one).
    #[pyo3(signature = (after_index, bytes_max, last_index = u64::MAX))]
    fn read_batch(
        &self,
        py: Python<'_>,
        after_index: u64,
        bytes_max: usize,
        last_index: u64,
    ) -> PyResult<Option<PyEntryBatch>> {
        let batch = py
            .detach(|| self.log.read_range(after_index, last_index, bytes_max))
            .map_err(to_py)?;
        Ok(batch.map(|batch| PyEntryBatch { batch }))
    }

    /// The cached batch of the entries after `after_index`, shared (no copy), if the cache
    /// holds it whole and it ends by `last_index`; else None (use `read_batch`).
    #[pyo3(signature = (after_index, last_index = u64::MAX))]
    fn read_whole_batch(&self, after_index: u64, last_index: u64) -> Option<PyEntryBatch> {
        self.log
            .read_whole_batch(after_index, last_index)
            .map(|batch| PyEntryBatch { batch })
    }

    /// The follower's UpdateConsensus log step; returns
    /// `(matched, last_received, hint_index, truncated_from, durable_index)`.
    #[pyo3(signature = (preceding, batch, committed_index))]
    fn append_replicated(
        &self,
        py: Python<'_>,
        preceding: OpIdTuple,
        batch: Option<PyRef<'_, PyEntryBatch>>,
        committed_index: u64,
    ) -> PyResult<AppendOutcomeTuple> {
        let batch = batch.map(|b| b.batch.clone());
        let preceding = OpId::new(preceding.0, preceding.1);
        let outcome = py
            .detach(|| {
                self.log
                    .append_replicated(preceding, batch.as_ref(), committed_index)
            })
            .map_err(to_py)?;
        Ok((
            outcome.matched,
            op_tuple(outcome.last_received),
            outcome.hint_index,
            outcome.truncated_from,
            outcome.durable_index,
        ))
    }

    fn last_op_id(&self) -> OpIdTuple {
        op_tuple(self.log.last_op_id())
    }

    /// FAULT INJECTION, tests only: the next `count` syncs of the WAL fail with `errno`.
    fn _inject_sync_failures(&self, count: u32, errno: i32) {
        self.log
            .wal()
            .fault_injection()
            .fail_next_syncs(count, errno);
    }

    /// FAULT INJECTION, tests only: the next `count` syncs of the WAL first sleep `delay_s`.
    fn _inject_sync_delays(&self, count: u32, delay_s: f64) {
        self.log
            .wal()
            .fault_injection()
            .delay_next_syncs(count, Duration::from_secs_f64(delay_s.max(0.0)));
    }

    /// Writes `frame` to `sink` once everything appended so far is durable, from the WAL
    /// committer whose sync made it so (at once if it is); the handle takes it back.
    fn answer_when_durable(
        &self,
        py: Python<'_>,
        sink: &PyAnswerSink,
        frame: PyBackedBytes,
    ) -> PyDurableAnswer {
        let sink = Arc::clone(&sink.sink);
        let frame = frame.to_vec();
        let answer = py.detach(|| self.log.answer_when_durable(sink, frame));
        PyDurableAnswer { answer }
    }

    /// While `quiet`, the WAL's durable changes do not signal its notifier (failures do);
    /// turning it off signals once if a change went unsignalled
    /// (`nyala_wal::Log::set_quiet_durability`).
    fn set_quiet_durability(&self, quiet: bool) {
        self.log.wal().set_quiet_durability(quiet);
    }

    fn term_at(&self, index: u64) -> Option<u64> {
        self.log.term_at(index)
    }

    fn durable_index(&self) -> u64 {
        self.log.durable_index()
    }

    fn first_index(&self) -> u64 {
        self.log.wal().first_index()
    }

    /// CONFIG_CHANGE entries above `index` as `(term, index, payload)`.
    fn config_entries_after<'py>(
        &self,
        py: Python<'py>,
        index: u64,
    ) -> Vec<(u64, u64, Bound<'py, PyBytes>)> {
        self.log
            .config_entries_after(index)
            .into_iter()
            .map(|c| (c.op_id.term, c.op_id.index, PyBytes::new(py, &c.payload)))
            .collect()
    }

    /// Blocks (GIL released) until everything appended so far is durable; `False` if
    /// `timeout_s` passed first.
    #[pyo3(signature = (timeout_s = None))]
    fn wait_durable(&self, py: Python<'_>, timeout_s: Option<f64>) -> PyResult<bool> {
        let deadline = timeout_s.map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
        loop {
            let slice = match deadline {
                Some(deadline) => deadline
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(WAIT_SLICE_MS)),
                None => Duration::from_millis(WAIT_SLICE_MS),
            };
            let done = py
                .detach(|| self.log.wait_durable(Some(slice)))
                .map_err(to_py)?;
            if done {
                return Ok(true);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }

    /// A descriptor that becomes readable when the durable point moves or the log fails.
    fn notification_fd(&self) -> i32 {
        self.log.wal().notification_fd()
    }

    fn drain_notifications(&self) {
        self.log.wal().drain_notifications();
    }

    /// Closes the segment files while the log is idle; whether it was (`Log::release_files`).
    fn release_files(&self) -> bool {
        self.log.wal().release_files()
    }

    /// The exception the WAL failed with, or `None`.
    fn failure(&self, py: Python<'_>) -> Option<Py<PyBaseException>> {
        self.log
            .wal()
            .failure()
            .map(|err| to_py(err).into_value(py))
    }

    /// Frees cached entries at or below `index` that are durable.
    fn evict_through(&self, index: u64) {
        self.log.evict_through(index);
    }

    /// What the log cache holds: `first_index`, `entries`, `bytes`, `bytes_max`.
    fn cache_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.log.cache_stats();
        let dict = PyDict::new(py);
        dict.set_item("first_index", stats.first_index)?;
        dict.set_item("entries", stats.entries)?;
        dict.set_item("bytes", stats.bytes)?;
        dict.set_item("bytes_max", stats.bytes_max)?;
        Ok(dict)
    }

    /// Writes what is queued and closes the WAL; later appends fail.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.log.wal().close()).map_err(to_py)
    }

    /// Keeps every entry at or after `index` from GC until released; returns the anchor id.
    fn register_anchor(&self, index: u64) -> u64 {
        self.log.wal().register_anchor(index).0
    }

    /// Moves an anchor to `index`.
    fn update_anchor(&self, anchor: u64, index: u64) -> PyResult<()> {
        self.log
            .wal()
            .update_anchor(AnchorId(anchor), index)
            .map_err(to_py)
    }

    /// Every anchor as `(anchor_id, index)`, by anchor id.
    fn anchors(&self) -> Vec<(u64, u64)> {
        self.log
            .wal()
            .anchors()
            .into_iter()
            .map(|(id, index)| (id.0, index))
            .collect()
    }

    /// Releases an anchor.
    fn release_anchor(&self, anchor: u64) -> PyResult<()> {
        self.log
            .wal()
            .release_anchor(AnchorId(anchor))
            .map_err(to_py)
    }

    /// Removes closed segments below the anchors and the durable index; returns
    /// `(segments_deleted, segments_recycled, first_index)`.
    fn gc(&self, py: Python<'_>) -> PyResult<(usize, usize, u64)> {
        let report = py.detach(|| self.log.wal().gc()).map_err(to_py)?;
        Ok((
            report.segments_deleted,
            report.segments_recycled,
            report.first_index,
        ))
    }

    /// The log's copy image (`nyala_wal::Log::copy_image`): one `CopyFile` per segment with
    /// durable data, each of fixed length.
    fn copy_image(&self, py: Python<'_>) -> PyResult<Vec<PyCopyFile>> {
        let images = py.detach(|| self.log.wal().copy_image()).map_err(to_py)?;
        Ok(images.into_iter().map(PyCopyFile::from_segment).collect())
    }

    /// Paths of the live segments, oldest first (the last is being appended to).
    fn segment_paths(&self) -> Vec<String> {
        self.log
            .wal()
            .segment_paths()
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect()
    }
}

/// `data[start..end]` of a Python `bytes`, which it keeps alive (a received message whose
/// entries field becomes a batch without being copied out).
pub(crate) struct ByteRange {
    data: PyBackedBytes,
    start: usize,
    end: usize,
}

impl ByteRange {
    /// `data[start..end]`; the caller checked the range lies within `data`.
    pub(crate) fn new(data: PyBackedBytes, start: usize, end: usize) -> Self {
        debug_assert!(start <= end && end <= data.len());
        ByteRange { data, start, end }
    }
}

impl AsRef<[u8]> for ByteRange {
    fn as_ref(&self) -> &[u8] {
        &self.data[self.start..self.end]
    }
}

/// Splits a serialized protobuf message: returns the message without field `field_number`
/// (a copy of the other fields, which are small) and the byte range of that field's value
/// in `data` (its last occurrence, as protobuf reads a repeated singular field), or `None`.
/// The field must be length-delimited.
#[pyfunction]
pub fn split_proto_field<'py>(
    py: Python<'py>,
    data: &[u8],
    field_number: u32,
) -> PyResult<SplitField<'py>> {
    let (rest, found) = split_fields(data, field_number)?;
    Ok((PyBytes::new(py, &rest), found.last().copied()))
}

/// `split_proto_field` for a repeated field of a message in any contiguous buffer: the byte
/// ranges of every occurrence, in order (a follower takes a peer channel frame's requests
/// out of the connection's buffer without protobuf copying the whole frame first).
#[pyfunction]
pub fn split_proto_repeated<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    field_number: u32,
) -> PyResult<SplitRepeated<'py>> {
    let buffer = PyBuffer::<u8>::get(data)?;
    if !buffer.is_c_contiguous() {
        return Err(invalid(
            "split_proto_repeated needs a contiguous buffer".into(),
        ));
    }
    // SAFETY: the GIL is held throughout and no Python code runs, so nothing can change or
    // free the buffer, which `buffer` keeps exported, while the slice is read.
    let bytes =
        unsafe { std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, buffer.len_bytes()) };
    let (rest, found) = split_fields(bytes, field_number)?;
    Ok((PyBytes::new(py, &rest), found))
}

/// The fields of `data` other than `field_number`, and the ranges of that field's values.
fn split_fields(data: &[u8], field_number: u32) -> PyResult<(Vec<u8>, Vec<Span>)> {
    let end = data.len();
    let mut rest = Vec::new();
    let mut found = Vec::new();
    let mut at = 0;
    while at < end {
        let field_start = at;
        let key = take_varint(data, &mut at)?;
        let value_start;
        match key & 7 {
            0 => {
                take_varint(data, &mut at)?;
                value_start = at;
            }
            1 | 5 => {
                at += if key & 7 == 1 { 8 } else { 4 };
                value_start = at;
            }
            2 => {
                let len = take_varint(data, &mut at)?;
                value_start = at;
                at = usize::try_from(len)
                    .ok()
                    .and_then(|len| at.checked_add(len))
                    .unwrap_or(usize::MAX);
            }
            other => {
                return Err(invalid(format!(
                    "protobuf wire type {other} at byte {field_start} is not supported"
                )))
            }
        }
        if at > end {
            return Err(invalid(format!(
                "protobuf field at byte {field_start} runs past the {end} byte data"
            )));
        }
        if key >> 3 == u64::from(field_number) {
            if key & 7 != 2 {
                return Err(invalid(format!(
                    "protobuf field {field_number} is not length-delimited"
                )));
            }
            found.push((value_start, at));
        } else {
            rest.extend_from_slice(&data[field_start..at]);
        }
    }
    Ok((rest, found))
}

/// Reads a protobuf varint at `*at`, advancing past it.
fn take_varint(data: &[u8], at: &mut usize) -> PyResult<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&byte) = data.get(*at) else {
            return Err(invalid(format!(
                "protobuf varint cut short at byte {}",
                *at
            )));
        };
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(invalid(format!("protobuf varint too long at byte {}", *at)))
}

/// The follower's side of a peer channel connection (`nyala_consensus::AnswerSink`): frames
/// written from the event loop and from WAL committers, in order, never interleaved.
#[pyclass(frozen, name = "AnswerSink", module = "nyala._native")]
pub struct PyAnswerSink {
    pub(crate) sink: Arc<AnswerSink>,
}

fn sink_error(err: std::io::Error) -> PyErr {
    match err.kind() {
        std::io::ErrorKind::NotConnected
        | std::io::ErrorKind::BrokenPipe
        | std::io::ErrorKind::ConnectionReset => PyConnectionResetError::new_err(err.to_string()),
        _ => PyOSError::new_err(err.to_string()),
    }
}

#[pymethods]
impl PyAnswerSink {
    /// A sink writing to a duplicate of the connected socket `fd`.
    #[new]
    fn new(fd: i32) -> PyResult<Self> {
        let sink = AnswerSink::new(fd).map_err(sink_error)?;
        Ok(PyAnswerSink {
            sink: Arc::new(sink),
        })
    }

    /// Writes one frame after what is pending; returns the bytes still pending.
    fn write_frame(&self, py: Python<'_>, data: PyBackedBytes) -> PyResult<usize> {
        py.detach(|| self.sink.write_frame(&data))
            .map_err(sink_error)
    }

    /// Sends what is pending; returns what is still pending.
    fn flush(&self, py: Python<'_>) -> PyResult<usize> {
        py.detach(|| self.sink.flush()).map_err(sink_error)
    }

    fn pending(&self) -> usize {
        self.sink.pending()
    }

    /// The duplicate descriptor (watch it for writability while bytes are pending), or
    /// None once closed.
    fn fileno(&self) -> Option<i32> {
        self.sink.fd()
    }

    /// Readable once a committer left bytes pending; ``drain_wake`` clears it.
    fn wake_fd(&self) -> i32 {
        self.sink.wake_fd()
    }

    fn drain_wake(&self) {
        self.sink.drain_wake();
    }

    /// Closes the duplicate descriptor and drops what is pending.
    fn close(&self) {
        self.sink.close();
    }

    #[getter]
    fn closed(&self) -> bool {
        self.sink.is_closed()
    }
}

/// An answer handed to ``ReplicatedLog.answer_when_durable``.
#[pyclass(frozen, name = "DurableAnswer", module = "nyala._native")]
pub struct PyDurableAnswer {
    answer: DurableAnswer,
}

impl PyDurableAnswer {
    pub(crate) fn new(answer: DurableAnswer) -> Self {
        PyDurableAnswer { answer }
    }
}

#[pymethods]
impl PyDurableAnswer {
    /// Takes the answer back: True if the log has not written it and never will.
    fn cancel(&self) -> bool {
        self.answer.cancel()
    }

    /// Whether the log wrote it.
    fn sent(&self) -> bool {
        self.answer.sent()
    }
}
