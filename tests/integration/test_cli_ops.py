"""The command line without surprises (issue 35, item 3), against a real cluster: the scan's
truncation notice and ``--limit`` in every format, errors as JSON under ``--format json``,
``--timeout``, failing fast with the cause when no master answers, consistent headers,
``tablet change-config --cas-config-opid-index``, ``remote-replica unsafe-change-config``,
``table copy``, ``perf loadgen``, ``table rename-column``, the refused leader type change, and
the master setting that keeps operator-added replicas. Each checks exit codes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from click.testing import CliRunner

import nyala
from nyala._proto import metadata_pb2
from nyala.cli import main
from nyala.local_cluster import LocalCluster
from nyala.testing import MiniCluster
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags
from nyala.testing.replica_ops import committed_config, voters

SCHEMA = nyala.Schema.parse("id:int64, v:string?", key=["id"])
ROWS = 1_500


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    flags = fast_master_flags()
    with LocalCluster(1, 3, master_flags=flags, tserver_flags=list(FAST_TSERVER_FLAGS)) as local:
        table = local.client.create_table(
            "t", SCHEMA, partitioning=nyala.HashPartitioning("id", 3), replicas=3
        )
        ids = np.arange(ROWS, dtype=np.int64)
        assert table.insert(pa.table({"id": ids, "v": pa.array(ids.astype(str))})).ok
        yield local


class Run:
    """What one in-process ``nyala`` command printed and returned."""

    def __init__(self, args: list[str], masters: str | None) -> None:
        env = {"NYALA_MASTERS": masters} if masters else {"NYALA_MASTERS": ""}
        result = CliRunner(env=env).invoke(main, args, catch_exceptions=False)
        self.code = result.exit_code
        self.stdout = result.stdout
        self.stderr = result.stderr

    def json(self) -> Any:
        assert self.code == 0, self.stderr
        return json.loads(self.stdout)


def nyala_cmd(cluster: LocalCluster | None, *args: str) -> Run:
    return Run(list(args), cluster.masters if cluster is not None else None)


def _json_error(run: Run) -> dict[str, str]:
    assert run.code == 1, (run.stdout, run.stderr)
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    doc: dict[str, str] = json.loads(lines[0])
    return doc


# --- scan: truncation notice, --limit in every format -----------------------------------------


def test_scan_limits_every_format_the_same_and_says_when_it_cut(cluster: LocalCluster) -> None:
    notice = "showing the first 1,000 rows"
    table = nyala_cmd(cluster, "table", "scan", "t")
    assert table.code == 0
    assert len(table.stdout.splitlines()) == 1 + 1000  # header + default limit
    assert notice in table.stderr
    default_json = nyala_cmd(cluster, "table", "scan", "t", "--format", "json")
    assert len(default_json.json()) == 1000
    assert notice in default_json.stderr
    five = nyala_cmd(cluster, "table", "scan", "t", "--limit", "5", "--format", "json")
    assert len(five.json()) == 5
    assert "showing the first 5 rows" in five.stderr
    everything = nyala_cmd(cluster, "table", "scan", "t", "--limit", "0", "--format", "json")
    assert len(everything.json()) == ROWS
    assert everything.stderr == ""
    exact = nyala_cmd(cluster, "table", "scan", "t", "--limit", str(ROWS), "--format", "json")
    assert len(exact.json()) == ROWS
    assert exact.stderr == ""  # nothing was cut


# --- errors as JSON; --timeout; failing fast -------------------------------------------------


def test_errors_are_one_json_line_under_format_json(cluster: LocalCluster) -> None:
    error = _json_error(nyala_cmd(cluster, "table", "scan", "nope", "--format", "json"))
    assert error["error"] == "NotFoundError"
    assert "nope" in error["message"]
    error = _json_error(
        nyala_cmd(cluster, "table", "count", "t", "--where", "id >>= 1", "--format", "json")
    )
    assert error["error"] == "InvalidArgumentError"
    plain = nyala_cmd(cluster, "table", "scan", "nope")
    assert plain.code == 1
    assert plain.stderr.startswith("nyala: error: NotFoundError: ")


def test_no_reachable_master_fails_fast_with_the_cause() -> None:
    for fmt in ("table", "json"):
        start = time.monotonic()
        run = Run(["table", "list", "-m", "127.0.0.1:1", "--format", fmt], None)
        elapsed_s = time.monotonic() - start
        assert run.code == 1
        assert "Connection refused" in run.stderr
        assert "NetworkError" in run.stderr
        assert elapsed_s < 5.0, elapsed_s  # was 15 s, hiding the cause behind a timeout
    error = _json_error(Run(["master", "list", "-m", "127.0.0.1:1", "--format", "json"], None))
    assert error["error"] == "NetworkError"
    assert "Connection refused" in error["message"]


def test_timeout_bounds_a_command_against_a_master_that_never_answers() -> None:
    with socket.socket() as silent:  # accepts connections, never speaks: no fail-fast
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        addr = f"127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        run = Run(["table", "list", "-m", addr, "--timeout", "1.5", "--format", "json"], None)
        elapsed_s = time.monotonic() - start
    error = _json_error(run)
    assert error["error"] == "TimedOutError"
    assert elapsed_s < 5.0, elapsed_s
    usage = Run(["table", "list", "-m", addr, "--timeout", "0"], None)
    assert usage.code == 2  # not a positive number of seconds


# --- headers and labels ----------------------------------------------------------------------


def test_listings_have_upper_case_headers_and_one_replica_label(cluster: LocalCluster) -> None:
    for args in (["master", "list"], ["tserver", "list"], ["tablet", "list"], ["table", "list"]):
        run = nyala_cmd(cluster, *args)
        assert run.code == 0, run.stderr
        header = run.stdout.splitlines()[0]
        assert header == header.upper(), (args, header)
    masters = nyala_cmd(cluster, "master", "list", "--format", "json").json()
    assert masters[0]["role"] == "LEADER"
    describe = nyala_cmd(cluster, "table", "describe", "t").stdout.splitlines()
    tablets = describe[describe.index("") + 2 :]
    for line in tablets:
        leader, replicas = line.split()[-2:]
        assert "@127.0.0.1:" in leader
        assert leader in replicas.split(","), line


# --- tablet change-config with a CAS; refused leader type change ------------------------------


def _tablet(cluster: LocalCluster, table: str) -> str:
    tablets = nyala_cmd(cluster, "tablet", "list", "--table", table, "--format", "json").json()
    return str(tablets[0]["tablet_id"])


def test_change_config_applies_only_at_the_given_config_index(cluster: LocalCluster) -> None:
    cluster.client.create_table("cas", SCHEMA, replicas=3)
    tablet_id = _tablet(cluster, "cas")
    leader = cluster.mini.leader_of(tablet_id)
    follower = next(ts for ts in cluster.mini.tservers if ts is not leader)
    config = committed_config(leader, tablet_id)
    assert config is not None
    index = config.opid_index if config.HasField("opid_index") else -1  # -1: the initial one
    stale = index + 100
    args = ["tablet", "change-config", tablet_id, "MODIFY_PEER", str(follower.uuid)]
    error = _json_error(
        nyala_cmd(cluster, *args, "--type", "NON_VOTER", "--cas-config-opid-index", str(stale),
                  "--format", "json")
    )  # fmt: skip
    assert error["error"] == "CasFailedError"
    assert voters(committed_config(leader, tablet_id)) == voters(config)  # nothing changed
    done = nyala_cmd(
        cluster, *args, "--type", "NON_VOTER", "--cas-config-opid-index",
        str(index), "--format", "json",
    ).json()  # fmt: skip
    types = {p["uuid"]: p["member_type"] for p in done["peers"]}
    assert types[str(follower.uuid)] == "NON_VOTER"
    assert done["opid_index"] > index
    cluster.client.delete_table("cas")


def test_the_leaders_type_is_changed_only_with_force(cluster: LocalCluster) -> None:
    cluster.client.create_table("typed_leader", SCHEMA, replicas=3)
    tablet_id = _tablet(cluster, "typed_leader")
    leader = cluster.mini.leader_of(tablet_id)
    args = ["tablet", "change-replica-type", tablet_id, str(leader.uuid), "NON_VOTER"]
    refused = _json_error(nyala_cmd(cluster, *args, "--format", "json"))
    assert refused["error"] == "IllegalStateError"
    assert "leads" in refused["message"]
    config = committed_config(leader, tablet_id)
    assert str(leader.uuid) in voters(config)
    forced = nyala_cmd(cluster, *args, "--force", "--timeout", "60")
    assert forced.code == 0, forced.stderr
    now = committed_config(cluster.mini.leader_of(tablet_id), tablet_id)
    assert str(leader.uuid) not in voters(now)
    cluster.client.delete_table("typed_leader")


# --- remote-replica unsafe-change-config -----------------------------------------------------


def test_unsafe_change_config_online_makes_a_survivor_lead_alone(cluster: LocalCluster) -> None:
    cluster.client.create_table("unsafe", SCHEMA, replicas=3)
    tablet_id = _tablet(cluster, "unsafe")
    leader = cluster.mini.leader_of(tablet_id)
    survivor = next(ts for ts in cluster.mini.tservers if ts is not leader)
    run = nyala_cmd(
        None, "remote-replica", "unsafe-change-config", survivor.rpc_addr, tablet_id,
        str(survivor.uuid), "--format", "json",
    )  # fmt: skip
    assert run.json()["voters"] == [str(survivor.uuid)]
    start = time.monotonic()
    ops.wait_until(
        lambda: voters(committed_config(survivor, tablet_id)) == {str(survivor.uuid)},
        timeout_s=10,
        what="the survivor's one-voter config committed",
    )
    assert time.monotonic() - start < 2.0  # a sole voter elects itself at once
    bad = Run(["remote-replica", "unsafe-change-config", survivor.rpc_addr, "f" * 32,
               str(survivor.uuid), "--format", "json"], None)  # fmt: skip
    assert _json_error(bad)["error"] == "TabletNotFoundError"
    cluster.client.delete_table("unsafe")


# --- table copy, rename-column, perf loadgen -------------------------------------------------


def test_table_copy_with_predicates_creates_the_destination(cluster: LocalCluster) -> None:
    predicates = '["AND", [">=", "id", 500], ["NOTNULL", "v"]]'
    summary = nyala_cmd(
        cluster, "table", "copy", "t", "t_copy", "--predicates", predicates, "--format", "json"
    ).json()
    assert (summary["rows"], summary["failed"]) == (ROWS - 500, 0)
    described = nyala_cmd(cluster, "table", "describe", "t_copy", "--format", "json").json()
    assert described["partitioning"] == "HASH(id) 3"
    assert nyala_cmd(cluster, "table", "count", "t_copy", "--format", "json").json()["rows"] == (
        ROWS - 500
    )
    again = nyala_cmd(cluster, "table", "copy", "t", "t_copy", "--where", "id < 10",
                      "--format", "json")  # fmt: skip
    assert again.json()["rows"] == 10
    duplicate = nyala_cmd(cluster, "table", "copy", "t", "t_copy", "--predicates",
                          '["AND", ["=", "id", 600]]', "--format", "json")  # fmt: skip
    assert duplicate.code == 1  # the row is there already: insert fails it, exit 1
    assert json.loads(duplicate.stdout)["failed"] == 1
    bad = nyala_cmd(cluster, "table", "copy", "t", "t_x", "--predicates", "[1", "--format", "json")
    assert _json_error(bad)["error"] == "InvalidArgumentError"
    missing = nyala_cmd(cluster, "table", "copy", "t", "t_none", "--no-create-table")
    assert missing.code == 1
    assert "NotFoundError" in missing.stderr
    cluster.client.delete_table("t_copy")


def test_table_copy_keeps_the_range_partitions(cluster: LocalCluster) -> None:
    # Splits at 100 and 200 and a gap from 300 to 400: the copy has the same tablets.
    partitioning = [
        nyala.HashPartitioning("id", 2),
        nyala.RangePartitioning("id", bounds=[(None, 100), (100, 200), (200, 300), (400, None)]),
    ]
    cluster.client.create_table("ranged", SCHEMA, partitioning=partitioning, replicas=1)
    ids = [5, 150, 250, 450]
    cluster.client.table("ranged").insert({"id": ids, "v": ["a", "b", "c", "d"]})
    summary = nyala_cmd(cluster, "table", "copy", "ranged", "ranged_copy", "--format", "json")
    assert summary.json()["rows"] == len(ids)
    source = nyala_cmd(cluster, "table", "describe", "ranged", "--format", "json").json()
    copied = nyala_cmd(cluster, "table", "describe", "ranged_copy", "--format", "json").json()
    assert len(copied["tablets"]) == len(source["tablets"]) == 8
    partitions = sorted(t["partition"] for t in copied["tablets"])
    assert partitions == sorted(t["partition"] for t in source["tablets"])
    assert "300" in " ".join(partitions)  # the gap [300, 400) stays a gap
    rows = cluster.client.table("ranged_copy").scan().to_arrow()
    assert sorted(rows["id"].to_pylist()) == ids
    cluster.client.delete_table("ranged")
    cluster.client.delete_table("ranged_copy")


def test_change_replication_factor_help_says_its_wait() -> None:
    from nyala.cli.cluster import CHANGE_REPLICATION_FACTOR_TIMEOUT_S

    result = CliRunner().invoke(main, ["cluster", "change-replication-factor", "--help"])
    assert f"(default: {CHANGE_REPLICATION_FACTOR_TIMEOUT_S:g})" in result.output
    assert CHANGE_REPLICATION_FACTOR_TIMEOUT_S == 300


def test_rename_column(cluster: LocalCluster) -> None:
    cluster.client.create_table("renamed", SCHEMA, replicas=1)
    done = nyala_cmd(cluster, "table", "rename-column", "renamed", "v", "w", "--format", "json")
    assert done.json()["to"] == "w"
    described = nyala_cmd(cluster, "table", "describe", "renamed", "--format", "json").json()
    assert [c["name"] for c in described["columns"]] == ["id", "w"]
    missing = nyala_cmd(cluster, "table", "rename-column", "renamed", "nope", "x", "--format",
                        "json")  # fmt: skip
    assert _json_error(missing)["error"] in ("NotFoundError", "InvalidArgumentError")
    cluster.client.delete_table("renamed")


def test_perf_loadgen_writes_every_row_and_prints_the_rate(cluster: LocalCluster) -> None:
    before = {t["name"] for t in cluster.client.list_tables()}
    report = nyala_cmd(
        cluster, "perf", "loadgen", "--threads", "3", "--rows-per-thread", "2000",
        "--columns", "5", "--batch-rows", "500", "--format", "json",
    ).json()  # fmt: skip
    assert (report["rows"], report["failed"], report["threads"]) == (6000, 0, 3)
    assert report["rows_per_s"] > 0
    assert {t["name"] for t in cluster.client.list_tables()} == before  # auto table dropped
    kept = nyala_cmd(cluster, "perf", "loadgen", "--rows-per-thread", "100", "--table", "lg",
                     "--keep-auto-table", "--format", "json").json()  # fmt: skip
    assert kept["table"] == "lg"
    assert cluster.client.table("lg").count() == 200
    assert len(cluster.client.table("lg").schema.columns) == 5
    cluster.client.delete_table("lg")


# --- local-cluster status: exit code and ports -----------------------------------------------


def test_local_cluster_status_exit_code_and_ports(tmp_path: Any) -> None:
    directory = str(tmp_path / "lc")
    try:
        started = Run(["local-cluster", "start", "--dir", directory, "--masters", "1",
                       "--tservers", "1", "--format", "json"], None).json()  # fmt: skip
        status = Run(["local-cluster", "status", "--dir", directory, "--format", "json"], None)
        doc = status.json()
        assert doc["healthy"]
        assert all(s["http_addr"].startswith("127.0.0.1:") for s in doc["servers"])
        table = Run(["local-cluster", "status", "--dir", directory], None)
        assert table.code == 0
        assert "HTTP ADDR" in table.stdout
        tserver = next(s for s in started["servers"] if s["role"] == "tserver")
        subprocess.run(["kill", "-9", str(tserver["pid"])], check=True)
        down = Run(["local-cluster", "status", "--dir", directory], None)
        assert down.code == 1
        assert "not answering: tserver-0" in down.stdout
    finally:
        Run(["local-cluster", "stop", "--dir", directory], None)


# --- the master keeps operator-added replicas when told to -----------------------------------


@pytest.mark.parametrize("evict", [False, True], ids=["kept", "evicted"])
def test_an_operator_added_voter_is_kept_only_when_excess_eviction_is_off(evict: bool) -> None:
    switch = "--catalog-manager-evict-excess-replicas" if evict else (
        "--no-catalog-manager-evict-excess-replicas"
    )  # fmt: skip
    flags = fast_master_flags(switch)
    with MiniCluster(
        4, num_masters=1, master_flags=flags, tserver_flags=FAST_TSERVER_FLAGS
    ) as mini:
        ops.call(mini, "CreateTable", ops.create_table_request("t", SCHEMA, replicas=3))
        ops.wait_create_done(mini, "t")
        (location,) = ops.locations(mini, "t")
        tablet_id = location.tablet_id
        holders = {r.ts_info.permanent_uuid for r in location.replicas}
        spare = next(ts for ts in mini.tservers if ts.uuid not in holders)
        masters = ",".join(mini.master_addrs)
        added = Run(["tablet", "add-replica", tablet_id, str(spare.uuid), "-m", masters,
                     "--timeout", "60"], None)  # fmt: skip
        assert added.code == 0, added.stderr

        def voter_count() -> int:
            config = committed_config(mini.leader_of(tablet_id), tablet_id)
            return len([p for p in config.peers if p.member_type == metadata_pb2.VOTER])

        if evict:
            ops.wait_until(lambda: voter_count() == 3, timeout_s=30, what="the excess evicted")
        else:
            time.sleep(3.0)  # 30 background passes of the master (100 ms each)
            assert voter_count() == 4


def test_cli_help_lists_the_new_nouns() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "nyala.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "remote-replica" in out
    assert "perf" in out
