"""Unit tests of the master's pure parts: placement, partitions, sys-catalog records, and how
a tablet report updates a tablet record."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from nyala._proto import master_pb2, metadata_pb2
from nyala.consensus.types import RaftConfig, RaftPeer
from nyala.errors import IllegalStateError, InvalidArgumentError
from nyala.master.catalog import Catalog
from nyala.master.formation import check_masters_match
from nyala.master.partitions import table_partitions
from nyala.master.placement import choose_replicas
from nyala.master.sys_catalog import CatalogRecord, decode_contents, encode_records
from nyala.master.tablet_reports import _merge_report
from nyala.partition import rows_to_ipc
from nyala.schema import Column, Schema
from nyala.storage import StorageEngine

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], key=["id"])


def test_power_of_two_choices_spreads_replicas_evenly() -> None:
    servers = [f"ts{i}" for i in range(6)]
    load: dict[str, int] = {}
    rng = random.Random(7)
    for _ in range(200):
        chosen = choose_replicas(servers, load, 3, rng)
        assert len(set(chosen)) == 3
    counts = Counter(load)
    assert sum(counts.values()) == 600
    assert max(counts.values()) - min(counts.values()) <= 10


def test_placement_refuses_more_replicas_than_live_servers() -> None:
    with pytest.raises(InvalidArgumentError, match="only 2 tablet servers"):
        choose_replicas(["a", "b"], {}, 3, random.Random(1))


def test_placement_keeps_off_avoided_servers_while_others_remain() -> None:
    rng = random.Random(3)
    for _ in range(100):
        # The avoided server is by far the least loaded: load alone would pick it.
        load = {"stuck": 0, "a": 50, "b": 50}
        assert choose_replicas(["a", "b", "stuck"], load, 1, rng, avoid={"stuck"}) != ["stuck"]
        load = {"stuck": 0, "a": 50, "b": 50, "c": 50}
        chosen = choose_replicas(["a", "b", "c", "stuck"], load, 3, rng, avoid={"stuck"})
        assert sorted(chosen) == ["a", "b", "c"]


def test_placement_takes_avoided_servers_only_when_too_few_others() -> None:
    rng = random.Random(5)
    seen: set[str] = set()
    for _ in range(100):
        chosen = choose_replicas(["a", "b", "x", "y"], {}, 3, rng, avoid={"x", "y"})
        assert len(set(chosen)) == 3
        assert {"a", "b"} <= set(chosen[:2])
        seen.add(chosen[2])
    assert seen == {"x", "y"}  # the last one still chosen among the avoided ones
    assert sorted(choose_replicas(["a", "x"], {}, 2, rng, avoid={"a", "x"})) == ["a", "x"]


def test_partitions_hash_times_range_splits() -> None:
    request = master_pb2.CreateTableRequestPB()
    request.partition_schema.hash_schema.add(columns=["id"], num_buckets=3)
    request.partition_schema.range_columns.append("id")
    request.split_rows = rows_to_ipc(SCHEMA, ["id"], [[100], [200]])
    partitions = table_partitions(SCHEMA, request)
    assert len(partitions) == 9
    starts = [p.partition_key_start for p in partitions]
    assert starts == sorted(starts)
    assert sorted(tuple(p.hash_buckets) for p in partitions)[0] == (0,)


def test_sys_catalog_records_round_trip_through_storage(tmp_path: object) -> None:
    from pathlib import Path

    from nyala.master.sys_catalog import SYS_CATALOG_SCHEMA

    table = master_pb2.SysTableEntryPB(table_id="t1", name="events", num_replicas=3)
    tablet = master_pb2.SysTabletEntryPB(tablet_id="a" * 32, table_id="t1")
    engine = StorageEngine.create(Path(str(tmp_path)) / "cat", SYS_CATALOG_SCHEMA)
    engine.apply(encode_records([CatalogRecord.table(table), CatalogRecord.tablet(tablet)]), 1)
    renamed = master_pb2.SysTableEntryPB(table_id="t1", name="renamed", num_replicas=3)
    engine.apply(encode_records([CatalogRecord.table(renamed)]), 2)  # an upsert
    contents = decode_contents(engine.scan())
    assert [t.name for t in contents.tables] == ["renamed"]
    assert [t.tablet_id for t in contents.tablets] == ["a" * 32]
    catalog = Catalog.from_records(contents.tables, contents.tablets)
    assert list(catalog.tables_by_name) == ["renamed"]
    assert list(catalog.tables_by_id["t1"].tablets) == ["a" * 32]


def test_retired_tserver_records_round_trip(tmp_path: object) -> None:
    from pathlib import Path

    from nyala.master.sys_catalog import SYS_CATALOG_SCHEMA

    engine = StorageEngine.create(Path(str(tmp_path)) / "cat", SYS_CATALOG_SCHEMA)
    table = master_pb2.SysTableEntryPB(table_id="t1", name="events", num_replicas=3)
    retired = master_pb2.SysTServerEntryPB(ts_uuid="ts-9", retired=True, retire_time_us=7)
    engine.apply(encode_records([CatalogRecord.table(table), CatalogRecord.tserver(retired)]), 1)
    contents = decode_contents(engine.scan())
    assert [t.table_id for t in contents.tables] == ["t1"]
    assert [(s.ts_uuid, s.retired) for s in contents.tservers] == [("ts-9", True)]


def _tablet(state: int = master_pb2.SYS_TABLET_CREATING) -> master_pb2.SysTabletEntryPB:
    pb = master_pb2.SysTabletEntryPB(tablet_id="b" * 32, table_id="t", state=state)
    for uuid in ("x", "y", "z"):
        pb.consensus_state.committed_config.peers.add(
            permanent_uuid=uuid, member_type=metadata_pb2.VOTER
        )
    return pb


def _report(term: int, leader: str, config_index: int | None = None, version: int = 0) -> object:
    pb = master_pb2.ReportedTabletPB(tablet_id="b" * 32, schema_version=version)
    pb.consensus_state.current_term = term
    pb.consensus_state.leader_uuid = leader
    if config_index is not None:
        pb.consensus_state.committed_config.opid_index = config_index
    return pb


def test_report_from_the_leader_makes_a_creating_tablet_running() -> None:
    merged = _merge_report(_tablet(), "x", _report(2, "x", version=1))
    assert merged is not None
    assert merged.state == master_pb2.SYS_TABLET_RUNNING
    assert merged.consensus_state.leader_uuid == "x"
    assert merged.reported_schema_version == 1


def test_report_from_a_follower_or_an_older_term_changes_no_leadership() -> None:
    stored = _merge_report(_tablet(), "x", _report(5, "x"))
    assert _merge_report(stored, "y", _report(5, "x")) is None  # a follower's word on x
    assert _merge_report(stored, "y", _report(4, "y")) is None  # a stale leader


def test_newer_committed_config_is_taken_from_any_replica() -> None:
    stored = _tablet(master_pb2.SYS_TABLET_RUNNING)
    merged = _merge_report(stored, "y", _report(1, "x", config_index=7))
    assert merged is not None
    assert merged.consensus_state.committed_config.opid_index == 7
    assert _merge_report(merged, "z", _report(1, "x", config_index=3)) is None


def test_masters_list_must_match_the_config_on_disk() -> None:
    config = RaftConfig(peers=(RaftPeer("a" * 32, "h:1"), RaftPeer("b" * 32, "h:2")))
    check_masters_match(config, ["h:2", "h:1"])
    with pytest.raises(IllegalStateError, match="does not match"):
        check_masters_match(config, ["h:1", "h:3"])
