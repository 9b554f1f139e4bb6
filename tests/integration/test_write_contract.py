"""The write contract on real processes (issue #32, docs/write-semantics.md): every row of a
call is applied, failed with a reason, or unknown, and the table holds exactly the applied
rows. 3 masters, 3 tservers, a table of 4 tablets with a gap between its ranges.

* Property tests (Hypothesis): random batches mixing every kind of bad row with good ones,
  through ``Table.insert``/``upsert``, a session and ``nyala table load``; for each call the
  outcomes partition the input exactly and match the model's, and a leader scan holds exactly
  the model's rows. (The Spark writer's run is in tests/spark.)
* A tablet leader paused or SIGKILLed under a multi-tablet write: its rows come back unknown,
  the others applied, and ``retry()`` applies them exactly once.
* Schema evolution: omitted columns, defaults kept by the master across a leader change, an
  old Parquet file loaded after a column was added, a writer that outlives a schema change.
"""

from __future__ import annotations

import contextlib
import gc
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nyala
from nyala import errors
from nyala._proto import consensus_pb2
from nyala.cli import main
from nyala.client.write import RowOutcome, Writer
from nyala.rowops import OpType
from nyala.testing import MiniCluster, logs_on_failure
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, ServerProcess, fast_master_flags
from nyala.testing.write_contract import (
    PARTITIONING,
    SCHEMA,
    Kind,
    Model,
    Row,
    RowSpec,
    outcome_names,
    rows_table,
    table_rows,
)

MASTER_FLAGS = fast_master_flags()

SPECS = st.lists(
    st.builds(RowSpec, st.sampled_from(list(Kind)), st.integers(0, 10_000)),
    min_size=1,
    max_size=24,
)
PROPERTY = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[MiniCluster]:
    with logs_on_failure(
        MiniCluster(3, num_masters=3, master_flags=MASTER_FLAGS, tserver_flags=FAST_TSERVER_FLAGS)
    ) as mini:
        yield mini


@pytest.fixture(scope="module")
def client(cluster: MiniCluster) -> Iterator[nyala.Client]:
    with nyala.connect(cluster.master_addrs, timeout_ms=30_000) as c:
        yield c


class Contract:
    """One table and its model: writes a batch, then checks outcomes and contents."""

    def __init__(self, client: nyala.Client, name: str, *, tablets: int = 4) -> None:
        partitioning = PARTITIONING if tablets > 1 else None
        self.table = client.create_table(name, SCHEMA, partitioning=partitioning, replicas=3)
        assert len(self.table.tablets()) == tablets
        self.model = Model()
        self.calls = 0

    def rows(self, op: OpType, specs: list[RowSpec], present: set[int] | None = None) -> list[Row]:
        self.calls += 1
        return self.model.resolve(op, specs, self.calls, present)

    def check(self, rows: list[Row], outcomes: list[str], codes: dict[int, str]) -> None:
        """``outcomes[i]`` and, for failed rows, ``codes[i]`` against the model; then the
        table's rows against the model."""
        assert len(outcomes) == len(rows), "one outcome per input row"
        expected = self.model.expect(rows)
        for i, (row, want, got) in enumerate(zip(rows, expected, outcomes, strict=True)):
            if got == "unknown":
                continue  # settled by key below (no fault is injected here, so rare)
            assert got == want.outcome, (i, row.op, row.id, want, got, codes.get(i))
            if got == "failed":
                assert codes[i] == want.code, (i, row.op, row.id, want, codes[i])
        self.model.settle(rows, outcomes, self.lookup)
        assert table_rows(self.table.scan().to_arrow()) == self.model.rows

    def lookup(self, key: int) -> dict[str, Any] | None:
        found = table_rows(self.table.scan(where=[("id", "=", key)]).to_arrow())
        return found.get(key)


def _result_of(call: Any) -> nyala.WriteResult:
    try:
        result: nyala.WriteResult = call()
    except errors.PartialWriteError as exc:
        result = exc.result
    return result


# --- the property tests -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def api_table(client: nyala.Client) -> Contract:
    return Contract(client, "contract_api")


