//! Bindings for the tablet storage engine (`nyala._native.StorageEngine`).
//!
//! Schemas cross as plain tuples (the typed Python side is `nyala.schema`), batches cross as
//! pyarrow objects through the Arrow C data interface (zero-copy), and op-batch IPC bytes are
//! copied once into an Arrow buffer. Every call that touches disk or loops over rows releases
//! the GIL, except `check_op_batch` on a small batch (`crate::gil`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayData, ArrayRef, RecordBatch};
use arrow::buffer::Buffer;
use arrow::datatypes::{Schema as ArrowSchema, SchemaRef};
use arrow::pyarrow::{PyArrowType, Table};
use nyala_consensus::ReplicatedLog;
use nyala_storage::{
    apply_write_entries, encode_ipc, Admission, ColumnSchema, DataType, Engine, EngineOptions,
    OpBatch, Predicate, PredicateOp, RequestResult, ScanSpec, Schema, StorageError, Value,
    WriteEffect, WriteOutcome,
};
use nyala_wal::EntryType;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyString};

use crate::consensus::PyReplicatedLog;
use crate::errors::to_py;

/// One column as Python passes it: (id, name, type name, nullable, default or None).
pub(crate) type ColumnTuple = (u32, String, String, bool, Option<Py<PyAny>>);
/// A schema as Python passes it: (columns, key column count, version, next column id).
pub(crate) type SchemaTuple = (Vec<ColumnTuple>, usize, u32, u32);

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<StorageEngine>()?;
    m.add_class::<ScanCursor>()?;
    m.add_function(wrap_pyfunction!(check_op_batch, m)?)?;
    m.add_function(wrap_pyfunction!(decode_write_entry, m)?)?;
    m.add_function(wrap_pyfunction!(set_key_block_cache_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(key_block_cache_stats, m)?)?;
    m.add_function(wrap_pyfunction!(rowset_index_bytes, m)?)?;
    m.add("CELL_BYTES_MAX", nyala_storage::ops::CELL_BYTES_MAX)?;
    m.add("ROW_BYTES_MAX", nyala_storage::ops::ROW_BYTES_MAX)?;
    Ok(())
}

/// Sets the budget of the process-wide cache of rowsets' key blocks, which presence checks
/// (INSERT, UPDATE, DELETE against flushed rows) read (`nyala_storage::key_blocks`).
#[pyfunction]
fn set_key_block_cache_bytes(bytes: usize) {
    nyala_storage::set_key_block_cache_bytes(bytes);
}

/// The key block cache: bytes, blocks, hits, misses.
#[pyfunction]
fn key_block_cache_stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let (bytes, blocks, hits, misses) = nyala_storage::key_block_cache_stats();
    let d = PyDict::new(py);
    d.set_item("bytes", bytes)?;
    d.set_item("blocks", blocks)?;
    d.set_item("hits", hits)?;
    d.set_item("misses", misses)?;
    Ok(d)
}

/// Bytes the process's open rowsets hold in memory while open (bloom filters, Parquet
/// footers, key ranges, sparse key indexes; `nyala_storage::diskrowset::index_bytes`).
#[pyfunction]
fn rowset_index_bytes() -> usize {
    nyala_storage::diskrowset::index_bytes()
}

/// The rows of an op batch (a pyarrow RecordBatch: columns by name, any left out, plus the op
/// column) that break a rule of `schema`, as (row, status code, message) in row order: the
/// per-row checks every tablet replica applies (`nyala_storage::ops::check_op_batch`).
#[pyfunction]
fn check_op_batch(
    py: Python<'_>,
    batch: PyArrowType<RecordBatch>,
    schema: SchemaTuple,
) -> PyResult<Vec<(usize, u8, String)>> {
    let schema = schema_from_py(py, schema)?;
    let small = crate::gil::is_small(&batch.0);
    let problems = crate::gil::detach_unless(py, small, move || {
        nyala_storage::ops::check_op_batch(&batch.0, &schema)
    })
    .map_err(to_py)?;
    Ok(problems
        .into_iter()
        .map(|p| (p.row, p.status as u8, p.message))
        .collect())
}

