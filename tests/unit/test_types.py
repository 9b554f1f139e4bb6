"""decimal(p,s), date, varchar(n) and UTC timestamps: the schema syntax, defaults in every
form they are kept in, and a storage engine holding them (per-row errors, truncation,
predicates with statistics pruning, key encoding against the Python reference)."""

from __future__ import annotations

import datetime
import decimal
import zoneinfo
from pathlib import Path

import pyarrow as pa
import pytest

from nyala import _native
from nyala.errors import InvalidArgumentError
from nyala.partition import decode_key, describe_range, encode_key, hash64
from nyala.rowops import OpType, prepare_op_batch
from nyala.rpc.schema_pb import schema_from_pb, schema_to_pb
from nyala.schema import Column, Schema, canonical_type, format_schema
from nyala.storage import RowStatus, StorageEngine
from nyala.tablet.superblock import schema_from_dict, schema_to_dict

D = decimal.Decimal
UTC = datetime.UTC
TYPED = Schema.parse(
    "id:int64, price:decimal(38,2)?, day:date?, code:varchar(4)?, ts:timestamp?", key=["id"]
)
#: Decimal extremes of decimal(38,2), dates before 1970 and far ahead, multi-byte text.
EXTREMES = {
    "id": [1, 2, 3, 4],
    "price": [D("999999999999999999999999999999999999.99"), D("-0.01"), D("0.00"), None],
    "day": [datetime.date(1, 1, 1), datetime.date(1969, 12, 31), datetime.date(9999, 12, 31), None],
    "code": ["ab", "日本語テキスト", "😀😀😀😀😀", None],
    "ts": [
        datetime.datetime(2024, 1, 1, 10, tzinfo=zoneinfo.ZoneInfo("Europe/Berlin")),
        datetime.datetime(1969, 7, 20, 20, 17, 40, 123456, tzinfo=UTC),
        datetime.datetime(2024, 1, 1, 9),  # naive: taken as UTC
        None,
    ],
}


def test_parse_handles_commas_in_parameters_and_prints_types_as_written() -> None:
    schema = Schema.parse(
        "id:int64, price:decimal(10, 2), d:date?, v:varchar( 32 )?, n:decimal(5)", key=["id"]
    )
    assert [c.type for c in schema.columns] == [
        "int64",
        "decimal(10,2)",
        "date",
        "varchar(32)",
        "decimal(5,0)",
    ]
    assert format_schema(schema) == (
        "id:int64, price:decimal(10,2), d:date?, v:varchar(32)?, n:decimal(5,0)"
    )
    assert Schema.parse(format_schema(schema), key=["id"]) == schema
    assert schema.to_arrow().field("price").type == pa.decimal128(10, 2)
    assert schema.to_arrow().field("d").type == pa.date32()
    assert schema.to_arrow().field("v").type == pa.string()
    assert TYPED.to_arrow().field("ts").type == pa.timestamp("us", tz="UTC")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("decimal(39,2)", "1 <= p <= 38"),
        ("decimal(0,0)", "1 <= p <= 38"),
        ("decimal(4,5)", "0 <= s <= p"),
        ("decimal(a,b)", "integers"),
        ("decimal(1,2,3)", "decimal"),
        ("varchar(0)", "1 <= n <= 65535"),
        ("varchar(65536)", "1 <= n <= 65535"),
        ("varchar", "unknown column type"),
        ("decimal", "unknown column type"),
    ],
)
def test_type_parameters_are_checked(text: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message.replace("(", r"\(")):
        canonical_type(text)


def test_defaults_of_the_new_types_round_trip_through_every_form() -> None:
    schema = Schema.parse(
        "id:int64, p:decimal(38,4)=-1234567890123456789012345678901234.5678, d:date=1969-12-31, "
        "v:varchar(3)='héllo', t:timestamp=2024-01-01T10:00:00+01:00",
        key=["id"],
    )
    defaults = {c.name: c.default for c in schema.columns}
    assert defaults["p"] == D("-1234567890123456789012345678901234.5678")
    assert defaults["d"] == datetime.date(1969, 12, 31)
    assert defaults["v"] == "hél"  # truncated to 3 characters, as the servers store it
    assert defaults["t"] == 1_704_099_600_000_000  # 09:00 UTC
    assert Schema.from_native(schema.to_native()) == schema
    assert schema_from_pb(schema_to_pb(schema)).columns == schema.columns
    assert schema_from_dict(schema_to_dict(schema)) == schema
    assert Schema.parse(format_schema(schema), key=["id"]) == schema
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        Column("x", "decimal(5,2)", default=D("1.234"))  # rescaling would round
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        Column("x", "decimal(5,2)", default=D("1000.00"))  # 6 digits
    with pytest.raises(InvalidArgumentError, match="does not fit"):
        Column("x", "date", default=datetime.datetime(2024, 1, 1))


