"""The scanner's replica choice and its resume-after-last-key through a storage key bound
(the cluster-backed paths are in tests/integration/test_client_scan.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from nyala import _native, errors
from nyala._proto import tserver_pb2
from nyala.client.meta_cache import Replica, TableInfo, TabletLocation
from nyala.client.scanner import Scanner, _is_local
from nyala.partition import HashPartitioning, Partition, PartitionSchema, create_partitions
from nyala.schema import Schema
from nyala.storage import StorageEngine
from nyala.tserver.services import _key_bound

SCHEMA = Schema.parse("a:int64, b:string, v:double?", key=["a", "b"])
INFO = TableInfo("t1", "t", SCHEMA, PartitionSchema(), 3)
TABLET = TabletLocation(
    "tab1",
    Partition(),
    (
        Replica("s1", "10.9.9.1:7050", "FOLLOWER", "VOTER"),
        Replica("s2", "127.0.0.1:7050", "FOLLOWER", "VOTER"),
        Replica("s3", "10.9.9.3:7050", "LEADER", "VOTER"),
    ),
    "s3",
)


def scanner(**kwargs: Any) -> Scanner:
    # The cache and the channel pool are only used while iterating, which these tests don't.
    return Scanner(None, None, INFO, timeout_ms=1_000, **kwargs)  # type: ignore[arg-type]


def test_replica_selection_orders_the_candidates() -> None:
    assert scanner()._candidates(TABLET) == []
    for _ in range(20):
        follower = [r.uuid for r in scanner(replica="follower")._candidates(TABLET)]
        assert follower[-1] == "s3"
        assert set(follower) == {"s1", "s2", "s3"}
        closest = [r.uuid for r in scanner(replica="closest")._candidates(TABLET)]
        assert closest[0] == "s2"
        assert set(closest) == {"s1", "s2", "s3"}
    seen_first = {scanner(replica="any")._candidates(TABLET)[0].uuid for _ in range(60)}
    assert seen_first == {"s1", "s2", "s3"}


def test_follower_requests_carry_the_bound_and_leader_requests_read_latest() -> None:
    s = scanner(replica="any")
    assert s.max_staleness_ms > 0  # a default bound when none is named
    scan = s._request("tab1", "s1", None, None, follower=True).new_scan
    assert scan.read_mode == tserver_pb2.READ_FOLLOWER
    assert scan.max_staleness_ms == s.max_staleness_ms
    scan = scanner(replica="any", max_staleness_ms=250)._request("tab1", "s1", None, 5, True)
    assert (scan.new_scan.max_staleness_ms, scan.new_scan.limit_rows) == (250, 5)
    scan = s._request("tab1", "s3", None, None, follower=False).new_scan
    assert scan.read_mode == tserver_pb2.READ_LATEST
    assert not scan.lower_bound_key


def test_bad_selection_is_a_typed_error() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="replica must be one of"):
        scanner(replica="nearest")
    with pytest.raises(errors.InvalidArgumentError):
        scanner(replica="any", max_staleness_ms=-1)


def test_locality() -> None:
    assert _is_local("127.0.0.1:7050")
    assert _is_local("localhost:1")
    assert not _is_local("10.9.9.1:7050")


def test_resume_after_the_last_key_happens_in_storage(tmp_path: Path) -> None:
    engine = StorageEngine.create(tmp_path / "data", SCHEMA)
    keys = [(a, b) for a in range(3) for b in ("x", "y", "z")]
    engine.write(
        {"a": [k[0] for k in keys], "b": [k[1] for k in keys], "v": [1.0] * len(keys)},
        "insert",
        1,
    )
    s = scanner(replica="leader")
    first = engine.scan(s._fetch, limit=4).to_batches()[0]  # (0,x) .. (1,x)
    last_key = s._last_key(first)
    assert last_key.to_pylist() == [{"a": 1, "b": "x"}]
    request = s._request("tab1", "s3", last_key, 2, follower=False).new_scan
    assert request.limit_rows == 3  # one more: the bound is inclusive
    bound = _key_bound(request.lower_bound_key, "lower")
    rest = engine.scan(s._fetch, lower_bound=bound, limit=request.limit_rows).to_batches()[0]
    assert rest.num_rows == 3  # storage served only keys >= (1, x)
    resumed = s._drop_last_sent(rest, last_key)
    got = list(zip(resumed.column("a").to_pylist(), resumed.column("b").to_pylist(), strict=True))
    assert got == [(1, "y"), (1, "z")]
    # A last row deleted meanwhile: nothing to drop.
    assert s._drop_last_sent(resumed, last_key).num_rows == 2


def test_a_malformed_key_bound_is_refused() -> None:
    with pytest.raises(errors.InvalidArgumentError, match="not an Arrow IPC stream"):
        _key_bound(b"garbage", "lower")
    two = pa.RecordBatch.from_pylist([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, two.schema) as writer:
        writer.write_batch(two)
    with pytest.raises(errors.InvalidArgumentError, match="2 rows"):
        _key_bound(sink.getvalue().to_pybytes(), "upper")


def test_point_predicates_prune_tablets_by_routing_their_values() -> None:
    schema = Schema.parse("id:int64, name:string, v:double?", key=["id", "name"])
    ps, _ = PartitionSchema.from_spec(HashPartitioning(["id"], 4), schema)
    parts = create_partitions(ps)
    tablets = [TabletLocation(f"t{i}", p, TABLET.replicas, "s3") for i, p in enumerate(parts)]
    router = _native.PartitionRouter(
        [(list(h.columns), h.buckets, h.seed) for h in ps.hash_levels],
        list(ps.range_columns),
        [p.key_start for p in parts],
        [p.key_end for p in parts],
    )
    info = TableInfo("t1", "t", schema, ps, 3)

    def pruned(*where: tuple[Any, ...]) -> list[str]:
        s = Scanner(None, None, info, where=list(where), timeout_ms=1_000)  # type: ignore[arg-type]
        return [t.tablet_id for t in s._prune(tablets, router)]

    everything = [t.tablet_id for t in tablets]
    probe = pa.RecordBatch.from_arrays([pa.array([7, 8], pa.int64())], names=["id"])
    home = [f"t{i}" for i in router.route(probe).to_pylist()]  # type: ignore[attr-defined]
    assert pruned(("id", "=", 7)) == [home[0]]
    assert pruned(("id", "in", [7, 8])) == sorted(set(home))
    assert pruned(("id", "in", [7, 8]), ("id", "=", 8)) == [home[1]]
    assert pruned(("id", "=", 7), ("id", "=", 8)) == []  # contradictory: nothing matches
    assert pruned(("id", ">=", 7)) == everything  # a range says nothing about hash buckets
    assert pruned(("name", "=", "x")) == everything
    assert pruned() == everything
