"""Table partitioning: which tablet owns which row (DESIGN.md §3, docs/partitioning.md).

A table's rows are split by zero or more levels of hash partitioning over key columns, then by
range partitioning over key columns. Every row has a *partition key*: one 4-byte big-endian
bucket number per hash level, followed by the memcomparable encoding of its range columns.
Each tablet owns one contiguous interval ``[partition_key_start, partition_key_end)`` of that
byte space (an empty end is unbounded), so finding a row's tablet is a binary search.

This module is the reference: it defines the hash, the key encoding and the enumeration of a new
table's partitions, row by row in Python. The hot path (routing a whole Arrow batch and splitting
it per tablet) is ``nyala._native.PartitionRouter`` (rust/storage/src/partition.rs), which tests
check against this module. It is shared by the master (creating tablets) and the client (routing
writes and pruning scans) and must not import either of them.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime
import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from nyala._proto import master_pb2, metadata_pb2
from nyala.errors import InvalidArgumentError
from nyala.schema import (
    Schema,
    decimal_params,
    from_unscaled,
    normalize_default,
    unscaled,
    varchar_chars,
)

#: Most buckets one hash level may have, and most hash levels (limits, as in Kudu).
HASH_BUCKETS_MAX = 1024
HASH_LEVELS_MAX = 4
#: Most tablets one table may be created with.
PARTITIONS_MAX = 4096
#: Width of one hash bucket in an encoded partition key, in bytes.
BUCKET_BYTES = 4

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_SEED_MULTIPLIER = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1
_INT_WIDTHS = {"int8": 1, "int16": 2, "int32": 4, "int64": 8, "timestamp": 8, "date": 4}
_DECIMAL_BYTES = 16
_EPOCH_DATE = datetime.date(1970, 1, 1)


# --- the hash and the key encoding (the reference for the Rust router) ----------------------


def hash64(data: bytes, seed: int = 0) -> int:
    """The partitioning hash: FNV-1a 64 over ``data`` from an offset basis mixed with ``seed``,
    finished by MurmurHash3's ``fmix64`` so that every output bit depends on every input bit
    (plain FNV's low bits, which ``% buckets`` reads, mix poorly)."""
    h = _FNV_OFFSET ^ ((seed * _SEED_MULTIPLIER) & _MASK64)
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK64
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _MASK64
    h ^= h >> 33
    h = (h * 0xC4CEB93FE53B3F53) & _MASK64
    h ^= h >> 33
    return h


def encode_key(types: Sequence[str], values: Sequence[Any]) -> bytes:
    """The memcomparable encoding of one row's ``values`` of columns of ``types`` (the same
    encoding the storage engine uses for primary keys, rust/storage/src/key.rs): integers,
    timestamps, dates (4-byte days) and decimals (16-byte unscaled value) big-endian with the
    sign bit flipped; strings, varchars and binaries raw when last, otherwise with ``00``
    escaped as ``00 01`` and terminated by ``00 00``."""
    if len(types) != len(values):
        raise InvalidArgumentError(f"{len(values)} values for {len(types)} key columns")
    out = bytearray()
    for i, (type_, value) in enumerate(zip(types, values, strict=True)):
        last = i + 1 == len(types)
        width = _INT_WIDTHS.get(type_)
        params = decimal_params(type_)
        if params is not None:
            width = _DECIMAL_BYTES
        if width is not None:
            number = _as_int(type_, value)
            bits = width * 8
            if not -(1 << (bits - 1)) <= number < (1 << (bits - 1)):
                raise InvalidArgumentError(f"{value!r} is out of range for {type_}")
            out += ((number & ((1 << bits) - 1)) ^ (1 << (bits - 1))).to_bytes(width, "big")
        elif type_ in ("string", "binary") or varchar_chars(type_) is not None:
            raw = _as_bytes(type_, value)
            out += raw if last else raw.replace(b"\x00", b"\x00\x01") + b"\x00\x00"
        else:
            raise InvalidArgumentError(f"type {type_} cannot be a key or partition column")
    return bytes(out)


def _as_int(type_: str, value: Any) -> int:
    """The integer a key value of ``type_`` encodes as (timestamps: UTC microseconds; dates:
    days since 1970-01-01; decimals: the unscaled value)."""
    if type_ == "timestamp" and not isinstance(value, int):
        try:
            return int(pa.scalar(value, type=pa.timestamp("us", tz="UTC")).value)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as err:
            raise InvalidArgumentError(f"{value!r} is not a timestamp: {err}") from err
    if type_ == "date" and not isinstance(value, int):
        if isinstance(value, str):
            try:
                value = datetime.date.fromisoformat(value)
            except ValueError:
                raise InvalidArgumentError(f"{value!r} is not a date") from None
        if isinstance(value, datetime.datetime) or not isinstance(value, datetime.date):
            raise InvalidArgumentError(f"{value!r} is not a date")
        return (value - _EPOCH_DATE).days
    params = decimal_params(type_)
    if params is not None:
        return unscaled(normalize_default(type_, value), params[1])
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            as_int = int(value)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"{value!r} is not a {type_}") from None
        if as_int != value:
            raise InvalidArgumentError(f"{value!r} is not a {type_}")
        return as_int
    return value


