//! A follower's receive of a leader's AppendEntries without Python per request
//! (`nyala._native.parse_append_request`, `nyala._native.ParsedAppend`); the Python side is
//! `GrpcTransport.follow_append` and `RaftRuntime.follow_leader` (docs/consensus.md, "A
//! follower's native receive").
//!
//! `parse_append_request` reads a serialized `ConsensusRequestPB` and decodes its entry batch
//! in one call. It takes only the common case, the one worth a path of its own: entries
//! (no heartbeat), no quiescence, no config change among them, a header that agrees with the
//! batch. Anything else, malformed input included, is `None`: the caller takes the general
//! path, which parses with protobuf and answers every error as before. `ParsedAppend.append`
//! then appends the batch, only if its preceding entry is the log's last (so the append
//! neither truncates nor skips), and hands the answer to the log's committer
//! (`ReplicatedLog.answer_when_durable`), which writes it to the connection once the entries
//! are durable. Whether the replica may take the request at all (it follows this leader in
//! this term, nothing else is waiting for its core) is Python's decision, made before.

use std::sync::Arc;

use nyala_common::proto::{
    put_bytes, put_message, put_op_id, put_packed, put_uint, FIXED64, LEN, VARINT,
};
use nyala_common::OpId;
use nyala_consensus::wire::request_fields::*;
use nyala_consensus::EntryBatch;
use nyala_wal::EntryType;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;

use crate::consensus::{ByteRange, PyAnswerSink, PyDurableAnswer, PyReplicatedLog};
use crate::errors::to_py;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyParsedAppend>()?;
    m.add_function(wrap_pyfunction!(parse_append_request, m)?)?;
    Ok(())
}

/// Wire type of fixed32 fields (the others are `nyala_common::proto`'s).
const FIXED32: u64 = 5;

/// A received AppendEntries that may take the native path (module doc).
#[pyclass(frozen, name = "ParsedAppend", module = "nyala._native")]
pub struct PyParsedAppend {
    #[pyo3(get)]
    tablet_id: String,
    #[pyo3(get)]
    dest_uuid: String,
    #[pyo3(get)]
    caller_uuid: String,
    #[pyo3(get)]
    caller_term: u64,
    #[pyo3(get)]
    committed_index: u64,
    #[pyo3(get)]
    leader_timestamp: u64,
    #[pyo3(get)]
    safe_timestamp: u64,
    preceding: OpId,
    batch: EntryBatch,
}

#[pymethods]
impl PyParsedAppend {
    /// `(term, index)` of the entry before the batch.
    #[getter]
    fn preceding(&self) -> (u64, u64) {
        (self.preceding.term, self.preceding.index)
    }

    /// `(term, index)` of the batch's last entry.
    #[getter]
    fn last(&self) -> (u64, u64) {
        let last = self.batch.last_op_id();
        (last.term, last.index)
    }

    /// Appends the batch to `log` if its preceding entry is the log's last, and hands the
    /// answer to the log (a `ConsensusBatchResponsePB` of `call_id`: `responder_uuid`,
    /// `responder_term`, the batch's last entry received and, once written, durable), which
    /// writes it to `sink` from the committer whose sync makes the entries durable. Returns
    /// the handle of that answer; None if the preceding entry is not the log's last (nothing
    /// was done). Raises if the log refuses the append.
    fn append(
        &self,
        py: Python<'_>,
        log: PyRef<'_, PyReplicatedLog>,
        sink: PyRef<'_, PyAnswerSink>,
        call_id: u64,
        responder_uuid: &str,
        responder_term: u64,
    ) -> PyResult<Option<PyDurableAnswer>> {
        let log = &log.log;
        let sink = Arc::clone(&sink.sink);
        let last = self.batch.last_op_id();
        let frame = answer_frame(call_id, responder_uuid, responder_term, last);
        py.detach(|| {
            if log.last_op_id() != self.preceding {
                return Ok(None);
            }
            let outcome = log
                .append_replicated(self.preceding, Some(&self.batch), self.committed_index)
                .map_err(to_py)?;
            if !outcome.matched || outcome.truncated_from.is_some() || outcome.last_received != last
            {
                // Cannot be: the preceding entry was the log's last, and only this thread
                // appends to a follower's log.
                return Err(to_py(nyala_consensus::ConsensusError::InvalidArgument(
                    format!(
                        "the native append after {} did not simply extend the log",
                        self.preceding
                    ),
                )));
            }
            Ok(Some(PyDurableAnswer::new(
                log.answer_when_durable(sink, frame),
            )))
        })
    }
}

