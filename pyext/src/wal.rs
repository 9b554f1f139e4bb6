//! Bindings for the write-ahead log (`nyala._native.Log`); the typed API is `nyala.wal.Log`.
//!
//! Conversion and GIL handling only: every disk write, sync, wait and read runs with the GIL
//! released. Payloads that are immutable (`bytes`, read-only buffers) are borrowed while the
//! GIL is released; mutable buffers are copied first so Python code cannot change them.

use std::path::PathBuf;
use std::time::Duration;

use nyala_wal::{
    EntryRef, EntryType, Log, LogOptions, Preallocation, SyncPolicy, WalError, HISTOGRAM_BUCKETS,
};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyBaseException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::errors::to_py;

// Literal defaults in the signature (so Python sees them) must equal the Rust ones.
const _: () = assert!(nyala_wal::SEGMENT_SIZE_BYTES_DEFAULT == 8_388_608);
const _: () = assert!(nyala_wal::QUEUE_BYTES_MAX_DEFAULT == 67_108_864);
const _: () = assert!(nyala_wal::SYNCS_IN_FLIGHT_MAX_DEFAULT == 1);

/// Appends with at most this many payload bytes keep the GIL (see `PyLog::append`).
const SMALL_APPEND_BYTES_MAX: usize = 64 << 10;

/// How long one blocking wait sleeps before checking for KeyboardInterrupt.
const WAIT_SLICE_MS: u64 = 100;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLog>()?;
    m.add_class::<PyWalNotifier>()?;
    Ok(())
}

/// One eventfd that many logs signal durability on, each under a token (`nyala_wal::Notifier`;
/// see `nyala.consensus.runtime.wal_log.DurabilitySignals`).
#[pyclass(frozen, name = "WalNotifier", module = "nyala._native")]
pub struct PyWalNotifier {
    pub(crate) inner: std::sync::Arc<nyala_wal::Notifier>,
}

#[pymethods]
impl PyWalNotifier {
    #[new]
    fn new() -> PyResult<Self> {
        let inner = nyala_wal::Notifier::new().map_err(|e| {
            to_py(WalError::Io {
                op: "eventfd",
                path: PathBuf::new(),
                source: e,
            })
        })?;
        Ok(PyWalNotifier { inner })
    }

    /// The descriptor to watch: readable once a log signalled.
    fn fileno(&self) -> i32 {
        self.inner.fd()
    }

    /// Clears the descriptor; the tokens of the logs that signalled since the last call.
    fn take_ready(&self) -> Vec<u64> {
        self.inner.take_ready()
    }
}

/// An entry as returned to Python: `(term, index, type, payload)`.
type NativeEntry<'py> = (u64, u64, u8, Bound<'py, PyBytes>);

/// A payload ready to be read without the GIL.
enum Payload {
    /// Address and length of an immutable buffer kept alive by the caller's list.
    Borrowed(usize, usize),
    Owned(Vec<u8>),
}

/// One entry converted from Python, usable while the GIL is released.
struct StagedEntry {
    term: u64,
    index: u64,
    entry_type: EntryType,
    payload: Payload,
}

/// Keeps the Python objects behind borrowed payloads alive (the caller's iterable may be a
/// generator that holds no other reference to them).
struct Staged {
    entries: Vec<StagedEntry>,
    _bytes: Vec<Py<PyAny>>,
    _buffers: Vec<PyBuffer<u8>>,
}

impl Staged {
    fn from_python(entries: &Bound<'_, PyAny>) -> PyResult<Staged> {
        let mut staged = Staged {
            entries: Vec::new(),
            _bytes: Vec::new(),
            _buffers: Vec::new(),
        };
        for item in entries.try_iter()? {
            let (term, index, type_code, data): (u64, u64, u8, Bound<'_, PyAny>) =
                item?.extract()?;
            let entry_type = EntryType::from_u8(type_code).ok_or_else(|| {
                to_py(WalError::InvalidArgument(format!(
                    "unknown entry type {type_code}"
                )))
            })?;
            let payload = if let Ok(bytes) = data.cast::<PyBytes>() {
                let slice = bytes.as_bytes();
                let payload = Payload::Borrowed(slice.as_ptr() as usize, slice.len());
                staged._bytes.push(data.clone().unbind());
                payload
            } else {
                let buffer = PyBuffer::<u8>::get(&data)?;
                if buffer.readonly() && buffer.is_c_contiguous() {
                    let payload = Payload::Borrowed(buffer.buf_ptr() as usize, buffer.len_bytes());
                    staged._buffers.push(buffer);
                    payload
                } else {
                    Payload::Owned(buffer.to_vec(data.py())?)
                }
            };
            staged.entries.push(StagedEntry {
                term,
                index,
                entry_type,
                payload,
            });
        }
        Ok(staged)
    }

    /// The entries as borrowed refs (call only while `self` is alive).
    fn refs(&self) -> Vec<EntryRef<'_>> {
        self.entries
            .iter()
            .map(|e| {
                let payload: &[u8] = match &e.payload {
                    // SAFETY: the buffer is immutable and kept alive by `_buffers` (a
                    // `bytes` object or a read-only exporter) for as long as `self` lives.
                    Payload::Borrowed(ptr, len) => unsafe {
                        std::slice::from_raw_parts(*ptr as *const u8, *len)
                    },
                    Payload::Owned(bytes) => bytes,
                };
                EntryRef::new(e.term, e.index, e.entry_type, payload)
            })
            .collect()
    }
}