/// A WRITE entry payload's header (docs/tablet-write-entry.md) as
/// `(kind, client id or None, seq no, first incomplete seq no, schema version, ops offset,
/// timestamp)` (timestamp 0 for entries before format version 3);
/// `CorruptionError` / `NotSupportedError` if it is damaged or newer than this build.
#[pyfunction]
fn decode_write_entry(payload: &[u8]) -> PyResult<WriteEntryTuple> {
    let header = nyala_storage::decode_write_entry(payload).map_err(to_py)?;
    let (client, seq, first) = match header.request_id {
        Some(r) => (Some(r.client_id), r.seq_no, r.first_incomplete_seq_no),
        None => (
            None,
            nyala_storage::write_entry::NO_SEQ_NO,
            nyala_storage::write_entry::NO_SEQ_NO,
        ),
    };
    Ok((
        header.kind as u8,
        client,
        seq,
        first,
        header.schema_version,
        header.ops_offset,
        header.timestamp,
    ))
}

/// What `decode_write_entry` returns.
type WriteEntryTuple = (u8, Option<String>, i64, i64, u32, usize, u64);

/// One applied WRITE entry as Python gets it: (op index, effect code (0 applied, 1 refused,
/// 2 duplicate, 3 stale), row statuses or None, failed rows, refusal message or None,
/// client id or None, seq no, client watermark or None).
type OutcomeTuple<'py> = (
    u64,
    u8,
    Option<Bound<'py, PyBytes>>,
    usize,
    Option<String>,
    Option<String>,
    i64,
    Option<i64>,
    usize,
    u64,
);

/// A schema change met while applying: (op index, schema version, schema document).
type AlterTuple<'py> = (u64, u32, Bound<'py, PyBytes>);

/// A remembered request's first outcome as Python gets it: (op index, effect code (0 applied,
/// 1 refused), row statuses or None, refusal message or None, timestamp).
type RequestOutcomeTuple<'py> = (u64, u8, Option<Bound<'py, PyBytes>>, Option<String>, u64);

/// What `apply_range` did: the last index handled, the WRITE outcomes, and the schema change
/// (op index, version, document) that stopped it.
type AppliedRange = (u64, Vec<WriteOutcome>, Option<(u64, u32, Buffer)>);

/// The entries after `after` up to `last` that are WRITEs, applied in order until a schema
/// change (returned unapplied); what `StorageEngine.apply_committed` does with the GIL
/// released.
fn apply_range(
    engine: &Engine,
    log: &ReplicatedLog,
    mut after: u64,
    last: u64,
    read_bytes_max: usize,
) -> PyResult<AppliedRange> {
    let mut outcomes = Vec::new();
    while after < last {
        // The batch as appended, shared with the log cache, when it is there whole; a copy
        // of the range otherwise (older entries come from the WAL). Bounded by `last`: the
        // uncommitted tail behind it is not read.
        let batch = match log.read_whole_batch(after, last) {
            Some(batch) => batch,
            None => log
                .read_range(after, last, read_bytes_max)
                .map_err(to_py)?
                .ok_or_else(|| {
                    to_py(StorageError::corruption(format!(
                        "committed entry {} is not in the log",
                        after + 1
                    )))
                })?,
        };
        let bytes = batch.as_bytes();
        let base = bytes.as_ptr() as usize;
        let ptr = std::ptr::NonNull::new(bytes.as_ptr().cast_mut())
            .expect("a slice's pointer is never null");
        let len = bytes.len();
        // SAFETY: `ptr..ptr + len` are the batch's bytes, immutable and alive as long as the
        // batch, which the buffer keeps.
        let whole = unsafe {
            Buffer::from_custom_allocation(
                ptr,
                len,
                Arc::new(std::panic::AssertUnwindSafe(batch.clone())),
            )
        };
        let writes = batch
            .metas()
            .iter()
            .enumerate()
            .filter(|(_, m)| m.index > after && m.index <= last && m.entry_type == EntryType::Write)
            .map(|(position, meta)| {
                let payload = batch.entry(position).payload;
                let start = payload.as_ptr() as usize - base;
                (meta.index, whole.slice_with_length(start, payload.len()))
            });
        let applied = apply_write_entries(engine, writes).map_err(to_py)?;
        outcomes.extend(applied.outcomes);
        if let Some((index, version, doc)) = applied.schema_change {
            return Ok((index - 1, outcomes, Some((index, version, doc))));
        }
        after = last.min(batch.last_op_id().index);
    }
    Ok((after, outcomes, None))
}

