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
