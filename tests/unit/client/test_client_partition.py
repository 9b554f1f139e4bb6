"""Partitioning: the Python reference (nyala.partition) and the Rust router agree, and a new
table's partitions cover the key space exactly once."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nyala import _native
from nyala.errors import InvalidArgumentError
from nyala.partition import (
    HashPartitioning,
    Partition,
    PartitionSchema,
    RangePartitioning,
    RangeSpec,
    create_partitions,
    encode_key,
    find_partition,
    hash64,
)
from nyala.schema import Schema

SCHEMA = Schema.parse(
    "id:int64, name:string, small:int8, ts:timestamp, v:double?", key=["id", "name", "small", "ts"]
)


def router(ps: PartitionSchema, parts: list[Partition]) -> _native.PartitionRouter:
    levels = [(list(h.columns), h.buckets, h.seed) for h in ps.hash_levels]
    return _native.PartitionRouter(
        levels, list(ps.range_columns), [p.key_start for p in parts], [p.key_end for p in parts]
    )


rows_strategy = st.lists(
    st.tuples(
        st.integers(-(2**63), 2**63 - 1),
        st.text(alphabet="ab\x00z", max_size=5),
        st.integers(-128, 127),
        st.integers(-(2**62), 2**62),
    ),
    min_size=1,
    max_size=60,
)


def to_batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    ids, names, smalls, tss = zip(*rows, strict=True)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ids, pa.int64()),
            pa.array(names, pa.string()),
            pa.array(smalls, pa.int8()),
            pa.array(tss, pa.timestamp("us")),
        ],
        names=["id", "name", "small", "ts"],
    )


SPECS = [
    HashPartitioning(["id"], 4),
    [HashPartitioning(["id", "name"], 3, seed=11), HashPartitioning("small", 2)],
    [
        HashPartitioning("ts", 5, seed=2**32 - 1),
        RangePartitioning(["name", "small"], [("a", 0), ("b", -3)]),
    ],
    RangePartitioning("id", [-5, 0, 10**12]),
    None,
]


@pytest.mark.parametrize("spec_index", range(len(SPECS)))
@settings(max_examples=40, deadline=None)
@given(rows=rows_strategy)
def test_rust_router_agrees_with_reference(spec_index: int, rows: list[tuple[Any, ...]]) -> None:
    ps, ranges = PartitionSchema.from_spec(SPECS[spec_index], SCHEMA)  # type: ignore[arg-type]
    parts = create_partitions(ps, ranges)
    batch = to_batch(rows)
    native = router(ps, parts)
    keys = native.partition_keys(batch)
    routes = pa.array(native.route(batch)).to_pylist()
    for i, row in enumerate(rows):
        values = dict(zip(["id", "name", "small", "ts"], row, strict=True))
        expected = ps.partition_key(SCHEMA, values)
        assert keys[i] == expected
        assert routes[i] == find_partition(parts, expected)
    sliced = native.split_ipc(batch)
    seen: list[int] = []
    for partition, positions, ipc in sliced:
        part_rows = pa.ipc.open_stream(ipc).read_all()
        position_list = pa.array(positions).to_pylist()
        assert part_rows.num_rows == len(position_list)
        assert part_rows.column("id").to_pylist() == [rows[p][0] for p in position_list]
        assert all(routes[p] == partition for p in position_list)
        seen.extend(position_list)
    assert sorted(seen) == list(range(len(rows)))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=40), seed=st.integers(0, 2**32 - 1))
def test_native_hash_is_the_reference_hash(data: bytes, seed: int) -> None:
    assert _native.partition_hash64(data, seed) == hash64(data, seed)


def test_key_encoding_orders_like_values() -> None:
    values = [-(2**63), -1, 0, 1, 2**63 - 1]
    encoded = [encode_key(["int64"], [v]) for v in values]
    assert encoded == sorted(encoded)
    assert encode_key(["string", "int8"], ["a\x00", -1]) == b"a\x00\x01\x00\x00\x7f"
    when = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    assert encode_key(["timestamp"], [when]) == encode_key(["timestamp"], [1704067200000000])
    with pytest.raises(InvalidArgumentError):
        encode_key(["int8"], [200])
    with pytest.raises(InvalidArgumentError):
        encode_key(["string"], [5])


@pytest.mark.parametrize("spec_index", range(len(SPECS)))
def test_partitions_cover_the_key_space_once(spec_index: int) -> None:
    ps, ranges = PartitionSchema.from_spec(SPECS[spec_index], SCHEMA)  # type: ignore[arg-type]
    parts = create_partitions(ps, ranges)
    assert parts == sorted(parts)
    assert parts[0].key_start.strip(b"\x00") == b""
    assert parts[-1].key_end == b""
    for a, b in itertools.pairwise(parts):
        assert a.key_end  # only the last is unbounded
        assert a.key_end <= b.key_start  # no overlap
    for i in range(2000):
        key = ps.partition_key(SCHEMA, {"id": i * 7919, "name": str(i), "small": i % 100, "ts": i})
        assert find_partition(parts, key) is not None
    assert PartitionSchema.from_pb(ps.to_pb()) == ps
    assert [Partition.from_pb(p.to_pb()) for p in parts] == parts


def test_bounds_leave_gaps_and_bad_specs_are_refused() -> None:
    spec = RangePartitioning("id", splits=[10], bounds=[(0, 100), (200, None)])
    ps, ranges = PartitionSchema.from_spec(spec, SCHEMA)
    parts = create_partitions(ps, ranges)
    assert len(parts) == 3
    native = router(ps, parts)
    inside = to_batch([(5, "", 0, 0), (50, "", 0, 0), (250, "", 0, 0)])
    assert pa.array(native.route(inside)).to_pylist() == [0, 1, 2]
    with pytest.raises(InvalidArgumentError, match="no partition covers"):
        native.route(to_batch([(150, "", 0, 0)]))
    bad: list[Any] = [
        HashPartitioning("v", 2),  # not a key column
        [HashPartitioning("id", 2), HashPartitioning("id", 3)],  # a column in two levels
        RangePartitioning("id", [1, 1]),  # duplicate split
        RangePartitioning("id", [500], bounds=[(0, 100)]),  # split outside the bounds
        RangePartitioning("id", bounds=[(0, 100), (50, 150)]),  # overlapping bounds
    ]
    for spec in bad:
        with pytest.raises(InvalidArgumentError):
            create_partitions(*PartitionSchema.from_spec(spec, SCHEMA))
    with pytest.raises(InvalidArgumentError):
        HashPartitioning("id", 1)
    with pytest.raises(InvalidArgumentError):
        create_partitions(PartitionSchema(), RangeSpec(splits=(b"x",)))
