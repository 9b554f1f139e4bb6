"""Splitting op batches into per-tablet write requests (``PartitionRouter.split_requests``):
every row lands once, in the tablet the Python reference names, in input order, with every
value (nulls, strings, every type) intact, and no request exceeds its caps."""

from __future__ import annotations

from typing import Any

import numpy as np
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
    create_partitions,
    find_partition,
)
from nyala.rowops import OP_COLUMN, make_op_batch
from nyala.schema import Schema

SCHEMA = Schema.parse(
    "id:int64, name:string, small:int32, f:double?, s:string?, b:binary?, flag:bool?, "
    "ts:timestamp?, i8:int8?, i16:int16?, f32:float?",
    key=["id", "name", "small"],
)
KEY = ["id", "name", "small"]

SPECS: list[Any] = [
    HashPartitioning("id", 4),
    [HashPartitioning(["id", "name"], 3, seed=5), HashPartitioning("small", 2)],
    [HashPartitioning("name", 2), RangePartitioning("id", [-100, 0, 1000])],
    RangePartitioning(["name", "small"], [("m", 0)]),
]


def router(spec: Any) -> tuple[PartitionSchema, list[Partition], _native.PartitionRouter]:
    ps, ranges = PartitionSchema.from_spec(spec, SCHEMA)
    parts = create_partitions(ps, ranges)
    native = _native.PartitionRouter(
        [(list(h.columns), h.buckets, h.seed) for h in ps.hash_levels],
        list(ps.range_columns),
        [p.key_start for p in parts],
        [p.key_end for p in parts],
    )
    return ps, parts, native


row_strategy = st.fixed_dictionaries(
    {
        "id": st.integers(-(2**63), 2**63 - 1),
        "name": st.text(alphabet="am\x00zé", max_size=6),
        "small": st.integers(-(2**31), 2**31 - 1),
        "f": st.none() | st.floats(allow_nan=False),
        "s": st.none() | st.text(max_size=8),
        "b": st.none() | st.binary(max_size=8),
        "flag": st.none() | st.booleans(),
        "ts": st.none() | st.integers(-(2**55), 2**55),  # within datetime's years 1..9999
        "i8": st.none() | st.integers(-128, 127),
        "i16": st.none() | st.integers(-(2**15), 2**15 - 1),
        "f32": st.none() | st.floats(width=32, allow_nan=False),
    }
)


def op_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    columns = {c.name: pa.array([r[c.name] for r in rows], c.arrow_type) for c in SCHEMA.columns}
    return make_op_batch(columns, "upsert", SCHEMA)


def check_split(
    spec: Any,
    batch: pa.RecordBatch,
    rows_max: int,
    bytes_max: int,
    threads: int = 0,
    selection: list[int] | None = None,
) -> list[tuple[int, list[int], pa.Table]]:
    """Splits ``batch`` (the rows at ``selection``, or all) and checks every invariant against
    the Python reference."""
    ps, parts, native = router(spec)
    chosen = None if selection is None else pa.array(selection, pa.uint32())
    pieces, unrouted = native.split_requests(batch, rows_max, bytes_max, threads, chosen)
    assert pa.array(unrouted).to_pylist() == []  # every spec here covers every key
    rows = batch.to_pylist()
    seen: list[int] = []
    out = []
    last: tuple[int, int] = (-1, -1)
    for partition, positions, ipc in pieces:
        table = pa.ipc.open_stream(ipc).read_all()
        position_list = pa.array(positions).to_pylist()
        assert table.schema == batch.schema
        assert 0 < table.num_rows == len(position_list) <= rows_max
        assert position_list == sorted(position_list)  # input order within a tablet
        assert (partition, position_list[0]) > last  # partitions ascending, then positions
        last = (partition, position_list[-1])
        assert table.to_pylist() == [rows[p] for p in position_list]  # every value intact
        for p in position_list:
            key = ps.partition_key(SCHEMA, {k: rows[p][k] for k in KEY})
            assert find_partition(parts, key) == partition
        seen.extend(position_list)
        out.append((partition, position_list, table))
    wanted = list(range(batch.num_rows)) if selection is None else selection
    assert sorted(seen) == wanted  # every (selected) row exactly once
    return out


@pytest.mark.parametrize("spec_index", range(len(SPECS)))
@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(row_strategy, min_size=1, max_size=40),
    rows_max=st.integers(1, 50),
    threads=st.integers(0, 3),
)
def test_split_matches_the_reference(
    spec_index: int, rows: list[dict[str, Any]], rows_max: int, threads: int
) -> None:
    check_split(SPECS[spec_index], op_batch(rows), rows_max, 1 << 30, threads)


