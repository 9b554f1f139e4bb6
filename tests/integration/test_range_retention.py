"""Time-series retention on real processes (issue 33): a table of daily range partitions ×
hash buckets is loaded, then its oldest days are dropped one by one while writers keep
writing to the newest day and the leader master is killed half-way. Afterwards the rows of
the dropped days are gone, every other row is intact, the writers saw no error, and every
replica of the dropped tablets is tombstoned on every tablet server.

The default suite runs a small but complete version (6 days × 2 buckets, 2 dropped); the
issue's size (30 days × 4 buckets, 7 dropped) runs under ``-m slow``.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator

import pytest

import nyala
from nyala._proto import tserver_admin_pb2
from nyala.testing import MiniCluster, logs_on_failure
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags

FIRST_DAY = datetime.date(2024, 1, 1)
ROWS_PER_DAY = 300
TABLET_DATA_TOMBSTONED = 3


@pytest.fixture
def cluster() -> Iterator[MiniCluster]:
    with logs_on_failure(
        MiniCluster(
            3, num_masters=3, master_flags=fast_master_flags(), tserver_flags=FAST_TSERVER_FLAGS
        )
    ) as mini:
        yield mini


def day(i: int) -> datetime.date:
    return FIRST_DAY + datetime.timedelta(days=i)


def tombstoned_on_every_tserver(cluster: MiniCluster, tablet_ids: set[str]) -> bool:
    """Every tablet server holds each of ``tablet_ids`` as a tombstone (RF 3 on 3 servers)."""
    for ts in cluster.tservers:
        with ts.proxy() as proxy:
            request = tserver_admin_pb2.ListTabletsRequestPB(dest_uuid=ts.uuid)
            entries = proxy.call(proxy.admin.ListTablets, request).status_and_schema
        states = {
            e.tablet_status.tablet_id: e.tablet_status.data_state
            for e in entries
            if e.tablet_status.tablet_id in tablet_ids
        }
        if set(states) != tablet_ids or set(states.values()) != {TABLET_DATA_TOMBSTONED}:
            return False
    return True


@pytest.mark.parametrize(
    ("days", "buckets", "dropped"),
    [
        pytest.param(6, 2, 2, id="6-days"),
        # 120 tablets created, elected and loaded beside the rest of `make test` took 172 s
        # once (22 s alone): the size is what it checks, not the speed.
        pytest.param(30, 4, 7, id="30-days", marks=[pytest.mark.slow, pytest.mark.timeout(600)]),
    ],
)
def test_oldest_days_dropped_while_writers_write_and_the_leader_master_changes(
    cluster: MiniCluster, days: int, buckets: int, dropped: int
) -> None:
    schema = nyala.Schema.parse("day:date, id:int64, v:int64", key=["day", "id"])
    # Creating days × buckets × 3 replicas (360 at the size) is timed by
    # benches/many_tablets_bench.py; here it may take longer than the default admin deadline
    # on a loaded machine without that being what this test is about.
    with nyala.connect(cluster.master_addrs, timeout_ms=60_000, admin_timeout_ms=180_000) as client:
        table = client.create_table(
            "metrics",
            schema,
            partitioning=[
                nyala.HashPartitioning(["id"], buckets=buckets),
                nyala.RangePartitioning(
                    ["day"], bounds=[(day(i), day(i + 1)) for i in range(days)]
                ),
            ],
            replicas=3,
        )
        assert len(table.tablets()) == days * buckets
        for i in range(days):
            ids = list(range(ROWS_PER_DAY))
            assert table.insert({"day": [day(i)] * ROWS_PER_DAY, "id": ids, "v": ids}).ok
        by_range = {}
        for tablet in table.tablets():
            by_range.setdefault(tablet.partition.range_bounds(), set()).add(tablet.tablet_id)

        # Writers of the newest day, each with its own client, as separate applications are.
        stop = threading.Event()
        problems: list[str] = []
        written: list[list[int]] = []

        def write(worker: int) -> None:
            mine: list[int] = []
            written.append(mine)
            with nyala.connect(cluster.master_addrs, timeout_ms=60_000) as own:
                live = own.table("metrics")
                next_id = 1_000_000 * (worker + 1)
                while not stop.is_set():
                    ids = list(range(next_id, next_id + 50))
                    try:
                        result = live.insert({"day": [day(days - 1)] * 50, "id": ids, "v": ids})
                    except nyala.errors.NyalaError as exc:
                        problems.append(f"writer {worker}: {exc!r}")
                        return
                    if not result.ok:
                        problems.append(f"writer {worker}: {result.row_errors[:3]}")
                        return
                    mine.extend(ids)
                    next_id += 50

        writers = [threading.Thread(target=write, args=(w,)) for w in range(2)]
        for writer in writers:
            writer.start()
        killed = None
        try:
            for i in range(dropped):
                if i == dropped // 2:
                    killed = cluster.leader_master()
                    killed.kill()  # the next drop goes to whoever leads next
                client.alter_table("metrics", drop_range_partition=(day(i), day(i + 1)))
        finally:
            stop.set()
            for writer in writers:
                writer.join(timeout=120)
        assert not problems, problems
        assert sum(len(w) for w in written) > 0, "the writers wrote nothing while days dropped"

        table = client.table("metrics")
        assert len(table.tablets()) == (days - dropped) * buckets
        rows = table.scan(columns=["day", "id"]).to_arrow()
        got: dict[datetime.date, set[int]] = {}
        for d, key in zip(
            rows.column("day").to_pylist(), rows.column("id").to_pylist(), strict=True
        ):
            got.setdefault(d, set()).add(key)
        assert rows.num_rows == sum(len(v) for v in got.values()), "a row came back twice"
        expected = {day(i): set(range(ROWS_PER_DAY)) for i in range(dropped, days)}
        expected[day(days - 1)] |= {k for w in written for k in w}
        assert got == expected
        # Writes to a dropped day are row errors now.
        late = table.insert({"day": [day(0)], "id": [1], "v": [1]})
        assert [e.row for e in late.row_errors] == [0]

        gone = set().union(
            *(
                ids
                for bounds, ids in by_range.items()
                if bounds[0] < schema_key(table, day(dropped))
            )
        )
        assert len(gone) == dropped * buckets
        if killed is not None:
            killed.start()
        ops.wait_until(
            lambda: tombstoned_on_every_tserver(cluster, gone),
            timeout_s=120,
            what="every replica of the dropped days tombstoned on every tablet server",
        )


def schema_key(table: nyala.Table, value: datetime.date) -> bytes:
    """The encoded range key of ``value`` in ``table``."""
    return table.partition_schema.encode_range_key(table.schema, [value])
