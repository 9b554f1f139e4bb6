"""``nyala local-replica``: offline tools on the fs roots of real (stopped) tserver processes,
including the catastrophic-recovery path after a tablet lost two of its three replicas, and a
replica tombstoned by mistake brought back from the quarantine as docs/operations.md says."""

from __future__ import annotations

import json
import shutil
from typing import Any

from click.testing import CliRunner

from nyala._proto import metadata_pb2, tserver_admin_pb2
from nyala.cli import main
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster
from nyala.testing.mini_cluster import ServerProcess
from nyala.testing.tablet_ops import row_checksum, scan, write_to_leader

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], ["id"])
TABLET = "c" * 32


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, ["local-replica", *args])


def _json(*args: str) -> Any:
    result = _cli(*args, "--format", "json")
    assert result.exit_code == 0, result.output + result.stderr
    return json.loads(result.stdout)


def _load(cluster: MiniCluster, rows: int) -> list[int]:
    ids = list(range(rows))
    for start in range(0, rows, 50):
        chunk = ids[start : start + 50]
        write_to_leader(
            cluster,
            TABLET,
            SCHEMA,
            {"id": chunk, "v": [f"v{i}" for i in chunk]},
            op="insert",
            client_id="local-replica-test",
            seq_no=start,
        )
    return ids


def test_unsafe_rewrite_config_recovers_a_tablet_that_lost_two_of_three(
    cluster: MiniCluster,
) -> None:
    cluster.create_tablet(TABLET, SCHEMA)
    ids = _load(cluster, 200)
    # The leader holds every acknowledged write; the two others are lost for good.
    survivor = cluster.leader_of(TABLET)
    lost: list[ServerProcess] = [ts for ts in cluster.tservers if ts is not survivor]
    for ts in lost:
        ts.kill()
    survivor.stop()
    root = str(survivor.fs_root)

    [row] = _json("list", "--fs-root", root)
    assert row["tablet_id"] == TABLET
    assert row["data_state"] == "READY"
    assert len(row["peers"]) == 3

    dump = _json("wal", "dump", str(survivor.fs_root / "wals" / TABLET))
    kinds = [entry["kind"] for entry in dump]
    assert "NO_OP" in kinds
    assert kinds.count("WRITE") >= 4  # at least one entry per acknowledged batch of 50

    assert survivor.uuid is not None
    refused = _cli(
        "cmeta", "unsafe-rewrite-config", TABLET, "f" * 32 + ":127.0.0.1:1", "--fs-root", root
    )
    assert refused.exit_code == 1
    assert "must include this server" in refused.stderr
    doc = _json("cmeta", "unsafe-rewrite-config", TABLET, survivor.uuid, "--fs-root", root)
    assert [p["uuid"] for p in doc["committed_config"]["peers"]] == [survivor.uuid]
    assert _json("cmeta", "print", TABLET, "--fs-root", root) == doc

    survivor.restart()
    assert cluster.leader_of(TABLET) is survivor
    table = scan(survivor, TABLET, SCHEMA)
    expected = row_checksum([ids, [f"v{i}" for i in ids]])
    assert row_checksum([table["id"].to_pylist(), table["v"].to_pylist()]) == expected
    # The recovered one-replica tablet accepts writes again.
    write_to_leader(
        cluster,
        TABLET,
        SCHEMA,
        {"id": [10_000], "v": ["after"]},
        op="insert",
        client_id="local-replica-test",
        seq_no=10_000,
    )


