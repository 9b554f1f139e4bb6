//! Bindings for the partition router (`nyala._native.PartitionRouter`, `partition_hash64`).
//!
//! Batches cross as pyarrow objects through the Arrow C data interface (zero-copy); routing,
//! splitting and IPC encoding run with the GIL released, except for small batches
//! (`crate::gil`). `split_small_rows` takes a few rows as Python lists instead, and keeps the
//! GIL.

use std::sync::Arc;

use parking_lot::Mutex;

use arrow::array::{
    Array, ArrayData, ArrayRef, BinaryBuilder, BooleanBuilder, Float64Builder, Int16Builder,
    Int32Builder, Int64Builder, Int8Builder, RecordBatch, StringBuilder, UInt32Array, UInt8Array,
};
use arrow::datatypes::{DataType, Field, Schema as ArrowSchema};
use arrow::pyarrow::PyArrowType;
use nyala_storage::ops::OP_COLUMN;
use nyala_storage::partition::{hash64, HashLevel, PartitionRouter as Router, StreamEncoder};
use nyala_storage::write_request::WriteRequestHead;
use nyala_storage::{encode_ipc, DataType as ColumnType, Schema, StorageError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFloat, PyInt, PyList, PyString};

use crate::errors::to_py;
use crate::storage::schema_from_py;

/// A hash level as Python passes it: (column names, buckets, seed).
type HashLevelTuple = (Vec<String>, u32, u32);
/// One partition's rows as Python gets them: (partition, original row positions, IPC bytes).
type SliceTuple<'py> = (u32, PyArrowType<ArrayData>, Bound<'py, PyBytes>);
/// `split_small_rows`' answer: (partition, row positions, IPC bytes) per request, and the
/// positions of the rows no partition covers.
type SmallSplit<'py> = (Vec<(u32, Vec<u32>, Bound<'py, PyBytes>)>, Vec<u32>);
/// Threads that encode one batch's requests at most (the client is one of many processes).
const SPLIT_THREADS_MAX: usize = 4;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PartitionRouter>()?;
    m.add_function(wrap_pyfunction!(partition_hash64, m)?)?;
    m.add_function(wrap_pyfunction!(write_request_head, m)?)?;
    Ok(())
}

/// A client's serialized `WriteRequestPB` without its rows
/// (`nyala_storage::write_request::write_request_head`); the caller appends `ops`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn write_request_head<'py>(
    py: Python<'py>,
    dest_uuid: &str,
    tablet_id: &str,
    client_id: &str,
    seq_no: i64,
    first_incomplete_seq_no: i64,
    attempt_no: u32,
    schema_version: u32,
    authz_token: &[u8],
    propagated_timestamp: u64,
) -> Bound<'py, PyBytes> {
    let head = nyala_storage::write_request::write_request_head(&WriteRequestHead {
        dest_uuid,
        tablet_id,
        client_id,
        seq_no,
        first_incomplete_seq_no,
        attempt_no,
        schema_version,
        authz_token,
        propagated_timestamp,
    });
    PyBytes::new(py, &head)
}

/// The partitioning hash of `data` (docs/partitioning.md).
#[pyfunction]
#[pyo3(signature = (data, seed = 0))]
fn partition_hash64(data: &[u8], seed: u32) -> u64 {
    hash64(data, seed)
}

/// Routes the rows of Arrow batches to one table's partitions.
#[pyclass(frozen, module = "nyala._native")]
pub struct PartitionRouter {
    router: Arc<Router>,
    /// What `split_small_rows` keeps from one call to the next.
    small: Mutex<SmallRows>,
}

/// The table schema last given to `split_small_rows` (the very tuple, held so that its
/// identity means the same schema) parsed, and the encoder of its requests.
#[derive(Default)]
struct SmallRows {
    schema: Option<(Py<PyAny>, Schema)>,
    encoder: StreamEncoder,
}

/// `schema` (a `SchemaTuple`) parsed, or the one `kept` if it is the same object.
fn parsed_schema<'a>(
    kept: &'a mut Option<(Py<PyAny>, Schema)>,
    schema: &Bound<'_, PyAny>,
) -> PyResult<&'a Schema> {
    let known = matches!(kept, Some((tuple, _)) if tuple.is(schema));
    if !known {
        let parsed = schema_from_py(schema.py(), schema.extract()?)?;
        *kept = Some((schema.clone().unbind(), parsed));
    }
    Ok(&kept.as_ref().expect("parsed above").1)
}

#[pymethods]
impl PartitionRouter {
    /// A router over partitions `[starts[i], ends[i])` sorted by start (empty end: unbounded).
    #[new]
    fn new(
        hash_levels: Vec<HashLevelTuple>,
        range_columns: Vec<String>,
        starts: Vec<Vec<u8>>,
        ends: Vec<Vec<u8>>,
    ) -> PyResult<Self> {
        let levels = hash_levels
            .into_iter()
            .map(|(columns, buckets, seed)| HashLevel {
                columns,
                buckets,
                seed,
            })
            .collect();
        let router = Router::new(levels, range_columns, starts, ends).map_err(to_py)?;
        Ok(PartitionRouter {
            router: Arc::new(router),
            small: Mutex::default(),
        })
    }