fn outcome_to_py<'py>(py: Python<'py>, outcome: WriteOutcome) -> OutcomeTuple<'py> {
    let (client, seq) = match outcome.header.request_id {
        Some(r) => (Some(r.client_id), r.seq_no),
        None => (None, nyala_storage::write_entry::NO_SEQ_NO),
    };
    let (code, statuses, failed, message) = match outcome.effect {
        WriteEffect::Applied(statuses) => {
            let failed = statuses
                .iter()
                .filter(|s| **s != nyala_storage::RowStatus::Ok)
                .count();
            (0, Some(status_bytes(py, &statuses)), failed, None)
        }
        WriteEffect::Refused(message) => (1, None, 0, Some(message)),
        WriteEffect::Duplicate => (2, None, 0, None),
        WriteEffect::Stale => (3, None, 0, None),
        WriteEffect::AlterSchema => (4, None, 0, None),
    };
    (
        outcome.index,
        code,
        statuses,
        failed,
        message,
        client,
        seq,
        outcome.watermark,
        outcome.ops_bytes,
        outcome.header.timestamp,
    )
}

/// One tablet's storage engine.
#[pyclass(frozen, module = "nyala._native")]
pub struct StorageEngine {
    engine: Arc<Engine>,
}

fn options(flush_threshold_bytes: usize, background_flush: bool) -> EngineOptions {
    EngineOptions {
        flush_threshold_bytes,
        background_flush,
        fault_injector: None,
    }
}

#[pymethods]
impl StorageEngine {
    /// Creates an empty engine in `path` with `schema`.
    #[staticmethod]
    #[pyo3(signature = (path, schema, flush_threshold_bytes = 64 * 1024 * 1024, background_flush = true))]
    fn create(
        py: Python<'_>,
        path: PathBuf,
        schema: SchemaTuple,
        flush_threshold_bytes: usize,
        background_flush: bool,
    ) -> PyResult<StorageEngine> {
        let schema = schema_from_py(py, schema)?;
        let engine = py
            .detach(|| {
                Engine::create(
                    &path,
                    schema,
                    options(flush_threshold_bytes, background_flush),
                )
            })
            .map_err(to_py)?;
        Ok(StorageEngine {
            engine: Arc::new(engine),
        })
    }

    /// Opens the engine in `path`.
    #[staticmethod]
    #[pyo3(signature = (path, flush_threshold_bytes = 64 * 1024 * 1024, background_flush = true))]
    fn open(
        py: Python<'_>,
        path: PathBuf,
        flush_threshold_bytes: usize,
        background_flush: bool,
    ) -> PyResult<StorageEngine> {
        let engine = py
            .detach(|| Engine::open(&path, options(flush_threshold_bytes, background_flush)))
            .map_err(to_py)?;
        Ok(StorageEngine {
            engine: Arc::new(engine),
        })
    }

