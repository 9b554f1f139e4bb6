"""Consensus messages <-> protobuf (``proto/nyala/consensus.proto``), for both sides of the
gRPC transport: the leader's client (``GrpcTransport``) and the tablet server's
``ConsensusService`` handlers. Pure functions; no I/O.

Entries travel as the native entry-batch bytes (``docs/wal-format.md``): encoding asks the batch
for ``to_wire()``, or on the hot path for the serialized message as a head followed by the
batch's own bytes, not copied (``append_request_parts``, a ``WireRequest``; the peer channel
writes those bytes to its socket in place); decoding goes through a ``BatchDecoder`` the
caller supplies (``WalEntryBatch.from_wire`` in servers), so row data never becomes Python
objects per entry. The header counts and OpIds sent next to the bytes are checked against the
decoded batch.

What the proto does not carry, and how each side recovers it:

* ``AppendRequest.seq`` / ``AppendResponse.seq`` (the heartbeat round ReadIndex counts): responses
  come back to a callback of their request (``PeerStreams`` matches them by call id; one per
  unary call), so the client re-attaches the seq of the request it sent
  (``append_response_from_pb(..., seq=...)``); the server sees seq 0.
* ``VoteResponse.pre_election``: the client knows it from its request.
* ``AppendResponse.hint_index`` (LOG_MISMATCH): carried as Kudu does, as
  ``status.last_received_current_leader.index = hint_index - 1`` (the last entry the follower
  believes matches), so the leader retries from the one after it.
* ``TimeoutNow`` becomes ``RunLeaderElectionRequestPB``; the server answers it with
  ``RaftCore.run_leader_election()`` (the message's term is not sent: a stale nudge costs an
  election, never safety).
* An unsolicited durability ack (an ``AppendResponse`` the follower emits when its log becomes
  durable, answering no request) has no slot on the stream: the server should answer each
  request only once the entries it appended are durable, with ``durable_index`` read then.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeAlias, cast

from nyala import _native
from nyala._proto import common_pb2, consensus_pb2
from nyala.consensus.log import EntryBatch
from nyala.consensus.messages import (
    AppendRequest,
    AppendResponse,
    AppendStatus,
    TimeoutNow,
    VoteDenial,
    VoteRequest,
    VoteResponse,
)
from nyala.consensus.types import OpId
from nyala.errors import InvalidArgumentError


class WireBatch(EntryBatch, Protocol):
    """An entry batch that can be sent (``nyala.consensus.runtime.wal_log.WalEntryBatch``)."""

    def to_wire(self) -> bytes:
        """The batch's wire encoding."""
        ...

    def wire_view(self) -> memoryview:
        """The batch's wire encoding in place (read-only; keeps the batch alive)."""
        ...

    @property
    def entry_count(self) -> int:
        """How many entries the batch holds."""
        ...

    @property
    def native(self) -> _native.EntryBatch:
        """The native batch (``_native.append_request_head`` reads its header)."""
        ...


WireRequest: TypeAlias = bytes | tuple[bytes, memoryview]
"""A serialized ``ConsensusRequestPB``: its bytes, or a head followed by a batch's encoding in
place (``append_request_parts``), which together are those bytes."""


def request_size(request: WireRequest) -> int:
    """Bytes of the serialized request."""
    if isinstance(request, bytes):
        return len(request)
    head, body = request
    return len(head) + body.nbytes


def request_bytes(request: WireRequest) -> bytes:
    """The serialized request as one ``bytes`` (a copy of a batch's encoding)."""
    if isinstance(request, bytes):
        return request
    head, body = request
    return b"".join((head, body))


BatchDecoder = Callable[[bytes, int, int], EntryBatch]
"""Checks and wraps received batch bytes ``data[start:end]`` (raises ``CorruptionError`` on
damage); may keep ``data`` rather than copy the range."""


class ReceivedAppendRequest:
    """A received ``ConsensusRequestPB`` whose entries were not parsed by protobuf: the other
    fields as a message, and where the entries lie in the received bytes. Made by
    ``append_request_from_wire`` (what a server does with each request of a
    ConsensusPeerStream batch), so a
    follower decodes its batch straight from the bytes gRPC handed over; protobuf would have
    copied them twice (into the message, then into a new ``bytes`` on access)."""

    __slots__ = ("data", "entries_range", "header")

    def __init__(
        self,
        header: consensus_pb2.ConsensusRequestPB,
        data: bytes,
        entries_range: tuple[int, int] | None,
    ) -> None:
        self.header = header
        self.data = data
        self.entries_range = entries_range

    @property
    def tablet_id(self) -> str:
        return self.header.tablet_id

    @property
    def dest_uuid(self) -> str:
        return self.header.dest_uuid