/// The serialized `ConsensusBatchResponsePB` answering one request with `OK`: what
/// `wire.append_response_to_pb` and the transport's hand-off build in Python.
fn answer_frame(call_id: u64, responder: &str, term: u64, last: OpId) -> Vec<u8> {
    let mut frame = Vec::with_capacity(96 + responder.len());
    put_message(&mut frame, 2, |response| {
        // ConsensusResponsePB
        put_bytes(response, 1, responder.as_bytes());
        put_uint(response, 2, term);
        put_message(response, 3, |status| {
            // ConsensusStatusPB: last_received, and last_durable_idx (the answer waits for it)
            put_op_id(status, 1, last);
            put_uint(status, 4, last.index);
        });
    });
    put_packed(&mut frame, 3, std::iter::once(call_id)); // call_ids
    frame
}

/// A serialized `ConsensusRequestPB` as a `ParsedAppend`, its batch decoded (and kept as a
/// range of `data`, not copied); None unless it is an AppendEntries the native path takes
/// (module doc), including whenever it is malformed.
#[pyfunction]
pub fn parse_append_request(py: Python<'_>, data: PyBackedBytes) -> Option<PyParsedAppend> {
    let fields = Fields::read(&data)?;
    let (start, end) = fields.entries?;
    if fields.quiesce || start == end || fields.entry_count == 0 {
        return None;
    }
    let (first, last, preceding) = (
        fields.first_entry_id?,
        fields.last_entry_id?,
        fields.preceding_id.unwrap_or(OpId::new(0, 0)),
    );
    if last.index < first.index
        || u64::from(fields.entry_count) != last.index - first.index + 1
        || first.index != preceding.index.checked_add(1)?
    {
        return None;
    }
    let text = |range: Option<(usize, usize)>| -> Option<String> {
        let (from, to) = range.unwrap_or((0, 0));
        std::str::from_utf8(&data[from..to]).ok().map(str::to_owned)
    };
    let tablet_id = text(fields.tablet_id)?;
    let dest_uuid = text(fields.dest_uuid)?;
    let caller_uuid = text(fields.caller_uuid)?;
    let batch = py
        .detach(|| EntryBatch::decode(ByteRange::new(data, start, end)))
        .ok()?;
    if batch.first_op_id() != first
        || batch.last_op_id() != last
        || batch
            .metas()
            .iter()
            .any(|meta| meta.entry_type == EntryType::ConfigChange)
    {
        return None;
    }
    Some(PyParsedAppend {
        tablet_id,
        dest_uuid,
        caller_uuid,
        caller_term: fields.caller_term,
        committed_index: fields.committed_index,
        leader_timestamp: fields.leader_timestamp,
        safe_timestamp: fields.safe_timestamp,
        preceding,
        batch,
    })
}

/// The fields of a `ConsensusRequestPB` the native path reads: strings and the entries as
/// ranges of the message, op ids parsed. Integers that protobuf would read as negative
/// `int64`s make the message one for the general path (which refuses them), as does a
/// message field given twice (protobuf would merge the two).
#[derive(Default)]
struct Fields {
    dest_uuid: Option<(usize, usize)>,
    tablet_id: Option<(usize, usize)>,
    caller_uuid: Option<(usize, usize)>,
    caller_term: u64,
    preceding_id: Option<OpId>,
    committed_index: u64,
    entries: Option<(usize, usize)>,
    entry_count: u32,
    first_entry_id: Option<OpId>,
    last_entry_id: Option<OpId>,
    quiesce: bool,
    leader_timestamp: u64,
    safe_timestamp: u64,
}

