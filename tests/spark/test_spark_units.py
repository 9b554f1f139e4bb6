"""Unit tests of the Spark data source's parts that need no cluster and no SparkSession:
option parsing, the type and schema mapping, and filter translation."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from nyala.errors import InvalidArgumentError, SchemaMismatchError
from nyala.rowops import OpType
from nyala.schema import Schema
from nyala.spark import options as opts
from nyala.spark import schema_map

pytestmark = pytest.mark.spark

SCHEMA = Schema.parse(
    "id:int64, tag:string, v:double?, n:int32?, ts:timestamp?, b:binary?, ok:bool?, s8:int8?",
    key=["id", "tag"],
)


# --- options ------------------------------------------------------------------------------


def test_write_options_defaults_and_case_insensitive_keys() -> None:
    parsed = opts.parse_write_options({"Nyala.Masters": "h:1", "nyala.TABLE": "t"})
    assert parsed.masters == "h:1"
    assert parsed.table == "t"
    assert parsed.operation is OpType.UPSERT
    assert parsed.batch_rows == opts.BATCH_ROWS_DEFAULT
    assert parsed.create_table is None
    assert not parsed.ignore_null
    assert not parsed.ignore_extra_columns
    assert parsed.fail_on_row_errors
    relaxed = opts.parse_write_options(
        {
            "nyala.masters": "h:1",
            "nyala.table": "t",
            "nyala.ignoreExtraColumns": "true",
            "nyala.failOnRowErrors": "false",
        }
    )
    assert relaxed.ignore_extra_columns
    assert not relaxed.fail_on_row_errors


@pytest.mark.parametrize(
    "operation",
    ["insert", "insert_ignore", "upsert", "update", "update_ignore", "delete", "delete_ignore"],
)
def test_every_operation_parses(operation: str) -> None:
    parsed = opts.parse_write_options(
        {"nyala.masters": "h:1", "nyala.table": "t", "nyala.operation": operation}
    )
    assert parsed.operation is OpType[operation.upper()]


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"nyala.operaton": "delete"}, "unknown write option 'nyala.operaton'"),
        ({"nyala.operation": "merge"}, "unknown operation"),
        ({"nyala.batchRows": "0"}, "nyala.batchRows must be in"),
        ({"nyala.batchRows": "ten"}, "must be an integer"),
        ({"nyala.createTable": "maybe"}, "must be true or false"),
        ({"nyala.createTable": "true"}, "nyala.primaryKey is required"),
        ({"nyala.primaryKey": "id"}, "only applies with nyala.createTable=true"),
        ({"nyala.ignoreNull": "true", "nyala.operation": "insert"}, "ignoreNull applies"),
        (
            {"nyala.createTable": "true", "nyala.primaryKey": "id", "nyala.replicas": "2"},
            "must be odd",
        ),
        (
            {"nyala.createTable": "true", "nyala.primaryKey": "id", "nyala.hashPartitions": "v:4"},
            "not in the primary key",
        ),
    ],
)
def test_bad_write_options_name_the_option(extra: dict[str, str], fragment: str) -> None:
    with pytest.raises(InvalidArgumentError, match=fragment):
        opts.parse_write_options({"nyala.masters": "h:1", "nyala.table": "t", **extra})


def test_masters_fall_back_to_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NYALA_MASTERS", raising=False)
    with pytest.raises(InvalidArgumentError, match=r"nyala\.masters is required"):
        opts.parse_write_options({"nyala.table": "t"})
    monkeypatch.setenv("NYALA_MASTERS", "a:1,b:2")
    assert opts.parse_write_options({"nyala.table": "t"}).masters == "a:1,b:2"


def test_create_table_options() -> None:
    parsed = opts.parse_write_options(
        {
            "nyala.masters": "h:1",
            "nyala.table": "t",
            "nyala.createTable": "TRUE",
            "nyala.primaryKey": "id, tag",
            "nyala.hashPartitions": "id:4; id+tag:2",
            "nyala.replicas": "1",
        }
    )
    assert parsed.create_table == opts.CreateTableOptions(
        ("id", "tag"), (opts.HashLevel(("id",), 4), opts.HashLevel(("id", "tag"), 2)), 1
    )


def test_read_options() -> None:
    parsed = opts.parse_read_options(
        {
            "nyala.masters": "h:1",
            "nyala.table": "t",
            "nyala.columns": "id, v",
            "nyala.replicaSelection": "CLOSEST_REPLICA",
            "nyala.maxStalenessMs": "500",
        }
    )
    assert parsed.columns == ("id", "v")
    assert parsed.replica_selection is opts.ReplicaSelection.CLOSEST_REPLICA
    assert parsed.max_staleness_ms == 500
    with pytest.raises(InvalidArgumentError, match="replicaSelection must be one of"):
        opts.parse_read_options(
            {"nyala.masters": "h", "nyala.table": "t", "nyala.replicaSelection": "x"}
        )
    with pytest.raises(InvalidArgumentError, match="only to replicaSelection=closest_replica"):
        opts.parse_read_options(
            {"nyala.masters": "h", "nyala.table": "t", "nyala.maxStalenessMs": "1"}
        )
    with pytest.raises(InvalidArgumentError, match="names a column twice"):
        opts.parse_read_options({"nyala.masters": "h", "nyala.table": "t", "nyala.columns": "a,a"})


# --- types and schemas --------------------------------------------------------------------


def test_spark_ddl_and_read_schema_match_pyspark() -> None:
    types = pytest.importorskip("pyspark.sql.types")
    arrow_types = pytest.importorskip("pyspark.sql.pandas.types")
    ddl = schema_map.spark_ddl(SCHEMA)
    assert ddl == (
        "`id` BIGINT NOT NULL, `tag` STRING NOT NULL, `v` DOUBLE, `n` INT, `ts` TIMESTAMP, "
        "`b` BINARY, `ok` BOOLEAN, `s8` TINYINT"
    )
    spark_types = {
        "int8": types.ByteType(),
        "int32": types.IntegerType(),
        "int64": types.LongType(),
        "double": types.DoubleType(),
        "bool": types.BooleanType(),
        "string": types.StringType(),
        "binary": types.BinaryType(),
        "timestamp": types.TimestampType(),
    }
    struct = types.StructType(
        [types.StructField(c.name, spark_types[c.type], c.nullable) for c in SCHEMA.columns]
    )
    expected = arrow_types.to_arrow_schema(struct, timezone=schema_map.READ_TIMEZONE)
    assert schema_map.read_arrow_schema(SCHEMA, SCHEMA.names).equals(expected)


def test_read_batch_relabels_timestamps_without_copying() -> None:
    batch = pa.record_batch(
        {"ts": pa.array([1, None], pa.timestamp("us")), "id": pa.array([1, 2], pa.int64())}
    )
    target = schema_map.read_arrow_schema(SCHEMA, ["id", "ts"])
    out = schema_map.to_read_batch(batch, target)
    assert out.schema.equals(target)
    assert out.column(1).buffers()[1].address == batch.column(0).buffers()[1].address


def spark_like_schema(**overrides: pa.DataType) -> pa.Schema:
    fields = {
        "id": pa.int64(),
        "tag": pa.string(),
        "v": pa.float64(),
        "n": pa.int32(),
        "ts": pa.timestamp("us", tz="Etc/UTC"),
        "b": pa.binary(),
        "ok": pa.bool_(),
        "s8": pa.int8(),
    }
    fields.update(overrides)
    return pa.schema([pa.field(k, t) for k, t in fields.items()])


def test_plan_accepts_spark_types_widening_and_narrowing() -> None:
    plan = schema_map.plan_write(
        spark_like_schema(n=pa.int16(), tag=pa.large_string(), s8=pa.int64()),
        "t",
        SCHEMA,
        OpType.UPSERT,
    )
    # bigint into int8: accepted, each value that does not fit is its row's error.
    assert plan.names == SCHEMA.names


def test_plan_lists_every_mismatch_before_writing() -> None:
    bad = spark_like_schema(n=pa.string(), v=pa.string()).append(pa.field("extra", pa.int8()))
    bad = bad.remove(bad.get_field_index("tag"))
    with pytest.raises(SchemaMismatchError) as info:
        schema_map.plan_write(bad, "t", SCHEMA, OpType.UPSERT)
    text = str(info.value)
    assert "['extra'] are not in table 't' (ignoreExtraColumns drops them)" in text
    assert "column 'n' is string in the DataFrame but int32" in text
    assert "column 'v' is string" in text
    assert "column 'tag' (string) is missing" in text
    # Text files parse strings row by row; extra columns can be dropped.
    ok = bad.append(pa.field("tag", pa.string()))
    plan = schema_map.plan_write(
        ok, "t", SCHEMA, OpType.UPSERT, ignore_extra_columns=True, parse_strings=True
    )
    assert "extra" not in plan.names


def test_plan_may_omit_nullable_columns_but_update_and_delete_differ() -> None:
    keys_only = pa.schema([pa.field("id", pa.int64()), pa.field("tag", pa.string())])
    for op in (OpType.INSERT, OpType.UPSERT):
        plan = schema_map.plan_write(keys_only, "t", SCHEMA, op)
        assert [c.name for c in plan.columns if c.omitted] == ["v", "n", "ts", "b", "ok", "s8"]
        assert plan.names == ["id", "tag"]
    with pytest.raises(SchemaMismatchError, match="is missing"):
        schema_map.plan_write(keys_only, "t", SCHEMA, OpType.UPDATE)
    assert schema_map.plan_write(keys_only, "t", SCHEMA, OpType.DELETE).names == ["id", "tag"]
    with pytest.raises(SchemaMismatchError, match="'tag'"):
        schema_map.plan_write(keys_only.remove(1), "t", SCHEMA, OpType.DELETE_IGNORE)
    strict = Schema.parse("id:int64, n:int32, d:int32=4", key=["id"])
    with pytest.raises(SchemaMismatchError, match="'n' \\(int32\\) is missing"):
        schema_map.plan_write(pa.schema([pa.field("id", pa.int64())]), "t", strict, OpType.INSERT)


def test_conform_selects_the_plan_columns_without_copying() -> None:
    batch = pa.record_batch(
        {
            "v": pa.array([1.0, 2.0, None]),
            "id": pa.array([1, 2, None], pa.int64()),
            "tag": pa.array(["a", None, "c"]),
        }
    )
    schema = Schema.parse("id:int64, tag:string, v:double?, w:int8?", key=["id", "tag"])
    plan = schema_map.plan_write(batch.schema, "t", schema, OpType.UPSERT)
    out = schema_map.conform(batch, plan)
    # Table order, the omitted column left out; nulls are the client's to refuse, row by row.
    assert out.schema.names == ["id", "tag", "v"]
    assert out.column(2).buffers()[1].address == batch.column(0).buffers()[1].address


def test_schema_for_create_makes_keys_not_null_and_refuses_nested_types() -> None:
    made = schema_map.schema_for_create(spark_like_schema(), ["id", "tag"])
    assert made.key == ["id", "tag"]
    assert not made.column("id").nullable
    assert made.column("v").nullable
    assert made.column("ts").type == "timestamp"
    typed = schema_map.schema_for_create(
        pa.schema([pa.field("d", pa.date32()), pa.field("p", pa.decimal128(12, 3))]), ["d"]
    )
    assert [c.type for c in typed.columns] == ["date", "decimal(12,3)"]
    assert schema_map.spark_ddl(typed) == "`d` DATE NOT NULL, `p` DECIMAL(12,3)"
    with pytest.raises(SchemaMismatchError, match="column 'l' has type list"):
        schema_map.schema_for_create(pa.schema([pa.field("l", pa.list_(pa.int8()))]), ["l"])


def test_decimal_and_varchar_conversions_by_row() -> None:
    assert schema_map.converts_losslessly("decimal(10,2)", "decimal(12,3)")
    assert not schema_map.converts_losslessly("decimal(10,2)", "decimal(10,3)")
    assert schema_map.converts_by_row("decimal(38,10)", "decimal(5,2)")  # row errors if not
    assert schema_map.converts_by_row("int64", "decimal(5,2)")
    assert schema_map.converts_by_row("string", "varchar(3)")  # truncated by the servers
    assert not schema_map.converts_by_row("date", "decimal(5,2)")


# --- filters ------------------------------------------------------------------------------


def test_filters_translate_to_predicates() -> None:
    ds = pytest.importorskip("pyspark.sql.datasource")
    from nyala.spark import filters

    utc = datetime.UTC
    given = [
        ds.EqualTo(("id",), 5),
        ds.GreaterThanOrEqual(("ts",), datetime.datetime(1970, 1, 1, 0, 0, 1, tzinfo=utc)),
        ds.In(("tag",), ["a", "b", None]),
        ds.IsNull(("n",)),
        ds.IsNotNull(("v",)),
        ds.LessThan(("v",), 2),
        ds.EqualNullSafe(("ok",), None),
        ds.Not(ds.EqualTo(("id",), 1)),
        ds.StringStartsWith(("tag",), "a"),
        ds.GreaterThan(("n",), 2.5),
        ds.EqualTo(("s8",), 300),
        ds.EqualTo(("nested", "x"), 1),
        ds.EqualTo(("b",), b"\x00"),
    ]
    pushed = filters.translate(given, SCHEMA)
    assert pushed.predicates == (
        ("id", "=", 5),
        ("ts", ">=", 1_000_000),
        ("tag", "in", ["a", "b"]),
        ("n", "is null"),
        ("v", "is not null"),
        ("v", "<", 2.0),
        ("ok", "is null"),
        ("b", "=", b"\x00"),
    )
    # Double predicates are pushed and re-checked; inexpressible ones stay with Spark.
    assert pushed.remaining == (given[4], given[5], *given[7:12])
    assert all(any(r is g for g in given) for r in pushed.remaining)


def test_naive_timestamp_literal_is_utc_wall_clock() -> None:
    from nyala.spark.filters import timestamp_micros

    naive = datetime.datetime(2020, 1, 1)
    aware = datetime.datetime(2020, 1, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=1)))
    assert timestamp_micros(naive) == timestamp_micros(aware) == 1_577_836_800_000_000


def test_credentials_option_names_a_directory_on_the_executors() -> None:
    base = {"nyala.masters": "h:1", "nyala.table": "t"}
    assert opts.parse_read_options(base).credentials is None
    read = opts.parse_read_options({**base, "nyala.credentials": "/etc/nyala/alice"})
    assert read.credentials == "/etc/nyala/alice"
    write = opts.parse_write_options({**base, "nyala.credentials": " /etc/nyala/bob "})
    assert write.credentials == "/etc/nyala/bob"
