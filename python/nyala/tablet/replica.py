"""One tablet replica on this server: superblock, consensus metadata, WAL, Raft and storage.

``TabletReplica`` owns the open handles of one replica and its runtime state
(``TabletState``). It opens what the superblock points at and closes it again; the
``TabletManager`` decides when (create, startup, tombstone, delete). ``start_consensus`` puts
the replica on a ``RaftRuntime`` (given a transport by its server) and makes it ``RUNNING``;
until then an opened replica reports ``NOT_STARTED`` with a reason that says so.

Bootstrap (issue 7 item 4): storage opens at its ``last_flushed_index``; the Raft core starts
with ``last_applied = last_flushed_index`` and re-announces every committed entry above it as it
re-learns the commit index, which the ``Applier`` applies again. Uncommitted entries stay in the
log for consensus to commit or truncate.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import enum
import functools
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from nyala.common.clock import Clock, HybridClock, hybrid_time, physical_us
from nyala.consensus.core import LeaderContact, bootstrap_cmeta
from nyala.consensus.effects import Apply
from nyala.consensus.metadata import ConsensusMetadata
from nyala.consensus.options import RaftOptions
from nyala.consensus.runtime import RaftRuntime, RuntimeOptions
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.runtime.transport import GrpcTransport, Transport
from nyala.consensus.runtime.wal_log import DurabilitySignals, WalLog, WalLogOptions
from nyala.consensus.types import MIN_OP_ID, OpId, Role
from nyala.errors import (
    AbortedError,
    IllegalStateError,
    InvalidArgumentError,
    NotLeaderError,
    SchemaMismatchError,
    StaleReplicaError,
    TabletNotRunningError,
    TimedOutError,
    kept_as_answer,
)
from nyala.schema import Schema
from nyala.storage import FLUSH_THRESHOLD_BYTES, Predicate, StorageEngine
from nyala.tablet.applier import ADMIT_DUPLICATE, ADMIT_STALE, Applier, WriteOutcome
from nyala.tablet.superblock import (
    DataState,
    Superblock,
    schema_from_dict,
    schema_to_dict,
    write_superblock,
)
from nyala.tablet.write_entry import RequestId, encode_alter_schema_entry, encode_write_entry

log = logging.getLogger(__name__)

OPENED_REASON = "storage, WAL and cmeta open; consensus not started yet"
#: How long a replica's counted bytes on disk are reused before they are counted again.
DISK_USAGE_REFRESH_S = 30.0
#: How long row history is kept for snapshot reads (Kudu's ``tablet_history_max_age_sec``).
HISTORY_MAX_AGE_S_DEFAULT = 15 * 60
#: Longest wait of a snapshot read for the writes at or before its timestamp to apply.
SNAPSHOT_WAIT_S = 30.0
#: How long a follower waits for its leader's safe time to pass a snapshot before it refuses
#: (the client then reads another replica, finally the leader).
FOLLOWER_SNAPSHOT_WAIT_S = 2.0
#: (safe time, commit index) pairs a follower keeps from its leader's requests.
SAFE_TIMES_KEPT = 256
#: Read modes of ``TabletReplica.open_scan``.
READ_MODES = ("latest", "follower", "snapshot", "read_your_writes")


class PageCursor(Protocol):
    """What a tablet server's scanner pages through: a storage cursor, or a result built
    whole (``TableCursor``)."""

    def next_ipc(self, bytes_max: int) -> tuple[bytes, int] | None: ...

    def close(self) -> None: ...


class TableCursor:
    """A result computed whole (a diff scan: the difference of two snapshots is known only
    once both are read), paged out like a storage cursor."""

    def __init__(self, rows: pa.Table) -> None:
        self._batches = rows.combine_chunks().to_batches()
        self._next = 0  # index of the next batch
        self._offset = 0  # rows of it already sent

    def next_ipc(self, bytes_max: int) -> tuple[bytes, int] | None:
        while self._next < len(self._batches):
            batch = self._batches[self._next]
            if self._offset >= batch.num_rows:
                self._next, self._offset = self._next + 1, 0
                continue
            row_bytes = max(1, batch.nbytes // max(1, batch.num_rows))
            take = max(1, min(batch.num_rows - self._offset, bytes_max // row_bytes))
            page = batch.slice(self._offset, take)
            self._offset += take
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, page.schema) as writer:
                writer.write_batch(page)
            return sink.getvalue().to_pybytes(), take
        return None

    def close(self) -> None:
        self._batches, self._next = [], 0


class TabletState(enum.Enum):
    """Runtime state of a replica (names match ``nyala.TabletState`` on the wire)."""

    NOT_STARTED = "NOT_STARTED"
    BOOTSTRAPPING = "BOOTSTRAPPING"
    RUNNING = "RUNNING"
    FAILED = "FAILED"  # offline; ``state_reason`` says why
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"


@dataclass(frozen=True)
class ReplicaPaths:
    """Where one replica's files live (DESIGN.md §6)."""

    superblock: Path
    cmeta: Path
    wal_dir: Path
    data_dir: Path


