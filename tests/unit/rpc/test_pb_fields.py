"""Hand-built protobuf fields parse as protobuf's own encoding of the same message."""

from __future__ import annotations

import pytest

from nyala._proto import common_pb2, tserver_pb2
from nyala.rpc.pb_fields import length_delimited_head, varint

# Around every boundary where a varint takes one more byte, and the largest int64.
VALUES = [0, 1, 127, 128, 300, 16_383, 16_384, 2**21 - 1, 2**21, 2**28, 2**35 + 5, 2**63 - 1]


@pytest.mark.parametrize("value", VALUES)
def test_varint_is_protobufs_encoding(value: int) -> None:
    # seq_no is field 2, an int64: its tag byte, then the value's varint.
    encoded = common_pb2.RequestIdPB(seq_no=value).SerializeToString()
    assert (b"\x10" + varint(value) if value else b"") == encoded


def test_varint_refuses_negative_values() -> None:
    with pytest.raises(ValueError, match="negative"):
        varint(-1)


@pytest.mark.parametrize("length", [0, 1, 127, 128, 16_384, 300_000])
def test_a_bytes_field_joined_after_a_serialized_header_parses_as_set(length: int) -> None:
    rows = bytes(range(256)) * (length // 256) + b"r" * (length % 256)
    header = tserver_pb2.WriteRequestPB(dest_uuid="d" * 32, tablet_id="t", schema_version=3)
    ops_field = tserver_pb2.WriteRequestPB.DESCRIPTOR.fields_by_name["ops"].number
    joined = header.SerializeToString() + length_delimited_head(ops_field, length) + rows
    parsed = tserver_pb2.WriteRequestPB.FromString(joined)
    assert parsed.ops == rows
    assert (parsed.dest_uuid, parsed.tablet_id, parsed.schema_version) == ("d" * 32, "t", 3)
    header.ops = rows
    if length:  # protobuf leaves an empty field out; the joined one says "empty" explicitly
        assert joined == header.SerializeToString()  # the same bytes as protobuf's own
