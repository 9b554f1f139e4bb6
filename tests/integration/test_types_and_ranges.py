"""decimal, date, varchar and UTC timestamps, and range partitions added and dropped, on real
processes (issue 33): round trips through the client, pandas and the command line with exact
values back; hash and range partitioning on keys of these types; predicates on them; range
partitions added and dropped through the master, bounds shown as values.

One cluster (1 master, 3 tablet servers) serves the module.
"""

from __future__ import annotations

import datetime
import decimal
import json
import zoneinfo
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import nyala
from nyala._proto import metadata_pb2
from nyala.cli import main
from nyala.testing import MiniCluster, logs_on_failure, replica_ops
from nyala.testing import master_ops as ops
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, fast_master_flags

D = decimal.Decimal
UTC = datetime.UTC
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
SCHEMA_TEXT = (
    "id:int64, price:decimal(38,2)?, small:decimal(5,3)?, day:date?, code:varchar(4)?, "
    "ts:timestamp?"
)
ROWS: dict[str, list[Any]] = {
    "id": [1, 2, 3, 4, 5],
    "price": [
        D("999999999999999999999999999999999999.99"),
        D("-999999999999999999999999999999999999.99"),
        D("0.01"),
        D("-0.00"),
        None,
    ],
    "small": [D("99.999"), D("-99.999"), D("0.001"), D("0"), None],
    "day": [
        datetime.date(1, 1, 1),
        datetime.date(1969, 12, 31),
        datetime.date(1900, 2, 28),
        datetime.date(9999, 12, 31),
        None,
    ],
    "code": ["abcd", "日本語テキスト", "😀x😀y😀", "a\u0301bcdef", None],
    "ts": [
        datetime.datetime(2024, 1, 1, 10, 0, tzinfo=BERLIN),  # 09:00 UTC
        datetime.datetime(1950, 6, 1, 12, 0, 0, 123456, tzinfo=UTC),
        datetime.datetime(2024, 7, 1, 10, 0),  # naive: taken as UTC
        datetime.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        None,
    ],
}
EXPECTED_CODES = ["abcd", "日本語テ", "😀x😀y", "a\u0301bc", None]  # 4 characters, not bytes
EXPECTED_TS = [
    datetime.datetime(2024, 1, 1, 9, 0, tzinfo=UTC),
    datetime.datetime(1950, 6, 1, 12, 0, 0, 123456, tzinfo=UTC),
    datetime.datetime(2024, 7, 1, 10, 0, tzinfo=UTC),
    datetime.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    None,
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[MiniCluster]:
    with logs_on_failure(
        MiniCluster(
            3, num_masters=1, master_flags=fast_master_flags(), tserver_flags=FAST_TSERVER_FLAGS
        )
    ) as mini:
        yield mini


@pytest.fixture
def client(cluster: MiniCluster) -> Iterator[nyala.Client]:
    with nyala.connect(cluster.master_addrs, timeout_ms=30_000) as c:
        yield c


def cli(cluster: MiniCluster, *args: str) -> Any:
    """Runs ``nyala ARGS --format json`` in-process; its parsed output (must succeed)."""
    result = CliRunner().invoke(
        main, [*args, "--masters", ",".join(cluster.master_addrs), "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr or result.output
    return json.loads(result.stdout)


def cli_error(cluster: MiniCluster, *args: str) -> str:
    """Runs a command that must fail; its one-line error."""
    result = CliRunner().invoke(main, [*args, "--masters", ",".join(cluster.master_addrs)])
    assert result.exit_code != 0, result.output
    return result.stderr


def check_rows(table: pa.Table) -> None:
    got = table.sort_by("id")
    assert got.schema.field("price").type == pa.decimal128(38, 2)
    assert got.schema.field("small").type == pa.decimal128(5, 3)
    assert got.schema.field("day").type == pa.date32()
    assert got.schema.field("code").type == pa.string()
    assert got.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert got.column("price").to_pylist() == ROWS["price"]
    assert got.column("small").to_pylist() == ROWS["small"]
    assert got.column("day").to_pylist() == ROWS["day"]
    assert got.column("code").to_pylist() == EXPECTED_CODES
    assert got.column("ts").to_pylist() == EXPECTED_TS


def test_types_round_trip_through_the_client_and_pandas(client: nyala.Client) -> None:
    schema = nyala.Schema.parse(SCHEMA_TEXT, key=["id"])
    table = client.create_table(
        "typed", schema, partitioning=nyala.HashPartitioning(["id"], buckets=3), replicas=3
    )
    assert table.insert(ROWS).ok
    check_rows(table.scan().to_arrow())
    # A decimal that does not fit, or would round, is a row error; the others are written.
    result = table.insert({"id": [10, 11, 12], "small": [D("100.000"), D("1.0001"), D("1.5")]})
    assert [e.row for e in result.row_errors] == [0, 1]
    assert table.scan(where=[("id", ">=", 10)]).to_arrow().column("id").to_pylist() == [12]
    table.delete({"id": [12]})
    # pandas both ways: zone-aware pandas timestamps go in, UTC-labelled ones come out.
    frame = table.scan().to_pandas().sort_values("id").reset_index(drop=True)
    assert str(frame["ts"].dtype) == "datetime64[us, UTC]"
    frame["id"] = frame["id"] + 100
    frame["ts"] = frame["ts"].dt.tz_convert("America/New_York")
    assert table.insert(frame).ok
    again = table.scan(where=[("id", ">=", 100)]).to_arrow()
    check_rows(
        again.set_column(0, "id", pa.compute.subtract(again.column("id"), 100))  # type: ignore[attr-defined]
    )

    # Predicates on every new type, pushed into the tablets.
    def ids(*where: tuple[Any, ...]) -> list[int]:
        found = table.scan(columns=["id"], where=list(where)).to_arrow()
        return sorted(found.column("id").to_pylist())

    assert ids(("price", "<", D("0"))) == [2, 102]
    assert ids(("day", "<", datetime.date(1970, 1, 1)), ("id", "<", 100)) == [1, 2, 3]
    assert ids(("code", "=", "日本語テ")) == [2, 102]
    assert ids(("ts", ">=", datetime.datetime(2024, 1, 1, 10, tzinfo=BERLIN))) == [1, 3, 101, 103]
    assert ids(("ts", "is null")) == [5, 105]
    assert ids(("small", "!=", D("0")), ("id", "<", 100)) == [1, 2, 3]


def test_hash_and_range_partitioning_on_keys_of_the_new_types(client: nyala.Client) -> None:
    schema = nyala.Schema.parse(
        "day:date, amount:decimal(18,2), tag:varchar(3), v:int64?", key=["day", "amount", "tag"]
    )
    table = client.create_table(
        "typed_keys",
        schema,
        partitioning=[
            nyala.HashPartitioning(["amount", "tag"], buckets=2),
            nyala.RangePartitioning(
                ["day"],
                bounds=[(datetime.date(1960, 1, 1), datetime.date(1980, 1, 1))],
                splits=[datetime.date(1970, 1, 1)],
            ),
        ],
        replicas=3,
    )
    assert len(table.tablets()) == 4
    partitions = sorted(
        {t.partition.describe(table.partition_schema, schema) for t in table.tablets()}
    )
    assert "1960-01-01 <= day < 1970-01-01" in partitions[0]
    days = [datetime.date(1965, 5, 5), datetime.date(1970, 1, 1), datetime.date(1979, 12, 31)]
    rows = {
        "day": days,
        "amount": [D("-1.50"), D("0.00"), D("1234567890123456.78")],
        "tag": ["abcdef", "x", "日本語テキスト"],
        "v": [1, 2, 3],
    }
    assert table.upsert(rows).ok
    out = table.scan().to_arrow().sort_by("v")
    assert out.column("tag").to_pylist() == ["abc", "x", "日本語"]
    assert out.column("amount").to_pylist() == rows["amount"]
    # The stored key is the truncated text: an upsert of the long text hits the same row.
    assert table.upsert({**rows, "v": [4, 5, 6]}).ok
    assert table.count() == 3
    outside = table.insert({"day": [datetime.date(1959, 12, 31)], "amount": [D("1")], "tag": ["a"]})
    assert [e.row for e in outside.row_errors] == [0]
    # Pruning: an equality on the range and hash columns reads one tablet.
    scan = table.scan(where=[("day", "=", days[1]), ("amount", "=", D("0.00")), ("tag", "=", "x")])
    assert scan.to_arrow().column("v").to_pylist() == [5]
    assert len(scan.served_by) == 1


def test_cli_load_scan_and_predicates_of_every_type(cluster: MiniCluster, tmp_path: Path) -> None:
    created = cli(
        cluster, "table", "create", "cli_typed", "--schema", SCHEMA_TEXT, "--key", "id",
        "--hash", "id:2", "--replicas", "3",
    )  # fmt: skip
    assert created["tablets"] == 2
    described = cli(cluster, "table", "describe", "cli_typed")
    types = {c["name"]: c["type"] for c in described["columns"]}
    assert types == {
        "id": "int64",
        "price": "decimal(38,2)",
        "small": "decimal(5,3)",
        "day": "date",
        "code": "varchar(4)",
        "ts": "timestamp",
    }
    path = tmp_path / "rows.parquet"
    arrow = pa.table(
        {
            "id": pa.array(ROWS["id"], pa.int64()),
            "price": pa.array(ROWS["price"], pa.decimal128(38, 2)),
            "small": pa.array(ROWS["small"], pa.decimal128(5, 3)),
            "day": pa.array(ROWS["day"], pa.date32()),
            "code": pa.array(ROWS["code"]),
            "ts": pa.array(
                [None if t is None else t.astimezone(BERLIN) for t in EXPECTED_TS],
                pa.timestamp("us", tz="Europe/Berlin"),
            ),
        }
    )
    pq.write_table(arrow, path)
    loaded = cli(cluster, "table", "load", "cli_typed", str(path))
    assert loaded["applied"] == 5
    scanned = cli(cluster, "table", "scan", "cli_typed")
    by_id = {r["id"]: r for r in scanned}
    assert by_id[1]["price"] == "999999999999999999999999999999999999.99"
    assert by_id[2]["day"] == "1969-12-31"
    assert by_id[2]["code"] == "日本語テ"
    assert by_id[1]["ts"] == "2024-01-01 09:00:00+00:00"

    def where(*clauses: str) -> list[int]:
        args = [a for c in clauses for a in ("--where", c)]
        return sorted(r["id"] for r in cli(cluster, "table", "scan", "cli_typed", *args))

    assert where("ts >= '2024-01-01 10:00:00+01:00'") == [1, 3]
    assert where("ts >= '2024-01-01T09:00:00Z'") == [1, 3]
    assert where("ts < 2024-01-01") == [2, 4]  # a date is midnight UTC
    assert where("ts = 1719828000000000") == [3]  # integer microseconds
    assert where("day < '1970-01-01'") == [1, 2, 3]
    assert where("day IN ('1969-12-31', 9999-12-31)") == [2, 4]
    assert where("price != 0.01", "price is not null") == [1, 2, 4]
    assert where("small = 99.999") == [1]
    assert where("code = '日本語テ'") == [2]
    assert where("id <> 3", "ts IS NULL") == [5]
    assert where("code in ('abcd', 'a,b')") == [1]
    error = cli_error(cluster, "table", "scan", "cli_typed", "--where", "day ~ 3")
    assert "accepted:" in error
    assert "IS NOT NULL" in error
    assert "IN (V1" in error
    error = cli_error(cluster, "table", "scan", "cli_typed", "--where", "day = yesterday")
    assert "not a date value" in error
    assert "accepted:" in error


def test_range_partitions_added_and_dropped_with_bounds_shown_as_values(
    client: nyala.Client, cluster: MiniCluster
) -> None:
    schema = nyala.Schema.parse("day:date, id:int64, v:string?", key=["day", "id"])
    jan, feb, mar = (datetime.date(2024, m, 1) for m in (1, 2, 3))
    table = client.create_table(
        "monthly",
        schema,
        partitioning=[
            nyala.HashPartitioning(["id"], buckets=2),
            nyala.RangePartitioning(["day"], bounds=[(jan, feb)]),
        ],
        replicas=3,
    )
    assert table.insert({"day": [jan, jan], "id": [1, 2], "v": ["a", "b"]}).ok
    refused = table.insert({"day": [feb], "id": [3]})
    assert [e.row for e in refused.row_errors] == [0]
    assert "no tablet covers" in refused.row_errors[0].message
    # Add next month through the API, the month after through the CLI.
    table = client.alter_table("monthly", add_range_partition=(feb, mar))
    assert len(table.tablets()) == 4
    added = cli(cluster, "table", "add-range-partition", "monthly", "2024-03-01", "2024-04-01")
    assert added["tablets"] == 6
    assert added["ranges"] == [
        "2024-01-01 <= day < 2024-02-01",
        "2024-02-01 <= day < 2024-03-01",
        "2024-03-01 <= day < 2024-04-01",
    ]
    table = client.table("monthly")
    assert table.insert({"day": [feb, mar], "id": [3, 4]}).ok
    # Overlaps and unknown ranges are refused with the ranges named, and change nothing.
    with pytest.raises(nyala.errors.InvalidArgumentError, match="overlaps range 2024-01-01"):
        client.alter_table(
            "monthly",
            add_range_partition=(datetime.date(2023, 12, 1), jan + datetime.timedelta(days=3)),
        )
    with pytest.raises(nyala.errors.InvalidArgumentError, match="no range partition"):
        client.alter_table("monthly", drop_range_partition=(jan, mar))
    error = cli_error(
        cluster, "table", "drop-range-partition", "monthly", "2024-01-01", "2024-01-15"
    )
    assert "no range partition" in error
    listed = cli(cluster, "tablet", "list", "--table", "monthly")
    assert sorted({t["partition"] for t in listed})[0] == "bucket 0, 2024-01-01 <= day < 2024-02-01"
    described = cli(cluster, "table", "describe", "monthly")
    assert "2024-02-01 <= day < 2024-03-01" in described["tablets"][1]["partition"]
    # Drop January: its rows are gone, writes to it are row errors, the rest is intact.
    jan_tablets = {
        t.tablet_id
        for t in table.tablets()
        if t.partition.range_bounds()[0] == table.partition_schema.encode_range_key(schema, [jan])
    }
    assert len(jan_tablets) == 2
    dropped = cli(cluster, "table", "drop-range-partition", "monthly", "2024-01-01", "2024-02-01")
    assert dropped["tablets"] == 4
    with nyala.connect(cluster.master_addrs, timeout_ms=30_000) as fresh:
        table = fresh.table("monthly")
        assert {t.tablet_id for t in table.tablets()}.isdisjoint(jan_tablets)
        assert sorted(table.scan(columns=["id"]).to_arrow().column("id").to_pylist()) == [3, 4]
        late = table.insert({"day": [jan, feb], "id": [9, 9]})
        assert [e.row for e in late.row_errors] == [0]
        # An unbounded range may be added when nothing overlaps it.
        table = fresh.alter_table("monthly", add_range_partition=(datetime.date(2024, 4, 1), None))
        shown = {t.partition.describe(table.partition_schema, schema) for t in table.tablets()}
        assert "bucket 1, 2024-04-01 <= day" in shown
        # Range predicates prune tablets as equality on hash columns does.
        assert len(table.scan(where=[("day", ">=", mar)]).tablets()) == 4
        assert len(table.scan(where=[("day", "<", mar), ("day", ">", feb)]).tablets()) == 2
        assert len(table.scan(where=[("day", "=", mar), ("id", "=", 4)]).tablets()) == 1
        assert table.scan(where=[("day", ">=", mar)]).to_arrow().column("id").to_pylist() == [4]


def test_a_client_with_a_stale_cache_after_ranges_are_dropped_and_added(
    client: nyala.Client, cluster: MiniCluster
) -> None:
    """Client ``stale`` caches the table's layout; another client drops January and adds
    March. The stale client's scans never show January's rows (not even before the dropped
    replicas are tombstoned) and see March's; its writes to January fail row by row, and
    its writes to March succeed."""
    schema = nyala.Schema.parse("day:date, id:int64, v:string?", key=["day", "id"])
    jan, feb, mar, apr = (datetime.date(2024, m, 1) for m in (1, 2, 3, 4))
    client.create_table(
        "stale_layout",
        schema,
        partitioning=[
            nyala.HashPartitioning(["id"], buckets=2),
            nyala.RangePartitioning(["day"], bounds=[(jan, feb), (feb, mar)]),
        ],
        replicas=3,
    )
    with nyala.connect(cluster.master_addrs, timeout_ms=30_000) as stale:
        table = stale.table("stale_layout")
        ids = list(range(20))
        assert table.insert({"day": [jan] * 20, "id": ids}).ok
        assert table.insert({"day": [feb] * 20, "id": ids}).ok
        assert table.count() == 40
        cached = {t.tablet_id for t in table.tablets()}
        assert len(cached) == 4

        def days(*where: tuple[Any, ...]) -> list[datetime.date]:
            return table.scan(columns=["day"], where=list(where)).to_arrow()["day"].to_pylist()

        client.alter_table("stale_layout", drop_range_partition=(jan, feb))
        # At once, whether or not the tombstones have reached the replicas yet.
        assert days() == [feb] * 20
        assert days(("day", "<", feb)) == []
        assert days(("day", "=", jan), ("id", "=", 3)) == []
        assert {t.tablet_id for t in table.tablets()} < cached  # the scans refreshed it
        client.alter_table("stale_layout", add_range_partition=(mar, apr))
        assert client.table("stale_layout").insert({"day": [mar] * 5, "id": ids[:5]}).ok
        assert sorted(days()) == [feb] * 20 + [mar] * 5
        assert days(("day", ">=", mar)) == [mar] * 5
        assert days(("day", "=", mar), ("id", "=", 4)) == [mar]

    with (
        nyala.connect(cluster.master_addrs, timeout_ms=30_000) as scanning,
        nyala.connect(cluster.master_addrs, timeout_ms=30_000) as writing,
    ):
        table = scanning.table("stale_layout")
        before = {t.tablet_id: t for t in table.tablets()}  # cached: February and March
        writer = writing.table("stale_layout")
        assert {t.tablet_id for t in writer.tablets()} == set(before)
        # A scan under way when February is dropped: it started with February's tablets
        # (bucket 0's February first), and ends without error when they have gone.
        scan = iter(table.scan(columns=["day"], page_batches=1))
        started = next(scan).column("day").to_pylist()
        assert set(started) == {feb}
        client.alter_table("stale_layout", drop_range_partition=(feb, mar))
        gone = {i for i, t in before.items() if t.partition.range_bounds()[0] == key(table, feb)}
        ops.wait_until(
            lambda: all(
                all(
                    replica_ops.tablet_states(ts).get(i) == metadata_pb2.TABLET_DATA_TOMBSTONED
                    for i in gone
                )
                for ts in cluster.tservers
            ),
            timeout_s=60,
            what="the dropped tablets' replicas tombstoned",
        )
        rest = [d for batch in scan for d in batch.column("day").to_pylist()]
        assert rest.count(mar) == 5
        assert set(rest) <= {feb, mar}  # what bucket 0's February scanner had open, at most
        # The writer still routes February's rows to February's tablets: they answer
        # TABLET_NOT_FOUND, the master no longer lists them, and the rows fail one by one.
        # (A call whose every row went to a dropped tablet returns them so; it does not raise.)
        result = writer.insert({"day": [feb, feb], "id": [100, 101]})
        assert [e.row for e in result.row_errors] == [0, 1]
        assert {e.code for e in result.row_errors} == {"NOT_FOUND"}
        assert all("range partition was dropped" in e.message for e in result.row_errors)
        assert writer.insert({"day": [mar], "id": [100]}).ok
        client.alter_table("stale_layout", add_range_partition=(apr, None))
        # April was added since the writer cached the layout: it asks the master again.
        result = writer.insert({"day": [apr, feb], "id": [100, 102]})
        assert [e.row for e in result.row_errors] == [1]
        assert "no tablet covers the row's key" in result.row_errors[0].message
        assert sorted(table.scan(columns=["day"]).to_arrow()["day"].to_pylist()) == (
            [mar] * 6 + [apr]
        )


def key(table: nyala.Table, value: Any) -> bytes:
    """The encoded range key of ``value`` in ``table`` (one range column)."""
    return table.partition_schema.encode_range_key(table.schema, [value])


def test_csv_load_of_decimals_dates_and_timestamps_with_rejects(
    client: nyala.Client, cluster: MiniCluster, tmp_path: Path
) -> None:
    cli(
        cluster, "table", "create", "csv_typed", "--schema", SCHEMA_TEXT, "--key", "id",
        "--hash", "id:2", "--replicas", "3",
    )  # fmt: skip
    path = tmp_path / "rows.csv"
    path.write_text(
        "id,price,small,day,code,ts\n"
        "1,12345678.91,99.999,1969-12-31,日本語テキスト,2024-01-01 10:00:00+01:00\n"
        "2,-999999999999999999999999999999999999.99,-0.001,0001-01-01,ab,2024-01-01T09:00:00Z\n"
        "3,0.10,,2024-02-29,,2024-07-01 10:00:00\n"
        "4,1.234,1,2024-01-01,x,\n"  # 1.234 would round: refused
        "5,7,100.000,2024-01-01,x,\n"  # 100.000 does not fit decimal(5,3)
        "6,7,1,2024-02-30,x,\n"  # no such day
        "7,abc,1,2024-01-01,x,2024-01-01\n"  # not a number
        "8,7,1,2024-01-01,x,yesterday\n"  # not a time
        "9,,,,,\n"
    )
    rejects = tmp_path / "rejects.parquet"
    result = CliRunner().invoke(
        main,
        [
            "table", "load", "csv_typed", str(path), "--rejects", str(rejects),
            "--masters", ",".join(cluster.master_addrs), "--format", "json",
        ],
    )  # fmt: skip
    assert result.exit_code == 1, result.output  # some rows were not applied
    summary = json.loads(result.stdout)
    assert (summary["applied"], summary["failed"], summary["unknown"]) == (4, 5, 0)
    assert summary["failed_by_code"] == {"INVALID_ARGUMENT": 5}
    refused = pq.read_table(rejects).sort_by("__row").to_pydict()
    assert refused["id"] == ["4", "5", "6", "7", "8"]  # the values as they were in the file
    assert refused["__row"] == [3, 4, 5, 6, 7]
    assert "cannot convert '1.234' to decimal128(38, 2)" in refused["__error_message"][0]
    assert "'2024-02-30'" in refused["__error_message"][2]
    assert "'yesterday'" in refused["__error_message"][4]
    got = client.table("csv_typed").scan().to_arrow().sort_by("id").to_pydict()
    assert got["id"] == [1, 2, 3, 9]
    assert got["price"] == [
        D("12345678.91"),
        D("-999999999999999999999999999999999999.99"),
        D("0.10"),
        None,
    ]
    assert got["small"] == [D("99.999"), D("-0.001"), None, None]
    assert got["day"] == [
        datetime.date(1969, 12, 31),
        datetime.date(1, 1, 1),
        datetime.date(2024, 2, 29),
        None,
    ]
    assert got["code"] == ["日本語テ", "ab", None, None]
    assert got["ts"] == [
        datetime.datetime(2024, 1, 1, 9, tzinfo=UTC),
        datetime.datetime(2024, 1, 1, 9, tzinfo=UTC),
        datetime.datetime(2024, 7, 1, 10, tzinfo=UTC),
        None,
    ]
    # Fixed, the rejects load back (their bookkeeping columns dropped).
    fixed = pq.read_table(rejects).to_pandas()
    fixed["price"], fixed["small"], fixed["day"] = "1.23", "1", "2024-01-02"
    fixed["ts"] = "2024-01-02"
    pq.write_table(pa.Table.from_pandas(fixed, preserve_index=False), rejects)
    again = cli(cluster, "table", "load", "csv_typed", str(rejects), "--ignore-extra-columns")
    assert again["applied"] == 5
    assert client.table("csv_typed").count(where=[("price", "=", D("1.23"))]) == 5