    /// The number of partitions.
    fn __len__(&self) -> usize {
        self.router.len()
    }

    /// Every row's encoded partition key.
    fn partition_keys<'py>(
        &self,
        py: Python<'py>,
        batch: PyArrowType<RecordBatch>,
    ) -> PyResult<Vec<Bound<'py, PyBytes>>> {
        let router = self.router.clone();
        let (bytes, offsets) = py
            .detach(move || router.partition_keys(&batch.0))
            .map_err(to_py)?;
        Ok(offsets
            .windows(2)
            .map(|w| PyBytes::new(py, &bytes[w[0]..w[1]]))
            .collect())
    }

    /// Each row's partition index, as a pyarrow UInt32Array.
    fn route(
        &self,
        py: Python<'_>,
        batch: PyArrowType<RecordBatch>,
    ) -> PyResult<PyArrowType<ArrayData>> {
        let router = self.router.clone();
        let routes = py.detach(move || router.route(&batch.0)).map_err(to_py)?;
        Ok(PyArrowType(
            arrow::array::UInt32Array::from(routes).into_data(),
        ))
    }

    /// The batch cut into write requests: ``(requests, unrouted)``. Each request is (partition
    /// index, original row positions as a pyarrow UInt32Array, the rows as Arrow IPC stream
    /// bytes), each partition's rows in input order in pieces of at most `rows_max` rows and
    /// `bytes_max` bytes (each row measured; a larger row alone), ascending by partition then
    /// position; `unrouted` (a UInt32Array) holds the positions no partition covers. With
    /// `selection` (ascending positions, a pyarrow UInt32Array) only those rows are routed.
    /// Routed once; encoded on up to `threads` threads (0: one per core, at most 4), without
    /// the GIL.
    #[pyo3(signature = (batch, rows_max, bytes_max, threads = 0, selection = None))]
    fn split_requests<'py>(
        &self,
        py: Python<'py>,
        batch: PyArrowType<RecordBatch>,
        rows_max: usize,
        bytes_max: usize,
        threads: usize,
        selection: Option<PyArrowType<ArrayData>>,
    ) -> PyResult<(Vec<SliceTuple<'py>>, PyArrowType<ArrayData>)> {
        let router = self.router.clone();
        let threads = if threads == 0 {
            std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(SPLIT_THREADS_MAX)
        } else {
            threads
        };
        let selection = match selection {
            None => None,
            Some(data) => match data.0.data_type() {
                DataType::UInt32 => Some(UInt32Array::from(data.0)),
                other => {
                    return Err(to_py(StorageError::invalid(format!(
                        "selection must be a uint32 array, not {other}"
                    ))))
                }
            },
        };
        let small = crate::gil::is_small(&batch.0);
        let split = crate::gil::detach_unless(py, small, move || {
            router.split_requests(&batch.0, rows_max, bytes_max, threads, selection.as_ref())
        })
        .map_err(to_py)?;
        let requests = split
            .requests
            .into_iter()
            .map(|r| {
                let ipc = PyBytes::new(py, &r.ipc);
                (r.partition, PyArrowType(r.rows.into_data()), ipc)
            })
            .collect();
        Ok((requests, PyArrowType(split.unrouted.into_data())))
    }

    /// A few rows given as Python lists, cut into write requests without pyarrow: the path of
    /// a write of one or a few rows, whose pyarrow conversions each gave up the GIL and so
    /// cost a thread switch per call when many threads write (docs/performance.md). Works
    /// with the GIL held.
    ///
    /// `columns` are `(name, values)` in the table's column order, each `values` a list of
    /// the same length holding `None` or values of exactly the column's Python type: `int`
    /// for the integer types (in range), `float` for `double`, `bool`, `str` for strings and
    /// varchars, `bytes` for binary. Every row gets op code `op`. Returns
    /// `split_requests`' `(requests, unrouted)`, row positions as lists, or None when a value
    /// is not of those types, a column is of another type (float, timestamp, date, decimal)
    /// or not in `schema`, or a row breaks a rule of `check_op_batch`: the caller then takes
    /// the general path, which converts what it can and reports the rest row by row.
    ///
    /// The router keeps the last `schema` parsed (the tuple `Schema.to_native` keeps, so the
    /// same object means the same schema) and its last stream encoder (the schema's encoded
    /// message and the writer's buffers): building those was half the cost of a one-row call.
    #[pyo3(signature = (schema, columns, op, rows_max, bytes_max))]
    fn split_small_rows<'py>(
        &self,
        py: Python<'py>,
        schema: &Bound<'py, PyAny>,
        columns: Vec<(String, Bound<'py, PyList>)>,
        op: u8,
        rows_max: usize,
        bytes_max: usize,
    ) -> PyResult<Option<SmallSplit<'py>>> {
        // Another thread in here (between two steps that may let the GIL go) has the kept
        // state: this call parses and encodes afresh.
        let mut fresh = SmallRows::default();
        let mut kept = self.small.try_lock();
        let small = kept.as_deref_mut().unwrap_or(&mut fresh);
        let SmallRows {
            schema: kept_schema,
            encoder,
        } = small;
        let schema = parsed_schema(kept_schema, schema)?;
        let rows = columns.first().map_or(0, |(_, values)| values.len());
        let mut fields = Vec::with_capacity(columns.len() + 1);
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len() + 1);
        for (name, values) in &columns {
            let Some(column) = schema.columns().iter().find(|c| &c.name == name) else {
                return Ok(None);
            };
            if values.len() != rows {
                return Ok(None);
            }
            let Some(array) = array_of(column.data_type, values)? else {
                return Ok(None);
            };
            fields.push(Field::new(name.as_str(), array.data_type().clone(), true));
            arrays.push(array);
        }
        fields.push(Field::new(OP_COLUMN, DataType::UInt8, true));
        arrays.push(Arc::new(UInt8Array::from(vec![op; rows])));
        let batch = RecordBatch::try_new(Arc::new(ArrowSchema::new(fields)), arrays)
            .map_err(|e| to_py(StorageError::invalid(format!("cannot build rows: {e}"))))?;
        if !nyala_storage::ops::check_op_batch(&batch, schema)
            .map_err(to_py)?
            .is_empty()
        {
            return Ok(None);
        }
        let split = self
            .router
            .split_requests_with(&batch, rows_max, bytes_max, encoder)
            .map_err(to_py)?;
        let requests = split
            .requests
            .into_iter()
            .map(|r| {
                (
                    r.partition,
                    r.rows.values().to_vec(),
                    PyBytes::new(py, &r.ipc),
                )
            })
            .collect();
        Ok(Some((requests, split.unrouted.values().to_vec())))
    }

    /// The batch split per partition: (partition index, original row positions as a pyarrow
    /// UInt32Array, the rows as Arrow IPC stream bytes), ascending by partition.
    fn split_ipc<'py>(
        &self,
        py: Python<'py>,
        batch: PyArrowType<RecordBatch>,
    ) -> PyResult<Vec<SliceTuple<'py>>> {
        let router = self.router.clone();
        let slices = py
            .detach(move || {
                router.split(&batch.0).and_then(|slices| {
                    slices
                        .into_iter()
                        .map(|s| Ok((s.partition, s.rows, encode_ipc(&s.batch)?)))
                        .collect::<nyala_storage::Result<Vec<_>>>()
                })
            })
            .map_err(to_py)?;
        Ok(slices
            .into_iter()
            .map(|(p, rows, ipc)| (p, PyArrowType(rows.into_data()), PyBytes::new(py, &ipc)))
            .collect())
    }
}

