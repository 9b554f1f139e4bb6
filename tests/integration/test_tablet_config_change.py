"""ChangeConfig on real tserver processes: a tablet on three of four servers; a stale CAS index
is refused with the committed index, a follower refuses with the leader hint, and REMOVE_PEER of
a follower commits a two-VOTER config that the remaining replicas report. ADD_PEER of an empty
replica as a promotable NON_VOTER, with the voter it replaces marked in the same config entry
(a request that swaps two voters at once is refused whole): the leader replays its WAL to it
(no tablet copy), promotes it, and once elected it serves every row written before it joined.
A promotable NON_VOTER that answers but lags far behind (its process stopped most of the time
while the leader holds a backlog of many batches) is promoted only once it is within a batch of
the commit index."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from nyala import _native, errors
from nyala._proto import common_pb2, consensus_pb2, metadata_pb2, tserver_pb2
from nyala.consensus.types import NO_OPID_INDEX
from nyala.rowops import encode, make_op_batch
from nyala.rpc.errors import raise_for_response
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster, dump_logs
from nyala.testing.mini_cluster import LOOPBACK, ServerProcess

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], ["id"])
TABLET = "d" * 32
DEADLINE_S = 60.0


@pytest.fixture
def cluster4(request: pytest.FixtureRequest) -> Iterator[MiniCluster]:
    """Four tablet servers, ready; their logs are printed if the test fails."""
    with MiniCluster(4) as mini:
        yield mini
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            dump_logs(mini, sys.stderr)


def _cstate(ts: ServerProcess) -> Any:
    request = consensus_pb2.GetConsensusStateRequestPB(dest_uuid=ts.uuid, tablet_ids=[TABLET])
    with ts.proxy() as proxy:
        response = proxy.call(proxy.consensus.GetConsensusState, request)
    return response.tablets[0].cstate


def _opid_index(config: Any) -> int:
    return int(config.opid_index) if config.HasField("opid_index") else NO_OPID_INDEX


def _change_config(
    ts: ServerProcess, change_type: int, peer_uuid: str, cas: int | None = None
) -> Any:
    request = consensus_pb2.ChangeConfigRequestPB(
        dest_uuid=ts.uuid,
        tablet_id=TABLET,
        type=change_type,
        server=metadata_pb2.RaftPeerPB(permanent_uuid=peer_uuid),
    )
    if cas is not None:
        request.cas_config_opid_index = cas
    with ts.proxy() as proxy:
        return proxy.call(proxy.consensus.ChangeConfig, request, timeout_ms=10_000)


def _retrying(fn: Any) -> Any:
    """``fn()`` until it stops refusing with a retriable error (a new leader first commits an
    op of its own term before it accepts a config change)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            return fn()
        except errors.ServiceUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _write(ts: ServerProcess, ids: list[int], seq: int) -> Any:
    batch = make_op_batch({"id": ids, "v": [f"value-{i}" for i in ids]}, "insert", SCHEMA)
    request = tserver_pb2.WriteRequestPB(
        dest_uuid=ts.uuid,
        tablet_id=TABLET,
        request_id=common_pb2.RequestIdPB(
            client_id="config-change-test", seq_no=seq, first_incomplete_seq_no=seq
        ),
        schema_version=0,
        ops=encode(batch).to_pybytes(),
    )
    with ts.proxy() as proxy:
        return proxy.call(proxy.tablet.Write, request, timeout_ms=10_000)


def test_cas_refusal_follower_refusal_and_remove_peer(cluster4: MiniCluster) -> None:
    members = cluster4.tservers[:3]
    cluster4.create_tablet(TABLET, SCHEMA, servers=members)
    leader = cluster4.leader_of(TABLET)
    followers = [ts for ts in members if ts is not leader]
    victim, survivor = followers
    gone = str(victim.uuid)
    initial_index = _opid_index(_cstate(leader).committed_config)

    # A stale CAS index is refused with the committed config's index; nothing changes.
    with pytest.raises(errors.CasFailedError) as cas_info:
        _retrying(
            lambda: _change_config(leader, consensus_pb2.REMOVE_PEER, gone, initial_index + 7)
        )
    assert cas_info.value.committed_opid_index == initial_index
    assert len(_cstate(leader).committed_config.peers) == 3

    # A follower refuses with the leader hint.
    with pytest.raises(errors.NotLeaderError) as leader_info:
        _change_config(survivor, consensus_pb2.REMOVE_PEER, gone, initial_index)
    assert leader_info.value.leader_uuid == leader.uuid
    assert leader_info.value.leader_addr == leader.rpc_addr

    # REMOVE_PEER of a follower with the right CAS index.
    response = _retrying(
        lambda: _change_config(leader, consensus_pb2.REMOVE_PEER, gone, initial_index)
    )
    new_index = _opid_index(response.new_config)
    assert new_index > initial_index
    expected = sorted(str(ts.uuid) for ts in (leader, survivor))
    assert sorted(p.permanent_uuid for p in response.new_config.peers) == expected

    deadline = time.monotonic() + DEADLINE_S
    for ts in (leader, survivor):
        while True:
            cstate = _cstate(ts)
            if _opid_index(cstate.committed_config) == new_index:
                break
            assert time.monotonic() < deadline, f"{ts.name} never committed config {new_index}"
            time.sleep(0.05)
        assert sorted(p.permanent_uuid for p in cstate.committed_config.peers) == expected
        assert all(p.member_type == metadata_pb2.VOTER for p in cstate.committed_config.peers)
        assert not cstate.HasField("pending_config")

    # The CAS now names the new committed index, and the two-VOTER group still commits writes.
    with pytest.raises(errors.CasFailedError) as again:
        _change_config(leader, consensus_pb2.REMOVE_PEER, survivor.uuid or "", initial_index)
    assert again.value.committed_opid_index == new_index
    assert not _write(cluster4.leader_of(TABLET), [1, 2, 3], 0).per_row_errors


