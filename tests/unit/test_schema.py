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