@pytest.mark.parametrize("spec_index", range(len(SPECS)))
@settings(max_examples=25, deadline=None)
@given(rows=st.lists(row_strategy, min_size=1, max_size=40), data=st.data())
def test_a_selection_routes_only_its_rows(
    spec_index: int, rows: list[dict[str, Any]], data: st.DataObject
) -> None:
    keep = data.draw(st.lists(st.booleans(), min_size=len(rows), max_size=len(rows)))
    selection = [i for i, k in enumerate(keep) if k]
    batch = op_batch(rows)
    # Rows left out may hold anything, even a null key (the client refuses those itself).
    left_out = [i for i, k in enumerate(keep) if not k]
    if left_out:
        ids = batch.column("id").to_pylist()
        ids[left_out[0]] = None
        batch = batch.set_column(0, "id", pa.array(ids, pa.int64()))
    if selection:
        check_split(SPECS[spec_index], batch, 7, 1 << 30, 0, selection)


def test_rows_no_partition_covers_come_back_and_rows_are_measured_one_by_one() -> None:
    gapped = RangePartitioning("id", bounds=[(0, 100), (200, 300)])
    ps, ranges = PartitionSchema.from_spec(gapped, SCHEMA)
    parts = create_partitions(ps, ranges)
    native = _native.PartitionRouter(
        [], list(ps.range_columns), [p.key_start for p in parts], [p.key_end for p in parts]
    )
    base = {c.name: None for c in SCHEMA.columns} | {"name": "n", "small": 1}
    ids = [5, 150, 250, -1, 300, 99]
    big = "y" * (1 << 20)  # over the cell limit: the router measures, it does not judge
    rows = [base | {"id": i, "s": big if i == 250 else "z"} for i in ids]
    columns = {c.name: pa.array([r[c.name] for r in rows], c.arrow_type) for c in SCHEMA.columns}
    columns[OP_COLUMN] = pa.array([3] * len(rows), pa.uint8())
    batch = pa.RecordBatch.from_pydict(columns)
    pieces, unrouted = native.split_requests(batch, 100, 64 * 1024)
    assert pa.array(unrouted).to_pylist() == [1, 3, 4]
    sent = sorted(p for _, positions, _ in pieces for p in pa.array(positions).to_pylist())
    assert sent == [0, 2, 5]
    for _, positions, ipc in pieces:
        # The 1 MiB row goes alone; the small ones share a request under the 64 KiB cap.
        if 2 in pa.array(positions).to_pylist():
            assert pa.array(positions).to_pylist() == [2]
        else:
            assert len(ipc) < 64 * 1024


def test_a_slice_of_a_batch_splits_like_its_copy() -> None:
    rng = np.random.default_rng(3)
    n = 5000
    full = make_op_batch(
        {
            "id": rng.integers(-(2**40), 2**40, n),
            "name": pa.array([f"n{i % 97}" for i in range(n)]),
            "small": rng.integers(0, 100, n).astype(np.int32),
            "f": pa.array(rng.random(n), mask=rng.random(n) < 0.3),
            "s": pa.array([None if i % 7 == 0 else "x" * (i % 13) for i in range(n)]),
            "b": pa.nulls(n, pa.binary()),
            "flag": pa.array(rng.random(n) < 0.5),
            "ts": pa.array(rng.integers(0, 2**50, n), pa.timestamp("us")),
            "i8": pa.array(rng.integers(-128, 128, n).astype(np.int8)),
            "i16": pa.array(rng.integers(-(2**15), 2**15, n).astype(np.int16)),
            "f32": pa.array(rng.random(n).astype(np.float32), mask=rng.random(n) < 0.5),
        },
        "upsert",
        SCHEMA,
    )
    sliced = full.slice(1234, 2345)
    for spec in SPECS:
        got = check_split(spec, sliced, 300, 1 << 30)
        want = check_split(
            spec, pa.Table.from_batches([sliced]).combine_chunks().to_batches()[0], 300, 1 << 30
        )
        assert [(p, pos) for p, pos, _ in got] == [(p, pos) for p, pos, _ in want]


def test_requests_respect_the_byte_cap() -> None:
    n = 20_000
    batch = make_op_batch(
        {
            "id": np.arange(n, dtype=np.int64),
            "name": pa.array(["k"] * n),
            "small": np.zeros(n, dtype=np.int32),
            "f": np.ones(n),
            "s": pa.array(["y" * 100] * n),
            "b": pa.nulls(n, pa.binary()),
            "flag": pa.nulls(n, pa.bool_()),
            "ts": pa.nulls(n, pa.timestamp("us")),
            "i8": pa.nulls(n, pa.int8()),
            "i16": pa.nulls(n, pa.int16()),
            "f32": pa.nulls(n, pa.float32()),
        },
        "upsert",
        SCHEMA,
    )
    bytes_max = 256 * 1024
    pieces = check_split(SPECS[0], batch, n, bytes_max)
    assert len(pieces) > 4  # the cap, not the tablet count, set the number of requests
    for _, _, table in pieces:
        # The cap is estimated from the average row; rows here are all alike.
        assert table.nbytes <= bytes_max * 1.1