def test_engine_round_trips_extremes_truncates_varchar_and_converts_zones(
    tmp_path: Path,
) -> None:
    engine = StorageEngine.create(tmp_path / "t", TYPED, background_flush=False)
    assert engine.write(EXTREMES, OpType.INSERT, 1).ok
    for flushed in (False, True):
        if flushed:
            engine.flush()
        rows = engine.scan().to_pylist()
        assert [r["price"] for r in rows] == EXTREMES["price"]
        assert [r["day"] for r in rows] == EXTREMES["day"]
        # Truncated to 4 characters (not bytes) by the engine: multi-byte text stays valid.
        assert [r["code"] for r in rows] == ["ab", "日本語テ", "😀😀😀😀", None]
        # The engine stores UTC microseconds; 10:00 Berlin is 09:00 UTC.
        assert [r["ts"] for r in rows] == [
            datetime.datetime(2024, 1, 1, 9),
            datetime.datetime(1969, 7, 20, 20, 17, 40, 123456),
            datetime.datetime(2024, 1, 1, 9),
            None,
        ]


def test_a_decimal_that_does_not_fit_is_a_row_error_and_the_others_are_written(
    tmp_path: Path,
) -> None:
    schema = Schema.parse("id:int64, p:decimal(5,2)?", key=["id"])
    given = {"id": [1, 2, 3, 4], "p": [D("1.5"), D("1000.00"), D("1.234"), D("-999.99")]}
    prepared = prepare_op_batch(given, OpType.INSERT, schema)
    assert [p.row for p in prepared.problems] == [1, 2]
    assert all(p.code == "INVALID_ARGUMENT" for p in prepared.problems)
    # The engine checks the precision itself too (a batch built without the client).
    raw = pa.record_batch(
        {
            "id": pa.array([1, 2], pa.int64()),
            "p": pa.array([D("1.50"), D("1000.00")], pa.decimal128(38, 2)).cast(
                pa.decimal128(5, 2), safe=False
            ),
            "__op": pa.array([1, 1], pa.uint8()),
        }
    )
    engine = StorageEngine.create(tmp_path / "t", schema, background_flush=False)
    result = engine.apply(raw, 1)
    assert result.errors() == [(1, RowStatus.OUT_OF_RANGE)]
    assert engine.scan().to_pylist() == [{"id": 1, "p": D("1.50")}]
    problems = _native.check_op_batch(raw, schema.to_native())
    assert [(row, message) for row, _status, message in problems] == [
        (1, 'column "p": 1000.00 does not fit decimal(5,2)')
    ]


def test_text_of_every_type_parses_exactly_and_bad_text_fails_its_row_alone() -> None:
    """What a CSV load hands the client: every column as text."""
    text = {
        "id": ["1", "2", "3", "4", "5", "6"],
        "price": ["12345678.91", "-0.01", "1.234", "abc", None, "99999999999999999999999.99"],
        "day": ["1969-12-31", "0001-01-01", "2024-02-29", "2024-02-30", None, "2024-01-01"],
        "code": ["日本語テキスト", "", "abcd", "x", None, "y"],
        # With and without a zone offset in one column; a bare date is midnight UTC.
        "ts": [
            "2024-01-01 10:00:00+01:00",
            "2024-01-01T09:00:00Z",
            "2024-01-01",
            "2024-01-01 09:00:00",
            "1969-12-31T23:59:59.999999-0100",
            "not a time",
        ],
    }
    batch = pa.record_batch({k: pa.array(v, pa.string()) for k, v in text.items()})
    prepared = prepare_op_batch(batch, OpType.INSERT, TYPED)
    assert [(p.row, p.code) for p in prepared.problems] == [
        (2, "INVALID_ARGUMENT"),  # 1.234 would round in decimal(38,2)
        (3, "INVALID_ARGUMENT"),  # abc (and 2024-02-30)
        (5, "INVALID_ARGUMENT"),  # not a time
    ]
    assert "cannot convert '1.234'" in prepared.problems[0].message
    got = prepared.batch.to_pydict()
    assert got["price"][:2] == [D("12345678.91"), D("-0.01")]
    assert got["price"][5] == D("99999999999999999999999.99")  # 25 digits, exactly
    assert got["day"][:3] == [
        datetime.date(1969, 12, 31),
        datetime.date(1, 1, 1),
        datetime.date(2024, 2, 29),
    ]
    nine = datetime.datetime(2024, 1, 1, 9, tzinfo=UTC)
    assert got["ts"][:5] == [
        nine,
        nine,
        datetime.datetime(2024, 1, 1, tzinfo=UTC),
        nine,
        datetime.datetime(1970, 1, 1, 0, 59, 59, 999999, tzinfo=UTC),
    ]


