//! Bindings for the partition router (`nyala._native.PartitionRouter`, `partition_hash64`).
//!
//! Batches cross as pyarrow objects through the Arrow C data interface (zero-copy); routing,
//! splitting and IPC encoding run with the GIL released.

use std::sync::Arc;

use arrow::array::{Array, ArrayData, RecordBatch, UInt32Array};
use arrow::datatypes::DataType;
use arrow::pyarrow::PyArrowType;
use nyala_storage::partition::{hash64, HashLevel, PartitionRouter as Router};
use nyala_storage::{encode_ipc, StorageError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::to_py;

/// A hash level as Python passes it: (column names, buckets, seed).
type HashLevelTuple = (Vec<String>, u32, u32);
/// One partition's rows as Python gets them: (partition, original row positions, IPC bytes).
type SliceTuple<'py> = (u32, PyArrowType<ArrayData>, Bound<'py, PyBytes>);
/// Threads that encode one batch's requests at most (the client is one of many processes).
const SPLIT_THREADS_MAX: usize = 4;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PartitionRouter>()?;
    m.add_function(wrap_pyfunction!(partition_hash64, m)?)?;
    Ok(())
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
        let split = py
            .detach(move || {
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