class TabletReplica:
    """The open parts of one replica; created by ``TabletManager`` only."""

    def __init__(
        self,
        superblock: Superblock,
        paths: ReplicaPaths,
        wal_options: WalLogOptions,
        flush_threshold_bytes: int = FLUSH_THRESHOLD_BYTES,
        hybrid_clock: HybridClock | None = None,
        history_max_age_s: float = HISTORY_MAX_AGE_S_DEFAULT,
        durability_signals: DurabilitySignals | None = None,
    ):
        self.superblock = superblock
        self._durability_signals = durability_signals
        # The server's hybrid clock (shared by its replicas): timestamps of writes (assigned
        # as leader, in op order) and of snapshot reads (docs/consistency.md).
        self.clock = hybrid_clock or HybridClock()
        self.history_max_age_s = history_max_age_s
        # Timestamps this leader assigned to writes not yet applied (or failed), oldest first:
        # a snapshot read at T waits until none <= T is left.
        self._inflight_ts: dict[int, None] = {}
        # As a follower: (safe time, commit index) pairs its leader sent, oldest first: every
        # write stamped at or before the safe time is at or below the commit index.
        self._safe_times: collections.deque[tuple[int, int]] = collections.deque(
            maxlen=SAFE_TIMES_KEPT
        )
        # As a leader: (term, a commit index of an entry of that term), once there is one; and
        # (applied index, safe time) after each apply, for requests built before an apply.
        self._safe_term_start: tuple[int, int] | None = None
        self._applied_safe: collections.deque[tuple[int, int]] = collections.deque(
            maxlen=SAFE_TIMES_KEPT
        )
        self._safe_term_seen = -1
        self.paths = paths
        self._wal_options = wal_options
        self._flush_threshold_bytes = flush_threshold_bytes
        self.state = TabletState.NOT_STARTED
        # (when, bytes) of the last count of the files on disk (``on_disk_bytes``).
        self._disk_usage: tuple[float, int] | None = None
        self._data_usage: tuple[float, int] | None = None  # (when, bytes) of data_bytes
        self.state_reason = ""
        self.cmeta: ConsensusMetadata | None = None
        self.storage: StorageEngine | None = None
        self.wal: WalLog | None = None
        self.applier: Applier | None = None
        self.runtime: RaftRuntime | None = None
        self.transport: Transport | None = None
        # Metrics (read by the server's /metrics): rows and bytes (Arrow IPC) returned by
        # scans of this replica. Flushes are counted by the storage engine.
        self.rows_scanned = 0
        self.bytes_scanned = 0
        # WAL anchor at the first op not yet flushed to rowsets (replay needs it after a crash).
        self._storage_anchor: int | None = None

    @property
    def tablet_id(self) -> str:
        """The tablet's id (32 hex digits)."""
        return self.superblock.tablet_id

    @property
    def storage_anchor(self) -> int | None:
        """The id of the WAL anchor the storage holds (at the first unflushed op), if open."""
        return self._storage_anchor

    def create_files(self) -> None:
        """Lays down a new replica's cmeta (initial config, term 0) and empty storage.

        Called before the superblock is written: a crash in between leaves files that no
        superblock points at, which the next CreateTablet clears (``clear_leftovers``).
        """
        assert self.superblock.data_state is DataState.READY
        bootstrap_cmeta(FileCmetaStore(self.paths.cmeta), self.superblock.initial_config)
        StorageEngine.create(self.paths.data_dir, self.superblock.schema)

    def open(self) -> None:
        """Opens cmeta, storage and the WAL of a READY replica; FAILED (with why) on error."""
        if self.superblock.data_state is not DataState.READY:
            raise IllegalStateError(
                f"tablet {self.tablet_id} is {self.superblock.data_state.value}, not READY"
            )
        self.state = TabletState.BOOTSTRAPPING
        try:
            self.cmeta = FileCmetaStore(self.paths.cmeta).load()
            self.storage = StorageEngine.open(
                self.paths.data_dir, flush_threshold_bytes=self._flush_threshold_bytes
            )
            self.wal = WalLog(
                self.paths.wal_dir,
                self.tablet_id,
                self._wal_options,
                signals=self._durability_signals,
            )
            self._roll_schema_forward(self.storage)
            self.applier = Applier(self.wal, self.storage, self._on_alter_schema)
            self._storage_anchor = self.wal.register_anchor(self.storage.last_flushed_index + 1)
        except Exception as exc:  # any failure keeps this replica offline, never the server
            self.close()
            self.fail(f"{type(exc).__name__}: {exc}")
            log.warning("tablet %s failed to start: %s", self.tablet_id, self.state_reason)
            return
        self.state = TabletState.NOT_STARTED
        self.state_reason = OPENED_REASON

    def fail(self, reason: str) -> None:
        """Marks the replica offline with ``reason``."""
        self.state = TabletState.FAILED
        self.state_reason = reason

    def last_logged_op_id(self) -> OpId:
        """The last OpId in the WAL (what a tombstone keeps so the replica can still vote)."""
        if self.wal is not None:
            return self.wal.last_op_id()
        if self.superblock.tombstone_last_logged_opid is not None:
            return self.superblock.tombstone_last_logged_opid
        return MIN_OP_ID

    def close(self) -> None:
        """Releases the open handles; the files stay. Raft must be stopped first
        (``stop_consensus``) when it was started."""
        if self.runtime is not None:
            # A runtime whose task already ended (it failed on a WAL error, or the server's
            # task group unwound) needs no stopping; a live one must be stopped first.
            assert not self.runtime.running, "stop_consensus before close"
            self.runtime = None
            self.transport = None
        self.state = TabletState.STOPPING
        self.applier = None
        self._storage_anchor = None
        if self.wal is not None:
            self.wal.close()
        self.wal = None
        # Dropping the last reference stops the engine's background work (Rust Drop).
        self.storage = None
        self.state = TabletState.STOPPED

    def gc_wal(self) -> tuple[int, int]:
        """Moves the storage anchor up to the first unflushed op and removes the WAL segments
        nobody needs any more (copy sessions hold their own anchors). Returns (segments
        removed, first index still in the WAL); (0, 0) when the replica is not open."""
        wal, storage, anchor = self.wal, self.storage, self._storage_anchor
        if wal is None or storage is None or anchor is None:
            return 0, 0
        wal.update_anchor(anchor, storage.last_flushed_index + 1)
        return wal.gc()

    def on_disk_bytes(self, *, max_age_s: float = DISK_USAGE_REFRESH_S) -> int:
        """Bytes of the replica's WAL and data files, as counted at most ``max_age_s``
        (default ``DISK_USAGE_REFRESH_S``) ago: counting lists and stats every file, and a
        server with thousands of replicas must not do that for every page view."""
        now = time.monotonic()
        cached = self._disk_usage
        if cached is not None and now - cached[0] < max_age_s:
            return cached[1]
        total = _tree_bytes(self.paths.wal_dir) + _tree_bytes(self.paths.data_dir)
        self._disk_usage = (now, total)
        return total

    def wal_bytes(self) -> int | None:
        """Bytes of the replica's WAL segments now (None while its WAL is not open): the
        segments the log lists, one ``stat`` each."""
        wal = self.wal
        if wal is None:
            return None
        return sum(file_bytes(path) for path in wal.segment_paths())

    def data_bytes(self, *, max_age_s: float) -> int:
        """Bytes of the replica's data files (rowsets, manifest), as counted at most
        ``max_age_s`` ago (counting stats every file)."""
        now = time.monotonic()
        cached = self._data_usage
        if cached is not None and now - cached[0] < max_age_s:
            return cached[1]
        total = _tree_bytes(self.paths.data_dir)
        self._data_usage = (now, total)
        return total

    # --- consensus --------------------------------------------------------------------------

    def start_consensus(
        self,
        uuid: str,
        task_group: asyncio.TaskGroup,
        transport: Transport,
        clock: Clock,
        *,
        raft_options: RaftOptions | None = None,
        runtime_options: RuntimeOptions | None = None,
        isolate_failure: bool = True,
        on_consensus_change: Callable[[str], None] | None = None,
    ) -> RaftRuntime:
        """Runs Raft for this replica as a task of ``task_group``; the replica is RUNNING.

        If Raft or the WAL fails, the replica goes FAILED and the group goes on
        (``isolate_failure``), or the failure ends the whole group. ``on_consensus_change`` is
        called (on the event loop) when the replica's role, term, leader or committed config
        changes, with this replica's tablet id: the tablet server then reports it to the masters
        at once."""
        if self.wal is None or self.storage is None or self.applier is None:
            raise IllegalStateError(f"tablet {self.tablet_id} is not open ({self.state.value})")
        applier = self.applier
        tablet_id = self.tablet_id

        def changed() -> None:
            assert on_consensus_change is not None
            on_consensus_change(tablet_id)

        runtime = RaftRuntime(
            uuid,
            self.wal,
            FileCmetaStore(self.paths.cmeta),
            transport,
            clock,
            notifier=self.wal,
            raft_options=raft_options,
            options=runtime_options,
            rng=random.Random(),
            group_id=tablet_id,
            last_applied_index=applier.applied_index,
            on_apply=lambda effect: self._on_apply(applier, effect),
            on_failure=self._on_consensus_failure if isolate_failure else None,
            on_role_change=None if on_consensus_change is None else lambda _: changed(),
            on_config_committed=None if on_consensus_change is None else lambda _: changed(),
        )
        if isinstance(transport, GrpcTransport):
            transport.timestamps = self._leader_timestamps
            transport.on_timestamps = self._on_leader_timestamps
            transport.answer_when_durable = self.wal.answer_when_durable
            transport.native_log = self.wal.native
            transport.quiet_durability = self.wal.set_quiet_durability
        # A runtime before this one (stopped) may have left the log quiet.
        self.wal.set_quiet_durability(False)
        runtime.start(task_group)
        self.runtime = runtime
        self.transport = transport
        self.state = TabletState.RUNNING
        self.state_reason = ""
        return runtime

    async def stop_consensus(self, timeout_s: float = 5.0) -> None:
        """Stops Raft and waits until its task is gone, so the WAL can be closed safely."""
        runtime, self.runtime = self.runtime, None
        self.transport = None
        if runtime is None:
            return
        runtime.stop()
        async with asyncio.timeout(timeout_s):
            while True:
                if not runtime.running:
                    break
                await asyncio.sleep(0.005)
        if self.state is TabletState.RUNNING:
            self.state = TabletState.STOPPED

    def _on_consensus_failure(self, failure: BaseException) -> None:
        """Raft or the WAL failed (the runtime logged why): this replica goes offline until the
        server restarts, as Kudu's does; the server's other replicas are not affected."""
        if self.state is not TabletState.FAILED:  # a failed apply already said why
            self.fail(f"consensus failed: {type(failure).__name__}: {failure}")
        # Consensus RPCs and writes are refused with TABLET_FAILED (the tablet manager's
        # lookup) rather than served from the frozen state of a runtime that no longer runs.
        self.runtime = None
        self.transport = None

    def _on_apply(self, applier: Applier, effect: Apply) -> None:
        try:
            applier.apply(effect.first_index, effect.last_index)
        except Exception as exc:
            # A committed entry that cannot be applied stops this replica: skipping it would
            # make it diverge from the others.
            self.fail(f"apply of {effect.first_index}..{effect.last_index} failed: {exc!r}")
            raise  # the runtime fails with it and tells ``_on_consensus_failure``
        runtime, wal = self.runtime, self.wal
        if runtime is not None and runtime.role is Role.LEADER:
            self._applied_safe.append((applier.applied_index, self._safe_now()))
        if runtime is not None and wal is not None:
            # Applied here and received by every peer: the log cache's copy has no reader
            # left (Kudu evicts through its all-replicated index the same way).
            wal.evict_through(min(applier.applied_index, runtime.core.all_replicated_index))

    def _running(self) -> tuple[RaftRuntime, StorageEngine, Applier]:
        if self.state is not TabletState.RUNNING:
            raise TabletNotRunningError(
                f"tablet {self.tablet_id} is {self.state.value}: {self.state_reason}"
            )
        assert self.runtime is not None
        assert self.storage is not None
        assert self.applier is not None
        return self.runtime, self.storage, self.applier

    def _require_leader(self, runtime: RaftRuntime) -> None:
        if runtime.role is Role.LEADER:
            return  # the hot path: no status snapshot
        status = runtime.status()
        if status.role is not Role.LEADER:
            leader = status.leader_uuid
            peer = None if leader is None else status.committed_config.peer(leader)
            raise NotLeaderError(
                f"tablet {self.tablet_id}: this replica is {status.role.value}",
                leader_uuid=leader,
                leader_addr=None if peer is None else peer.address,
            )

    # --- schema changes ---------------------------------------------------------------------

    async def alter_schema(self, schema: Schema, table_name: str) -> None:
        """AlterSchema at the leader: replicates the change to ``schema`` (any later version)
        as a log entry, ordered with the writes around it; returns once applied here.
        Idempotent: a version the tablet already has is a no-op."""
        runtime, _, applier = self._running()
        self._require_leader(runtime)
        current = self.superblock.schema.version
        if schema.version <= current:
            return
        # A jump over versions is fine: the master sends the table's latest schema, and a
        # tablet that missed an alter (down, or not leader then) goes straight to it.
        doc = json.dumps(
            {
                "schema": schema_to_dict(schema),
                "table_name": table_name or self.superblock.table_name,
            },
            sort_keys=True,
        ).encode()
        with applier.collecting():
            stamp = self._assign_timestamp()
            try:
                entry = encode_alter_schema_entry(schema.version, doc, timestamp=stamp)
                op_id = await runtime.propose(entry)
            finally:
                self._inflight_ts.pop(stamp, None)
            applier.take_outcome(op_id.index)
        if self.state is TabletState.FAILED:
            raise IllegalStateError(f"tablet {self.tablet_id} failed: {self.state_reason}")

    def _on_alter_schema(self, index: int, version: int, doc: bytes) -> None:
        """Applies a committed schema change: storage first (it persists the schema with the
        op index), then the superblock (``_roll_schema_forward`` repairs a crash in between)."""
        fields = json.loads(doc)
        schema = schema_from_dict(fields["schema"])
        assert schema.version == version, "the entry's version is its schema's"
        storage = self.storage
        assert storage is not None, "applied only while open"
        if storage.schema.version < version:
            storage.alter_schema(schema, index)
        if self.superblock.schema.version < version:
            sb = dataclasses.replace(
                self.superblock, schema=schema, table_name=str(fields["table_name"])
            )
            write_superblock(self.paths.superblock, sb)
            self.superblock = sb
        log.info("tablet %s: schema version %d at op %d", self.tablet_id, version, index)

    def _roll_schema_forward(self, storage: StorageEngine) -> None:
        if storage.schema.version > self.superblock.schema.version:
            sb = dataclasses.replace(self.superblock, schema=storage.schema)
            write_superblock(self.paths.superblock, sb)
            self.superblock = sb

    async def write(
        self, request_id: RequestId | None, schema_version: int, ops: bytes
    ) -> WriteOutcome:
        """Replicates one op batch through Raft and returns its applied outcome.

        ``NotLeaderError`` (with the leader hint) on a follower, ``SchemaMismatchError`` if the
        batch was encoded for another schema version. A retried request id returns the first
        outcome without applying again.
        """
        runtime, _, applier = self._running()
        self._require_leader(runtime)
        earlier = self._known_outcome(applier, request_id, schema_version)
        if earlier is not None:
            return earlier
        timestamp = self._assign_timestamp()
        try:
            with applier.collecting():
                payload = encode_write_entry(request_id, schema_version, ops, timestamp=timestamp)
                op_id = await runtime.propose(payload)
                # The collected outcome carries the timestamp of the entry that applied the
                # request: a duplicate entry (a retry racing a leader change) answers with the
                # first one's, the time its rows were really written.
                return self._collect(applier, op_id)
        finally:
            self._inflight_ts.pop(timestamp, None)

    async def write_many(
        self, requests: Sequence[tuple[RequestId | None, int, bytes]]
    ) -> list[WriteOutcome | Exception]:
        """``write`` for several op batches (request id, schema version, ops) at once: they
        are proposed together (one WAL group commit, one replication batch) and each gets its
        own outcome or error, in order. A replica that is not the leader raises for all."""
        runtime, _, applier = self._running()
        self._require_leader(runtime)
        results: list[WriteOutcome | Exception | None] = []  # None: proposed below
        payloads: list[bytes] = []
        slots: list[int] = []
        stamps: list[int] = []
        for request_id, schema_version, ops in requests:
            result: WriteOutcome | Exception | None
            try:
                result = self._known_outcome(applier, request_id, schema_version)
                if result is None:
                    stamp = self._assign_timestamp()
                    stamps.append(stamp)
                    payloads.append(
                        encode_write_entry(request_id, schema_version, ops, timestamp=stamp)
                    )
                    slots.append(len(results))
            except Exception as exc:  # refused before proposing: this request only
                result = kept_as_answer(exc)
            results.append(result)
        if payloads:
            try:
                with applier.collecting():
                    futures = runtime.propose_many(payloads)
                    # Awaited one by one: ``asyncio.wait``'s own waiter took one more
                    # event-loop turn. They resolve in index order, in one pass of the
                    # runtime, so once the first is done the rest usually are too.
                    for future in futures:
                        if not future.done():
                            with contextlib.suppress(Exception):  # read below, per write
                                await future
                    for slot, future in zip(slots, futures, strict=True):
                        error = future.exception()
                        if error is None:
                            try:
                                results[slot] = self._collect(applier, future.result())
                            except IllegalStateError as exc:
                                results[slot] = kept_as_answer(exc)
                        elif isinstance(error, Exception):
                            results[slot] = kept_as_answer(error)
                        else:
                            results[slot] = AbortedError(f"write {slot} abandoned: {error!r}")
            finally:
                for stamp in stamps:
                    self._inflight_ts.pop(stamp, None)
        answered = [r for r in results if r is not None]
        assert len(answered) == len(results), "every proposed write was resolved"
        return answered

    def _known_outcome(
        self, applier: Applier, request_id: RequestId | None, schema_version: int
    ) -> WriteOutcome | None:
        """Checks a write before it is proposed; the first outcome of a retried request.

        A retry's first outcome is looked up before its schema version is checked: a request
        applied before a schema change is answered as applied, not refused as mismatched
        (the client would take a refusal as "not applied")."""
        if request_id is not None:
            admission = applier.admit(request_id)
            if admission == ADMIT_DUPLICATE:
                earlier = applier.outcome_of(request_id)
                if earlier is not None:  # unless a later request's watermark just forgot it
                    return earlier
            elif admission == ADMIT_STALE:
                raise AbortedError(
                    f"request {request_id.seq_no} of client {request_id.client_id} was declared "
                    "complete by the client; its outcome is no longer kept"
                )
        # The superblock holds the tablet's schema (AlterSchema must update it with storage).
        if schema_version != self.superblock.schema.version:
            raise SchemaMismatchError(
                f"tablet {self.tablet_id} has schema version {self.superblock.schema.version}, "
                f"the write was encoded for {schema_version}"
            )
        return None

    def _collect(self, applier: Applier, op_id: OpId) -> WriteOutcome:
        outcome = applier.take_outcome(op_id.index)
        if outcome is None:
            raise IllegalStateError(f"tablet {self.tablet_id}: op {op_id} committed unapplied")
        return outcome

    async def scan(
        self,
        columns: Sequence[str] | None = None,
        where: Sequence[Predicate] = (),
        *,
        limit: int | None = None,
        **bounds: Any,
    ) -> tuple[int, pa.Table]:
        """A linearizable scan at the leader read whole (small tablets such as the sys
        catalog): served once ReadIndex confirmed leadership and everything committed before
        the call is applied. Returns (read index, rows)."""
        index, storage = await self._read_point(None)
        rows = storage.scan(columns, where, limit=limit, **bounds)
        self.rows_scanned += rows.num_rows
        self.bytes_scanned += rows.nbytes
        return index, rows

    async def open_scan(
        self,
        max_staleness_ms: int | None,
        columns: Sequence[str] | None = None,
        where: Sequence[Predicate] = (),
        *,
        limit: int | None = None,
        read_mode: str = "latest",
        snapshot_ts: int = 0,
        diff_start_ts: int = 0,
        propagated_ts: int = 0,
        **bounds: Any,
    ) -> tuple[int, PageCursor, int]:
        """Opens a cursor; returns (read index, cursor, snapshot timestamp or 0).

        ``read_mode`` "latest" reads at the leader, linearizably (after ReadIndex), or with
        ``max_staleness_ms`` as a follower read (see ``_read_point``): the cursor sees every
        op up to the read index, and possibly later committed ones. "snapshot" reads the
        versions at ``snapshot_ts`` (0: this replica picks its clock's now) once every write
        at or before it is applied here (``_snapshot_point``); "read_your_writes" is a
        snapshot this replica picks at or after the timestamps the client has seen (the
        caller moved the clock past them). With ``diff_start_ts`` a snapshot read returns the
        rows that differ between ``diff_start_ts`` and the snapshot, with ``is_deleted``. The
        cursor is opened off the event loop (the in-memory rows are copied then)."""
        if read_mode not in READ_MODES:
            raise InvalidArgumentError(f"read mode must be one of {READ_MODES}; got {read_mode}")
        cursor: PageCursor
        if read_mode in ("latest", "follower"):
            index, storage = await self._read_point(max_staleness_ms)
            cursor = await asyncio.to_thread(
                storage.open_scan, columns, where, limit=limit, **bounds
            )
            return index, cursor, 0
        index, storage, snapshot_ts = await self._snapshot_point(
            snapshot_ts if read_mode == "snapshot" else 0, propagated_ts
        )
        if diff_start_ts:
            self._check_history(diff_start_ts, storage)
            if diff_start_ts > snapshot_ts:
                raise InvalidArgumentError(
                    f"a diff scan's start {diff_start_ts} is after its end {snapshot_ts}"
                )
            rows = await asyncio.to_thread(
                functools.partial(
                    storage.diff_scan,
                    diff_start_ts,
                    snapshot_ts,
                    columns,
                    where,
                    limit=limit,
                    **bounds,
                )
            )
            cursor = TableCursor(rows)
        else:
            cursor = await asyncio.to_thread(
                functools.partial(
                    storage.open_scan,
                    columns,
                    where,
                    limit=limit,
                    snapshot_ts=snapshot_ts,
                    **bounds,
                )
            )
        return index, cursor, snapshot_ts

    # --- hybrid time (docs/consistency.md) ---------------------------------------------------

    def _assign_timestamp(self) -> int:
        """The timestamp of a write this leader is about to propose. Called right before the
        proposal is queued, with no await in between, so timestamps rise in op order."""
        stamp = self.clock.now()
        self._inflight_ts[stamp] = None
        return stamp

    def ancient_history_mark(self) -> int:
        """Timestamps before this may have lost their history (Kudu's AHM): the clock less
        ``history_max_age_s``."""
        physical = physical_us(self.clock.peek()) - int(self.history_max_age_s * 1_000_000)
        return hybrid_time(max(0, physical))

    def _check_history(self, timestamp: int, storage: StorageEngine) -> None:
        mark = max(self.ancient_history_mark(), storage.history_gc_mark)
        if timestamp < mark:
            raise InvalidArgumentError(
                f"tablet {self.tablet_id}: snapshot timestamp {timestamp} is older than the "
                f"ancient history mark {mark}: history older than tablet_history_max_age_s "
                f"({self.history_max_age_s:g} s) is not kept"
            )

    async def _snapshot_point(
        self, snapshot_ts: int, propagated_ts: int = 0
    ) -> tuple[int, StorageEngine, int]:
        """Waits until this replica holds every write with a timestamp <= the snapshot's and
        returns (read index, storage, snapshot timestamp).

        At the leader: ReadIndex confirms leadership and applies everything committed before
        the read (with it, every entry of earlier leaders); then the writes this leader itself
        has stamped at or before the snapshot are waited for. Writes stamped later are above
        the snapshot: the clock has passed it (a timestamp ahead of the clock, within the
        clock error, is first waited for). Without a timestamp the leader picks its clock's
        now. A follower serves it once a safe time its leader sent has passed the snapshot
        and the commit index sent with it is applied here (``_follower_snapshot_point``)."""
        runtime, storage, applier = self._running()
        if runtime.role is not Role.LEADER:
            if snapshot_ts:
                self._check_history(snapshot_ts, storage)
            return await self._follower_snapshot_point(
                runtime, storage, applier, snapshot_ts, propagated_ts
            )
        if snapshot_ts:
            self._check_history(snapshot_ts, storage)
            try:
                self.clock.check_not_ahead(snapshot_ts)
            except ValueError as exc:
                raise InvalidArgumentError(f"tablet {self.tablet_id}: {exc}") from None
            ahead_us = self.clock.ahead_us(snapshot_ts)
            if ahead_us > 0:
                await asyncio.sleep(ahead_us / 1_000_000)
            self.clock.update(snapshot_ts)
        else:
            snapshot_ts = self.clock.now()
        index = await runtime.read_index()
        deadline = time.monotonic() + SNAPSHOT_WAIT_S
        while self._inflight_ts and next(iter(self._inflight_ts)) <= snapshot_ts:
            if time.monotonic() > deadline:
                raise TimedOutError(
                    f"tablet {self.tablet_id}: writes at or before {snapshot_ts} did not "
                    f"apply within {SNAPSHOT_WAIT_S:g} s"
                )
            await asyncio.sleep(0.001)
        self._require_leader(runtime)
        return index, storage, snapshot_ts

    async def _follower_snapshot_point(
        self,
        runtime: RaftRuntime,
        storage: StorageEngine,
        applier: Applier,
        snapshot_ts: int,
        propagated_ts: int,
    ) -> tuple[int, StorageEngine, int]:
        """A snapshot read at this follower: at ``snapshot_ts``, or (0) at the latest safe time
        its leader sent, or the client's ``propagated_ts`` if that is later. Waits up to
        ``FOLLOWER_SNAPSHOT_WAIT_S`` for a safe time past it and for the commit index sent
        with that safe time to be applied; ``StaleReplicaError`` otherwise (an idle,
        quiesced tablet sends no safe times: the client then reads at the leader)."""
        if not snapshot_ts:
            latest = self._safe_times[-1][0] if self._safe_times else 0
            snapshot_ts = max(latest, propagated_ts)
            if not snapshot_ts:
                raise StaleReplicaError(
                    f"tablet {self.tablet_id}: no safe time from a leader yet for a snapshot"
                )
        deadline = time.monotonic() + FOLLOWER_SNAPSHOT_WAIT_S
        while True:
            needed = next((c for s, c in self._safe_times if s >= snapshot_ts), None)
            if needed is not None and applier.applied_index >= needed:
                return applier.applied_index, storage, snapshot_ts
            if time.monotonic() > deadline or runtime.role is Role.LEADER:
                raise StaleReplicaError(
                    f"tablet {self.tablet_id}: this follower's safe time has not reached "
                    f"snapshot {snapshot_ts} (its leader's last: "
                    f"{self._safe_times[-1][0] if self._safe_times else 0})"
                )
            await asyncio.sleep(0.002)

    def _safe_now(self) -> int:
        """This leader's safe time now: below its oldest stamped write that is not applied
        yet, else the clock. Every write stamped at or before it is applied here."""
        return next(iter(self._inflight_ts)) - 1 if self._inflight_ts else self.clock.now()

    def _leader_timestamps(self, commit_index: int) -> tuple[int, int]:
        """(clock, safe time) for an AppendEntries this leader sends with ``commit_index``:
        every write stamped at or before the safe time is at or below that index. 0 until
        the leader has committed an entry of its own term (until then entries of an earlier
        leader may lie above it). A request built before the latest applies (its commit
        index below the applied index) gets the safe time recorded when that index was
        applied, not today's, which may cover writes above it."""
        now = self.clock.now()
        runtime, wal, applier = self.runtime, self.wal, self.applier
        if runtime is None or wal is None or applier is None:
            return now, 0
        core = runtime.core
        term_start = self._safe_term_start
        if term_start is None or term_start[0] != core.term or commit_index < term_start[1]:
            if wal.term_at(commit_index) != core.term:
                return now, 0
            self._safe_term_start = (core.term, commit_index)
        if commit_index >= applier.applied_index:
            return now, min(now, self._safe_now())
        for index, safe in reversed(self._applied_safe):
            if index <= commit_index:
                return now, safe
        return now, 0

    def _on_leader_timestamps(
        self, term: int, leader_ts: int, safe_ts: int, commit_index: int
    ) -> None:
        """A follower got its leader's clock and safe time: its clock moves past the
        leader's (so as a later leader it stamps above every write it holds), and the safe
        time is kept for snapshot reads here."""
        runtime = self.runtime
        if runtime is None or term < runtime.core.term:
            return  # a deposed leader's: not the current leader's promise
        try:
            self.clock.update(leader_ts)
        except ValueError as exc:
            log.warning("tablet %s: leader's clock refused: %s", self.tablet_id, exc)
            return
        if term > self._safe_term_seen:
            self._safe_times.clear()  # a new leader's promises replace the old one's
            self._safe_term_seen = term
        if safe_ts and (not self._safe_times or safe_ts > self._safe_times[-1][0]):
            self._safe_times.append((safe_ts, commit_index))

    async def _read_point(self, max_staleness_ms: int | None) -> tuple[int, StorageEngine]:
        """The index a read is served at. Without a staleness bound: at the leader, after
        ReadIndex. With one (Kudu's READ_LATEST on a follower, no ReadIndex): this replica's
        applied index if it had everything its current leader had committed no more than
        ``max_staleness_ms`` ago, ``StaleReplicaError`` otherwise; such a read may miss writes
        acknowledged in that window. At the leader a follower read is a leader read."""
        runtime, storage, applier = self._running()
        if max_staleness_ms is None or runtime.role is Role.LEADER:
            self._require_leader(runtime)
            return await runtime.read_index(), storage
        refusal = follower_read_refusal(
            runtime.core.leader_contact(), max_staleness_ms, applier.applied_index
        )
        if refusal is not None:
            raise StaleReplicaError(f"tablet {self.tablet_id}: {refusal}")
        return applier.applied_index, storage