class PeerBatch(Protocol):
    """A ``ConsensusBatchRequestPB`` as a server serves it: parsed by protobuf (from
    ConsensusPeerStream), or split by the peer channel (``peer_channel.SplitBatch``)."""

    @property
    def dest_uuid(self) -> str: ...

    @property
    def call_ids(self) -> Sequence[int]: ...

    @property
    def requests(self) -> Sequence[bytes]: ...

    @property
    def votes(self) -> Sequence[consensus_pb2.VoteRequestPB]: ...

    @property
    def vote_call_ids(self) -> Sequence[int]: ...


#: An UpdateConsensus request as a server receives it: parsed by protobuf, or split by
#: ``append_request_from_wire`` (for each request of a ConsensusPeerStream batch).
ReceivedRequest: TypeAlias = consensus_pb2.ConsensusRequestPB | ReceivedAppendRequest


def append_request_from_wire(data: bytes) -> ReceivedAppendRequest:
    """Splits a serialized ``ConsensusRequestPB`` (``InvalidArgumentError`` if malformed)."""
    header_bytes, entries_range = _native.split_proto_field(data, _ENTRIES_FIELD)
    try:
        header = consensus_pb2.ConsensusRequestPB.FromString(header_bytes)
    except Exception as exc:  # protobuf's DecodeError: a malformed message
        raise InvalidArgumentError(f"malformed ConsensusRequestPB: {exc}") from exc
    return ReceivedAppendRequest(header, data, entries_range)


_DENIAL_TO_CODE = {
    VoteDenial.TERM_TOO_OLD: consensus_pb2.INVALID_TERM,
    VoteDenial.ALREADY_VOTED: consensus_pb2.ALREADY_VOTED,
    VoteDenial.LAST_OPID_TOO_OLD: consensus_pb2.LAST_OPID_TOO_OLD,
    VoteDenial.LEADER_IS_ALIVE: consensus_pb2.LEADER_IS_ALIVE,
}
_CODE_TO_DENIAL = {code: denial for denial, code in _DENIAL_TO_CODE.items()}

_STATUS_TO_CODE = {
    AppendStatus.OK: consensus_pb2.CONSENSUS_ERROR_NONE,
    AppendStatus.LOG_MISMATCH: consensus_pb2.PRECEDING_ENTRY_DIDNT_MATCH,
    AppendStatus.TERM_TOO_OLD: consensus_pb2.INVALID_TERM,
}
_CODE_TO_STATUS = {code: status for status, code in _STATUS_TO_CODE.items()}


def op_id_to_pb(op_id: OpId) -> common_pb2.OpIdPB:
    """``OpIdPB`` of an OpId."""
    return common_pb2.OpIdPB(term=op_id.term, index=op_id.index)


def op_id_from_pb(pb: common_pb2.OpIdPB) -> OpId:
    """OpId of an ``OpIdPB``; negative fields are an ``InvalidArgumentError``."""
    if pb.term < 0 or pb.index < 0:
        raise InvalidArgumentError(f"negative op id {pb.term}.{pb.index}")
    return OpId(pb.term, pb.index)


# --- UpdateConsensus ----------------------------------------------------------------------------


#: The field number of ``ConsensusRequestPB.entries``, which a received request is split at.
_ENTRIES_FIELD = consensus_pb2.ConsensusRequestPB.DESCRIPTOR.fields_by_name["entries"].number


def append_request_to_pb(
    request: AppendRequest, tablet_id: str, *, last_appended_index: int = 0
) -> consensus_pb2.ConsensusRequestPB:
    """The ``ConsensusRequestPB`` of an AppendEntries (``entries`` must be a ``WireBatch``)."""
    pb = _append_request_header_pb(request, tablet_id, last_appended_index)
    if request.entries is not None:
        pb.entries = cast(WireBatch, request.entries).to_wire()
    return pb