/// The write-ahead log of one tablet (native part; see `nyala.wal.Log`).
#[pyclass(frozen, name = "Log", module = "nyala._native")]
pub struct PyLog {
    log: Log,
}

#[pymethods]
impl PyLog {
    #[new]
    #[pyo3(signature = (
        directory,
        tablet_id,
        *,
        segment_size_bytes = 8388608,
        sync = "group",
        syncs_in_flight_max = 1,
        queue_bytes_max = 67108864,
        min_segments_to_retain = 1,
        preallocation = "recycle",
        recycle_pool_segments_max = 2,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        directory: PathBuf,
        tablet_id: &str,
        segment_size_bytes: u64,
        sync: &str,
        syncs_in_flight_max: usize,
        queue_bytes_max: usize,
        min_segments_to_retain: usize,
        preallocation: &str,
        recycle_pool_segments_max: usize,
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
        let preallocation = match preallocation {
            "fallocate" => Preallocation::Fallocate,
            "recycle" => Preallocation::Recycle,
            "zero_fill" => Preallocation::ZeroFill,
            other => {
                return Err(invalid(format!(
                    "preallocation must be 'fallocate', 'recycle' or 'zero_fill', not {other:?}"
                )))
            }
        };
        let options = LogOptions {
            segment_size_bytes,
            sync_policy,
            syncs_in_flight_max,
            queue_bytes_max,
            min_segments_to_retain,
            preallocation,
            recycle_pool_segments_max,
            ..LogOptions::default()
        };
        let log = py
            .detach(|| Log::open(&directory, tablet_id, options))
            .map_err(to_py)?;
        Ok(PyLog { log })
    }

    /// Queues entries `(term, index, type, payload)`; returns `(ticket, last_index)`.
    fn append(&self, py: Python<'_>, entries: &Bound<'_, PyAny>) -> PyResult<(u64, u64)> {
        let staged = Staged::from_python(entries)?;
        let refs = staged.refs();
        // Small appends only take a lock and copy a little: releasing and re-taking the GIL
        // would cost more than it saves. Large ones, or a full queue, release it.
        let bytes: usize = refs.iter().map(|e| e.payload.len()).sum();
        if bytes <= SMALL_APPEND_BYTES_MAX {
            if let Some(ticket) = self.log.try_append(&refs).map_err(to_py)? {
                return Ok((ticket.ticket, ticket.last_index));
            }
        }
        let ticket = py.detach(|| self.log.append(&refs)).map_err(to_py)?;
        Ok((ticket.ticket, ticket.last_index))
    }

    /// Queues a truncation after `last_kept`; returns its ticket.
    fn truncate_after(&self, py: Python<'_>, last_kept: u64) -> PyResult<u64> {
        py.detach(|| self.log.truncate_after(last_kept))
            .map_err(to_py)
    }

    /// Truncates after `last_kept` and appends `entries` in one step.
    fn truncate_and_append(
        &self,
        py: Python<'_>,
        last_kept: u64,
        entries: &Bound<'_, PyAny>,
    ) -> PyResult<(u64, u64)> {
        let staged = Staged::from_python(entries)?;
        let refs = staged.refs();
        let ticket = py
            .detach(|| self.log.truncate_and_append(last_kept, &refs))
            .map_err(to_py)?;
        Ok((ticket.ticket, ticket.last_index))
    }

    /// Blocks (GIL released) until `ticket` is durable; `False` if `timeout_s` passed first.
    #[pyo3(signature = (ticket, timeout_s = None))]
    fn wait(&self, py: Python<'_>, ticket: u64, timeout_s: Option<f64>) -> PyResult<bool> {
        let deadline =
            timeout_s.map(|s| std::time::Instant::now() + Duration::from_secs_f64(s.max(0.0)));
        loop {
            let slice = match deadline {
                Some(deadline) => deadline
                    .saturating_duration_since(std::time::Instant::now())
                    .min(Duration::from_millis(WAIT_SLICE_MS)),
                None => Duration::from_millis(WAIT_SLICE_MS),
            };
            let done = py
                .detach(|| self.log.wait_timeout(ticket, slice))
                .map_err(to_py)?;
            if done {
                return Ok(true);
            }
            if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                return Ok(false);
            }
            py.check_signals()?;
        }
    }

    fn durable_ticket(&self) -> u64 {
        self.log.durable_ticket()
    }

    fn durable_index(&self) -> u64 {
        self.log.durable_index()
    }

    /// `(term, index)` of the last appended entry.
    fn last_op_id(&self) -> (u64, u64) {
        let op = self.log.last_op_id();
        (op.term, op.index)
    }

    fn term_at(&self, index: u64) -> Option<u64> {
        self.log.term_at(index)
    }

    fn first_index(&self) -> u64 {
        self.log.first_index()
    }

    /// Entries `from_index..=to_index` as `(term, index, type, payload)`, up to `max_bytes`.
    fn read<'py>(
        &self,
        py: Python<'py>,
        from_index: u64,
        to_index: u64,
        max_bytes: usize,
    ) -> PyResult<Vec<NativeEntry<'py>>> {
        let entries = py
            .detach(|| self.log.read(from_index, to_index, max_bytes))
            .map_err(to_py)?;
        Ok(entries
            .into_iter()
            .map(|e| {
                (
                    e.term,
                    e.index,
                    e.entry_type.as_u8(),
                    PyBytes::new(py, &e.payload),
                )
            })
            .collect())
    }

    fn register_anchor(&self, index: u64) -> u64 {
        self.log.register_anchor(index).0
    }

    fn update_anchor(&self, anchor: u64, index: u64) -> PyResult<()> {
        self.log
            .update_anchor(nyala_wal::AnchorId(anchor), index)
            .map_err(to_py)
    }

    fn release_anchor(&self, anchor: u64) -> PyResult<()> {
        self.log
            .release_anchor(nyala_wal::AnchorId(anchor))
            .map_err(to_py)
    }

    /// Runs GC; returns `(segments_deleted, segments_recycled, first_index)`.
    fn gc(&self, py: Python<'_>) -> PyResult<(usize, usize, u64)> {
        let report = py.detach(|| self.log.gc()).map_err(to_py)?;
        Ok((
            report.segments_deleted,
            report.segments_recycled,
            report.first_index,
        ))
    }

    /// Counters as a dict of ints (histograms as lists of power-of-two bucket counts).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.log.metrics();
        let dict = PyDict::new(py);
        let counters = [
            ("entries_appended", m.entries_appended),
            ("batches_appended", m.batches_appended),
            ("truncations", m.truncations),
            ("bytes_written", m.bytes_written),
            ("groups", m.groups),
            ("group_entries_max", m.group_entries_max),
            ("syncs", m.syncs),
            ("sync_micros_total", m.sync_micros_total),
            ("sync_micros_max", m.sync_micros_max),
            ("syncs_overlapped", m.syncs_overlapped),
            ("sync_threads", m.sync_threads),
            ("segments_created", m.segments_created),
            ("segments_zero_filled", m.segments_zero_filled),
            ("segments_recycled", m.segments_recycled),
            ("segments_deleted", m.segments_deleted),
            ("fallocate_fallbacks", m.fallocate_fallbacks),
            ("rollover_waits", m.rollover_waits),
            ("rollover_wait_micros_total", m.rollover_wait_micros_total),
            ("append_backpressure_waits", m.append_backpressure_waits),
        ];
        for (name, value) in counters {
            dict.set_item(name, value)?;
        }
        debug_assert_eq!(m.group_entries_histogram.len(), HISTOGRAM_BUCKETS);
        dict.set_item(
            "group_entries_histogram",
            m.group_entries_histogram.to_vec(),
        )?;
        dict.set_item("sync_micros_histogram", m.sync_micros_histogram.to_vec())?;
        Ok(dict)
    }

    /// A descriptor that becomes readable when the durable point moves or the log fails.
    fn notification_fd(&self) -> i32 {
        self.log.notification_fd()
    }

    fn drain_notifications(&self) {
        self.log.drain_notifications();
    }

    /// The exception the log failed with, or `None`.
    fn failure(&self, py: Python<'_>) -> Option<Py<PyBaseException>> {
        self.log.failure().map(|err| to_py(err).into_value(py))
    }

    fn segment_paths(&self) -> Vec<String> {
        self.log
            .segment_paths()
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect()
    }

    /// Writes what is queued, closes the active segment and stops the log's threads.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.log.close()).map_err(to_py)
    }

    /// FAULT INJECTION, tests only: the next `count` syncs fail with `errno`.
    fn _inject_sync_failures(&self, count: u32, errno: i32) {
        self.log.fault_injection().fail_next_syncs(count, errno);
    }

    /// FAULT INJECTION, tests and benchmarks only: the next `count` syncs first sleep
    /// `delay_s` seconds (a slow device, without another process's I/O on the disk).
    fn _inject_sync_delays(&self, count: u32, delay_s: f64) {
        self.log
            .fault_injection()
            .delay_next_syncs(count, Duration::from_secs_f64(delay_s.max(0.0)));
    }

    /// FAULT INJECTION, tests only: preallocate as if `fallocate` were unsupported.
    fn _inject_fallocate_unsupported(&self, unsupported: bool) {
        self.log
            .fault_injection()
            .set_fallocate_unsupported(unsupported);
    }
}

fn invalid(message: String) -> PyErr {
    to_py(WalError::InvalidArgument(message))
}
