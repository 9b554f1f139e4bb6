"""Protobuf length-delimited fields put together by hand, for the messages whose large ``bytes``
field crosses the wire on a hot path (a write's rows, a batch of log entries).

Protobuf parses a message followed by one more field as that message with the field set. So the
small part of such a message is serialized by protobuf, and the large payload is appended after
its tag and length: one copy, in ``bytes.join``. Building the message instead copies the payload
into it, again into any message that holds it, and again when serializing, and with upb those
copies landed in fresh arena memory: 2.3-2.5 ns per byte against 0.08 for the join
(docs/performance.md, "Client write requests").
"""

from __future__ import annotations

#: Protobuf wire type of ``bytes``, ``string`` and message fields.
LENGTH_DELIMITED = 2


def varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf base-128 varint."""
    if value < 0:
        raise ValueError(f"a varint holds no negative value ({value})")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def length_delimited_head(field_number: int, length: int) -> bytes:
    """The tag and length that come before ``length`` bytes of field ``field_number``."""
    return varint(field_number << 3 | LENGTH_DELIMITED) + varint(length)


__all__ = ["LENGTH_DELIMITED", "length_delimited_head", "varint"]
