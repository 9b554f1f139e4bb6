//! A leader's AppendEntries in wire form (`nyala._native.append_request_head`,
//! `nyala._native.batch_request_frame`): the bindings of `nyala_consensus::wire`, for
//! `nyala.consensus.runtime.wire.append_request_parts` and the peer channel's
//! `batch_request_frame`, which built the same bytes through protobuf's Python objects and
//! Python varints (docs/performance.md, "A leader's AppendEntries encoded natively").

use nyala_common::OpId;
use nyala_consensus::wire::{self, AppendHead, EntriesHead, FramePiece, FrameRequest};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyTuple};

use crate::consensus::PyEntryBatch;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(append_request_head, m)?)?;
    m.add_function(wrap_pyfunction!(batch_request_frame, m)?)?;
    Ok(())
}

/// The serialized `ConsensusRequestPB` of an AppendEntries without its entries' bytes
/// (`nyala_consensus::wire::append_request_head`): with `entries`, the head that the
/// batch's own bytes complete, its entries aligned; without, the whole request.
#[pyfunction]
#[pyo3(signature = (
    dest_uuid, tablet_id, caller_uuid, term, preceding, committed_index,
    last_appended_index, quiesce, entries, leader_timestamp, safe_timestamp,
))]
#[allow(clippy::too_many_arguments)]
fn append_request_head<'py>(
    py: Python<'py>,
    dest_uuid: &str,
    tablet_id: &str,
    caller_uuid: &str,
    term: u64,
    preceding: (u64, u64),
    committed_index: u64,
    last_appended_index: u64,
    quiesce: bool,
    entries: Option<PyRef<'py, PyEntryBatch>>,
    leader_timestamp: u64,
    safe_timestamp: u64,
) -> PyResult<Bound<'py, PyBytes>> {
    let entries = match entries {
        None => None,
        Some(batch) => {
            let batch = &batch.batch;
            let count = u32::try_from(batch.len())
                .map_err(|_| PyValueError::new_err("a batch of more than 2^32 entries"))?;
            Some(EntriesHead {
                count,
                first: batch.first_op_id(),
                last: batch.last_op_id(),
                size: batch.size_bytes(),
            })
        }
    };
    let head = wire::append_request_head(&AppendHead {
        dest_uuid,
        tablet_id,
        caller_uuid,
        term,
        preceding: OpId::new(preceding.0, preceding.1),
        committed_index,
        last_appended_index,
        quiesce,
        entries,
        leader_timestamp,
        safe_timestamp,
    });
    Ok(PyBytes::new(py, &head))
}

/// A request's body as given, with the buffer that keeps its memory exported while the frame
/// is built.
type Body<'py> = (Bound<'py, PyAny>, PyBuffer<u8>);

/// The peer channel's frame of a `ConsensusBatchRequestPB` holding `requests` (each a
/// `bytes`, or a `(head, body)` pair whose body is a contiguous buffer) with their
/// `call_ids`, and `votes` (call id, serialized `VoteRequestPB`), as the pieces to write in
/// order: built `bytes`, and each body of `in_place_min` bytes or more as the object given.
#[pyfunction]
fn batch_request_frame<'py>(
    py: Python<'py>,
    dest_uuid: &str,
    caller_uuid: &str,
    call_ids: Vec<u64>,
    requests: Vec<Bound<'py, PyAny>>,
    votes: Vec<(u64, PyBackedBytes)>,
    in_place_min: usize,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let mut given: Vec<(PyBackedBytes, Option<Body<'py>>)> = Vec::with_capacity(requests.len());
    for request in &requests {
        if let Ok(pair) = request.cast::<PyTuple>() {
            let (head, body): (PyBackedBytes, Bound<'py, PyAny>) = pair.extract()?;
            let buffer = PyBuffer::<u8>::get(&body)?;
            if !buffer.is_c_contiguous() {
                return Err(PyValueError::new_err("a request's body must be contiguous"));
            }
            given.push((head, Some((body, buffer))));
        } else {
            given.push((request.extract::<PyBackedBytes>()?, None));
        }
    }
    // SAFETY: the GIL is held throughout and no Python code runs while the slices are read;
    // each `PyBuffer` keeps its export (and so its memory) alive until `given` is dropped,
    // after the frame is built.
    let frame_requests: Vec<FrameRequest<'_>> = given
        .iter()
        .map(|(head, body)| FrameRequest {
            head,
            body: match body {
                None => &[],
                Some((_, buffer)) => unsafe {
                    std::slice::from_raw_parts(buffer.buf_ptr() as *const u8, buffer.len_bytes())
                },
            },
        })
        .collect();
    let votes: Vec<(u64, &[u8])> = votes.iter().map(|(id, vote)| (*id, &vote[..])).collect();
    let pieces = wire::batch_request_frame(
        dest_uuid,
        caller_uuid,
        &call_ids,
        &frame_requests,
        &votes,
        in_place_min,
    );
    pieces
        .into_iter()
        .map(|piece| match piece {
            FramePiece::Built(bytes) => Ok(PyBytes::new(py, &bytes).into_any()),
            FramePiece::Body(i) => match &given[i].1 {
                Some((body, _)) => Ok(body.clone()),
                None => unreachable!("only a given body is placed"),
            },
        })
        .collect()
}