def _as_bytes(type_: str, value: Any) -> bytes:
    chars = varchar_chars(type_)
    if chars is not None and isinstance(value, str):
        return value[:chars].encode()  # as the tablet servers store it
    if type_ == "string" and isinstance(value, str):
        return value.encode()
    if type_ == "binary" and isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise InvalidArgumentError(f"{value!r} is not a {type_}")


# --- the partition schema ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class HashPartitioning:
    """One hash level: rows go to bucket ``hash64(encoded columns, seed) % buckets``."""

    columns: tuple[str, ...]
    buckets: int
    seed: int = 0

    def __init__(self, columns: Sequence[str] | str, buckets: int, seed: int = 0) -> None:
        cols = (columns,) if isinstance(columns, str) else tuple(columns)
        object.__setattr__(self, "columns", cols)
        object.__setattr__(self, "buckets", int(buckets))
        object.__setattr__(self, "seed", int(seed))
        if not cols:
            raise InvalidArgumentError("hash partitioning needs at least one column")
        if len(set(cols)) != len(cols):
            raise InvalidArgumentError(f"hash partitioning names a column twice: {list(cols)}")
        if not 2 <= self.buckets <= HASH_BUCKETS_MAX:
            raise InvalidArgumentError(f"hash buckets must be 2..={HASH_BUCKETS_MAX}")
        if not 0 <= self.seed < 1 << 32:
            raise InvalidArgumentError("hash seed must fit in 32 bits unsigned")


@dataclasses.dataclass(frozen=True)
class RangePartitioning:
    """Range partitioning over ``columns``: the ranges ``bounds`` (each ``(lower, upper)``,
    inclusive lower, exclusive upper, ``None`` unbounded; default one range covering
    everything), cut at ``splits``. A bound or split is a tuple of values of the range columns,
    or one value when there is one column. Rows outside every range are refused on write."""

    columns: tuple[str, ...]
    splits: tuple[tuple[Any, ...], ...] = ()
    bounds: tuple[tuple[tuple[Any, ...] | None, tuple[Any, ...] | None], ...] = ()

    def __init__(
        self,
        columns: Sequence[str] | str,
        splits: Iterable[Any] = (),
        bounds: Iterable[tuple[Any, Any]] = (),
    ) -> None:
        cols = (columns,) if isinstance(columns, str) else tuple(columns)
        object.__setattr__(self, "columns", cols)
        object.__setattr__(self, "splits", tuple(_as_row(s, cols) for s in splits))
        object.__setattr__(
            self,
            "bounds",
            tuple(
                (
                    None if low is None else _as_row(low, cols),
                    None if high is None else _as_row(high, cols),
                )
                for low, high in bounds
            ),
        )
        if not cols:
            raise InvalidArgumentError("range partitioning needs at least one column")
        if len(set(cols)) != len(cols):
            raise InvalidArgumentError(f"range partitioning names a column twice: {list(cols)}")