    /// The current schema as a tuple (columns, key_count, version, next_column_id).
    fn schema<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        schema_to_py(py, &self.engine.schema())
    }

    /// Applies Arrow IPC op-batch bytes as op `op_index` committed at `timestamp`; returns
    /// one status byte per row.
    #[pyo3(signature = (data, op_index, timestamp = 0))]
    fn apply_ipc<'py>(
        &self,
        py: Python<'py>,
        data: PyBuffer<u8>,
        op_index: u64,
        timestamp: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = data.to_vec(py)?;
        let engine = self.engine.clone();
        let statuses = py
            .detach(move || {
                let batch = engine.decode(Buffer::from_vec(bytes))?;
                engine.apply_at(&batch, op_index, timestamp)
            })
            .map_err(to_py)?;
        Ok(status_bytes(py, &statuses.statuses))
    }

    /// Applies the committed WRITE entries after `after` up to `last` of `log`, in order,
    /// with the GIL released: returns (the last index handled, one outcome per WRITE entry,
    /// a schema change that stopped it or None). Row bytes stay in native memory: the
    /// stored columns share the log's bytes wherever they are aligned, as WRITE entries lay
    /// them out. Entries up to the returned index are done; after a schema change (its
    /// index is the returned one plus one) the caller applies it and calls again. The
    /// engine's request index decides which requests are new and records their outcomes.
    #[pyo3(signature = (log, after, last, read_bytes_max = 4 * 1024 * 1024))]
    fn apply_committed<'py>(
        &self,
        py: Python<'py>,
        log: PyRef<'py, PyReplicatedLog>,
        after: u64,
        last: u64,
        read_bytes_max: usize,
    ) -> PyResult<(u64, Vec<OutcomeTuple<'py>>, Option<AlterTuple<'py>>)> {
        let engine: &Engine = &self.engine;
        let log: &ReplicatedLog = &log.log;
        let (through, outcomes, alter) =
            py.detach(|| apply_range(engine, log, after, last, read_bytes_max))?;
        let outcomes = outcomes.into_iter().map(|o| outcome_to_py(py, o)).collect();
        let alter = alter.map(|(index, version, doc)| (index, version, PyBytes::new(py, &doc)));
        Ok((through, outcomes, alter))
    }

    /// 0 if the request may be applied, 1 if it was applied already, 2 if it is a stale
    /// retry (below the client's first incomplete seq no and forgotten). Waits for an
    /// apply in progress (it holds the index) without releasing the GIL: every write asks,
    /// and handing the GIL to another thread and back cost more than the lookup (an apply
    /// holds the index with the GIL released, so it never waits for this).
    fn admit(&self, client_id: &str, seq_no: i64) -> u8 {
        match self.engine.requests().admit_seq(client_id, seq_no) {
            Admission::New => 0,
            Admission::Duplicate => 1,
            Admission::Stale => 2,
        }
    }

    /// The first outcome of an applied request, if it is remembered.
    fn request_outcome<'py>(
        &self,
        py: Python<'py>,
        client_id: &str,
        seq_no: i64,
    ) -> Option<RequestOutcomeTuple<'py>> {
        let outcome = self.engine.requests().outcome(client_id, seq_no).cloned()?;
        let (code, statuses, message) = match &outcome.result {
            RequestResult::Rows { .. } => {
                let statuses = outcome.result.statuses().unwrap_or_default();
                (0, Some(status_bytes(py, &statuses)), None)
            }
            RequestResult::Refused(message) => (1, None, Some(message.clone())),
        };
        Some((outcome.index, code, statuses, message, outcome.timestamp))
    }

    /// Number of remembered request ids (all clients).
    fn request_count(&self) -> usize {
        self.engine.requests().len()
    }

    /// Applies a pyarrow RecordBatch of row operations as op `op_index` committed at
    /// `timestamp`.
    #[pyo3(signature = (batch, op_index, timestamp = 0))]
    fn apply_batch<'py>(
        &self,
        py: Python<'py>,
        batch: PyArrowType<RecordBatch>,
        op_index: u64,
        timestamp: u64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let engine = self.engine.clone();
        let statuses = py
            .detach(move || {
                let batch: OpBatch = engine.validate(&batch.0)?;
                engine.apply_at(&batch, op_index, timestamp)
            })
            .map_err(to_py)?;
        Ok(status_bytes(py, &statuses.statuses))
    }

    /// Flushes memory to a new rowset; returns its id (None if nothing was written).
    fn flush(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        let engine = self.engine.clone();
        py.detach(move || engine.flush()).map_err(to_py)
    }

    /// Merges all rowsets, collecting history at `ancient_history_mark`; returns whether
    /// there was anything to do.
    #[pyo3(signature = (ancient_history_mark = 0))]
    fn compact(&self, py: Python<'_>, ancient_history_mark: u64) -> PyResult<bool> {
        let engine = self.engine.clone();
        py.detach(move || engine.compact(ancient_history_mark))
            .map_err(to_py)
    }

    /// Merges the run of rowsets the background policy picks (none below `min_rowsets`);
    /// returns whether it merged anything.
    fn compact_some(
        &self,
        py: Python<'_>,
        ancient_history_mark: u64,
        min_rowsets: usize,
    ) -> PyResult<bool> {
        let engine = self.engine.clone();
        py.detach(move || engine.compact_some(ancient_history_mark, min_rowsets))
            .map_err(to_py)
    }

    /// The rows that differ between the snapshots at `start_ts` and `end_ts`, with an
    /// `is_deleted` column, as a pyarrow Table (other arguments as for `scan`).
    #[pyo3(signature = (start_ts, end_ts, columns = None, predicates = Vec::new(), lower_bound = None, upper_bound = None, limit = None))]
    #[allow(clippy::too_many_arguments)]
    fn diff_scan(
        &self,
        py: Python<'_>,
        start_ts: u64,
        end_ts: u64,
        columns: Option<Vec<String>>,
        predicates: Vec<PredicateTuple>,
        lower_bound: Option<Vec<u8>>,
        upper_bound: Option<Vec<u8>>,
        limit: Option<usize>,
    ) -> PyResult<PyArrowType<Table>> {
        let spec = scan_spec(columns, predicates, lower_bound, upper_bound, limit, None)?;
        let engine = self.engine.clone();
        let result = py
            .detach(move || engine.diff_scan(&spec, start_ts, end_ts))
            .map_err(to_py)?;
        let table = Table::try_new(result.batches, result.schema)
            .map_err(|e| to_py(StorageError::arrow_internal("diff scan", e)))?;
        Ok(PyArrowType(table))
    }

    /// Reads rows in key order as a pyarrow Table. `predicates` are (column, op, values)
    /// with values a pyarrow Array of the column's type (None for the null tests).
    #[pyo3(signature = (columns = None, predicates = Vec::new(), lower_bound = None, upper_bound = None, limit = None, snapshot_ts = None))]
    #[allow(clippy::too_many_arguments)]
    fn scan(
        &self,
        py: Python<'_>,
        columns: Option<Vec<String>>,
        predicates: Vec<PredicateTuple>,
        lower_bound: Option<Vec<u8>>,
        upper_bound: Option<Vec<u8>>,
        limit: Option<usize>,
        snapshot_ts: Option<u64>,
    ) -> PyResult<PyArrowType<Table>> {
        let spec = scan_spec(
            columns,
            predicates,
            lower_bound,
            upper_bound,
            limit,
            snapshot_ts,
        )?;
        let engine = self.engine.clone();
        let result = py.detach(move || engine.scan(&spec)).map_err(to_py)?;
        let table = Table::try_new(result.batches, result.schema)
            .map_err(|e| to_py(StorageError::arrow_internal("scan", e)))?;
        Ok(PyArrowType(table))
    }

    /// Opens a cursor over a consistent view of the tablet (arguments as for `scan`).
    #[pyo3(signature = (columns = None, predicates = Vec::new(), lower_bound = None, upper_bound = None, limit = None, snapshot_ts = None))]
    #[allow(clippy::too_many_arguments)]
    fn open_scan(
        &self,
        py: Python<'_>,
        columns: Option<Vec<String>>,
        predicates: Vec<PredicateTuple>,
        lower_bound: Option<Vec<u8>>,
        upper_bound: Option<Vec<u8>>,
        limit: Option<usize>,
        snapshot_ts: Option<u64>,
    ) -> PyResult<ScanCursor> {
        let spec = scan_spec(
            columns,
            predicates,
            lower_bound,
            upper_bound,
            limit,
            snapshot_ts,
        )?;
        let engine = self.engine.clone();
        let cursor = py.detach(move || engine.open_scan(spec)).map_err(to_py)?;
        Ok(ScanCursor {
            schema: cursor.schema(),
            snapshot_index: cursor.snapshot_index(),
            inner: Mutex::new(cursor),
        })
    }

    /// Encodes each row of a pyarrow RecordBatch of key columns as a scan bound.
    fn encode_keys<'py>(
        &self,
        py: Python<'py>,
        keys: PyArrowType<RecordBatch>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let encoded = self.engine.encode_keys(&keys.0).map_err(to_py)?;
        Ok(encoded.iter().map(|k| PyBytes::new(py, k)).collect())
    }

    /// Replaces the schema as op `op_index` (flushes memory first).
    fn alter_schema(&self, py: Python<'_>, schema: SchemaTuple, op_index: u64) -> PyResult<()> {
        let schema = schema_from_py(py, schema)?;
        let engine = self.engine.clone();
        py.detach(move || engine.alter_schema(schema, op_index))
            .map_err(to_py)
    }

    /// Pins the current rowsets for tablet copy: (id, last_flushed_index, file paths,
    /// manifest file image).
    fn snapshot<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<(u64, u64, Vec<String>, Bound<'py, PyBytes>)> {
        let engine = self.engine.clone();
        let snapshot = py.detach(move || engine.snapshot()).map_err(to_py)?;
        let files = snapshot
            .files
            .iter()
            .map(|f| f.display().to_string())
            .collect();
        Ok((
            snapshot.id,
            snapshot.last_flushed_index,
            files,
            PyBytes::new(py, &snapshot.manifest_image),
        ))
    }

    /// Releases a snapshot's pins.
    fn release_snapshot(&self, id: u64) -> PyResult<()> {
        self.engine.release_snapshot(id).map_err(to_py)
    }

    /// Every op with index <= this is durable in rowsets.
    #[getter]
    fn last_flushed_index(&self) -> u64 {
        self.engine.last_flushed_index()
    }

    /// The highest op index applied.
    #[getter]
    fn last_applied_index(&self) -> u64 {
        self.engine.last_applied_index()
    }

    /// The highest ancient history mark compaction collected at (snapshot reads below it
    /// are refused).
    #[getter]
    fn history_gc_mark(&self) -> u64 {
        self.engine.history_gc_mark()
    }

    /// The newest commit timestamp applied.
    #[getter]
    fn last_timestamp(&self) -> u64 {
        self.engine.last_timestamp()
    }

    /// The last background flush error, if any.
    fn background_error(&self) -> Option<String> {
        self.engine.background_error()
    }

    /// Counters: mem_rows, mem_bytes, frozen_rows, frozen_bytes, rowsets, disk_rows,
    /// data_bytes, last_applied_index, last_flushed_index, flushes, flush_duration_us,
    /// compactions, compaction_duration_us, compaction_bytes_written.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.engine.stats();
        let d = PyDict::new(py);
        d.set_item("mem_rows", s.mem_rows)?;
        d.set_item("mem_bytes", s.mem_bytes)?;
        d.set_item("frozen_rows", s.frozen_rows)?;
        d.set_item("frozen_bytes", s.frozen_bytes)?;
        d.set_item("rowsets", s.rowsets)?;
        d.set_item("disk_rows", s.disk_rows)?;
        d.set_item("last_applied_index", s.last_applied_index)?;
        d.set_item("last_flushed_index", s.last_flushed_index)?;
        d.set_item("data_bytes", s.data_bytes)?;
        d.set_item("flushes", s.flushes)?;
        d.set_item("flush_duration_us", s.flush_duration_us)?;
        d.set_item("compactions", s.compactions)?;
        d.set_item("compaction_duration_us", s.compaction_duration_us)?;
        d.set_item("compaction_bytes_written", s.compaction_bytes_written)?;
        Ok(d)
    }
}