def test_one_tablet_sends_the_batch_whole_and_bad_input_is_refused() -> None:
    batch = op_batch([{c.name: None for c in SCHEMA.columns} | {"id": 1, "name": "a", "small": 2}])
    _, _, native = router(None)
    [(partition, positions, ipc)], _ = native.split_requests(batch, 10, 1 << 20)
    assert partition == 0
    assert pa.array(positions).to_pylist() == [0]
    assert pa.ipc.open_stream(ipc).read_all().to_batches()[0] == batch
    with pytest.raises(InvalidArgumentError):
        native.split_requests(batch, 0, 1 << 20)
    _, _, hashed = router(SPECS[0])
    no_id = batch.drop_columns(["id"])
    with pytest.raises(InvalidArgumentError, match="lacks column"):
        hashed.split_requests(no_id, 10, 1 << 20)
    with_null_key = pa.RecordBatch.from_arrays(
        [pa.array([None], pa.int64()), *batch.columns[1:]], names=batch.schema.names
    )
    with pytest.raises(InvalidArgumentError, match="nulls"):
        hashed.split_requests(with_null_key, 10, 1 << 20)
    assert OP_COLUMN in batch.schema.names


# --- split_small_rows: a few rows from Python lists, without pyarrow -----------------------

#: The columns ``split_small_rows`` takes (the others send a write down the general path).
SMALL_COLUMNS = ["id", "name", "small", "f", "s", "b", "flag", "i8", "i16"]


def small_columns(rows: list[dict[str, Any]]) -> list[tuple[str, list[Any]]]:
    return [(name, [r[name] for r in rows]) for name in SMALL_COLUMNS]


@pytest.mark.parametrize("spec_index", range(len(SPECS)))
@settings(max_examples=25, deadline=None)
@given(rows=st.lists(row_strategy, min_size=1, max_size=20), rows_max=st.integers(1, 30))
def test_small_rows_split_into_the_same_requests_as_their_op_batch(
    spec_index: int, rows: list[dict[str, Any]], rows_max: int
) -> None:
    # Plain Python values: what a caller of Table.upsert({"id": [1], ...}) passes.
    rows = [{**r, "f": None if r["f"] is None else float(r["f"])} for r in rows]
    _, _, native = router(SPECS[spec_index])
    split = native.split_small_rows(SCHEMA.to_native(), small_columns(rows), 3, rows_max, 1 << 30)
    assert split is not None
    pieces, unrouted = split
    assert unrouted == []
    given_rows = {name: values for name, values in small_columns(rows)}
    batch = make_op_batch(given_rows, "upsert", SCHEMA)
    expected, _ = native.split_requests(batch, rows_max, 1 << 30, 1)
    assert len(pieces) == len(expected)
    for (partition, positions, ipc), (partition_e, positions_e, ipc_e) in zip(
        pieces, expected, strict=True
    ):
        assert partition == partition_e
        assert positions == pa.array(positions_e).to_pylist()
        assert ipc == ipc_e  # byte for byte what the general path sends


BASE_ROW = {"id": 1, "name": "n", "small": 2, "f": 1.5, "s": "s", "b": b"b", "flag": True}


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("id", True),  # a bool is an int to Python, not to the table
        ("id", 1.0),  # a float in an integer column
        ("id", 2**63),  # out of int64's range
        ("small", 2**31),  # out of int32's range
        ("i8", 128),
        ("f", 1),  # an int in a double column: pyarrow's conversion decides
        ("s", b"bytes"),  # bytes in a string column
        ("b", "text"),  # text in a binary column
        ("flag", 1),
        ("s", "\ud800"),  # a lone surrogate is not UTF-8
        ("id", np.int64(5)),  # numpy's scalars: the general path converts them
        ("id", None),  # a null key breaks a rule: the general path reports the row
        ("s", "x" * (65 * 1024)),  # a cell over the limit, likewise
    ],
)
def test_values_the_small_path_does_not_take_send_the_write_down_the_general_path(
    column: str, value: Any
) -> None:
    _, _, native = router(SPECS[0])
    row = BASE_ROW | {"i8": 1, "i16": 1, column: value}
    assert native.split_small_rows(SCHEMA.to_native(), small_columns([row]), 3, 10, 1 << 30) is None


def test_columns_the_small_path_does_not_take_send_the_write_down_the_general_path() -> None:
    _, _, native = router(SPECS[0])
    native_schema = SCHEMA.to_native()
    columns = small_columns([BASE_ROW | {"i8": 1, "i16": 1}])
    for extra in (("f32", [1.5]), ("ts", [5]), ("nope", [1])):
        assert native.split_small_rows(native_schema, [*columns, extra], 3, 10, 1 << 30) is None
    uneven = [(name, values * (2 if name == "s" else 1)) for name, values in columns]
    assert native.split_small_rows(native_schema, uneven, 3, 10, 1 << 30) is None