/// `values` as an Arrow array of `data_type`, or None if one of them is not exactly of the
/// Python type that column takes here (`split_small_rows`), or does not convert (out of range,
/// text that is not UTF-8).
fn array_of(data_type: ColumnType, values: &Bound<'_, PyList>) -> PyResult<Option<ArrayRef>> {
    let n = values.len();
    macro_rules! array {
        ($builder:expr, $python:ty, $native:ty) => {{
            let mut builder = $builder;
            for value in values.iter() {
                if value.is_none() {
                    builder.append_null();
                } else if value.is_exact_instance_of::<$python>() {
                    match value.extract::<$native>() {
                        Ok(v) => builder.append_value(v),
                        Err(_) => return Ok(None),
                    }
                } else {
                    return Ok(None);
                }
            }
            Arc::new(builder.finish()) as ArrayRef
        }};
    }
    let array = match data_type {
        ColumnType::Int8 => array!(Int8Builder::with_capacity(n), PyInt, i8),
        ColumnType::Int16 => array!(Int16Builder::with_capacity(n), PyInt, i16),
        ColumnType::Int32 => array!(Int32Builder::with_capacity(n), PyInt, i32),
        ColumnType::Int64 => array!(Int64Builder::with_capacity(n), PyInt, i64),
        ColumnType::Double => array!(Float64Builder::with_capacity(n), PyFloat, f64),
        ColumnType::Bool => array!(BooleanBuilder::with_capacity(n), PyBool, bool),
        ColumnType::String | ColumnType::Varchar(_) => {
            array!(StringBuilder::with_capacity(n, 64 * n), PyString, &str)
        }
        ColumnType::Binary => array!(BinaryBuilder::with_capacity(n, 64 * n), PyBytes, &[u8]),
        _ => return Ok(None),
    };
    Ok(Some(array))
}