/// A scan predicate as Python passes it: (column, op, values or None).
type PredicateTuple = (String, String, Option<PyArrowType<ArrayData>>);

fn scan_spec(
    columns: Option<Vec<String>>,
    predicates: Vec<PredicateTuple>,
    lower_bound: Option<Vec<u8>>,
    upper_bound: Option<Vec<u8>>,
    limit: Option<usize>,
    snapshot_ts: Option<u64>,
) -> PyResult<ScanSpec> {
    let mut parsed = Vec::with_capacity(predicates.len());
    for (column, op, values) in predicates {
        let op = PredicateOp::parse(&op).map_err(to_py)?;
        let values: Option<ArrayRef> = values.map(|v| arrow::array::make_array(v.0));
        parsed.push(Predicate { column, op, values });
    }
    Ok(ScanSpec {
        columns,
        predicates: parsed,
        lower_bound,
        upper_bound,
        limit,
        snapshot_ts,
    })
}

/// A scan in progress (`StorageEngine.open_scan`). Each batch is produced with the GIL
/// released; the cursor pins the rowsets it still has to read until it is closed or dropped.
#[pyclass(frozen, module = "nyala._native")]
pub struct ScanCursor {
    schema: SchemaRef,
    snapshot_index: u64,
    /// One caller advances the cursor at a time.
    inner: Mutex<nyala_storage::ScanCursor>,
}