def test_predicates_on_the_new_types_with_statistics_pruning(tmp_path: Path) -> None:
    schema = Schema.parse("id:int64, p:decimal(18,2), day:date, v:varchar(8)", key=["id"])
    engine = StorageEngine.create(tmp_path / "t", schema, background_flush=False)
    ids = list(range(1000))
    rows = {
        "id": ids,
        "p": [D(i).scaleb(-2) for i in ids],
        "day": [datetime.date(1969, 12, 1) + datetime.timedelta(days=i) for i in ids],
        "v": [f"v{i:04d}" for i in ids],
    }
    assert engine.write(rows, OpType.INSERT, 1).ok
    for flushed in (False, True):
        if flushed:
            engine.flush()

        def ids_where(*where: tuple[object, ...]) -> list[int]:
            return engine.scan(columns=["id"], where=list(where)).column("id").to_pylist()

        assert ids_where(("p", ">=", D("9.98"))) == [998, 999]
        assert ids_where(("p", "=", "0.05")) == [5]  # decimal text, as the wire carries it
        assert ids_where(("day", "<", datetime.date(1969, 12, 3))) == [0, 1]
        assert ids_where(("day", "in", [datetime.date(1970, 1, 1), datetime.date(2030, 1, 1)])) == [
            31
        ]
        assert ids_where(("v", "=", "v0007")) == [7]
        assert len(ids_where(("p", "!=", D("0.00")))) == 999


def test_key_encoding_of_the_new_types_matches_the_reference() -> None:
    schema = Schema.parse(
        "p:decimal(38,3), d:date, v:varchar(4), t:timestamp", key=["p", "d", "v", "t"]
    )
    values = [
        (D("-1.5"), datetime.date(1969, 1, 1), "abcd", datetime.datetime(2024, 1, 1, tzinfo=UTC)),
        (D("0"), datetime.date(1970, 1, 1), "x", 0),
        (D("99999999999999999999999999999999999.999"), datetime.date(2200, 5, 5), "日本", -1),
    ]
    types = [c.type for c in schema.columns]
    arrays = [
        pa.array([row[i] for row in values], schema.column(name).storage_arrow_type)
        for i, name in enumerate(schema.names)
    ]
    batch = pa.RecordBatch.from_arrays(arrays, names=schema.names)
    expected = [encode_key(types, row) for row in values]
    by_range = _native.PartitionRouter([], schema.names, [b""], [b""])
    assert by_range.partition_keys(batch) == expected
    assert expected == sorted(expected)  # byte order is the values' order
    by_hash = _native.PartitionRouter([(schema.names, 4, 7)], [], [b""], [b""])
    buckets = [int.from_bytes(k[:4], "big") for k in by_hash.partition_keys(batch)]
    assert buckets == [hash64(k, 7) % 4 for k in expected]


def test_decode_key_inverts_encode_key_and_ranges_print_as_values() -> None:
    types = ["decimal(20,4)", "date", "timestamp", "varchar(5)", "int16", "string"]
    row = (
        D("-12.5000"),
        datetime.date(1901, 3, 4),
        datetime.datetime(1960, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        "a\x00b",
        -7,
        "tail\x00",
    )
    assert decode_key(types, encode_key(types, row)) == row
    schema = Schema.parse("day:date, id:int64", key=["day", "id"])
    low = encode_key(["date"], [datetime.date(2024, 1, 1)])
    high = encode_key(["date"], [datetime.date(2024, 2, 1)])
    assert describe_range(schema, ["day"], low, high) == "2024-01-01 <= day < 2024-02-01"
    assert describe_range(schema, ["day"], b"", high) == "day < 2024-02-01"
    assert describe_range(schema, ["day"], low, b"") == "2024-01-01 <= day"
    both = encode_key(["date", "int64"], [datetime.date(2024, 1, 1), 5])
    assert describe_range(schema, ["day", "id"], both, b"") == "(2024-01-01, 5) <= (day, id)"


@pytest.mark.parametrize(
    ("clause", "expected"),
    [
        (
            "ts >= '2024-01-01 10:00:00+01:00'",
            ("ts", ">=", datetime.datetime(2024, 1, 1, 9, tzinfo=UTC)),
        ),
        ("ts < 2024-01-01", ("ts", "<", datetime.datetime(2024, 1, 1, tzinfo=UTC))),
        ("ts = 1719828000000000", ("ts", "=", 1_719_828_000_000_000)),
        ("day != '1969-12-31'", ("day", "!=", datetime.date(1969, 12, 31))),
        ("day <> 1969-12-31", ("day", "!=", datetime.date(1969, 12, 31))),
        ("price IN (1.50, -2)", ("price", "in", [D("1.50"), D("-2.00")])),
        ("code in ('a,b', c)", ("code", "in", ["a,b", "c"])),
        ("code IS NOT NULL", ("code", "is not null")),
        ("code is null", ("code", "is null")),
    ],
)
def test_cli_where_accepts_every_types_literal(clause: str, expected: tuple[object, ...]) -> None:
    from nyala.cli.table import parse_where

    schema = Schema.parse(
        "id:int64, ts:timestamp?, day:date?, price:decimal(10,2)?, code:varchar(8)?", key=["id"]
    )
    assert parse_where(schema, clause) == expected


@pytest.mark.parametrize("clause", ["day ~ 3", "day = tomorrow", "price = 1.234", "id in 1, 2"])
def test_cli_where_errors_list_the_accepted_forms(clause: str) -> None:
    from nyala.cli.table import parse_where

    schema = Schema.parse("id:int64, day:date?, price:decimal(10,2)?", key=["id"])
    with pytest.raises(InvalidArgumentError, match="accepted: COLUMN OP VALUE"):
        parse_where(schema, clause)