def _as_row(value: Any, columns: tuple[str, ...]) -> tuple[Any, ...]:
    row = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if len(row) != len(columns):
        raise InvalidArgumentError(
            f"{value!r} has {len(row)} values for range columns {list(columns)}"
        )
    return row


#: What ``create_table(partitioning=...)`` accepts.
PartitioningSpec = (
    HashPartitioning | RangePartitioning | Sequence[HashPartitioning | RangePartitioning] | None
)


@dataclasses.dataclass(frozen=True)
class PartitionSchema:
    """The structure of a table's partitioning (what ``PartitionSchemaPB`` stores): its hash
    levels and its range columns. The range split points are not part of it; they live in the
    tablets' partition bounds."""

    hash_levels: tuple[HashPartitioning, ...] = ()
    range_columns: tuple[str, ...] = ()

    @classmethod
    def from_spec(cls, spec: PartitioningSpec, schema: Schema) -> tuple[PartitionSchema, RangeSpec]:
        """The partition schema and the encoded range bounds and splits of a user's
        partitioning (``None``: one tablet), validated against ``schema``."""
        items: list[HashPartitioning | RangePartitioning]
        if spec is None:
            items = []
        elif isinstance(spec, (HashPartitioning, RangePartitioning)):
            items = [spec]
        else:
            items = list(spec)
        hashes = [i for i in items if isinstance(i, HashPartitioning)]
        ranges = [i for i in items if isinstance(i, RangePartitioning)]
        if len(hashes) + len(ranges) != len(items):
            raise InvalidArgumentError("partitioning must be HashPartitioning/RangePartitioning")
        if len(ranges) > 1:
            raise InvalidArgumentError("at most one RangePartitioning")
        result = cls(tuple(hashes), ranges[0].columns if ranges else ())
        result.validate(schema)
        if not ranges:
            return result, RangeSpec()
        encode = functools.partial(result.encode_range_key, schema)
        bounds = tuple(
            (b"" if low is None else encode(low), b"" if high is None else encode(high))
            for low, high in ranges[0].bounds
        )
        return result, RangeSpec(tuple(encode(s) for s in ranges[0].splits), bounds)

    def validate(self, schema: Schema) -> None:
        """``InvalidArgumentError`` unless every partition column is a key column, no column is
        in two hash levels, and the counts are within limits."""
        key = set(schema.key)
        if len(self.hash_levels) > HASH_LEVELS_MAX:
            raise InvalidArgumentError(f"at most {HASH_LEVELS_MAX} hash levels")
        seen: set[str] = set()
        for level in self.hash_levels:
            for column in level.columns:
                if column not in key:
                    raise InvalidArgumentError(f"hash column {column!r} is not a key column")
                if column in seen:
                    raise InvalidArgumentError(f"column {column!r} is in two hash levels")
                seen.add(column)
        for column in self.range_columns:
            if column not in key:
                raise InvalidArgumentError(f"range column {column!r} is not a key column")
        if len(set(self.range_columns)) != len(self.range_columns):
            raise InvalidArgumentError("range partitioning names a column twice")

    def encode_range_key(self, schema: Schema, values: Sequence[Any]) -> bytes:
        """The encoded range part of a partition key for ``values`` of the range columns."""
        types = [schema.column(c).type for c in self.range_columns]
        return encode_key(types, values)

    def range_keys_from_arrow(self, schema: Schema, rows: pa.RecordBatch | pa.Table) -> list[bytes]:
        """The encoded range keys of ``rows`` (columns named as the range columns), e.g. the
        ``split_rows`` of a ``CreateTableRequestPB`` decoded from Arrow IPC."""
        missing = [c for c in self.range_columns if c not in rows.schema.names]
        if missing:
            raise InvalidArgumentError(f"range rows lack column(s) {missing}")
        columns = [rows.column(c).to_pylist() for c in self.range_columns]
        return [self.encode_range_key(schema, values) for values in zip(*columns, strict=True)]

    def partition_key(self, schema: Schema, row: dict[str, Any]) -> bytes:
        """The partition key of one row given as ``{column: value}`` (reference routing)."""
        out = bytearray()
        for level in self.hash_levels:
            types = [schema.column(c).type for c in level.columns]
            encoded = encode_key(types, [row[c] for c in level.columns])
            bucket = hash64(encoded, level.seed) % level.buckets
            out += bucket.to_bytes(BUCKET_BYTES, "big")
        out += self.encode_range_key(schema, [row[c] for c in self.range_columns])
        return bytes(out)

    def to_pb(self) -> metadata_pb2.PartitionSchemaPB:
        """The ``PartitionSchemaPB``."""
        pb = metadata_pb2.PartitionSchemaPB(range_columns=list(self.range_columns))
        for level in self.hash_levels:
            pb.hash_schema.add(
                columns=list(level.columns), num_buckets=level.buckets, seed=level.seed
            )
        return pb

    @classmethod
    def from_pb(cls, pb: metadata_pb2.PartitionSchemaPB) -> PartitionSchema:
        """Inverse of ``to_pb``."""
        levels = tuple(
            HashPartitioning(list(h.columns), h.num_buckets, h.seed) for h in pb.hash_schema
        )
        return cls(levels, tuple(pb.range_columns))

    def describe(self) -> str:
        """A one-line human form, e.g. ``HASH(id) 4, RANGE(ts)``."""
        parts = [f"HASH({', '.join(h.columns)}) {h.buckets}" for h in self.hash_levels]
        if self.range_columns:
            parts.append(f"RANGE({', '.join(self.range_columns)})")
        return ", ".join(parts) or "one tablet"