def test_delete_tombstones_and_keeps_what_voting_needs(cluster: MiniCluster) -> None:
    cluster.create_tablet(TABLET, SCHEMA)
    _load(cluster, 50)
    victim = next(ts for ts in cluster.tservers if ts is not cluster.leader_of(TABLET))
    result = _cli("delete", TABLET, "--fs-root", str(victim.fs_root))
    assert result.exit_code == 1
    assert "in use by another process" in result.stderr  # the server is still running
    assert len(result.stderr.strip().splitlines()) == 1
    victim.stop()
    root = str(victim.fs_root)
    result = _cli("delete", TABLET, "--fs-root", root)
    assert result.exit_code == 0, result.stderr
    [row] = _json("list", "--fs-root", root)
    assert row["data_state"] == "TOMBSTONED"
    assert row["tombstone_last_logged"] is not None
    assert row["term"] >= 1  # cmeta kept
    assert not (victim.fs_root / "wals" / TABLET).exists()
    [quarantined] = _json("quarantine", "list", "--fs-root", root)  # moved there, not deleted
    assert quarantined["tablet_id"] == TABLET
    result = _cli("delete", TABLET, "--fs-root", root, "--clean-unsafe")
    assert result.exit_code == 0, result.stderr
    assert _json("list", "--fs-root", root) == []


def test_bad_input_is_one_line_and_exit_1(tmp_path: Any, cluster: MiniCluster) -> None:
    ts = cluster.tserver(0)
    ts.stop()
    for args in (["cmeta", "print", "not-a-tablet"], ["cmeta", "print", "d" * 32]):
        result = _cli(*args, "--fs-root", str(ts.fs_root))
        assert result.exit_code == 1
        assert len(result.stderr.strip().splitlines()) == 1
    result = _cli("list", "--fs-root", str(tmp_path / "nothing"))
    assert result.exit_code == 1
    assert "not a nyala fs root" in result.stderr


def test_a_tombstoned_replica_is_quarantined_and_restored_from_there(
    cluster: MiniCluster,
) -> None:
    cluster.create_tablet(TABLET, SCHEMA)
    ids = _load(cluster, 200)
    # The tablet loses a majority: the leader is tombstoned by mistake, the others are lost.
    leader = cluster.leader_of(TABLET)
    others = [ts for ts in cluster.tservers if ts is not leader]
    for ts in others:
        ts.kill()
    request = tserver_admin_pb2.DeleteTabletRequestPB(
        dest_uuid=leader.uuid, tablet_id=TABLET, delete_type=metadata_pb2.TABLET_DATA_TOMBSTONED
    )
    with leader.proxy() as proxy:
        proxy.admin_call(proxy.admin.DeleteTablet, request)
    leader.stop()
    root = leader.fs_root
    assert not (root / "wals" / TABLET).exists()
    [entry] = _json("quarantine", "list", "--fs-root", str(root))
    assert entry["tablet_id"] == TABLET
    assert entry["size_bytes"] > 0
    quarantined = root / "quarantine" / entry["name"]
    assert sorted(p.name for p in quarantined.iterdir()) == ["cmeta", "data", "superblock", "wal"]

    # docs/operations.md, "Quarantine": put WAL, data and the READY superblock back, keep cmeta.
    shutil.copytree(quarantined / "wal", root / "wals" / TABLET)
    shutil.copytree(quarantined / "data", root / "data" / TABLET)
    shutil.copyfile(quarantined / "superblock", root / "tablet-meta" / TABLET)
    [row] = _json("list", "--fs-root", str(root))
    assert row["data_state"] == "READY"
    assert leader.uuid is not None
    _json("cmeta", "unsafe-rewrite-config", TABLET, leader.uuid, "--fs-root", str(root))
    leader.restart()
    assert cluster.leader_of(TABLET) is leader
    table = scan(leader, TABLET, SCHEMA)
    expected = row_checksum([ids, [f"v{i}" for i in ids]])
    assert row_checksum([table["id"].to_pylist(), table["v"].to_pylist()]) == expected

    leader.stop()
    refused = _cli("quarantine", "purge", "--fs-root", str(root))
    assert refused.exit_code == 1  # neither --all nor --older-than-s
    assert _json("quarantine", "purge", "--fs-root", str(root), "--older-than-s", "3600") == []
    [purged] = _json("quarantine", "purge", "--fs-root", str(root), "--all")
    assert purged["name"] == entry["name"]
    assert not quarantined.exists()
    assert _json("quarantine", "list", "--fs-root", str(root)) == []
