"""The Python client against real clusters: 3 masters, 3 tservers on loopback (issue 11).

One cluster serves the module; tests that kill servers bring them back before they end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

import nyala
from nyala import errors
from nyala.client.write import _Request
from nyala.testing import MiniCluster, logs_on_failure
from nyala.testing.garbage import collector_off
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags

MASTER_FLAGS = fast_master_flags()
TSERVER_FLAGS = FAST_TSERVER_FLAGS

SCHEMA = nyala.Schema.parse("id:int64, name:string?, v:double?", key=["id"])


@pytest.fixture(scope="module")
def cluster() -> Iterator[MiniCluster]:
    with logs_on_failure(
        MiniCluster(3, num_masters=3, master_flags=MASTER_FLAGS, tserver_flags=TSERVER_FLAGS)
    ) as mini:
        yield mini


@pytest.fixture
def client(cluster: MiniCluster) -> Iterator[nyala.Client]:
    with nyala.connect(cluster.master_addrs, timeout_ms=30_000) as c:
        yield c


def rows(start: int, count: int) -> pa.Table:
    ids = np.arange(start, start + count, dtype=np.int64)
    return pa.table(
        {"id": ids, "name": pa.array([f"n{i}" for i in ids]), "v": ids.astype(np.float64) / 2}
    )


def ids_of(table: nyala.Table) -> list[int]:
    return sorted(table.scan(columns=["id"]).to_arrow().column("id").to_pylist())


def test_create_write_scan_and_row_errors(client: nyala.Client) -> None:
    table = client.create_table(
        "basic", SCHEMA, partitioning=nyala.HashPartitioning(["id"], buckets=4), replicas=3
    )
    assert len(table.tablets()) == 4
    result = table.insert(rows(0, 5000))
    assert result.ok
    assert result.applied == 5000
    assert ids_of(table) == list(range(5000))
    # A dict of numpy arrays, with duplicates: the duplicates come back with their rows.
    again = table.insert(
        {"id": np.array([4999, 5000, 1]), "name": ["a", "b", "c"], "v": [1.0, 2.0, 3.0]}
    )
    assert [e.row for e in again.row_errors] == [0, 2]
    assert {e.code for e in again.row_errors} == {"ALREADY_PRESENT"}
    assert again.failed_rows is not None
    assert again.failed_rows.column("id").to_pylist() == [4999, 1]
    with pytest.raises(errors.AlreadyPresentError):
        again.raise_for_errors()
    assert (
        table.update({"id": [10, 123456], "name": ["x", "y"], "v": [0.0, 0.0]}).row_errors[0].row
        == 1
    )
    assert table.delete({"id": np.arange(0, 100, dtype=np.int64)}).ok
    assert table.count() == 5001 - 100
    scan = table.scan(columns=["name", "id"], where=[("id", ">=", 4990), ("id", "<", 4995)])
    got = scan.to_arrow()
    assert got.column_names == ["name", "id"]
    assert sorted(got.column("id").to_pylist()) == [4990, 4991, 4992, 4993, 4994]
    assert table.scan(where=[("id", "in", [100, 101, 99999])]).to_arrow().num_rows == 2
    assert table.scan(limit=7).to_arrow().num_rows == 7
    assert sum(b.num_rows for b in table.scan(batch_size_bytes=1024, page_batches=2)) == 4901
    described = client.describe_table("basic")
    assert described["partitioning"] == "HASH(id) 4"
    assert any(t["name"] == "basic" for t in client.list_tables())


def test_bad_input_is_a_typed_error(client: nyala.Client) -> None:
    table = client.create_table("typed", SCHEMA, replicas=3)
    # A value that does not convert is its row's error; the other rows are applied.
    result = table.insert({"id": ["not a number", "2"], "name": ["a", "b"], "v": [1.0, 2.0]})
    assert [(e.row, e.code) for e in result.row_errors] == [(0, "INVALID_ARGUMENT")]
    assert "cannot convert" in result.row_errors[0].message
    assert result.applied == 1
    # Omitted nullable columns are null; a column the table lacks is named.
    assert table.insert({"id": [1]}).ok
    with pytest.raises(errors.InvalidArgumentError, match=r"\['zz'\] are not in the table"):
        table.insert({"id": [3], "zz": [1]})
    with pytest.raises(errors.InvalidArgumentError, match="cannot convert"):
        table.insert({"id": [[1]]})
    with pytest.raises(errors.NotFoundError):
        client.table("no-such-table")
    with pytest.raises(errors.InvalidArgumentError):
        table.scan(where=[("id", "~", 3)])
    with pytest.raises(errors.InvalidArgumentError):
        client.create_table("bad", SCHEMA, partitioning=nyala.HashPartitioning("v", 2))


def test_range_partitioning_and_alter(client: nyala.Client) -> None:
    spec: list[nyala.HashPartitioning | nyala.RangePartitioning] = [
        nyala.HashPartitioning("id", 2),
        nyala.RangePartitioning("id", splits=[1000]),
    ]
    table = client.create_table("ranged", SCHEMA, partitioning=spec, replicas=3)
    assert len(table.tablets()) == 4
    assert table.upsert(rows(0, 2000)).ok
    table = client.alter_table(
        "ranged", add_columns=[nyala.Column("extra", "int32", nullable=True)]
    )
    assert table.schema.names == ["id", "name", "v", "extra"]
    assert table.upsert({"id": [1], "name": ["z"], "v": [1.0], "extra": [7]}).ok
    assert table.scan(where=[("extra", "=", 7)]).to_arrow().column("id").to_pylist() == [1]
    renamed = client.alter_table("ranged", new_name="ranged2")
    assert renamed.count() == 2000
    client.delete_table("ranged2")
    with pytest.raises(errors.NotFoundError):
        client.table("ranged2")


def test_session_background_flush_collects_errors(client: nyala.Client) -> None:
    client.create_table("sess", SCHEMA, partitioning=nyala.HashPartitioning("id", 3), replicas=3)
    with client.session(flush="background", flush_rows=500, flush_interval_ms=50) as session:
        for start in range(0, 3000, 100):
            session.insert("sess", rows(start, 100))
        session.insert("sess", rows(10, 2))  # duplicates: collected, not raised
    assert sorted(e.values["id"] for e in session.errors) == [10, 11]
    assert ids_of(client.table("sess")) == list(range(3000))
    manual = client.session(flush="manual", buffer_bytes_max=1)
    manual.upsert("sess", rows(5000, 10))
    with pytest.raises(errors.IllegalStateError, match="flush"):
        manual.upsert("sess", rows(6000, 10))
    manual.close()
    assert client.table("sess").count(where=[("id", ">=", 5000)]) == 10


def _leader_process(cluster: MiniCluster, table: nyala.Table, index: int = 0) -> int:
    tablet = table.tablets()[index]
    leader = cluster.leader_of(tablet.tablet_id)
    return cluster.tservers.index(leader)


def test_tablet_leader_killed_mid_session_loses_and_duplicates_nothing(
    cluster: MiniCluster, client: nyala.Client
) -> None:
    table = client.create_table(
        "failover", SCHEMA, partitioning=nyala.HashPartitioning("id", 2), replicas=3
    )
    acked: list[int] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def write_loop() -> None:
        start = 0
        while not stop.is_set():
            try:
                # INSERT: a retry applied twice would come back as ALREADY_PRESENT.
                table.insert(rows(start, 200), timeout_ms=30_000).raise_for_errors()
            except BaseException as exc:
                failures.append(exc)
                return
            acked.extend(range(start, start + 200))
            start += 200

    writer = threading.Thread(target=write_loop)
    writer.start()
    time.sleep(1.0)
    victim = _leader_process(cluster, table)
    cluster.tservers[victim].kill()
    time.sleep(3.0)
    stop.set()
    writer.join(timeout=60)
    try:
        assert not failures, failures
        assert len(acked) > 400
        got = ids_of(table)
        assert got[: len(acked)] == acked  # every acknowledged row, each once
        assert len(got) == len(set(got))
    finally:
        cluster.tservers[victim].restart()


def test_scan_resumes_after_the_leader_dies(cluster: MiniCluster, client: nyala.Client) -> None:
    table = client.create_table("scanfail", SCHEMA, replicas=3)
    assert table.insert(rows(0, 20_000)).ok
    victim = _leader_process(cluster, table)
    seen: list[int] = []
    scan = table.scan(columns=["id"], batch_size_bytes=16 * 1024, page_batches=1)
    try:
        for i, batch in enumerate(scan):
            seen.extend(batch.column("id").to_pylist())
            if i == 1:
                cluster.tservers[victim].kill()
        assert seen == list(range(20_000))
    finally:
        cluster.tservers[victim].restart()


def test_connect_errors(cluster: MiniCluster) -> None:
    with pytest.raises(errors.TimedOutError):
        nyala.connect("127.0.0.1:1", timeout_ms=500)
    with pytest.raises(errors.InvalidArgumentError, match="not the cluster's masters"):
        nyala.connect(cluster.master_addrs[:1], timeout_ms=5_000)
    with pytest.raises(errors.InvalidArgumentError):
        nyala.connect("no-port-here")


def test_master_failover_during_write_loop(cluster: MiniCluster, client: nyala.Client) -> None:
    client.create_table("mfail", SCHEMA, replicas=3)
    leader = cluster.leader_master()
    leader.kill()
    try:
        # The client finds the new leader master for DDL and metadata while writing.
        for start in range(0, 2000, 500):
            client.table("mfail").insert(rows(start, 500)).raise_for_errors()
            client.list_tables()
        client.create_table("mfail2", SCHEMA, replicas=3)
        assert client.table("mfail").count() == 2000
    finally:
        leader.restart()


def test_a_write_that_fails_for_good_leaves_no_cycle_that_holds_its_rows(
    cluster: MiniCluster, client: nyala.Client
) -> None:
    """A request that fails for good (here: its tablet's only replica is down past the write's
    deadline) is answered by its error, kept among the other requests' outcomes; with its
    traceback, which runs through the frame holding those outcomes, it would keep the rows in
    a cycle until the cyclic collector runs."""
    table = client.create_table("unreachable", SCHEMA, replicas=1)
    assert table.insert(rows(0, 10)).ok
    victim = _leader_process(cluster, table)
    cluster.tservers[victim].kill()
    try:
        with collector_off() as left:
            try:
                table.insert(rows(10, 1_000), timeout_ms=1_500)
            except errors.NyalaError:
                pass
            else:
                pytest.fail("a write to a tablet with no live replica succeeded")
            kept = left(_Request)
            assert kept == [], kept[:3]
    finally:
        cluster.tservers[victim].restart()