# --- partitions ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, order=True)
class Partition:
    """The part of the key space one tablet owns: ``[key_start, key_end)``, empty end =
    unbounded. Ordered by ``key_start``."""

    key_start: bytes = b""
    key_end: bytes = b""
    hash_buckets: tuple[int, ...] = ()

    def contains(self, partition_key: bytes) -> bool:
        """True if the row with this partition key belongs here."""
        return self.key_start <= partition_key and (
            not self.key_end or partition_key < self.key_end
        )

    def to_pb(self) -> metadata_pb2.PartitionPB:
        """The ``PartitionPB``."""
        return metadata_pb2.PartitionPB(
            hash_buckets=list(self.hash_buckets),
            partition_key_start=self.key_start,
            partition_key_end=self.key_end,
        )

    @classmethod
    def from_pb(cls, pb: metadata_pb2.PartitionPB) -> Partition:
        """Inverse of ``to_pb``."""
        return cls(
            bytes(pb.partition_key_start), bytes(pb.partition_key_end), tuple(pb.hash_buckets)
        )

    def range_bounds(self) -> tuple[bytes, bytes]:
        """The encoded range part ``(lower, upper)`` of this partition (empty: unbounded): its
        bounds without the hash bucket prefix."""
        skip = BUCKET_BYTES * len(self.hash_buckets)
        low = self.key_start[skip:]
        same_buckets = bool(self.key_end) and self.key_end[:skip] == self.key_start[:skip]
        return low, self.key_end[skip:] if same_buckets else b""

    def describe(self, partition_schema: PartitionSchema, schema: Schema | None = None) -> str:
        """A short human form: buckets and the range bounds, as values when ``schema`` is
        given (``2024-01-01 <= day < 2024-02-01``), else in hex."""
        parts = [f"bucket {b}" for b in self.hash_buckets]
        if partition_schema.range_columns:
            low, high = self.range_bounds()
            if schema is not None:
                parts.append(describe_range(schema, partition_schema.range_columns, low, high))
            else:
                parts.append(f"range [{low.hex() or '-inf'}, {high.hex() or '+inf'})")
        return ", ".join(parts) or "whole table"