@PROPERTY
@given(specs=SPECS, upsert=st.booleans())
def test_table_writes_report_every_row(
    api_table: Contract, specs: list[RowSpec], upsert: bool
) -> None:
    op = OpType.UPSERT if upsert else OpType.INSERT
    rows = api_table.rows(op, specs)
    result = _result_of(lambda: api_table.table.write(rows_table(rows), op))
    outcomes = outcome_names(result.outcomes)
    codes = {e.row: e.code for e in result.row_errors}
    # Each failed row names its key; applied + failed + unknown is the whole input.
    for error in result.row_errors:
        assert error.key == {"id": rows[error.row].id}
    assert result.applied + len(result.row_errors) + len(result.unknown) == len(rows)
    api_table.check(rows, outcomes, codes)


@pytest.fixture(scope="module")
def one_tablet_table(client: nyala.Client) -> Contract:
    return Contract(client, "contract_one_tablet", tablets=1)


@PROPERTY
@given(specs=SPECS, op=st.sampled_from([OpType.INSERT, OpType.UPSERT]), partitioned=st.booleans())
def test_writes_of_a_few_rows_as_lists_report_every_row(
    api_table: Contract,
    one_tablet_table: Contract,
    specs: list[RowSpec],
    op: OpType,
    partitioned: bool,
) -> None:
    """The rows as a dict of lists (``Writer.write_small``; its one-tablet shortcut when the
    table has one tablet): the same contract, and the failed rows' values come back."""
    contract = api_table if partitioned else one_tablet_table
    if not partitioned:  # its one tablet covers every key: no row falls between ranges
        specs = [RowSpec(Kind.GOOD, s.choice) if s.kind is Kind.GAP else s for s in specs]
    rows = contract.rows(op, specs)
    given = rows_table(rows).to_pydict()
    result = _result_of(lambda: contract.table.write(given, op))
    assert result.rows == len(rows)
    assert result.applied + len(result.row_errors) + len(result.unknown) == len(rows)
    for error in result.row_errors:
        assert error.key == {"id": rows[error.row].id}
    failed = [rows[e.row].id for e in result.row_errors]
    got = [] if result.failed_rows is None else result.failed_rows.column("id").to_pylist()
    assert got == failed
    if result.ok:
        assert result.timestamp > 0
        assert (result.outcomes == RowOutcome.APPLIED).all()
    codes = {e.row: e.code for e in result.row_errors}
    contract.check(rows, outcome_names(result.outcomes), codes)


def test_a_few_rows_to_one_tablet_come_back_row_by_row(client: nyala.Client) -> None:
    """The one-tablet shortcut of ``Writer.write_small``: a duplicate among the rows is a row
    error naming its key and keeping its values; a write all applied has its timestamp."""
    table = client.create_table("few_rows", SCHEMA, replicas=3)
    first = table.insert({"id": [1, 2], "v": ["a", "b"]})
    assert first.ok
    assert first.applied == 2
    assert first.timestamp > 0
    again = table.insert({"id": [2, 3], "v": ["c", "d"]})
    assert [(e.row, e.code, dict(e.key)) for e in again.row_errors] == [
        (0, "ALREADY_PRESENT", {"id": 2})
    ]
    assert again.applied == 1
    assert not again.unknown
    assert again.failed_rows is not None
    assert again.failed_rows.select(["id", "v"]).to_pylist() == [{"id": 2, "v": "c"}]
    assert outcome_names(again.outcomes) == ["failed", "applied"]
    assert again.timestamp >= first.timestamp
    assert client._writer.requests.outstanding == 0
    got = table.scan(columns=["id", "v"]).to_arrow().sort_by("id").to_pylist()
    assert got == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "d"}]


@pytest.fixture(scope="module")
def session_table(client: nyala.Client) -> Contract:
    return Contract(client, "contract_session")


OPS = st.sampled_from([OpType.INSERT, OpType.UPSERT, OpType.UPDATE, OpType.DELETE])


