"""nyala.schema: validation, the CLI string form, schema changes and the native round trip."""

from __future__ import annotations

import pytest

from nyala.errors import InvalidArgumentError
from nyala.schema import Column, Schema, format_schema


def test_parse_cli_form() -> None:
    schema = Schema.parse("id:int64, name:string?, ts:timestamp", key=["id"])
    assert schema.names == ["id", "name", "ts"]
    assert [c.nullable for c in schema.columns] == [False, True, False]
    assert schema.column("ts").type == "timestamp"
    assert schema.key == ["id"]
    assert format_schema(schema) == "id:int64, name:string?, ts:timestamp"
    assert Schema.parse(format_schema(schema), key=schema.key) == schema


def test_key_columns_move_to_the_front() -> None:
    schema = Schema.parse("v:double, b:string, a:int32", key=["a", "b"])
    assert schema.names == ["a", "b", "v"]
    assert schema.key == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "key", "message"),
    [
        ("id:int64, id:string", ["id"], "duplicate"),
        ("id:int64?", ["id"], "nullable"),
        ("id:decimal", ["id"], "unknown column type"),
        ("id:double", ["id"], "cannot be a key"),
        ("id:int64", ["nope"], "not in the schema"),
        ("id:int64", [], "at least one"),
        ("id int64", ["id"], "name:type"),
        ("id:int64,,", ["id"], "empty column"),
        ("id:int64, __x:int8", ["id"], "reserved"),
    ],
)
def test_rejects_bad_schemas(text: str, key: list[str], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        Schema.parse(text, key=key)


def test_changes_bump_version_and_never_reuse_ids() -> None:
    s0 = Schema.parse("id:int64, a:string?", key=["id"])
    s1 = s0.add_column(Column("b", "double", nullable=True))
    assert (s1.version, s1.column("b").id) == (1, 2)
    s2 = s1.drop_column("a").rename_column("b", "c")
    assert s2.version == 3
    assert s2.column("c").id == 2
    s3 = s2.add_column(Column("d", "int8", nullable=False, default=5))
    assert s3.column("d").id == 3
    with pytest.raises(InvalidArgumentError, match="key"):
        s3.drop_column("id")
    with pytest.raises(InvalidArgumentError, match="nullable or have a default"):
        s3.add_column(Column("e", "int8"))
    assert Schema.from_native(s3.to_native()) == s3
    assert s3.to_arrow().names == ["id", "c", "d"]


def test_defaults_are_checked_normalised_and_round_trip() -> None:
    import datetime

    from nyala.rpc.schema_pb import column_from_pb, column_to_pb, schema_from_pb, schema_to_pb
    from nyala.tablet.superblock import schema_from_dict, schema_to_dict

    schema = Schema.parse(
        "id:int64, n:int32=7, f:double=-inf, b:bool=true, s:string?='a b', bin:binary=xyz, "
        "ts:timestamp=2024-01-01T00:00:00",
        key=["id"],
    )
    defaults = {c.name: c.default for c in schema.columns}
    assert defaults == {
        "id": None,
        "n": 7,
        "f": float("-inf"),
        "b": True,
        "s": "a b",
        "bin": b"xyz",
        "ts": 1_704_067_200_000_000,
    }
    assert Schema.parse(format_schema(schema), key=["id"]) == schema
    # The wire form (what the master keeps in its sys catalog) and the superblock keep them.
    assert schema_from_pb(schema_to_pb(schema)).columns == schema.columns
    assert schema_from_dict(schema_to_dict(schema)) == schema
    for column in schema.columns:
        assert column_from_pb(column_to_pb(column)) == Column(
            column.name, column.type, nullable=column.nullable, default=column.default
        )
    when = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    assert Column("t", "timestamp", default=when).default == 1_704_067_200_000_000
    with pytest.raises(InvalidArgumentError, match="does not fit a int8"):
        Column("x", "int8", default=300)
    with pytest.raises(InvalidArgumentError, match="does not fit a string"):
        Column("x", "string", default=5)
    with pytest.raises(InvalidArgumentError, match="does not fit a int64"):
        Column("x", "int64", default=True)
    with pytest.raises(InvalidArgumentError, match="not a int32"):
        Schema.parse("id:int64, n:int32=seven", key=["id"])