impl Fields {
    fn read(data: &[u8]) -> Option<Fields> {
        let mut fields = Fields::default();
        let mut at = 0;
        while at < data.len() {
            match next_field(data, &mut at)? {
                (CALLER_TERM, Value::Int(v)) => fields.caller_term = non_negative(v)?,
                (COMMITTED_INDEX, Value::Int(v)) => fields.committed_index = non_negative(v)?,
                (ENTRY_COUNT, Value::Int(v)) => fields.entry_count = v as u32,
                (QUIESCE, Value::Int(v)) => fields.quiesce = v != 0,
                (LEADER_TIMESTAMP, Value::Fixed(v)) => fields.leader_timestamp = v,
                (SAFE_TIMESTAMP, Value::Fixed(v)) => fields.safe_timestamp = v,
                (DEST_UUID, Value::Bytes(range)) => fields.dest_uuid = Some(range),
                (TABLET_ID, Value::Bytes(range)) => fields.tablet_id = Some(range),
                (CALLER_UUID, Value::Bytes(range)) => fields.caller_uuid = Some(range),
                (ENTRIES, Value::Bytes(range)) => fields.entries = Some(range),
                (PRECEDING_ID, Value::Bytes((from, to))) => {
                    once(&mut fields.preceding_id, op_id(&data[from..to])?)?;
                }
                (FIRST_ENTRY_ID, Value::Bytes((from, to))) => {
                    once(&mut fields.first_entry_id, op_id(&data[from..to])?)?;
                }
                (LAST_ENTRY_ID, Value::Bytes((from, to))) => {
                    once(&mut fields.last_entry_id, op_id(&data[from..to])?)?;
                }
                // A known field of an unexpected wire type: protobuf refuses the message.
                (
                    CALLER_TERM | COMMITTED_INDEX | ENTRY_COUNT | QUIESCE | LEADER_TIMESTAMP
                    | SAFE_TIMESTAMP | DEST_UUID | TABLET_ID | CALLER_UUID | ENTRIES | PRECEDING_ID
                    | FIRST_ENTRY_ID | LAST_ENTRY_ID,
                    _,
                ) => return None,
                _ => {} // a field this path does not read
            }
        }
        Some(fields)
    }
}

/// One field's value: a varint, a fixed-width integer (64 bits; 32-bit ones read as their
/// value too), or the range of a length-delimited field's bytes in the message.
enum Value {
    Int(u64),
    Fixed(u64),
    Bytes((usize, usize)),
}

/// The field at `*at` (its number and value), advancing past it; None if it is malformed
/// or a group (no field of these messages is one).
fn next_field(data: &[u8], at: &mut usize) -> Option<(u64, Value)> {
    let key = varint(data, at)?;
    let value = match key & 7 {
        VARINT => Value::Int(varint(data, at)?),
        FIXED64 => {
            let bytes: [u8; 8] = data.get(*at..at.checked_add(8)?)?.try_into().ok()?;
            *at += 8;
            Value::Fixed(u64::from_le_bytes(bytes))
        }
        FIXED32 => {
            let bytes: [u8; 4] = data.get(*at..at.checked_add(4)?)?.try_into().ok()?;
            *at += 4;
            Value::Fixed(u64::from(u32::from_le_bytes(bytes)))
        }
        LEN => {
            let len = usize::try_from(varint(data, at)?).ok()?;
            let end = at.checked_add(len).filter(|&end| end <= data.len())?;
            let range = (*at, end);
            *at = end;
            Value::Bytes(range)
        }
        _ => return None,
    };
    Some((key >> 3, value))
}

/// Sets a message field read once; None if it was already set.
fn once(slot: &mut Option<OpId>, value: OpId) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

/// An `OpIdPB`.
fn op_id(data: &[u8]) -> Option<OpId> {
    let (mut term, mut index, mut at) = (0, 0, 0);
    while at < data.len() {
        match next_field(data, &mut at)? {
            (1, Value::Int(v)) => term = non_negative(v)?,
            (2, Value::Int(v)) => index = non_negative(v)?,
            (1 | 2, _) => return None,
            _ => {}
        }
    }
    Some(OpId::new(term, index))
}

/// An `int64` field's value, None if protobuf would read it as negative.
fn non_negative(value: u64) -> Option<u64> {
    (value <= i64::MAX as u64).then_some(value)
}

/// A base-128 varint at `*at`, advancing past it; None if cut short or over 10 bytes.
fn varint(data: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *data.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}