def decode_key(types: Sequence[str], data: bytes) -> tuple[Any, ...]:
    """Inverse of ``encode_key``: the values of one encoded key (timestamps as aware UTC
    ``datetime``, dates as ``date``, decimals as ``Decimal``)."""
    values: list[Any] = []
    at = 0
    for i, type_ in enumerate(types):
        last = i + 1 == len(types)
        params = decimal_params(type_)
        width = _DECIMAL_BYTES if params is not None else _INT_WIDTHS.get(type_)
        if width is not None:
            if at + width > len(data):
                raise InvalidArgumentError(f"encoded key {data.hex()} is truncated")
            bits = width * 8
            raw = int.from_bytes(data[at : at + width], "big") ^ (1 << (bits - 1))
            number = raw - (1 << bits) if raw >= 1 << (bits - 1) else raw
            at += width
            values.append(_from_int(type_, number))
            continue
        if last:
            raw_bytes, at = data[at:], len(data)
        else:
            out = bytearray()
            while True:
                if at + 1 >= len(data):
                    raise InvalidArgumentError(f"encoded key {data.hex()} is truncated")
                if data[at] == 0 and data[at + 1] == 0:
                    at += 2
                    break
                if data[at] == 0 and data[at + 1] == 1:
                    out.append(0)
                    at += 2
                    continue
                out.append(data[at])
                at += 1
            raw_bytes = bytes(out)
        values.append(raw_bytes if type_ == "binary" else raw_bytes.decode(errors="replace"))
    return tuple(values)


def _from_int(type_: str, number: int) -> Any:
    if type_ == "timestamp":
        return datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(
            microseconds=number
        )
    if type_ == "date":
        return _EPOCH_DATE + datetime.timedelta(days=number)
    params = decimal_params(type_)
    if params is not None:
        return from_unscaled(number, params[1])
    return number


def format_value(value: Any) -> str:
    """One key value as people read it: dates and timestamps in ISO form (UTC), text as
    itself, bytes in hex."""
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ").replace("+00:00", "Z")
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return str(value)


def describe_range(schema: Schema, columns: Sequence[str], low: bytes, high: bytes) -> str:
    """``2024-01-01 <= day < 2024-02-01`` for encoded range bounds (empty: unbounded);
    ``(a, b)`` tuples when there are several range columns."""
    types = [schema.column(c).type for c in columns]

    def shown(data: bytes) -> str:
        values = [format_value(v) for v in decode_key(types, data)]
        return values[0] if len(values) == 1 else f"({', '.join(values)})"

    name = columns[0] if len(columns) == 1 else f"({', '.join(columns)})"
    if not low and not high:
        return f"{name}: unbounded"
    text = name
    if low:
        text = f"{shown(low)} <= {text}"
    if high:
        text = f"{text} < {shown(high)}"
    return text


#: The comparison operators ``range_key_interval`` understands (others are ignored).
PRUNING_OPS = frozenset(("=", "==", "<", "<=", ">", ">=", "in"))


def range_key_interval(
    types: Sequence[str], predicates: Sequence[Iterable[tuple[str, Any]]]
) -> tuple[bytes, bytes | None]:
    """The interval ``[lower, upper)`` of encoded range keys (of range columns of ``types``;
    ``upper`` None: unbounded) that holds every key whose columns meet ``predicates`` (per
    range column in order, its ``(op, value)`` pairs: op in ``PRUNING_OPS``, ``in`` with a
    list of values), as Kudu's partition pruner bounds them: the first column's predicates
    bound the keys; while a column is fixed to one value by ``=``, the next column's
    predicates bound the keys within that prefix.

    A key's first column is its leading bytes, so "first column = v" is the set of keys
    starting with v's encoding (exactly that encoding when there is one range column).
    Predicates that cannot be encoded (a value of another type, out of range, a varchar value
    longer than n, which storage compares uncut) are skipped: they only widen the interval,
    never exclude a key that could match. ``upper <= lower`` means no key matches."""
    lower, upper = b"", None
    prefix = b""  # the encoded values of the leading columns fixed by '='
    for i, column_predicates in enumerate(predicates[: len(types)]):
        column_lower, column_upper, fixed = _column_interval(types[i:], column_predicates)
        if column_upper is not None and column_upper <= column_lower:
            return b"", b""
        lower = max(lower, prefix + column_lower)
        if column_upper is not None:
            bound = prefix + column_upper
            upper = bound if upper is None else min(upper, bound)
        if fixed is None:
            break
        prefix += fixed
    return lower, upper