def follower_read_refusal(
    contact: LeaderContact | None, max_staleness_ms: int, applied_index: int
) -> str | None:
    """Why a follower may not serve a read with this staleness bound, or None if it may.

    It may when, no more than ``max_staleness_ms`` ago, it held everything its current leader
    (of the current term) had committed at that time, and it has applied all of that. Then
    every write acknowledged before that moment is in its storage, so the read misses at most
    the writes of the last ``max_staleness_ms`` (plus the message's transit time).
    """
    if max_staleness_ms <= 0:
        return "a follower read needs a staleness bound (max_staleness_ms > 0)"
    if contact is None:
        return "no leader of the current term has been heard since this replica caught up"
    if contact.age_ms > max_staleness_ms:
        return (
            f"last caught up with leader {contact.leader_uuid} {contact.age_ms} ms ago, "
            f"over the staleness bound of {max_staleness_ms} ms"
        )
    if applied_index < contact.commit_index:
        return (
            f"applied index {applied_index} is behind the leader's commit index "
            f"{contact.commit_index}"
        )
    return None


def file_bytes(path: Path) -> int:
    """``path``'s size; 0 if it is gone (a WAL segment GC'd, a rowset compacted away, since
    it was listed)."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tree_bytes(root: Path) -> int:
    """Bytes of every file under ``root`` (0 if there is no such directory)."""
    if not root.is_dir():
        return 0
    return sum(file_bytes(p) for p in root.rglob("*") if p.is_file())
