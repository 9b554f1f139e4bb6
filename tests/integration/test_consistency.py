"""Consistent reads on real processes (issue 34, docs/consistency.md).

The checker: 3 tservers, a table of 8 tablets; two writers insert, update and delete single
rows (each write one tablet, so its timestamp is the row's) while tablets flush and compact,
a tablet leader's server is SIGKILLed and restarted, and a follower's server restarted.
Every acknowledged write is recorded with its timestamp in a ``VersionModel``. Then snapshot
scans at many timestamps, on leaders and on followers, must return exactly the model's rows
at that timestamp; the same scans repeated later return identical tables; diff scans equal
the difference of two snapshots; and each writer's read-your-writes scans, during the run,
saw its own last write. The default suite runs it for a few seconds; ``-m scale`` longer.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

import nyala
from nyala import errors
from nyala.cli import main
from nyala.client.write import RowOutcome
from nyala.testing import MiniCluster, logs_on_failure
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, ServerProcess, fast_master_flags
from nyala.testing.snapshots import DELETED, VersionModel

SCHEMA = nyala.Schema.parse("id:int64, v:int64?, w:string?", key=["id"])
TABLETS = 8
# Flushes every 0.7 s and a compaction once a replica has 3 rowsets: row versions go through
# MemRowSets, flushed rowsets and merged ones while the checker runs.
TSERVER_FLAGS = [
    *FAST_TSERVER_FLAGS,
    "--flush-interval-ms",
    "700",
    "--compaction-rowsets-min",
    "3",
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[MiniCluster]:
    with logs_on_failure(
        MiniCluster(3, num_masters=1, master_flags=fast_master_flags(), tserver_flags=TSERVER_FLAGS)
    ) as mini:
        yield mini


@pytest.fixture(scope="module")
def client(cluster: MiniCluster) -> Iterator[nyala.Client]:
    with nyala.connect(cluster.master_addrs, timeout_ms=30_000) as c:
        yield c


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()


class Writer(threading.Thread):
    """Single-row inserts, updates and deletes over its own keys, recorded when
    acknowledged; every few writes a read-your-writes scan of the key just written."""

    def __init__(
        self, table: nyala.Table, model: VersionModel, first_key: int, stop: threading.Event
    ) -> None:
        super().__init__(daemon=True)
        self.table, self.model, self.stop = table, model, stop
        self.rng = random.Random(first_key)
        self.keys = list(range(first_key, first_key + 400))
        self.live: set[int] = set()
        self.writes = 0
        self.ryw_checks = 0
        self.failures: list[str] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                self._one()
        except Exception as exc:  # reported by the test
            self.failures.append(f"{type(exc).__name__}: {exc}")

    def _one(self) -> None:
        key = self.rng.choice(self.keys)
        if not self.model.is_certain(key):
            return
        value: dict[str, Any] | None
        try:
            if key in self.live and self.rng.random() < 0.25:
                value = DELETED
                result = self.table.delete({"id": [key]}, timeout_ms=20_000)
            else:
                value = {"v": self.writes, "w": f"w{self.writes}"}
                data = {"id": [key], "v": [value["v"]], "w": [value["w"]]}
                result = self.table.upsert(data, timeout_ms=20_000)
        except errors.NyalaError:
            self.model.uncertain(key)  # e.g. unknown while its leader was killed
            return
        self.writes += 1
        outcome = result.outcomes[0]
        if outcome == RowOutcome.APPLIED:
            assert result.timestamp > 0, "an applied write reports its timestamp"
            self.model.record(key, result.timestamp, value)
            if value is DELETED:
                self.live.discard(key)
            else:
                self.live.add(key)
        else:
            self.model.uncertain(key)
            return
        if self.writes % 10 == 0:
            seen = self.table.scan(where=[("id", "=", key)], read_mode="read_your_writes")
            try:
                rows = _rows(seen.to_arrow())
            except errors.NyalaError:
                return  # e.g. the tablet's servers down for a moment: nothing was read
            expected = [] if value is DELETED else [{"id": key, **value}]
            if rows != expected:
                self.failures.append(f"read-your-writes of key {key}: {rows} != {expected}")
            if seen.snapshot_ts is None or seen.snapshot_ts < result.timestamp:
                self.failures.append(f"read-your-writes read at {seen.snapshot_ts}")
            self.ryw_checks += 1


class Reader(threading.Thread):
    """Snapshot scans while the writers run, each at the timestamp the first tablet's server
    picks (alternately through leaders and followers); kept to be checked against the model
    once every acknowledgement is in."""

    def __init__(self, table: nyala.Table, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.table, self.stop = table, stop
        self.reads: list[tuple[int, pa.Table, str]] = []
        #: Tablet scans (of all the reads) served by a replica that was not the leader.
        self.follower_served = 0
        self.errors = 0

    def run(self) -> None:
        replicas = ("leader", "follower")
        while not self.stop.is_set():
            replica = replicas[len(self.reads) % 2]
            scanner = self.table.scan(read_mode="snapshot", replica=replica, timeout_ms=20_000)
            try:
                rows = scanner.to_arrow()
            except errors.NyalaError:
                self.errors += 1  # e.g. every replica of a tablet down for a moment
                continue
            assert scanner.snapshot_ts is not None
            self.reads.append((scanner.snapshot_ts, rows, replica))
            if replica == "follower":
                leaders = {t.tablet_id: t.leader_uuid for t in self.table.tablets()}
                self.follower_served += sum(
                    1 for tablet, uuid in scanner.served_by.items() if uuid != leaders.get(tablet)
                )
            time.sleep(0.05)


def _snapshot(
    table: nyala.Table, ts: int, replica: str = "leader"
) -> tuple[pa.Table, nyala.Scanner]:
    scanner = table.scan(read_mode="snapshot", snapshot_ts=ts, replica=replica)
    return scanner.to_arrow(), scanner


def _check_snapshot(model: VersionModel, rows: pa.Table, ts: int, what: str = "") -> None:
    got = model.comparable(_rows(rows), "id")
    want = model.state_at(ts)
    missing = want.keys() - got.keys()
    extra = got.keys() - want.keys()
    wrong = {k for k in want.keys() & got.keys() if want[k] != got[k]}
    problems = bool(missing or extra or wrong)
    assert not problems, (
        f"snapshot {ts} {what}: {len(missing)} rows missing (e.g. {sorted(missing)[:3]}), "
        f"{len(extra)} extra (e.g. {sorted(extra)[:3]}), {len(wrong)} with other values "
        f"(e.g. {[(k, got[k], want[k]) for k in sorted(wrong)[:3]]})"
    )


def _leader_server(cluster: MiniCluster, client: nyala.Client, table: nyala.Table) -> int:
    tablet = table.tablets()[0]
    uuids = [ts.uuid for ts in cluster.tservers]
    return uuids.index(tablet.leader_uuid) if tablet.leader_uuid in uuids else 0


def _run_checker(cluster: MiniCluster, client: nyala.Client, name: str, seconds: float) -> None:
    table = client.create_table(
        name, SCHEMA, partitioning=nyala.HashPartitioning("id", TABLETS), replicas=3
    )
    model = VersionModel()
    stop = threading.Event()
    writers = [Writer(table, model, first, stop) for first in (0, 100_000)]
    reader = Reader(table, stop)
    for w in writers:
        w.start()
    reader.start()
    victim: ServerProcess | None = None
    try:
        time.sleep(seconds / 3)
        # A tablet leader's server dies without warning, and comes back.
        victim = cluster.tservers[_leader_server(cluster, client, table)]
        victim.kill()
        time.sleep(1.0)
        victim.restart()
        time.sleep(seconds / 3)
        # A follower's server restarts (stop, start): it replays its WAL.
        follower = next(t for t in cluster.tservers if t is not victim)
        follower.restart()
        time.sleep(seconds / 3)
    finally:
        stop.set()
        for w in writers:
            w.join(timeout=60)
        reader.join(timeout=60)
    failures = [f for w in writers for f in w.failures]
    assert not failures, failures[:5]
    assert sum(w.ryw_checks for w in writers) > 0
    stamps = model.timestamps
    assert len(stamps) > 50, f"only {len(stamps)} acknowledged writes"
    # The scans taken during the writes: exactly the writes acknowledged at or before each.
    assert len(reader.reads) > 5, f"only {len(reader.reads)} snapshot scans during the writes"
    for ts, rows, replica in reader.reads:
        _check_snapshot(model, rows, ts, f"read through {replica} during the writes")

    rng = random.Random(7)
    points = sorted({*rng.sample(stamps, 12), stamps[0] - 1, stamps[-1]})
    first: dict[int, pa.Table] = {}
    for ts in points:
        rows, scanner = _snapshot(table, ts)
        assert scanner.snapshot_ts == ts
        _check_snapshot(model, rows, ts)
        first[ts] = rows
    # Followers serve snapshots once their leader's safe time passed them.
    followers_served = 0
    for ts in points[-4:]:
        rows, scanner = _snapshot(table, ts, replica="follower")
        _check_snapshot(model, rows, ts)
        leaders = {t.tablet_id: t.leader_uuid for t in table.tablets()}
        followers_served += sum(
            1 for tablet, uuid in scanner.served_by.items() if uuid != leaders.get(tablet)
        )
    # (Once the writes stop, idle tablets quiesce and their followers' safe time stands
    # still: those reads may fall back to leaders. During the writes followers serve.)
    followers_served += reader.follower_served
    assert followers_served > 0, "no follower served a snapshot scan"
    print(
        f"\n{len(stamps)} acknowledged writes, {sum(w.ryw_checks for w in writers)} "
        f"read-your-writes checks, {len(reader.reads)} snapshot scans during the writes, "
        f"{len(points)} snapshots checked after them, {followers_served} "
        "tablet snapshots served by followers"
    )
    # Diff scans are the difference of two snapshots.
    for start, end in zip(points[:-1:3], points[2::3], strict=False):
        diff = _rows(table.diff_scan(start, end).to_arrow())
        got = {
            r["id"]: (DELETED if r["is_deleted"] else {"v": r["v"], "w": r["w"]})
            for r in diff
            if model.is_certain(r["id"])
        }
        assert got == model.diff(start, end), f"diff scan ({start}, {end}]"
    # Repeatable: later (after more flushes and compactions) the same snapshots read alike.
    time.sleep(2.0)
    for ts in points:
        again, _ = _snapshot(table, ts)
        assert again.equals(first[ts]), f"snapshot {ts} read differently the second time"


def test_snapshot_reads_under_writes_flushes_and_failures(
    cluster: MiniCluster, client: nyala.Client
) -> None:
    _run_checker(cluster, client, "checker", seconds=9.0)


@pytest.mark.scale
def test_snapshot_reads_under_writes_flushes_and_failures_long(
    cluster: MiniCluster, client: nyala.Client
) -> None:
    _run_checker(cluster, client, "checker_long", seconds=60.0)


def test_a_snapshot_scan_picks_one_timestamp_for_every_tablet(client: nyala.Client) -> None:
    table = client.create_table(
        "one_ts", SCHEMA, partitioning=nyala.HashPartitioning("id", 4), replicas=3
    )
    first = table.insert({"id": list(range(100)), "v": list(range(100))})
    assert first.ok
    assert first.timestamp > 0
    assert client.latest_observed_timestamp() >= first.timestamp
    scanner = table.scan(read_mode="snapshot")
    before = scanner.to_arrow()
    assert before.num_rows == 100
    picked = scanner.snapshot_ts
    assert picked is not None
    assert picked >= first.timestamp
    # Writes after the pick do not show in the same scanner, run again, or at that timestamp.
    assert table.insert({"id": list(range(100, 200))}).ok
    assert table.update({"id": list(range(50)), "v": [-1] * 50, "w": ["u"] * 50}).ok
    assert scanner.to_arrow().equals(before)
    assert table.scan(read_mode="snapshot", snapshot_ts=picked).to_arrow().equals(before)
    # A read-your-writes scan sees them; a latest scan too.
    assert table.scan(read_mode="read_your_writes").count() == 200
    assert table.count() == 200
    # Bad requests are refused clearly.
    with pytest.raises(errors.InvalidArgumentError, match="read_mode"):
        table.scan(read_mode="sometimes")
    with pytest.raises(errors.InvalidArgumentError, match="snapshot_ts"):
        table.scan(snapshot_ts=picked)
    far_future = nyala.timestamp_from_datetime(
        nyala.timestamp_to_datetime(picked).replace(year=2100)
    )
    with pytest.raises(errors.InvalidArgumentError, match="clock error"):
        table.scan(read_mode="snapshot", snapshot_ts=far_future).to_arrow()


def test_history_older_than_the_retention_is_refused(cluster: MiniCluster) -> None:
    flags = [*TSERVER_FLAGS, "--tablet-history-max-age-s", "2"]
    with (
        logs_on_failure(
            MiniCluster(1, num_masters=1, master_flags=fast_master_flags(), tserver_flags=flags)
        ) as mini,
        nyala.connect(mini.master_addrs, timeout_ms=30_000) as c,
    ):
        table = c.create_table("short_history", SCHEMA, replicas=1)
        old = table.insert({"id": [1], "v": [1]})
        assert table.update({"id": [1], "v": [2], "w": ["u"]}).ok
        assert (
            table.scan(read_mode="snapshot", snapshot_ts=old.timestamp)
            .to_arrow()
            .to_pylist()[0]["v"]
            == 1
        )
        time.sleep(3.0)
        with pytest.raises(errors.InvalidArgumentError, match="tablet_history_max_age_s"):
            table.scan(read_mode="snapshot", snapshot_ts=old.timestamp).to_arrow()
        assert table.scan().to_arrow().to_pylist()[0]["v"] == 2


def test_cli_scans_at_a_snapshot_and_diffs(cluster: MiniCluster, client: nyala.Client) -> None:
    table = client.create_table("cli_snap", SCHEMA, replicas=3)
    first = table.insert({"id": [1, 2, 3], "v": [10, 20, 30]})
    assert table.delete({"id": [2]}).ok
    assert table.update({"id": [3], "v": [33], "w": ["x"]}).ok
    runner = CliRunner(env={"NYALA_MASTERS": ",".join(cluster.master_addrs)})

    def run(*args: str) -> tuple[list[dict[str, Any]], str]:
        result = runner.invoke(
            main, ["table", "scan", "cli_snap", "--format", "json", *args], catch_exceptions=False
        )
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout), result.stderr

    rows, notice = run("--snapshot", str(first.timestamp))
    assert [(r["id"], r["v"]) for r in rows] == [(1, 10), (2, 20), (3, 30)]
    assert f"read at snapshot {first.timestamp}" in notice
    rows, notice = run("--read-mode", "snapshot")
    assert [(r["id"], r["v"]) for r in rows] == [(1, 10), (3, 33)]
    picked = int(notice.split("read at snapshot ")[1].split()[0])
    # An ISO date-time reads as of that microsecond: the one after the insert's.
    when = nyala.timestamp_to_datetime(first.timestamp + (1 << 12)).isoformat()
    rows, _ = run("--snapshot", when)
    assert [r["id"] for r in rows] == [1, 2, 3]
    rows, _ = run("--snapshot", str(picked), "--diff-from", str(first.timestamp))
    assert [(r["id"], r["is_deleted"]) for r in rows] == [(2, True), (3, False)]
    result = runner.invoke(main, ["table", "scan", "cli_snap", "--diff-from", "5"])
    assert result.exit_code == 2
    assert "--diff-from needs --snapshot" in result.stderr