def _column_interval(
    types: Sequence[str], predicates: Iterable[tuple[str, Any]]
) -> tuple[bytes, bytes | None, bytes | None]:
    """For keys of columns ``types`` (the rest of a range key), the interval ``[lower,
    upper)`` that every key whose first column meets ``predicates`` lies in, and that
    column's encoding if an ``=`` fixes it to one value (else None)."""
    lower, upper, fixed = b"", None, None
    for op, value in predicates:
        op = op.strip().lower()
        if op not in PRUNING_OPS:
            continue
        values = list(value) if op == "in" else [value]
        try:
            encoded = sorted(_leading_bytes(types, v) for v in values)
        except InvalidArgumentError:
            continue
        if not encoded:
            return b"", b"", None  # IN (): nothing matches
        low: bytes | None = b""
        high: bytes | None = None
        if op in ("=", "==", "in"):
            low, high = encoded[0], _after(encoded[-1], types)
            if len(set(encoded)) == 1:
                fixed = encoded[0]
        elif op in (">", ">="):
            low = encoded[0] if op == ">=" else _after(encoded[0], types)
        else:
            high = encoded[0] if op == "<" else _after(encoded[0], types)
        if low is None:
            return b"", b"", None  # nothing is above the largest value
        lower = max(lower, low)
        upper = high if upper is None else upper if high is None else min(upper, high)
    return lower, upper, fixed


def range_may_hold(low: bytes, high: bytes, interval: tuple[bytes, bytes | None]) -> bool:
    """True if a range partition ``[low, high)`` (empty: unbounded) shares a key with the
    ``interval`` of ``range_key_interval``."""
    lower, upper = interval
    return (not high or lower < high) and (upper is None or low < upper)


def _leading_bytes(types: Sequence[str], value: Any) -> bytes:
    """The bytes a range key starts with when its first column holds ``value``."""
    chars = varchar_chars(types[0])
    if chars is not None and isinstance(value, str) and len(value) > chars:
        raise InvalidArgumentError("stored values are cut to n characters; this one is longer")
    if len(types) == 1:
        return encode_key(types, [value])
    # Not last: encoded self-delimiting; encode it before a 1-byte column and drop that byte.
    return encode_key([types[0], "int8"], [value, 0])[:-1]


def _after(leading: bytes, types: Sequence[str]) -> bytes | None:
    """The smallest key above every key whose first column encodes as ``leading`` (None:
    there is none)."""
    if len(types) == 1:
        return leading + b"\x00"  # the key is exactly ``leading``
    trimmed = leading.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes([trimmed[-1] + 1])


@dataclasses.dataclass(frozen=True)
class RangeSpec:
    """Encoded range bounds ``(lower, upper)`` (empty = unbounded; no bounds = one range over
    everything) and the encoded split keys that cut them."""

    splits: tuple[bytes, ...] = ()
    bounds: tuple[tuple[bytes, bytes], ...] = ()

    def ranges(self) -> list[tuple[bytes, bytes]]:
        """The ranges, sorted, after cutting the bounds at the splits; ``InvalidArgumentError``
        on overlapping bounds, duplicate splits or a split outside every bound."""
        bounds = sorted(self.bounds or [(b"", b"")])
        for low, high in bounds:
            if high and low >= high:
                raise InvalidArgumentError("a range bound's lower must be below its upper")
        for (_, high), (low, _) in itertools.pairwise(bounds):
            if not high or low < high:
                raise InvalidArgumentError("range bounds overlap")
        splits = sorted(self.splits)
        if len(set(splits)) != len(splits):
            raise InvalidArgumentError("range splits must be distinct")
        ranges: list[tuple[bytes, bytes]] = []
        for low, high in bounds:
            inside = [s for s in splits if low < s and (not high or s < high)]
            cuts = [low, *inside, high]
            ranges.extend(itertools.pairwise(cuts))
        if len(ranges) - len(bounds) != len(splits):
            raise InvalidArgumentError("every range split must lie strictly inside a range bound")
        return ranges


