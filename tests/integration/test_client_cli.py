"""The ``nyala`` command line against a real cluster: every table/tablet/tserver command with
its JSON output checked, bad input as one stderr line with a non-zero exit, and
``local-cluster start|status|stop`` with ``nyala.LocalCluster``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import nyala
from nyala.cli import main
from nyala.local_cluster import LocalCluster

FLAGS = ["--heartbeat-interval-ms", "100", "--leader-failure-max-missed-heartbeat-periods", "3"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(masters=1, tservers=3, master_flags=FLAGS, tserver_flags=FLAGS) as local:
        yield local


class Outcome:
    """What one command printed and returned."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


def run_cli(*args: str, masters: str | None = None, in_process: bool = True) -> Outcome:
    """Runs ``nyala ARGS``: in this process through click's runner (the same code path,
    without an interpreter start per command on a loaded machine), or as a real process."""
    env = {k: v for k, v in os.environ.items() if k != "NYALA_MASTERS"}
    if masters:
        env["NYALA_MASTERS"] = masters
    if in_process:
        runner = CliRunner(env={"NYALA_MASTERS": masters})
        result = runner.invoke(main, list(args), catch_exceptions=False)
        return Outcome(result.exit_code, result.stdout, result.stderr)
    proc = subprocess.run(
        [sys.executable, "-m", "nyala.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def nyala_cli(*args: str, masters: str | None = None) -> Any:
    """Runs a command that must succeed; its parsed JSON (with ``--format``) or its text."""
    outcome = run_cli(*args, masters=masters)
    assert outcome.returncode == 0, outcome.stderr
    return json.loads(outcome.stdout) if "--format" in args else outcome.stdout


def test_table_commands_end_to_end(cluster: LocalCluster, tmp_path: Path) -> None:
    m = cluster.masters
    created = nyala_cli(
        "table", "create", "people", "--schema", "id:int64, name:string?, age:int32?",
        "--key", "id", "--hash", "id:3", "--replicas", "3", "--format", "json", masters=m,
    )  # fmt: skip
    assert created["tablets"] == 3
    listed = nyala_cli("table", "list", "--format", "json", masters=m)
    assert [t["name"] for t in listed] == ["people"]
    assert listed[0]["tablets"] == 3
    path = tmp_path / "people.parquet"
    pq.write_table(
        pa.table(
            {"id": list(range(100)), "name": [f"p{i}" for i in range(100)], "age": [30] * 100}
        ),
        path,
    )
    loaded = nyala_cli("table", "load", "people", str(path), "--format", "json", masters=m)
    assert loaded["rows"] == 100
    assert loaded["failed"] == 0
    counted = nyala_cli(
        "table", "count", "people", "--where", "id >= 90", "--format", "json", masters=m
    )
    assert counted["rows"] == 10
    scanned = nyala_cli(
        "table", "scan", "people", "--columns", "id,name", "--where", "id in (3, 5)",
        "--format", "json", masters=m,
    )  # fmt: skip
    assert scanned == [{"id": 3, "name": "p3"}, {"id": 5, "name": "p5"}]
    # A follower read may lag its leader by up to the bound, so it sees a subset, never more.
    nearby = nyala_cli(
        "table", "scan", "people", "--columns", "id,name", "--where", "id in (3, 5)",
        "--replica", "any", "--max-staleness-ms", "60000", "--format", "json", masters=m,
    )  # fmt: skip
    assert all(row in scanned for row in nearby)
    text = nyala_cli("table", "scan", "people", "--limit", "2", masters=m)
    assert text.splitlines()[0].split() == ["ID", "NAME", "AGE"]
    added = nyala_cli(
        "table", "add-column", "people", "email:string", "--format", "json", masters=m
    )
    assert added["schema_version"] >= 1
    nyala_cli("table", "drop-column", "people", "age", "--format", "json", masters=m)
    described = nyala_cli("table", "describe", "people", "--format", "json", masters=m)
    assert [c["name"] for c in described["columns"]] == ["id", "name", "email"]
    assert described["partitioning"] == "HASH(id) 3"
    tablets = nyala_cli("tablet", "list", "--table", "people", "--format", "json", masters=m)
    assert len(tablets) == 3
    assert all(len(t["replicas"]) == 3 for t in tablets)
    tservers = nyala_cli("tserver", "list", "--format", "json", masters=m)
    assert len(tservers) == 3
    assert all(s["live"] for s in tservers)
    stepped = nyala_cli(
        "tablet", "leader-step-down", tablets[0]["tablet_id"], "--abrupt", "--format", "json",
        masters=m,
    )  # fmt: skip
    assert stepped["stepped_down"] is True
    nyala_cli("table", "rename", "people", "folks", "--format", "json", masters=m)
    assert nyala_cli("table", "count", "folks", "--format", "json", masters=m)["rows"] == 100
    nyala_cli("table", "delete", "folks", "--format", "json", masters=m)
    assert nyala_cli("table", "list", "--format", "json", masters=m) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["table", "describe", "nope"], "NotFoundError"),
        (
            ["table", "create", "x", "--schema", "id:int64, b:blob", "--key", "id"],
            "unknown column type",
        ),
        (["table", "create", "x", "--schema", "id", "--key", "id"], "name:type"),
        (["table", "scan", "nope", "--where", "id >= 1"], "NotFoundError"),
        (["table", "load", "nope", "/no/such/file.parquet"], "Error"),
    ],
)
def test_bad_input_is_one_line_on_stderr(
    cluster: LocalCluster, args: list[str], message: str
) -> None:
    proc = run_cli(*args, masters=cluster.masters)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_wrong_type_in_loaded_data_and_unreachable_masters(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    cluster.client.create_table("typed", nyala.Schema.parse("id:int64, v:int32", key=["id"]))
    path = tmp_path / "bad.csv"
    path.write_text("id,v\n1,hello\n2,7\n")
    proc = run_cli(
        "table", "load", "typed", str(path), "--format", "json",
        masters=cluster.masters, in_process=False,
    )  # fmt: skip
    assert proc.returncode == 1
    summary = json.loads(proc.stdout)
    # The bad value fails its row alone, named by its key; the other row is applied.
    assert (summary["applied"], summary["failed"]) == (1, 1)
    assert "cannot convert 'hello'" in summary["failed_sample"][0]
    assert '{"id": 1}' in summary["failed_sample"][0]
    proc = run_cli("table", "list", masters="127.0.0.1:1")
    assert proc.returncode == 1
    assert "NetworkError" in proc.stderr  # fails fast with the cause (test_cli_ops.py)
    assert "Connection refused" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = run_cli("table", "list", in_process=False)  # no --masters and no NYALA_MASTERS
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr


def test_local_cluster_commands(tmp_path: Path) -> None:
    directory = tmp_path / "lc"
    try:
        started = nyala_cli(
            "local-cluster", "start", "--dir", str(directory), "--masters", "1", "--tservers",
            "1", "--format", "json",
        )  # fmt: skip
        assert len(started["servers"]) == 2
        assert all(s["answering"] for s in started["servers"])
        assert started["credentials"]  # secure by default (docs/security.md)
        with nyala.connect(started["masters"], credentials=started["credentials"]) as client:
            assert client.list_tables() == []
        status = nyala_cli("local-cluster", "status", "--dir", str(directory), "--format", "json")
        assert all(s["running"] for s in status["servers"])
    finally:
        stopped = nyala_cli("local-cluster", "stop", "--dir", str(directory), "--format", "json")
    assert sorted(stopped["stopped"]) == ["master-0", "tserver-0"]
    down = run_cli("local-cluster", "status", "--dir", str(directory), "--format", "json")
    assert down.returncode == 1  # not every server answers
    assert not any(s["running"] for s in json.loads(down.stdout)["servers"])
