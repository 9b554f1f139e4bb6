"""Leadership stays put under a sustained write load on three real tserver processes.

Regression test of a stall: a follower used to step the AppendEntries of its leader's stream one
at a time, each only after the previous one's entries were durable, so under load heartbeats
queued behind appends waiting for the disk, the follower's election timer fired although its
leader was alive, and leadership moved in the middle of the load (the write benchmark saw 2-3
leader changes per run). A term change during the load is the failure; nothing here is timed.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from nyala._proto import common_pb2, consensus_pb2, tserver_pb2
from nyala.rowops import encode, make_op_batch
from nyala.rpc import ServerProxy
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster, tablet_ops
from nyala.testing.mini_cluster import ServerProcess

SCHEMA = Schema([Column("id", "int64"), Column("v", "string")], ["id"])
TABLET = "d" * 32
WRITERS = 64
LOAD_S = 8.0


def _term_and_leader(ts: ServerProcess) -> tuple[int, str]:
    request = consensus_pb2.GetConsensusStateRequestPB(dest_uuid=ts.uuid, tablet_ids=[TABLET])
    with ts.proxy() as proxy:
        response = proxy.call(proxy.consensus.GetConsensusState, request)
    cstate = response.tablets[0].cstate
    return cstate.current_term, cstate.leader_uuid


async def _load(leader: ServerProcess) -> list[int]:
    """``WRITERS`` concurrent single-row writers for ``LOAD_S`` seconds; the acknowledged ids.
    Any refusal (e.g. NOT_THE_LEADER after a leadership change) fails the test."""
    ids = itertools.count()
    acknowledged: list[int] = []
    stop = time.monotonic() + LOAD_S
    async with ServerProxy(leader.rpc_addr) as proxy:

        async def writer(client: int) -> None:
            for seq in itertools.count():
                if time.monotonic() >= stop:
                    return
                row = next(ids)
                batch = make_op_batch({"id": [row], "v": ["x" * 92]}, "upsert", SCHEMA)
                request = tserver_pb2.WriteRequestPB(
                    dest_uuid=leader.uuid,
                    tablet_id=TABLET,
                    request_id=common_pb2.RequestIdPB(
                        client_id=f"load-{client}", seq_no=seq, first_incomplete_seq_no=seq
                    ),
                    schema_version=SCHEMA.version,
                    ops=encode(batch).to_pybytes(),
                )
                response = await proxy.call(proxy.tablet.Write, request)
                assert not response.per_row_errors
                acknowledged.append(row)

        async with asyncio.TaskGroup() as group:
            for client in range(WRITERS):
                group.create_task(writer(client))
    return acknowledged


def test_leadership_holds_under_write_load(cluster: MiniCluster) -> None:
    cluster.create_tablet(TABLET, SCHEMA)
    leader = cluster.leader_of(TABLET)
    term_before, _ = _term_and_leader(leader)
    acknowledged = asyncio.run(_load(leader))
    assert acknowledged
    for ts in cluster.tservers:
        assert _term_and_leader(ts) == (term_before, leader.uuid), ts.name
    table = tablet_ops.scan(leader, TABLET, SCHEMA)
    assert sorted(table.column("id").to_pylist()) == sorted(acknowledged)


def _sub(ts: ServerProcess, seq: int, ids: list[int], **overrides: object) -> Any:
    batch = make_op_batch({"id": ids, "v": [f"v{i}" for i in ids]}, "insert", SCHEMA)
    fields: dict[str, Any] = {
        "dest_uuid": ts.uuid,
        "tablet_id": TABLET,
        "request_id": common_pb2.RequestIdPB(
            client_id="multi", seq_no=seq, first_incomplete_seq_no=1
        ),
        "schema_version": SCHEMA.version,
        "ops": encode(batch).to_pybytes(),
    }
    fields.update(overrides)
    return tserver_pb2.WriteRequestPB(**fields)


def test_write_multi_answers_each_write_on_its_own(cluster: MiniCluster) -> None:
    cluster.create_tablet(TABLET, SCHEMA)
    leader = cluster.leader_of(TABLET)
    follower = next(ts for ts in cluster.tservers if ts is not leader)
    with leader.proxy() as proxy:
        first = proxy.call(proxy.tablet.Write, _sub(leader, 1, [1]))
        subs = [
            _sub(leader, 2, [2, 3]),
            _sub(leader, 1, [99]),  # a retry of request 1: its first outcome, not applied again
            _sub(leader, 3, [4], dest_uuid="f" * 32),  # meant for another server
            _sub(leader, 4, [5], tablet_id="e" * 32),  # no such tablet here
            _sub(leader, 5, [6], schema_version=SCHEMA.version + 1),
            _sub(leader, 6, [3, 7]),  # key 3 is taken by the first write of this call
        ]
        multi = tserver_pb2.WriteMultiRequestPB(dest_uuid=leader.uuid, requests=subs)
        answer = proxy.call(proxy.tablet.WriteMulti, multi)
    codes = [r.error.code if r.HasField("error") else None for r in answer.responses]
    assert codes == [
        None,
        None,
        common_pb2.WRONG_SERVER_UUID,
        common_pb2.TABLET_NOT_FOUND,
        common_pb2.MISMATCHED_SCHEMA,
        None,
    ]
    assert answer.responses[1].op_id.index == first.op_id.index
    assert answer.responses[0].op_id.index < answer.responses[5].op_id.index
    assert [(e.row_index, e.code) for e in answer.responses[5].per_row_errors] == [
        (0, common_pb2.ALREADY_PRESENT)
    ]
    table = tablet_ops.scan(leader, TABLET, SCHEMA)
    assert sorted(table.column("id").to_pylist()) == [1, 2, 3, 7]
    # A follower refuses every write of the call, each with the leader hint.
    with follower.proxy() as proxy:
        multi = tserver_pb2.WriteMultiRequestPB(
            dest_uuid=follower.uuid, requests=[_sub(follower, 7, [8]), _sub(follower, 8, [9])]
        )
        answer = proxy.call(proxy.tablet.WriteMulti, multi)
    assert [r.error.code for r in answer.responses] == [common_pb2.NOT_THE_LEADER] * 2
    assert {r.error.leader_uuid for r in answer.responses} == {leader.uuid}