impl ScanCursor {
    /// Advances the cursor with the GIL released.
    fn advance(&self, py: Python<'_>, bytes_max: usize) -> PyResult<Option<RecordBatch>> {
        py.detach(|| {
            self.inner
                .lock()
                .map_err(|_| StorageError::IllegalState("a scan cursor panicked".into()))?
                .next_batch(bytes_max.max(1))
        })
        .map_err(to_py)
    }
}

#[pymethods]
impl ScanCursor {
    /// The schema of every batch.
    #[getter]
    fn schema(&self) -> PyArrowType<ArrowSchema> {
        PyArrowType(self.schema.as_ref().clone())
    }

    /// The last op index applied to the view the cursor reads.
    #[getter]
    fn snapshot_index(&self) -> u64 {
        self.snapshot_index
    }

    /// The next rows in key order as a pyarrow RecordBatch of about `bytes_max` bytes at
    /// most (at least one row); None once the scan is done.
    fn next_batch(
        &self,
        py: Python<'_>,
        bytes_max: usize,
    ) -> PyResult<Option<PyArrowType<RecordBatch>>> {
        Ok(self.advance(py, bytes_max)?.map(PyArrowType))
    }

    /// `next_batch` as an Arrow IPC stream (schema and one batch) and its row count,
    /// encoded with the GIL released.
    fn next_ipc<'py>(
        &self,
        py: Python<'py>,
        bytes_max: usize,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, usize)>> {
        let encoded = py
            .detach(|| -> nyala_storage::Result<Option<(Vec<u8>, usize)>> {
                let mut cursor = self
                    .inner
                    .lock()
                    .map_err(|_| StorageError::IllegalState("a scan cursor panicked".into()))?;
                let Some(batch) = cursor.next_batch(bytes_max.max(1))? else {
                    return Ok(None);
                };
                Ok(Some((encode_ipc(&batch)?, batch.num_rows())))
            })
            .map_err(to_py)?;
        Ok(encoded.map(|(bytes, rows)| (PyBytes::new(py, &bytes), rows)))
    }

    /// Lets go of everything the cursor holds; it returns nothing more.
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            if let Ok(mut cursor) = self.inner.lock() {
                cursor.close();
            }
        });
    }
}