def append_request_parts(
    request: AppendRequest,
    tablet_id: str,
    *,
    last_appended_index: int = 0,
    timestamps: tuple[int, int] = (0, 0),
) -> WireRequest:
    """The serialized ``ConsensusRequestPB`` of an AppendEntries, what
    ``append_request_to_pb(...).SerializeToString()`` gives (with ``entries_alignment``
    padding): the other fields, then (protobuf parses a message followed by one more field
    as the message with that field) ``entries`` as the batch's own bytes, in place. Copying
    them into one message was a copy of every entry per follower on the leader's event
    loop, and framing the batch a second one. The head is encoded by the extension
    (``_native.append_request_head``); through protobuf's message it cost the leader 9 µs
    per request. ``timestamps`` are the leader's (clock, safe time), which the Raft core
    does not see."""
    batch = cast("WireBatch | None", request.entries)  # the WAL log's batches, or none
    preceding = request.preceding
    head = _native.append_request_head(
        request.dest,
        tablet_id,
        request.src,
        request.term,
        (preceding.term, preceding.index),
        request.committed_index,
        last_appended_index,
        request.quiesce,
        None if batch is None else batch.native,
        timestamps[0],
        timestamps[1],
    )
    return head if batch is None else (head, batch.wire_view())


def _append_request_header_pb(
    request: AppendRequest, tablet_id: str, last_appended_index: int
) -> consensus_pb2.ConsensusRequestPB:
    """An AppendEntries' ``ConsensusRequestPB`` without the entries' bytes."""
    pb = consensus_pb2.ConsensusRequestPB(
        dest_uuid=request.dest,
        tablet_id=tablet_id,
        caller_uuid=request.src,
        caller_term=request.term,
        preceding_id=op_id_to_pb(request.preceding),
        committed_index=request.committed_index,
        last_idx_appended_to_leader=last_appended_index,
        quiesce=request.quiesce,
    )
    batch = request.entries
    if batch is not None:
        pb.entry_count = cast(WireBatch, batch).entry_count
        pb.first_entry_id.CopyFrom(op_id_to_pb(batch.first_op_id))
        pb.last_entry_id.CopyFrom(op_id_to_pb(batch.last_op_id))
    return pb


def request_header(pb: ReceivedRequest) -> consensus_pb2.ConsensusRequestPB:
    """The header fields of a received AppendEntries (the entries may be absent)."""
    return pb.header if isinstance(pb, ReceivedAppendRequest) else pb


def append_request_from_pb(pb: ReceivedRequest, decode_batch: BatchDecoder) -> AppendRequest:
    """The AppendEntries of a ``ConsensusRequestPB``, parsed or as received (seq 0: the wire
    does not carry it)."""
    entries: EntryBatch | None = None
    if isinstance(pb, ReceivedAppendRequest):
        data, entries_range = pb.data, pb.entries_range
        pb = pb.header
    else:
        data = pb.entries
        entries_range = (0, len(data)) if data else None
    if entries_range is not None and entries_range[0] < entries_range[1]:
        entries = decode_batch(data, *entries_range)
        _check_batch_header(pb, entries)
    elif pb.entry_count:
        raise InvalidArgumentError(f"request announces {pb.entry_count} entries but has none")
    return AppendRequest(
        src=pb.caller_uuid,
        dest=pb.dest_uuid,
        term=pb.caller_term,
        preceding=op_id_from_pb(pb.preceding_id),
        entries=entries,
        committed_index=pb.committed_index,
        seq=0,
        quiesce=pb.quiesce,
    )


def _check_batch_header(pb: consensus_pb2.ConsensusRequestPB, batch: EntryBatch) -> None:
    first = op_id_from_pb(pb.first_entry_id)
    last = op_id_from_pb(pb.last_entry_id)
    if (first, last) != (batch.first_op_id, batch.last_op_id):
        raise InvalidArgumentError(
            f"request header says entries {first}..{last}, the batch holds "
            f"{batch.first_op_id}..{batch.last_op_id}"
        )
    count = batch.last_op_id.index - batch.first_op_id.index + 1
    if pb.entry_count != count:
        raise InvalidArgumentError(
            f"request header says {pb.entry_count} entries, the batch holds {count}"
        )
    if batch.first_op_id.index != pb.preceding_id.index + 1:
        raise InvalidArgumentError(
            f"batch starts at {batch.first_op_id}, not after preceding "
            f"{pb.preceding_id.term}.{pb.preceding_id.index}"
        )


