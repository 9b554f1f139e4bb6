"""The sys catalog: the master's one tablet (id ``000…0``), replicated by Raft over the same
tablet, WAL, storage and consensus code as any tserver tablet.

Each row is one record: ``(entry_type, entry_id) -> metadata``, where metadata is a serialized
``SysTableEntryPB``, ``SysTabletEntryPB``, ``SysTServerEntryPB`` (a retired tablet server),
``SysTskEntryPB`` (a token-signing key), ``SysUserEntryPB`` (a user of a secure cluster) or
``SysCaEntryPB`` (the cluster CA) (master.proto). ``write`` replicates any number of
records as ONE op batch, so a logical operation (a table and all its tablets) commits or fails
as a whole (seed 002, "Ensure each logical operation is replicated as one batch"). ``load``
reads every record back; the caller must have confirmed leadership first (``read_index``), so
everything committed before is applied.

This module owns the record format only; what the records mean belongs to the catalog manager.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeAlias, cast

import pyarrow as pa

from nyala._proto import master_pb2
from nyala.consensus.runtime import RaftRuntime
from nyala.consensus.types import RaftConfig
from nyala.errors import (
    CorruptionError,
    IllegalStateError,
    ServiceUnavailableError,
    TabletNotRunningError,
)
from nyala.rowops import OpType, make_op_batch
from nyala.schema import Column, Schema
from nyala.tablet import Partition, TabletManager
from nyala.tablet.replica import TabletReplica

#: The sys catalog's tablet id (and its table id).
SYS_CATALOG_TABLET_ID = "0" * 32
SYS_CATALOG_TABLE_NAME = "sys.catalog"

#: The record layout: one row per table or tablet.
SYS_CATALOG_SCHEMA = Schema(
    [Column("entry_type", "int8"), Column("entry_id", "string"), Column("metadata", "binary")],
    key=["entry_type", "entry_id"],
)


#: The message of a sys-catalog row.
SysRecord: TypeAlias = (
    master_pb2.SysTableEntryPB
    | master_pb2.SysTabletEntryPB
    | master_pb2.SysTServerEntryPB
    | master_pb2.SysTskEntryPB
    | master_pb2.SysUserEntryPB
    | master_pb2.SysCaEntryPB
)


class RecordType(enum.IntEnum):
    """What a sys-catalog row holds."""

    TABLE = 1
    TABLET = 2
    TSERVER = 3
    TSK = 4
    USER = 5
    CA = 6


@dataclass(frozen=True)
class CatalogRecord:
    """One row to write."""

    entry_type: RecordType
    entry_id: str
    metadata: SysRecord

    @staticmethod
    def table(pb: master_pb2.SysTableEntryPB) -> CatalogRecord:
        """The row of a table record."""
        return CatalogRecord(RecordType.TABLE, str(pb.table_id), pb)

    @staticmethod
    def tablet(pb: master_pb2.SysTabletEntryPB) -> CatalogRecord:
        """The row of a tablet record."""
        return CatalogRecord(RecordType.TABLET, str(pb.tablet_id), pb)

    @staticmethod
    def tserver(pb: master_pb2.SysTServerEntryPB) -> CatalogRecord:
        """The row of a tablet-server record."""
        return CatalogRecord(RecordType.TSERVER, str(pb.ts_uuid), pb)

    @staticmethod
    def tsk(pb: master_pb2.SysTskEntryPB) -> CatalogRecord:
        """The row of a token-signing key (zero-padded: rows sort by sequence number)."""
        return CatalogRecord(RecordType.TSK, f"{pb.key_seq:020d}", pb)

    @staticmethod
    def user(pb: master_pb2.SysUserEntryPB) -> CatalogRecord:
        """The row of a user (or of a revoked join credential)."""
        return CatalogRecord(RecordType.USER, user_key(pb), pb)

    @staticmethod
    def ca(pb: master_pb2.SysCaEntryPB) -> CatalogRecord:
        """The row of the cluster CA (there is one)."""
        return CatalogRecord(RecordType.CA, "ca", pb)


def user_key(pb: master_pb2.SysUserEntryPB) -> str:
    """A user record's row id, and its name in the revoked list (``rpc.auth.revocation_key``):
    the user's name, or ``join/<name>`` for a join credential."""
    return f"join/{pb.name}" if pb.join else str(pb.name)


@dataclass(frozen=True)
class CatalogContents:
    """Every record of the sys catalog, parsed."""

    tables: list[master_pb2.SysTableEntryPB]
    tablets: list[master_pb2.SysTabletEntryPB]
    tservers: list[master_pb2.SysTServerEntryPB] = field(default_factory=list)
    tsks: list[master_pb2.SysTskEntryPB] = field(default_factory=list)
    users: list[master_pb2.SysUserEntryPB] = field(default_factory=list)
    cas: list[master_pb2.SysCaEntryPB] = field(default_factory=list)


def encode_records(records: Sequence[CatalogRecord]) -> bytes:
    """The Arrow IPC op batch that upserts ``records``."""
    data = {
        "entry_type": pa.array([int(r.entry_type) for r in records], pa.int8()),
        "entry_id": pa.array([r.entry_id for r in records], pa.string()),
        "metadata": pa.array([r.metadata.SerializeToString() for r in records], pa.binary()),
    }
    batch = make_op_batch(data, OpType.UPSERT, SYS_CATALOG_SCHEMA)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