def _create_replica(ts: ServerProcess, config: Any) -> None:
    from nyala._proto import tserver_admin_pb2
    from nyala.rpc.schema_pb import schema_to_pb

    request = tserver_admin_pb2.CreateTabletRequestPB(
        dest_uuid=ts.uuid,
        table_id=TABLET,
        table_name="t",
        tablet_id=TABLET,
        schema=schema_to_pb(SCHEMA),
        config=config,
    )
    with ts.proxy() as proxy:
        proxy.admin_call(proxy.admin.CreateTablet, request)


def test_add_peer_as_promotable_non_voter_catches_up_from_the_wal(cluster4: MiniCluster) -> None:
    members = cluster4.tservers[:3]
    newcomer = cluster4.tservers[3]
    cluster4.create_tablet(TABLET, SCHEMA, servers=members)
    leader = cluster4.leader_of(TABLET)
    for seq in range(5):
        assert not _write(leader, [seq * 10 + i for i in range(10)], seq).per_row_errors

    # The new replica starts empty with the config it is being added to (no tablet copy: the
    # leader must replay its WAL to it).
    config = cluster4.initial_config(members)
    joining = config.peers.add(permanent_uuid=newcomer.uuid, member_type=metadata_pb2.NON_VOTER)
    joining.last_known_addr.host = LOOPBACK
    joining.last_known_addr.port = newcomer.rpc_port
    joining.attrs.promote = True
    _create_replica(newcomer, config)

    # More changes ride in the same config entry (as a move marks the voter it replaces), but
    # all of them together add or remove one VOTER at most: a swap of voters is refused whole.
    replaced = next(ts for ts in members if ts is not leader)
    marked = metadata_pb2.RaftPeerPB(permanent_uuid=replaced.uuid, member_type=metadata_pb2.VOTER)
    marked.attrs.replace = True
    swap = consensus_pb2.ChangeConfigRequestPB(
        dest_uuid=leader.uuid, tablet_id=TABLET, type=consensus_pb2.ADD_PEER, server=joining
    )
    swap.server.member_type = metadata_pb2.VOTER
    swap.more_changes.add(
        type=consensus_pb2.REMOVE_PEER,
        server=metadata_pb2.RaftPeerPB(permanent_uuid=replaced.uuid),
    )
    before = _cstate(leader).committed_config
    with pytest.raises(errors.InvalidArgumentError, match="one VOTER at a time"):
        _retrying(lambda: _send_change(leader, swap))
    assert _cstate(leader).committed_config == before

    request = consensus_pb2.ChangeConfigRequestPB(
        dest_uuid=leader.uuid, tablet_id=TABLET, type=consensus_pb2.ADD_PEER, server=joining
    )
    request.more_changes.add(type=consensus_pb2.MODIFY_PEER, server=marked)
    response = _retrying(lambda: _send_change(leader, request))
    added = next(p for p in response.new_config.peers if p.permanent_uuid == newcomer.uuid)
    assert added.member_type == metadata_pb2.NON_VOTER
    assert added.attrs.promote
    flagged = next(p for p in response.new_config.peers if p.permanent_uuid == replaced.uuid)
    assert flagged.attrs.replace
    assert flagged.member_type == metadata_pb2.VOTER
    assert flagged.last_known_addr.port == replaced.rpc_port  # MODIFY keeps the address

    # Caught up, the newcomer is promoted to VOTER by the leader; every replica agrees.
    deadline = time.monotonic() + DEADLINE_S
    for ts in [*members, newcomer]:
        while True:
            peers = {p.permanent_uuid: p for p in _cstate(ts).committed_config.peers}
            peer = peers.get(str(newcomer.uuid))
            if peer is not None and peer.member_type == metadata_pb2.VOTER:
                break
            assert time.monotonic() < deadline, f"{ts.name} never saw the newcomer promoted"
            time.sleep(0.1)
        assert len(peers) == 4
        assert _committed_index(ts) >= _opid_index(_cstate(ts).committed_config)

    # Its log holds the rows written before it joined: elected, it serves all of them.
    election = consensus_pb2.RunLeaderElectionRequestPB(dest_uuid=newcomer.uuid, tablet_id=TABLET)
    with newcomer.proxy() as proxy:
        proxy.call(proxy.consensus.RunLeaderElection, election)
    deadline = time.monotonic() + 10
    while _cstate(newcomer).leader_uuid != newcomer.uuid:
        assert time.monotonic() < deadline, "the newcomer did not win its election"
        time.sleep(0.05)
    assert _scan_ids(newcomer) == list(range(50))


