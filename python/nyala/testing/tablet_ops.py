"""Direct tablet reads and writes against tserver processes, for tests, benchmarks and the demo.

Until the master and the client exist (issues 9 and 11), these helpers stand where the client
will: they address a tablet on a named server, retry through whichever server leads with the
same request id, and stream a scan back as Arrow. They use only the public wire protocol.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from nyala import errors
from nyala._proto import common_pb2, tserver_pb2
from nyala.rowops import encode, make_op_batch
from nyala.rpc.errors import raise_for_response
from nyala.schema import Schema
from nyala.testing.mini_cluster import MiniCluster, ServerProcess

RETRY_PAUSE_S = 0.05


def write_request(
    ts: ServerProcess,
    tablet_id: str,
    schema: Schema,
    data: Any,
    *,
    op: str,
    client_id: str,
    seq_no: int,
) -> tserver_pb2.WriteRequestPB:
    """A ``WriteRequestPB`` for ``data`` (anything ``rowops.make_op_batch`` takes)."""
    batch = make_op_batch(data, op, schema)
    return tserver_pb2.WriteRequestPB(
        dest_uuid=ts.uuid or "",
        tablet_id=tablet_id,
        request_id=common_pb2.RequestIdPB(
            client_id=client_id, seq_no=seq_no, first_incomplete_seq_no=seq_no
        ),
        schema_version=schema.version,
        ops=encode(batch).to_pybytes(),
    )


def write(
    ts: ServerProcess, request: tserver_pb2.WriteRequestPB, *, timeout_ms: int = 10_000
) -> tserver_pb2.WriteResponsePB:
    """Sends one Write to ``ts``; raises the mapped error on refusal."""
    with ts.proxy() as proxy:
        return proxy.call(proxy.tablet.Write, request, timeout_ms=timeout_ms)


def write_to_leader(
    cluster: MiniCluster,
    tablet_id: str,
    schema: Schema,
    data: Any,
    *,
    op: str,
    client_id: str,
    seq_no: int,
    deadline_s: float = 60.0,
) -> tserver_pb2.WriteResponsePB:
    """Writes through whichever server leads, retrying the same request id (so a retry after
    an unknown outcome applies nothing twice) until acknowledged or ``deadline_s`` passes."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            leader = cluster.leader_of(tablet_id, timeout_s=max(0.1, deadline - time.monotonic()))
            request = write_request(
                leader, tablet_id, schema, data, op=op, client_id=client_id, seq_no=seq_no
            )
            return write(leader, request)
        except (errors.RetriableError, errors.TimedOutError, errors.AbortedError):
            if time.monotonic() > deadline:
                raise
            time.sleep(RETRY_PAUSE_S)


def scan(
    ts: ServerProcess, tablet_id: str, schema: Schema, *, batch_size_bytes: int = 1 << 20
) -> pa.Table:
    """A linearizable full scan of ``tablet_id`` on ``ts`` (which must lead it)."""
    request = tserver_pb2.ScanRequestPB(
        dest_uuid=ts.uuid or "",
        new_scan=tserver_pb2.NewScanRequestPB(
            tablet_id=tablet_id, read_mode=tserver_pb2.READ_LATEST
        ),
        batch_size_bytes=batch_size_bytes,
    )
    batches: list[pa.RecordBatch] = []
    with ts.proxy() as proxy:
        for response in proxy.tablet.Scan(request, timeout=60):
            if response.HasField("error"):
                raise_for_response(response)
            if response.batch:  # the answer that ends the scan carries no rows
                batches.extend(pa.ipc.open_stream(response.batch).read_all().to_batches())
    if not batches:
        return schema.to_arrow().empty_table()
    return pa.Table.from_batches(batches)


def row_checksum(columns: Sequence[Sequence[Any]]) -> str:
    """An order-independent digest of rows given column-wise (sorted, then hashed)."""
    rows = sorted(zip(*columns, strict=True))
    return hashlib.sha256(repr(rows).encode()).hexdigest()