#: Where each entry type goes in ``CatalogContents``, and the message it holds.
_CONTENTS_FIELD: dict[int, tuple[str, type[SysRecord]]] = {
    RecordType.TABLE: ("tables", master_pb2.SysTableEntryPB),
    RecordType.TABLET: ("tablets", master_pb2.SysTabletEntryPB),
    RecordType.TSERVER: ("tservers", master_pb2.SysTServerEntryPB),
    RecordType.TSK: ("tsks", master_pb2.SysTskEntryPB),
    RecordType.USER: ("users", master_pb2.SysUserEntryPB),
    RecordType.CA: ("cas", master_pb2.SysCaEntryPB),
}


def decode_contents(table: pa.Table) -> CatalogContents:
    """The records of a scan of the whole sys catalog; ``CorruptionError`` if one is bad."""
    contents = CatalogContents([], [], [], [], [], [])
    columns = table.to_pydict()
    for kind, entry_id, raw in zip(
        columns["entry_type"], columns["entry_id"], columns["metadata"], strict=True
    ):
        known = _CONTENTS_FIELD.get(kind)
        if known is None:
            raise CorruptionError(f"sys catalog row {entry_id!r} has unknown entry type {kind}")
        name, cls = known
        getattr(contents, name).append(_parse(cls, entry_id, raw))
    return contents


def _parse(cls: type[SysRecord], entry_id: str, raw: bytes) -> SysRecord:
    """The record of one row; ``CorruptionError`` if it does not parse."""
    pb = cls()
    try:
        pb.ParseFromString(raw)
    except Exception as exc:  # protobuf raises DecodeError (not a nyala error)
        raise CorruptionError(f"sys catalog row {entry_id!r} does not parse: {exc}") from None
    return pb


class SysCatalog:
    """This master's replica of the sys-catalog tablet."""

    def __init__(self, tablets: TabletManager, write_timeout_ms: int) -> None:
        self._tablets = tablets
        self._write_timeout_ms = write_timeout_ms

    @property
    def replica(self) -> TabletReplica | None:
        """The local replica, once created or opened."""
        return self._tablets.lookup(SYS_CATALOG_TABLET_ID)

    @property
    def runtime(self) -> RaftRuntime | None:
        """The replica's Raft runtime while it runs."""
        replica = self.replica
        return None if replica is None else replica.runtime

    def committed_config(self) -> RaftConfig | None:
        """The committed config of the local replica's cmeta (None: no replica yet)."""
        replica = self.replica
        if replica is None:
            return None
        runtime = replica.runtime
        if runtime is not None:
            return runtime.status().committed_config
        if replica.cmeta is None:
            raise IllegalStateError(
                f"sys catalog replica is {replica.state.value}: {replica.state_reason}"
            )
        return replica.cmeta.committed_config

    def create(self, config: RaftConfig) -> TabletReplica:
        """Creates the local replica with ``config`` as its initial config (blocking I/O)."""
        return self._tablets.create_tablet(
            SYS_CATALOG_TABLET_ID,
            table_id=SYS_CATALOG_TABLET_ID,
            table_name=SYS_CATALOG_TABLE_NAME,
            schema=SYS_CATALOG_SCHEMA,
            partition=Partition(),
            config=config,
        )

    def _running_replica(self) -> TabletReplica:
        replica = self.replica
        if replica is None or replica.runtime is None:
            raise TabletNotRunningError("the sys catalog is not running on this master")
        return replica

    async def write(self, records: Sequence[CatalogRecord]) -> None:
        """Replicates ``records`` as one batch; returns once committed and applied here.

        Fails (``NotLeaderError``, ``AbortedError``, ``TimedOutError``, ...) when the batch did
        not commit in time; the outcome is then unknown, and the caller must not trust its
        in-memory state for this term any more.
        """
        assert records, "an empty catalog write"
        replica = self._running_replica()
        ops = encode_records(records)
        try:
            async with asyncio.timeout(self._write_timeout_ms / 1000):
                outcome = await replica.write(None, SYS_CATALOG_SCHEMA.version, ops)
        except TimeoutError:
            raise ServiceUnavailableError(
                f"sys catalog write not committed within {self._write_timeout_ms} ms"
            ) from None
        if outcome.result is None:
            raise CorruptionError(f"sys catalog refused its own batch: {outcome.error}")

    def local_users(self) -> list[master_pb2.SysUserEntryPB]:
        """The user records this replica has applied (a follower's view: possibly behind the
        leader's, never ahead of what committed). Reads only their key range."""
        replica = self.replica
        storage = None if replica is None else replica.storage
        if storage is None:
            return []
        rows = storage.scan(
            ["entry_id", "metadata"],
            lower_bound={"entry_type": int(RecordType.USER), "entry_id": ""},
            upper_bound={"entry_type": int(RecordType.USER) + 1, "entry_id": ""},
        )
        ids, raws = rows.column("entry_id").to_pylist(), rows.column("metadata").to_pylist()
        return [
            cast(master_pb2.SysUserEntryPB, _parse(master_pb2.SysUserEntryPB, entry_id, raw))
            for entry_id, raw in zip(ids, raws, strict=True)
        ]

    async def load(self) -> CatalogContents:
        """Every record, as committed at a ReadIndex point confirmed by this leader."""
        replica = self._running_replica()
        _, table = await replica.scan()
        return await asyncio.to_thread(decode_contents, table)