def _send_change(ts: ServerProcess, request: Any) -> Any:
    with ts.proxy() as proxy:
        return proxy.call(proxy.consensus.ChangeConfig, request, timeout_ms=10_000)


def _committed_index(ts: ServerProcess) -> int:
    request = consensus_pb2.GetConsensusStateRequestPB(dest_uuid=ts.uuid, tablet_ids=[TABLET])
    with ts.proxy() as proxy:
        response = proxy.call(proxy.consensus.GetConsensusState, request)
    return int(response.tablets[0].committed_index)


def _scan_ids(ts: ServerProcess) -> list[int]:
    request = tserver_pb2.ScanRequestPB(
        dest_uuid=ts.uuid,
        new_scan=tserver_pb2.NewScanRequestPB(tablet_id=TABLET, read_mode=tserver_pb2.READ_LATEST),
        batch_size_bytes=1 << 20,
    )
    ids: list[int] = []
    with ts.proxy() as proxy:
        for response in proxy.tablet.Scan(request, timeout=30):
            raise_for_response(response)
            if not response.batch:
                continue  # the answer that ends the scan carries no rows
            table = pa.ipc.open_stream(response.batch).read_all()
            ids.extend(table.column("id").to_pylist())
    return sorted(ids)


def _wal_last_index(ts: ServerProcess) -> int:
    """The last entry index in ``ts``'s WAL of the tablet, read from its files (``ts`` is
    stopped: they do not change meanwhile)."""
    last = 0
    wal_dir = ts.fs_root / "wals" / TABLET
    for path in sorted(wal_dir.glob("wal-0*")):
        for _, _, entries, _ in _native.wal_dump_segment(str(path))[5]:
            for _, index, _, _ in entries:
                last = max(last, index)
    return last


def _is_voter_at(ts: ServerProcess, uuid: str) -> tuple[bool, int]:
    """Whether ``ts`` has ``uuid`` as a VOTER in its committed config, and that config's index."""
    config = _cstate(ts).committed_config
    voter = any(
        p.permanent_uuid == uuid and p.member_type == metadata_pb2.VOTER for p in config.peers
    )
    return voter, _opid_index(config)


def test_a_lagging_non_voter_is_promoted_only_once_within_a_batch(
    cluster4: MiniCluster,
) -> None:
    members = cluster4.tservers[:3]
    newcomer = cluster4.tservers[3]
    cluster4.create_tablet(TABLET, SCHEMA, servers=members)
    leader = cluster4.leader_of(TABLET)
    # A backlog of many consensus batches: each write is ~0.4 MiB, a batch at most 1 MiB.
    for seq in range(40):
        ids = list(range(seq * 2000, (seq + 1) * 2000))
        batch = make_op_batch({"id": ids, "v": ["x" * 200] * len(ids)}, "insert", SCHEMA)
        request = tserver_pb2.WriteRequestPB(
            dest_uuid=leader.uuid,
            tablet_id=TABLET,
            request_id=common_pb2.RequestIdPB(
                client_id="lagging", seq_no=seq, first_incomplete_seq_no=seq
            ),
            schema_version=0,
            ops=encode(batch).to_pybytes(),
        )
        with leader.proxy() as proxy:
            assert not proxy.call(proxy.tablet.Write, request, timeout_ms=30_000).per_row_errors
    written = _committed_index(leader)

    config = cluster4.initial_config(members)
    joining = config.peers.add(permanent_uuid=newcomer.uuid, member_type=metadata_pb2.NON_VOTER)
    joining.last_known_addr.host = LOOPBACK
    joining.last_known_addr.port = newcomer.rpc_port
    joining.attrs.promote = True
    _create_replica(newcomer, config)
    newcomer.signal(signal.SIGSTOP)
    request = consensus_pb2.ChangeConfigRequestPB(
        dest_uuid=leader.uuid, tablet_id=TABLET, type=consensus_pb2.ADD_PEER, server=joining
    )
    with leader.proxy() as proxy:
        proxy.call(proxy.consensus.ChangeConfig, request, timeout_ms=10_000)
    # Every entry up to the ADD_PEER's is committed before a promotion can be appended, so a
    # promoted newcomer must hold all but the last batch of them (a batch is at most 3 of
    # these entries).
    must_hold = written + 1 - 3
    deadline = time.monotonic() + 120
    while True:
        newcomer.signal(signal.SIGCONT)  # it answers the leader for a moment: reachable...
        time.sleep(0.05)
        newcomer.signal(signal.SIGSTOP)  # ...and is stopped most of the time: lagging
        voter, _ = _is_voter_at(leader, str(newcomer.uuid))
        if voter:
            held = _wal_last_index(newcomer)
            assert held >= must_hold, f"promoted holding {held}, the commit index was {written + 1}"
            break
        assert time.monotonic() < deadline, "the newcomer was never promoted"
        time.sleep(0.2)
    newcomer.signal(signal.SIGCONT)