fn status_bytes<'py>(
    py: Python<'py>,
    statuses: &[nyala_storage::RowStatus],
) -> Bound<'py, PyBytes> {
    let raw: Vec<u8> = statuses.iter().map(|s| *s as u8).collect();
    PyBytes::new(py, &raw)
}

pub(crate) fn schema_from_py(py: Python<'_>, schema: SchemaTuple) -> PyResult<Schema> {
    let (columns, key_count, version, next_column_id) = schema;
    let mut parsed = Vec::with_capacity(columns.len());
    for (id, name, type_name, nullable, default) in columns {
        let data_type = DataType::from_name(&type_name).map_err(to_py)?;
        let default = match default {
            None => None,
            Some(value) => Some(value_from_py(value.bind(py))?),
        };
        parsed.push(ColumnSchema {
            id,
            name,
            data_type,
            nullable,
            default,
        });
    }
    Schema::with_next_id(parsed, key_count, version, next_column_id).map_err(to_py)
}

fn value_from_py(value: &Bound<'_, PyAny>) -> PyResult<Value> {
    if value.is_instance_of::<PyBool>() {
        Ok(Value::Bool(value.extract()?))
    } else if value.is_instance_of::<PyInt>() {
        // A decimal's unscaled value may need more than 64 bits.
        match value.extract::<i64>() {
            Ok(v) => Ok(Value::Int(v)),
            Err(_) => Ok(Value::Decimal(value.extract()?)),
        }
    } else if value.is_instance_of::<PyFloat>() {
        Ok(Value::Float(value.extract()?))
    } else if value.is_instance_of::<PyString>() {
        Ok(Value::Bytes(value.extract::<String>()?.into_bytes()))
    } else if value.is_instance_of::<PyBytes>() {
        Ok(Value::Bytes(value.extract::<Vec<u8>>()?))
    } else {
        Err(to_py(StorageError::invalid(format!(
            "unsupported default value {value}"
        ))))
    }
}

fn schema_to_py<'py>(py: Python<'py>, schema: &Schema) -> PyResult<Bound<'py, PyAny>> {
    let mut columns = Vec::with_capacity(schema.columns().len());
    for c in schema.columns() {
        let default: Option<Bound<'py, PyAny>> = match &c.default {
            None => None,
            Some(Value::Int(v)) => Some(v.into_pyobject(py)?.into_any()),
            Some(Value::Decimal(v)) => Some(v.into_pyobject(py)?.into_any()),
            Some(Value::Float(v)) => Some(v.into_pyobject(py)?.into_any()),
            Some(Value::Bool(v)) => Some(PyBool::new(py, *v).to_owned().into_any()),
            Some(Value::Bytes(v)) if c.data_type.is_text() => {
                Some(PyString::new(py, &String::from_utf8_lossy(v)).into_any())
            }
            Some(Value::Bytes(v)) => Some(PyBytes::new(py, v).into_any()),
        };
        columns.push((
            c.id,
            c.name.clone(),
            c.data_type.name(),
            c.nullable,
            default,
        ));
    }
    (
        columns,
        schema.key_count(),
        schema.version(),
        schema.next_column_id(),
    )
        .into_pyobject(py)
        .map(|t| t.into_any())
}