def append_response_to_pb(
    response: AppendResponse, durable_index: int | None = None
) -> consensus_pb2.ConsensusResponsePB:
    """The ``ConsensusResponsePB`` of a follower's answer, its durable index replaced by
    ``durable_index`` when given (the transport's answers: what the log has made durable)."""
    status = consensus_pb2.ConsensusStatusPB(
        last_received=op_id_to_pb(response.last_received),
        last_durable_idx=response.durable_index if durable_index is None else durable_index,
    )
    if response.status is AppendStatus.LOG_MISMATCH:
        status.last_received_current_leader.CopyFrom(
            op_id_to_pb(OpId(0, max(0, response.hint_index - 1)))
        )
    if response.status is not AppendStatus.OK:
        status.error.CopyFrom(
            consensus_pb2.ConsensusErrorPB(
                code=_STATUS_TO_CODE[response.status], message=response.status.value
            )
        )
    return consensus_pb2.ConsensusResponsePB(
        responder_uuid=response.src, responder_term=response.term, status=status
    )


def append_response_from_pb(
    pb: consensus_pb2.ConsensusResponsePB, *, dest: str, seq: int
) -> AppendResponse:
    """The follower's answer in a ``ConsensusResponsePB``; ``dest`` and ``seq`` come from the
    request it answers (see the module docstring)."""
    status_pb = pb.status
    code = (
        status_pb.error.code if status_pb.HasField("error") else consensus_pb2.CONSENSUS_ERROR_NONE
    )
    status = _CODE_TO_STATUS.get(code)
    if status is None:
        raise InvalidArgumentError(f"unexpected consensus error code {code} in an answer")
    hint = 0
    if status is AppendStatus.LOG_MISMATCH:
        hint = status_pb.last_received_current_leader.index + 1
    return AppendResponse(
        src=pb.responder_uuid,
        dest=dest,
        term=pb.responder_term,
        status=status,
        last_received=op_id_from_pb(status_pb.last_received),
        durable_index=status_pb.last_durable_idx,
        hint_index=hint,
        seq=seq,
    )


# --- RequestVote --------------------------------------------------------------------------------


def vote_request_to_pb(request: VoteRequest, tablet_id: str) -> consensus_pb2.VoteRequestPB:
    """The ``VoteRequestPB`` of a (pre-)vote request."""
    return consensus_pb2.VoteRequestPB(
        dest_uuid=request.dest,
        tablet_id=tablet_id,
        candidate_uuid=request.src,
        candidate_term=request.term,
        candidate_status=consensus_pb2.ConsensusStatusPB(
            last_received=op_id_to_pb(request.last_op_id)
        ),
        ignore_live_leader=request.ignore_live_leader,
        is_pre_election=request.pre_election,
    )


def vote_request_from_pb(pb: consensus_pb2.VoteRequestPB) -> VoteRequest:
    """The (pre-)vote request of a ``VoteRequestPB``."""
    return VoteRequest(
        src=pb.candidate_uuid,
        dest=pb.dest_uuid,
        term=pb.candidate_term,
        last_op_id=op_id_from_pb(pb.candidate_status.last_received),
        pre_election=pb.is_pre_election,
        ignore_live_leader=pb.ignore_live_leader,
    )


def vote_response_to_pb(response: VoteResponse) -> consensus_pb2.VoteResponsePB:
    """The ``VoteResponsePB`` of a voter's answer."""
    pb = consensus_pb2.VoteResponsePB(
        responder_uuid=response.src,
        responder_term=response.term,
        vote_granted=response.granted,
    )
    if response.denial is not None:
        pb.consensus_error.CopyFrom(
            consensus_pb2.ConsensusErrorPB(
                code=_DENIAL_TO_CODE[response.denial], message=response.denial.value
            )
        )
    return pb


def vote_response_from_pb(pb: consensus_pb2.VoteResponsePB, request: VoteRequest) -> VoteResponse:
    """The voter's answer in a ``VoteResponsePB`` to ``request``."""
    denial: VoteDenial | None = None
    if pb.HasField("consensus_error"):
        denial = _CODE_TO_DENIAL.get(pb.consensus_error.code)
        if denial is None:
            raise InvalidArgumentError(f"unexpected vote denial code {pb.consensus_error.code}")
    return VoteResponse(
        src=pb.responder_uuid,
        dest=request.src,
        term=pb.responder_term,
        granted=pb.vote_granted,
        pre_election=request.pre_election,
        denial=denial,
    )


# --- leadership transfer ------------------------------------------------------------------------


def timeout_now_to_pb(
    message: TimeoutNow, tablet_id: str
) -> consensus_pb2.RunLeaderElectionRequestPB:
    """The ``RunLeaderElectionRequestPB`` that carries a leadership-transfer nudge."""
    return consensus_pb2.RunLeaderElectionRequestPB(dest_uuid=message.dest, tablet_id=tablet_id)