def create_partitions(
    partition_schema: PartitionSchema, ranges: RangeSpec | None = None
) -> list[Partition]:
    """The partitions of a new table: every combination of hash buckets × every range of
    ``ranges``, in key order. Without range bounds they cover the whole partition key space
    without overlap; with bounds, keys outside every bound belong to no partition."""
    range_list = (ranges or RangeSpec()).ranges()
    if range_list != [(b"", b"")] and not partition_schema.range_columns:
        raise InvalidArgumentError("range bounds or splits given without range columns")
    bucket_counts = [level.buckets for level in partition_schema.hash_levels]
    total = len(range_list)
    for count in bucket_counts:
        total *= count
    if total > PARTITIONS_MAX:
        raise InvalidArgumentError(f"{total} partitions; at most {PARTITIONS_MAX}")
    partitions = []
    for buckets in itertools.product(*(range(n) for n in bucket_counts)):
        prefix = b"".join(b.to_bytes(BUCKET_BYTES, "big") for b in buckets)
        for low, high in range_list:
            end = prefix + high if high else _next_prefix(buckets, bucket_counts)
            partitions.append(Partition(prefix + low, end, tuple(buckets)))
    return partitions


def _next_prefix(buckets: Sequence[int], counts: Sequence[int]) -> bytes:
    """The smallest bucket prefix after every key with bucket prefix ``buckets``; empty for the
    last one (unbounded above)."""
    if all(b + 1 == n for b, n in zip(buckets, counts, strict=True)):
        return b""
    head = b"".join(b.to_bytes(BUCKET_BYTES, "big") for b in buckets[:-1])
    return head + (buckets[-1] + 1).to_bytes(BUCKET_BYTES, "big")


def find_partition(partitions: Sequence[Partition], partition_key: bytes) -> int | None:
    """The index in ``partitions`` (sorted by start) owning ``partition_key``, or None."""
    starts = [p.key_start for p in partitions]
    i = bisect.bisect_right(starts, partition_key) - 1
    if i >= 0 and partitions[i].contains(partition_key):
        return i
    return None


# --- the wire form of range bounds and splits (CreateTableRequestPB) ---------------------------