@PROPERTY
@given(calls=st.lists(st.tuples(OPS, SPECS), min_size=1, max_size=4))
def test_session_reports_every_row(
    client: nyala.Client, session_table: Contract, calls: list[tuple[OpType, list[RowSpec]]]
) -> None:
    batches = []
    present = set(session_table.model.rows)  # later calls may pick keys earlier ones wrote
    with client.session(flush="background", flush_interval_ms=20) as session:
        for op, specs in calls:
            rows = session_table.rows(op, specs, present)
            batches.append(rows)
            session.apply(session_table.table.name, rows_table(rows), op)
    failed = {(e.call, e.row): e for e in session.errors}
    unknown = {(e.call, e.row) for e in session.unknown}
    assert not session.error_buffer_overflowed
    rows = [row for batch in batches for row in batch]
    outcomes, codes = [], {}
    for call, batch in enumerate(batches):
        for i, row in enumerate(batch):
            if (call, i) in failed:
                error = failed[(call, i)]
                assert error.key == {"id": row.id}
                codes[len(outcomes)] = error.code
                outcomes.append("failed")
            else:
                outcomes.append("unknown" if (call, i) in unknown else "applied")
    session_table.check(rows, outcomes, codes)


@pytest.fixture(scope="module")
def load_table(client: nyala.Client) -> Contract:
    return Contract(client, "contract_load")


@settings(PROPERTY, max_examples=6)
@given(specs=SPECS, upsert=st.booleans())
def test_table_load_reports_every_row(
    cluster: MiniCluster, load_table: Contract, specs: list[RowSpec], upsert: bool
) -> None:
    import tempfile

    op = OpType.UPSERT if upsert else OpType.INSERT
    rows = load_table.rows(op, specs)
    with tempfile.TemporaryDirectory() as tmp:
        source, rejects = Path(tmp) / "rows.parquet", Path(tmp) / "rejects.parquet"
        pq.write_table(rows_table(rows), source)
        outcome = CliRunner().invoke(
            main,
            [
                "table", "load", load_table.table.name, str(source),
                "--operation", op.name.lower(), "--rejects", str(rejects),
                "--masters", ",".join(cluster.master_addrs), "--format", "json",
            ],
            catch_exceptions=False,
        )  # fmt: skip
        summary = json.loads(outcome.stdout)
        rejected = pq.read_table(rejects).to_pylist() if rejects.exists() else []
    not_applied = {r["__row"]: r for r in rejected}
    assert outcome.exit_code == (1 if not_applied else 0), outcome.stderr
    assert summary["rows"] == len(rows)
    assert summary["applied"] + summary["failed"] + summary["unknown"] == len(rows)
    assert len(not_applied) == summary["failed"] + summary["unknown"]
    outcomes, codes = [], {}
    for i, row in enumerate(rows):
        reject = not_applied.get(i)
        if reject is None:
            outcomes.append("applied")
            continue
        assert reject["id"] == row.id  # the rejected row's values, for reprocessing
        codes[i] = reject["__error_code"]
        outcomes.append(
            "unknown" if reject["__error_message"].startswith("outcome unknown") else "failed"
        )
    for line in summary["failed_sample"]:
        assert '{"id": ' in line  # failed rows are named by their key values
    load_table.check(rows, outcomes, codes)


# --- a tablet leader lost under a multi-tablet write ------------------------------------------


@pytest.fixture(scope="module")
def slow_raft() -> Iterator[MiniCluster]:
    """Slow elections (after ~3 s of silence) and no quiescence (a quiesced tablet's followers
    campaign as soon as the leader's server falls silent): a write with a 1 s deadline to a
    lost leader cannot be saved by a new one in time, so its rows stay unknown. (With 1.5 s, a
    leader slowed by a loaded machine before the fault left too little margin.)"""
    flags = [
        "--raft-quiesce-after-idle-heartbeats", "0",
        "--leader-failure-max-missed-heartbeat-periods", "6",
    ]  # fmt: skip
    with logs_on_failure(MiniCluster(3, num_masters=1, tserver_flags=flags)) as mini:
        yield mini


