"""``nyala.consensus.runtime.wire``: every message survives message -> protobuf bytes -> message,
and headers that disagree with the batch they announce are refused."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nyala._proto import consensus_pb2
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
from nyala.consensus.runtime import wire
from nyala.consensus.types import OpId
from nyala.errors import InvalidArgumentError

TABLET = "0" * 32
# The machine is shared and busy: judge correctness, not generation speed.
RELAXED = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class JsonBatch:
    """A stand-in wire batch: consecutive entries of one term, encoded as JSON."""

    first_op_id: OpId
    last_op_id: OpId
    payloads: tuple[str, ...]

    @property
    def size_bytes(self) -> int:
        return sum(len(p) for p in self.payloads)

    def config_entries(self) -> Sequence[tuple[OpId, bytes]]:
        return ()

    def to_wire(self) -> bytes:
        first, last = self.first_op_id, self.last_op_id
        doc = [first.term, first.index, last.term, last.index, list(self.payloads)]
        return json.dumps(doc).encode()

    @property
    def entry_count(self) -> int:
        return len(self.payloads)


def decode_json_batch(data: bytes, start: int, end: int) -> EntryBatch:
    ft, fi, lt, li, payloads = json.loads(data[start:end])
    return JsonBatch(OpId(ft, fi), OpId(lt, li), tuple(payloads))


def through_bytes(pb: Any) -> Any:
    """Serializes and parses, as the network does."""
    parsed = type(pb)()
    parsed.ParseFromString(pb.SerializeToString())
    return parsed


terms = st.integers(min_value=0, max_value=2**40)
indexes = st.integers(min_value=0, max_value=2**40)
uuids = st.text(alphabet="0123456789abcdef", min_size=1, max_size=32)
op_ids = st.builds(OpId, terms, indexes)


@st.composite
def append_requests(draw: st.DrawFn) -> AppendRequest:
    preceding = draw(op_ids)
    count = draw(st.integers(min_value=0, max_value=5))
    batch = None
    if count:
        term = draw(st.integers(min_value=preceding.term, max_value=preceding.term + 3))
        first = OpId(term, preceding.index + 1)
        last = OpId(term, preceding.index + count)
        batch = JsonBatch(first, last, tuple(draw(st.text(max_size=8)) for _ in range(count)))
    return AppendRequest(
        src=draw(uuids),
        dest=draw(uuids),
        term=draw(terms),
        preceding=preceding,
        entries=batch,
        committed_index=draw(indexes),
        seq=0,
    )


@RELAXED
@given(append_requests())
def test_append_request_round_trip(request_: AppendRequest) -> None:
    pb = through_bytes(wire.append_request_to_pb(request_, TABLET, last_appended_index=7))
    assert pb.tablet_id == TABLET
    assert pb.last_idx_appended_to_leader == 7
    assert wire.append_request_from_pb(pb, decode_json_batch) == request_


@RELAXED
@given(
    src=uuids,
    dest=uuids,
    term=terms,
    status=st.sampled_from(AppendStatus),
    last=op_ids,
    durable=indexes,
    hint=st.integers(min_value=1, max_value=2**40),
    seq=st.integers(min_value=0, max_value=2**30),
)
def test_append_response_round_trip(
    src: str,
    dest: str,
    term: int,
    status: AppendStatus,
    last: OpId,
    durable: int,
    hint: int,
    seq: int,
) -> None:
    response = AppendResponse(
        src,
        dest,
        term,
        status,
        last,
        durable,
        hint_index=hint if status is AppendStatus.LOG_MISMATCH else 0,
        seq=seq,
    )
    pb = through_bytes(wire.append_response_to_pb(response))
    assert wire.append_response_from_pb(pb, dest=dest, seq=seq) == response


@RELAXED
@given(
    src=uuids,
    dest=uuids,
    term=terms,
    last=op_ids,
    pre=st.booleans(),
    ignore=st.booleans(),
    granted=st.booleans(),
    denial=st.sampled_from([None, *VoteDenial]),
)
def test_vote_round_trip(
    src: str,
    dest: str,
    term: int,
    last: OpId,
    pre: bool,
    ignore: bool,
    granted: bool,
    denial: VoteDenial | None,
) -> None:
    request = VoteRequest(src, dest, term, last, pre, ignore)
    request_pb = through_bytes(wire.vote_request_to_pb(request, TABLET))
    assert request_pb.tablet_id == TABLET
    assert wire.vote_request_from_pb(request_pb) == request
    response = VoteResponse(dest, src, term, granted, pre, None if granted else denial)
    response_pb = through_bytes(wire.vote_response_to_pb(response))
    assert wire.vote_response_from_pb(response_pb, request) == response


def test_timeout_now_is_a_run_leader_election_request() -> None:
    pb = wire.timeout_now_to_pb(TimeoutNow("a", "b", 4), TABLET)
    assert isinstance(pb, consensus_pb2.RunLeaderElectionRequestPB)
    assert (pb.dest_uuid, pb.tablet_id) == ("b", TABLET)


def batch_request() -> Any:
    batch = JsonBatch(OpId(2, 6), OpId(2, 8), ("x", "y", "z"))
    request = AppendRequest("a", "b", 2, OpId(1, 5), batch, 5, 0)
    return wire.append_request_to_pb(request, TABLET)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda pb: setattr(pb, "entry_count", 2), "says 2 entries"),
        (lambda pb: setattr(pb.last_entry_id, "index", 9), "header says entries"),
        (lambda pb: setattr(pb.preceding_id, "index", 4), "not after preceding"),
        (lambda pb: pb.ClearField("entries"), "announces 3 entries but has none"),
        (lambda pb: setattr(pb.preceding_id, "term", -1), "negative op id"),
    ],
)
def test_inconsistent_request_headers_are_refused(mutate: Any, message: str) -> None:
    pb = batch_request()
    assert wire.append_request_from_pb(pb, decode_json_batch).entries is not None
    mutate(pb)
    with pytest.raises(InvalidArgumentError, match=message):
        wire.append_request_from_pb(pb, decode_json_batch)


def test_unknown_error_codes_are_refused() -> None:
    response = AppendResponse("b", "a", 3, AppendStatus.OK, OpId(3, 9), 9)
    pb = wire.append_response_to_pb(response)
    pb.status.error.code = consensus_pb2.CONSENSUS_BUSY
    with pytest.raises(InvalidArgumentError, match="unexpected consensus error code"):
        wire.append_response_from_pb(pb, dest="a", seq=0)
    request = VoteRequest("a", "b", 3, OpId(2, 2))
    vote_pb = wire.vote_response_to_pb(VoteResponse("b", "a", 3, False, False))
    vote_pb.consensus_error.code = consensus_pb2.NOT_IN_QUORUM
    with pytest.raises(InvalidArgumentError, match="unexpected vote denial code"):
        wire.vote_response_from_pb(vote_pb, request)


def test_wal_log_batches_cross_the_wire_as_native_bytes(tmp_path: Any) -> None:
    wal_log = pytest.importorskip("nyala.consensus.runtime.wal_log")
    from nyala.consensus.types import EntryKind

    with wal_log.WalLog(tmp_path / "leader", "t", wal_log.WalLogOptions(sync="none")) as leader:
        leader.append(1, EntryKind.NO_OP, b"")
        for i in range(5):
            leader.append(1, EntryKind.WRITE, b"row-%d" % i)
        batch = leader.read_batch(0, 1 << 20)
        assert batch is not None
        request = AppendRequest("a", "b", 1, OpId(0, 0), batch, 0, 0)
        pb = through_bytes(wire.append_request_to_pb(request, TABLET))
        assert pb.entry_count == 6
        received = wire.append_request_from_pb(pb, wal_log.WalEntryBatch.from_wire)
        assert received.entries is not None
        assert received.entries.first_op_id == OpId(1, 1)
        assert received.entries.last_op_id == OpId(1, 6)
        with wal_log.WalLog(tmp_path / "follower", "t", wal_log.WalLogOptions(sync="none")) as f:
            result = f.append_replicated(received.preceding, received.entries, 0)
            assert result.matched
            assert f.last_op_id() == OpId(1, 6)


def test_a_request_with_another_seq_keeps_every_other_field() -> None:
    # ``with_seq`` lists the fields by hand (for speed): one added to ``AppendRequest`` and
    # not to it would be lost, or fail here.
    import dataclasses

    request = AppendRequest("a", "b", 7, OpId(6, 40), None, 39, 5, quiesce=True)
    assert request.with_seq(9) == dataclasses.replace(request, seq=9)
    assert len(dataclasses.fields(AppendRequest)) == 8, "with_seq must name every field"


def test_a_response_to_pb_may_carry_another_durable_index() -> None:
    answer = AppendResponse("b", "a", 3, AppendStatus.OK, OpId(3, 12), 10, 0)
    assert wire.append_response_to_pb(answer).status.last_durable_idx == 10
    assert wire.append_response_to_pb(answer, durable_index=12).status.last_durable_idx == 12