def rows_to_ipc(schema: Schema, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> bytes:
    """An Arrow IPC stream of ``rows`` of ``columns`` typed as in ``schema`` (the form of
    ``split_rows`` and of ``RangeBoundsPB`` bounds)."""
    fields = [pa.field(c, schema.column(c).arrow_type, nullable=False) for c in columns]
    arrays = [pa.array([row[i] for row in rows], type=field.type) for i, field in enumerate(fields)]
    batch = pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def range_spec_to_pb(
    schema: Schema, partition_schema: PartitionSchema, spec: PartitioningSpec
) -> tuple[list[master_pb2.RangeBoundsPB], bytes]:
    """The ``range_bounds`` and ``split_rows`` fields of a ``CreateTableRequestPB`` for a
    user's partitioning."""
    items = [spec] if isinstance(spec, (HashPartitioning, RangePartitioning)) else spec or []
    ranges = [i for i in items if isinstance(i, RangePartitioning)]
    if not ranges:
        return [], b""
    columns = partition_schema.range_columns
    bounds = []
    for low, high in ranges[0].bounds:
        bounds.append(
            _range_bounds_pb(
                b"" if low is None else rows_to_ipc(schema, columns, [low]),
                b"" if high is None else rows_to_ipc(schema, columns, [high]),
            )
        )
    splits = rows_to_ipc(schema, columns, ranges[0].splits) if ranges[0].splits else b""
    return bounds, splits


def range_bounds_pb(
    schema: Schema, partition_schema: PartitionSchema, bounds: tuple[Any, Any]
) -> master_pb2.RangeBoundsPB:
    """The ``RangeBoundsPB`` of one range ``(lower, upper)`` given as values of the range
    columns (one value, or a tuple with several columns; None: unbounded), checked against
    the table: ``InvalidArgumentError`` if it has no range partitioning or a value does not
    fit."""
    columns = partition_schema.range_columns
    if not columns:
        raise InvalidArgumentError("the table has no range partitioning (no range columns)")
    if not isinstance(bounds, (tuple, list)) or len(bounds) != 2:
        raise InvalidArgumentError(f"a range partition is (lower, upper); got {bounds!r}")
    rows = [None if b is None else _as_row(b, columns) for b in bounds]
    encoded = [b"" if r is None else partition_schema.encode_range_key(schema, r) for r in rows]
    if encoded[0] and encoded[1] and encoded[0] >= encoded[1]:
        raise InvalidArgumentError(f"range {bounds!r}: the lower bound must be below the upper")
    lower, upper = (b"" if r is None else rows_to_ipc(schema, columns, [r]) for r in rows)
    return _range_bounds_pb(lower, upper)


def range_bounds_from_pb(
    schema: Schema, partition_schema: PartitionSchema, pb: master_pb2.RangeBoundsPB
) -> tuple[bytes, bytes]:
    """The encoded ``(lower, upper)`` range keys of a ``RangeBoundsPB`` (empty: unbounded)."""
    out = []
    for data in (bytes(pb.lower), bytes(pb.upper)):
        keys = _keys_from_ipc(schema, partition_schema, data) if data else [b""]
        if len(keys) != 1:
            raise InvalidArgumentError("a range bound is one row")
        out.append(keys[0])
    return out[0], out[1]


def _range_bounds_pb(lower: bytes, upper: bytes) -> master_pb2.RangeBoundsPB:
    """A ``RangeBoundsPB`` (master.proto)."""
    return master_pb2.RangeBoundsPB(lower=lower, upper=upper)


def _keys_from_ipc(schema: Schema, partition_schema: PartitionSchema, data: bytes) -> list[bytes]:
    try:
        rows = pa.ipc.open_stream(data).read_all()
    except (pa.ArrowInvalid, OSError) as err:
        raise InvalidArgumentError(f"malformed Arrow IPC range rows: {err}") from err
    return partition_schema.range_keys_from_arrow(schema, rows)


def partitions_for_create_table(
    schema: Schema, request: master_pb2.CreateTableRequestPB
) -> list[metadata_pb2.PartitionPB]:
    """The ``PartitionPB`` of every tablet of a table created by ``request`` (a
    ``CreateTableRequestPB``), in key order: what the master calls."""
    partition_schema = PartitionSchema.from_pb(request.partition_schema)
    partition_schema.validate(schema)
    splits: list[bytes] = []
    if request.split_rows:
        splits = _keys_from_ipc(schema, partition_schema, bytes(request.split_rows))
    bounds = []
    for bound in request.range_bounds:
        low = _keys_from_ipc(schema, partition_schema, bytes(bound.lower)) if bound.lower else []
        high = _keys_from_ipc(schema, partition_schema, bytes(bound.upper)) if bound.upper else []
        if len(low) > 1 or len(high) > 1:
            raise InvalidArgumentError("a range bound is one row")
        bounds.append((low[0] if low else b"", high[0] if high else b""))
    spec = RangeSpec(tuple(splits), tuple(bounds))
    return [p.to_pb() for p in create_partitions(partition_schema, spec)]


__all__ = [
    "BUCKET_BYTES",
    "PRUNING_OPS",
    "HashPartitioning",
    "Partition",
    "PartitionSchema",
    "PartitioningSpec",
    "RangePartitioning",
    "RangeSpec",
    "create_partitions",
    "decode_key",
    "describe_range",
    "encode_key",
    "find_partition",
    "format_value",
    "hash64",
    "partitions_for_create_table",
    "range_bounds_from_pb",
    "range_bounds_pb",
    "range_key_interval",
    "range_may_hold",
    "range_spec_to_pb",
    "rows_to_ipc",
]
