"""The superblock: what a server knows about one tablet replica before anything else is opened.

The superblock lives in ``<fs_root>/tablet-meta/<tablet_id>`` (DESIGN.md §6), written through
``nyala.common.metafile`` (``MetaKind.SUPERBLOCK``: atomic replace, checksums, fsync). Its
presence is what makes a replica exist; its ``data_state`` drives startup (seed 000,
"Tablet startup"). Rowset lists and the last flushed op index belong to the storage engine's
own manifest in the data directory and are not repeated here.

Payload layout (UTF-8 JSON object, keys sorted)::

    {
      "format": 1,
      "tablet_id": <32 hex>, "table_id": <str>, "table_name": <str>,
      "schema": {"columns": [{"id", "name", "type", "nullable", "default"}, ...],
                 "key_count": <int>, "version": <int>, "next_column_id": <int>},
      "partition": {"hash_buckets": [<int>...], "key_start": <hex>, "key_end": <hex>},
      "initial_config": <config, layout of nyala.consensus.metadata>,
      "data_state": "READY" | "COPYING" | "TOMBSTONED" | "DELETED",
      "tombstone_last_logged_opid": null | {"term": <int>, "index": <int>},
      "state_reason": <str>,
      "quarantine_dir": <str>          (optional; absent or "" = none)
    }

``quarantine_dir`` is where a tombstone or delete in progress moves the replica's WAL and data
(``nyala.tablet.quarantine``): written with the TOMBSTONED or DELETED state, so startup finishes
the move into the same directory after a crash; cleared by any later state change.

``initial_config`` is the config the replica was created with; it is what makes a repeated
CreateTablet recognisable as the same request (the committed config moves on in cmeta).
An unknown ``format`` is ``NotSupportedError``; anything malformed is ``CorruptionError``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nyala.common import metafile
from nyala.common.metafile import MetaKind
from nyala.consensus.types import OpId, RaftConfig, config_from_dict, config_to_dict
from nyala.errors import CorruptionError, InvalidArgumentError, NotSupportedError
from nyala.schema import Column, Schema, default_from_json, default_to_json

SUPERBLOCK_FORMAT = 1


class DataState(enum.Enum):
    """The on-disk data state of a replica (seed 000, "Note on deleted tablets")."""

    READY = "READY"
    # A tablet copy is downloading; a restart turns it into TOMBSTONED.
    COPYING = "COPYING"
    # Data and WAL deleted; cmeta and ``tombstone_last_logged_opid`` kept so it can vote.
    TOMBSTONED = "TOMBSTONED"
    # Being removed entirely; startup finishes the removal.
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True)
class Partition:
    """The part of the key space a tablet owns (encoded partition keys, empty = unbounded)."""

    hash_buckets: tuple[int, ...] = ()
    key_start: bytes = b""
    key_end: bytes = b""


@dataclass(frozen=True)
class Superblock:
    """The persistent identity and data state of one replica."""

    tablet_id: str
    table_id: str
    table_name: str
    schema: Schema
    partition: Partition
    initial_config: RaftConfig
    data_state: DataState = DataState.READY
    # Set when tombstoned: the last OpId the WAL held, so the replica can still vote.
    tombstone_last_logged_opid: OpId | None = None
    state_reason: str = ""  # why it was tombstoned or deleted
    # Where a tombstone or delete moves the WAL and data ("" = removed, not quarantined).
    quarantine_dir: str = ""

    def with_state(
        self,
        state: DataState,
        *,
        last_logged: OpId | None = None,
        reason: str = "",
        quarantine_dir: str = "",
    ) -> Superblock:
        """The same replica in ``state``; a known last-logged OpId is never forgotten."""
        kept = last_logged if last_logged is not None else self.tombstone_last_logged_opid
        return dataclasses.replace(
            self,
            data_state=state,
            tombstone_last_logged_opid=kept,
            state_reason=reason,
            quarantine_dir=quarantine_dir,
        )


def schema_to_dict(schema: Schema) -> dict[str, Any]:
    """The JSON-ready form of a schema (the superblock's ``schema`` field)."""
    return _schema_to_dict(schema)


def schema_from_dict(doc: Any) -> Schema:
    """The schema of ``schema_to_dict``'s form; ``CorruptionError`` if malformed."""
    try:
        return _schema_from_dict(doc)
    except (KeyError, TypeError, ValueError, InvalidArgumentError) as exc:
        raise CorruptionError(f"schema document is malformed: {exc!r}") from None


def _schema_to_dict(schema: Schema) -> dict[str, Any]:
    out = [
        {
            "id": c.id,
            "name": c.name,
            "type": c.type,
            "nullable": c.nullable,
            "default": default_to_json(c.type, c.default),
        }
        for c in schema.columns
    ]
    return {
        "columns": out,
        "key_count": len(schema.key),
        "version": schema.version,
        "next_column_id": schema.next_column_id,
    }


def _schema_from_dict(doc: Any) -> Schema:
    columns = [
        Column(
            name=str(c["name"]),
            type=str(c["type"]),
            nullable=bool(c["nullable"]),
            default=default_from_json(str(c["type"]), c["default"]),
            id=int(c["id"]),
        )
        for c in doc["columns"]
    ]
    key_count = int(doc["key_count"])
    return Schema(
        columns,
        [c.name for c in columns[:key_count]],
        version=int(doc["version"]),
        next_column_id=int(doc["next_column_id"]),
    )


def encode_superblock(sb: Superblock) -> bytes:
    """The superblock payload (layout in the module docstring)."""
    last = sb.tombstone_last_logged_opid
    doc: dict[str, Any] = {
        "format": SUPERBLOCK_FORMAT,
        "tablet_id": sb.tablet_id,
        "table_id": sb.table_id,
        "table_name": sb.table_name,
        "schema": _schema_to_dict(sb.schema),
        "partition": {
            "hash_buckets": list(sb.partition.hash_buckets),
            "key_start": sb.partition.key_start.hex(),
            "key_end": sb.partition.key_end.hex(),
        },
        "initial_config": config_to_dict(sb.initial_config),
        "data_state": sb.data_state.value,
        "tombstone_last_logged_opid": None
        if last is None
        else {"term": last.term, "index": last.index},
        "state_reason": sb.state_reason,
    }
    if sb.quarantine_dir:
        doc["quarantine_dir"] = sb.quarantine_dir
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode_superblock(payload: bytes, *, name: str = "<superblock>") -> Superblock:
    """Parses an ``encode_superblock`` payload."""
    try:
        doc = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptionError(f"{name}: superblock payload is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise CorruptionError(f"{name}: superblock payload is not an object")
    if doc.get("format") != SUPERBLOCK_FORMAT:
        raise NotSupportedError(f"{name}: superblock format {doc.get('format')!r} unsupported")
    try:
        part = doc["partition"]
        last = doc["tombstone_last_logged_opid"]
        return Superblock(
            tablet_id=str(doc["tablet_id"]),
            table_id=str(doc["table_id"]),
            table_name=str(doc["table_name"]),
            schema=_schema_from_dict(doc["schema"]),
            partition=Partition(
                hash_buckets=tuple(int(b) for b in part["hash_buckets"]),
                key_start=bytes.fromhex(part["key_start"]),
                key_end=bytes.fromhex(part["key_end"]),
            ),
            initial_config=config_from_dict(doc["initial_config"]),
            data_state=DataState(doc["data_state"]),
            tombstone_last_logged_opid=None
            if last is None
            else OpId(int(last["term"]), int(last["index"])),
            state_reason=str(doc["state_reason"]),
            quarantine_dir=str(doc.get("quarantine_dir", "")),
        )
    except (KeyError, TypeError, ValueError, InvalidArgumentError, CorruptionError) as e:
        raise CorruptionError(f"{name}: malformed superblock: {e!r}") from None


def read_superblock(path: Path) -> Superblock:
    """Reads and checks ``path``; ``NotFoundError`` if absent, ``CorruptionError`` if damaged."""
    return decode_superblock(metafile.read(path, MetaKind.SUPERBLOCK), name=str(path))


def write_superblock(path: Path, sb: Superblock) -> None:
    """Replaces ``path`` atomically and durably."""
    assert path.name == sb.tablet_id, (path, sb.tablet_id)
    metafile.write_atomic(path, MetaKind.SUPERBLOCK, encode_superblock(sb))