def _isolate_one_leader(cluster: MiniCluster, table: nyala.Table) -> tuple[str, ServerProcess]:
    """Moves leaderships (asking the leaders themselves) until one tserver leads exactly one
    tablet of ``table``; returns that tablet and that tserver."""
    tablets = [t.tablet_id for t in table.tablets()]
    victim = cluster.leader_of(tablets[0])
    other = next(ts for ts in cluster.tservers if ts is not victim)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        led = [t for t in tablets[1:] if cluster.leader_of(t) is victim]
        if not led and cluster.leader_of(tablets[0]) is victim:
            return tablets[0], victim
        for tablet_id in led:
            request = consensus_pb2.LeaderStepDownRequestPB(
                dest_uuid=victim.uuid or "",
                tablet_id=tablet_id,
                mode=consensus_pb2.GRACEFUL,
                new_leader_uuid=other.uuid or "",
            )
            with contextlib.suppress(errors.NyalaError), victim.proxy() as proxy:
                proxy.call(proxy.consensus.LeaderStepDown, request, timeout_ms=5_000)
        time.sleep(0.5)
    raise AssertionError("could not leave the victim leading exactly one tablet")


def _wait_until_client_knows_leaders(
    cluster: MiniCluster, client: nyala.Client, table: nyala.Table
) -> None:
    """Waits until the masters name every tablet's actual leader and the client has read that:
    a location cached before the moves would send another tablet's rows to the victim."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        client._cache.invalidate(table._info.table_id)
        locations = client._cache.locations(table._info).tablets
        if all(t.leader_uuid == cluster.leader_of(t.tablet_id).uuid for t in locations):
            return
        time.sleep(0.2)
    raise AssertionError("the masters never named the moved leaders")


@pytest.mark.parametrize("fault", ["pause", "kill"])
def test_lost_leader_leaves_its_rows_unknown_and_retry_applies_them_once(
    slow_raft: MiniCluster, fault: str
) -> None:
    with nyala.connect(slow_raft.master_addrs, timeout_ms=30_000) as client:
        table = client.create_table(f"lost_{fault}", SCHEMA, partitioning=PARTITIONING, replicas=3)
        tablet_id, victim = _isolate_one_leader(slow_raft, table)
        _wait_until_client_knows_leaders(slow_raft, client, table)
        ids = np.concatenate([np.arange(0, 1000), np.arange(2000, 3000)])
        data = pa.table({"id": ids, "v": pa.array([f"v{i}" for i in ids])})
        locations = client._cache.locations(table._info)
        routes = pa.array(locations.router.route(pa.record_batch({"id": ids}))).to_pylist()
        lost_rows = {i for i, p in enumerate(routes) if locations.tablets[p].tablet_id == tablet_id}
        assert 0 < len(lost_rows) < len(ids)
        assert slow_raft.leader_of(tablet_id) is victim, "leadership moved before the fault"
        getattr(victim, fault)()
        try:
            with pytest.raises(errors.PartialWriteError) as raised:
                table.insert(data, timeout_ms=1_000)
            result = raised.value.result
            outcomes = result.outcomes
            unknown = {e.row for e in result.unknown}
            assert unknown == lost_rows, "exactly the lost leader's rows are unknown"
            assert not result.row_errors
            assert client._writer.requests.outstanding >= 1  # held for the retry
            # Every unknown row belongs to the lost tablet; every other row was applied.
            # (A scan waits 2 s at most for the lost leader, then reads a new one.)
            scan = table.scan(columns=["id"], attempt_timeout_ms=2_000, timeout_ms=60_000)
            lost_keys = set(scan.to_arrow().column("id").to_pylist()) ^ set(ids.tolist())
            assert {int(ids[r]) for r in unknown} == lost_keys
            assert int((outcomes == RowOutcome.APPLIED).sum()) == len(ids) - len(unknown)
        finally:
            if fault == "pause":
                victim.resume()
        # The retry resends the very requests: applied once (an INSERT applied twice would
        # come back ALREADY_PRESENT).
        settled = result.retry(timeout_ms=60_000)
        assert settled.ok, settled.row_errors[:3]
        assert settled.applied == len(ids)
        assert client._writer.requests.outstanding == 0  # every request answered
        got = table.scan(columns=["id"]).to_arrow().column("id").to_pylist()
        assert sorted(got) == sorted(ids.tolist())
        if fault == "kill":
            victim.restart()


def test_a_dropped_result_releases_its_unknown_requests() -> None:
    """A request whose outcome is unknown stays outstanding (its sequence number, the floor
    below which the servers forget outcomes) while a result may retry it, and is released
    once the result is dropped unretried; answered requests are released at once."""
    with (
        logs_on_failure(MiniCluster(1, num_masters=1)) as mini,
        nyala.connect(mini.master_addrs, timeout_ms=30_000) as client,
    ):
        table = client.create_table("dropped", SCHEMA, replicas=1)
        requests = client._writer.requests
        assert table.insert({"id": [1], "v": ["a"]}).ok
        assert requests.outstanding == 0
        server = mini.tservers[0]
        server.pause()
        try:
            with pytest.raises(errors.PartialWriteError) as raised:
                table.insert({"id": [2, 3], "v": ["b", "c"]}, timeout_ms=300)
            assert raised.value.result.unknown
            assert requests.outstanding == 1
            del raised
            gc.collect()
            assert requests.outstanding == 0
        finally:
            server.resume()


class _Stopped(BaseException):
    """An interruption (Ctrl-C, say) in the middle of making a write's requests."""


def test_a_write_stopped_before_sending_releases_its_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Requests made for a write that is interrupted before sending any are released at once
    (they are never sent): none stays outstanding, through either write path."""
    with (
        logs_on_failure(MiniCluster(1, num_masters=1)) as mini,
        nyala.connect(mini.master_addrs, timeout_ms=30_000) as client,
    ):
        table = client.create_table("stopped", SCHEMA, partitioning=PARTITIONING, replicas=1)
        requests = client._writer.requests
        ids = list(range(0, 40)) + list(range(2000, 2040))  # every tablet
        add_request = Writer._add_request
        made = [0]

        def stopped_at_the_second(self: Writer, *args: Any, **kwargs: Any) -> None:
            made[0] += 1
            if made[0] == 2:
                raise _Stopped
            add_request(self, *args, **kwargs)

        monkeypatch.setattr(Writer, "_add_request", stopped_at_the_second)
        small = {"id": ids, "v": [f"v{i}" for i in ids]}  # Writer.write_small
        large = pa.table(small)  # Writer.write
        for data in (small, large):
            made[0] = 0
            with pytest.raises(_Stopped):
                table.insert(data)
            assert made[0] == 2
            assert requests.outstanding == 0


# --- schema evolution ----------------------------------------------------------------------


def test_omitted_columns_take_defaults_the_master_keeps_across_a_leader_change(
    cluster: MiniCluster, client: nyala.Client
) -> None:
    schema = nyala.Schema(
        [
            nyala.Column("id", "int64"),
            nyala.Column("v", "string", nullable=True),
            nyala.Column("n", "int32", default=7),
            nyala.Column("s", "string", nullable=True, default="dflt"),
        ],
        key=["id"],
    )
    table = client.create_table("defaults", schema, partitioning=nyala.HashPartitioning("id", 2))
    assert table.insert({"id": [1, 2]}).ok  # v null; n and s their defaults
    assert table.upsert({"id": [3], "v": ["x"], "n": [1]}).ok
    # An explicit null is not an omission: the NOT NULL column refuses it, row by row.
    refused = table.insert({"id": [4, 5], "n": pa.array([None, 9], pa.int32())})
    assert [(e.row, e.code, e.key) for e in refused.row_errors] == [
        (0, "INVALID_ARGUMENT", {"id": 4})
    ]
    with pytest.raises(errors.InvalidArgumentError, match="nullable or have a default"):
        client.alter_table("defaults", add_columns=[nyala.Column("bad", "int64")])
    client.alter_table("defaults", add_columns=[nyala.Column("extra", "int64", default=42)])
    rows = {r["id"]: r for r in client.table("defaults").scan().to_arrow().to_pylist()}
    assert rows[1] == {"id": 1, "v": None, "n": 7, "s": "dflt", "extra": 42}
    assert rows[3] == {"id": 3, "v": "x", "n": 1, "s": "dflt", "extra": 42}
    assert rows[5]["n"] == 9
    leader = cluster.leader_master()
    leader.kill()
    try:
        with nyala.connect(cluster.master_addrs, timeout_ms=30_000) as fresh:
            described = {c["name"]: c for c in fresh.describe_table("defaults")["columns"]}
            assert described["n"]["default"] == 7
            assert described["s"]["default"] == "dflt"
            assert described["extra"]["default"] == 42
            assert described["v"]["default"] is None
            assert fresh.table("defaults").insert({"id": [6]}).ok
            row = fresh.table("defaults").scan(where=[("id", "=", 6)]).to_arrow().to_pylist()
            assert row == [{"id": 6, "v": None, "n": 7, "s": "dflt", "extra": 42}]
    finally:
        leader.restart()


def test_a_writer_outlives_a_schema_change(cluster: MiniCluster, client: nyala.Client) -> None:
    schema = nyala.Schema.parse("id:int64, v:string?", key=["id"])
    table = client.create_table("evolving", schema, partitioning=nyala.HashPartitioning("id", 2))
    assert table.insert({"id": [1], "v": ["a"]}).ok
    with nyala.connect(cluster.master_addrs, timeout_ms=30_000) as other:
        other.alter_table("evolving", add_columns=[nyala.Column("extra", "int32", nullable=True)])
    # Encoded for the old version: refused by the tablets, resent for the new one.
    assert table.insert({"id": [2], "v": ["b"]}).ok
    assert table.schema.names == ["id", "v", "extra"]
    assert table.insert({"id": [3], "v": ["c"], "extra": [7]}).ok
    with nyala.connect(cluster.master_addrs, timeout_ms=30_000) as other:
        other.alter_table("evolving", drop_columns=["v"])
    # Rows that carry a dropped column cannot be resent: nothing applied, the error raised.
    with pytest.raises(errors.SchemaMismatchError):
        table.insert({"id": [4], "v": ["d"], "extra": [8]})
    with pytest.raises(errors.InvalidArgumentError, match=r"\['v'\] are not in the table"):
        table.insert({"id": [4], "v": ["d"], "extra": [8]})
    assert table.insert({"id": [4], "v": ["d"], "extra": [8]}, ignore_extra_columns=True).ok
    assert table.count() == 4


def test_old_parquet_loads_after_a_column_is_added(
    cluster: MiniCluster, client: nyala.Client, tmp_path: Path
) -> None:
    masters = ",".join(cluster.master_addrs)

    def cli(*args: str) -> Any:
        return CliRunner().invoke(main, [*args, "--masters", masters], catch_exceptions=False)

    client.create_table("events", nyala.Schema.parse("id:int64, v:string?", key=["id"]), replicas=3)
    old = tmp_path / "old.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}), old)
    assert cli("table", "load", "events", str(old)).exit_code == 0
    assert cli("table", "add-column", "events", "extra:int32").exit_code == 0
    refused = cli("table", "add-column", "events", "strict:int32", "--not-null")
    assert refused.exit_code != 0
    assert "needs --default" in refused.stderr
    added = cli("table", "add-column", "events", "n:int64", "--not-null", "--default", "5")
    assert added.exit_code == 0, added.stderr
    # The old file still loads, as upserts and as inserts of new keys.
    assert cli("table", "load", "events", str(old)).exit_code == 0
    newer = tmp_path / "newer.parquet"
    pq.write_table(pa.table({"id": [4], "v": ["d"]}), newer)
    loaded = cli("table", "load", "events", str(newer), "--operation", "insert", "--format", "json")
    assert loaded.exit_code == 0, loaded.stderr
    assert json.loads(loaded.stdout)["applied"] == 1
    rows = {r["id"]: r for r in client.table("events").scan().to_arrow().to_pylist()}
    assert rows[4] == {"id": 4, "v": "d", "extra": None, "n": 5}
    assert rows[1]["n"] == 5
    # A column the table lacks is named, unless the load is told to drop it.
    extra = tmp_path / "extra.parquet"
    pq.write_table(pa.table({"id": [5], "v": ["e"], "bogus": [1]}), extra)
    named = cli("table", "load", "events", str(extra))
    assert named.exit_code != 0
    assert "bogus" in named.stderr
    assert cli("table", "load", "events", str(extra), "--ignore-extra-columns").exit_code == 0
    described = json.loads(cli("table", "describe", "events", "--format", "json").stdout)
    assert {c["name"]: c["default"] for c in described["columns"]}["n"] == 5
