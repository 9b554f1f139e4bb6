"""Tablet copy on a server: the ``TabletCopyService`` RPCs and their wiring.

Tablet servers and masters both host it (a master copies the sys catalog to a new master whose
WAL could not catch it up). ``TabletCopy`` is the server's tablet-copy component. It owns

* the source side: a ``CopySessionManager`` behind BeginTabletCopySession / FetchData /
  EndTabletCopySession, with a loop that expires idle sessions, and, on a server without TLS,
  the data channel (``nyala._native.CopyDataServer``, docs/tablet-copy.md) that serves the
  sessions' files natively; its port and each session's token go in the
  BeginTabletCopySession answer. FetchData answers are built by
  ``nyala._native.CopyFile.read_message``: the chunk is read straight into the serialized
  answer on the copy I/O pool, with no other copy;
* the target side: ``TabletCopyJobs`` behind StartTabletCopy / ListTabletCopies /
  CancelTabletCopy and the ``/tablet-copies`` page, downloading through ``GrpcCopySource``,
  which takes each chunk from the received answer without a copy;
* the copy I/O pool (``CopyIoPool``), the bounded threads both sides read, check and write on;
* auto-vivification on leaders: each replica's runtime reports a follower that needs a copy
  (``StartTabletCopy`` effect) and its transport reports a follower answering
  TABLET_NOT_FOUND; ``TabletCopy`` then sends StartTabletCopy to that follower, one call in
  flight per follower, again on every report until the follower answers with a log;
* periodic WAL GC of every replica (anchors: unflushed ops and copy sessions).

The server creates it, registers its service (``add_tablet_copy_service``), starts its loops
in its task group and hooks every replica it starts (``hook_replica``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import grpc

from nyala import _native
from nyala._proto import common_pb2, tablet_copy_pb2, tablet_copy_pb2_grpc
from nyala.common.clock import RealClock
from nyala.consensus.effects import StartTabletCopy
from nyala.consensus.metadata import decode_cmeta
from nyala.consensus.runtime.transport import GrpcTransport
from nyala.consensus.types import OpId
from nyala.errors import (
    CorruptionError,
    IllegalStateError,
    InvalidArgumentError,
    NotFoundError,
    NyalaError,
    TabletFailedError,
)
from nyala.rpc import Context, HttpResponse, RpcMetrics, ServiceBase, unary
from nyala.rpc.channel import ServerProxy
from nyala.rpc.errors import join_host_port, raise_for_response, split_host_port
from nyala.rpc.http import HttpRequest, Route
from nyala.rpc.server import override_serializers
from nyala.rpc.service import unary_serialized
from nyala.rpc.settings import RpcSettings
from nyala.server.convert import config_to_pb
from nyala.server.settings import ServerSettings
from nyala.server.web_ui import (
    Cell,
    Markup,
    PageFrame,
    code,
    form_button,
    heading,
    human_bytes,
    link,
    paragraph,
    state,
    table,
    wants_json,
)
from nyala.tablet import TabletManager
from nyala.tablet.copy_client import DownloadOptions
from nyala.tablet.copy_io import CopyIoPool
from nyala.tablet.copy_jobs import CopyJob, StartReplica, StopReplica, TabletCopyJobs
from nyala.tablet.copy_source import (
    CopySessionInfo,
    CopySessionManager,
    DataChunk,
    DataFile,
    DataKind,
)
from nyala.tablet.replica import TabletReplica

log = logging.getLogger(__name__)

_KIND_TO_PB = {
    DataKind.ROWSET_FILE: tablet_copy_pb2.DataIdPB.ROWSET_FILE,
    DataKind.WAL_SEGMENT: tablet_copy_pb2.DataIdPB.LOG_SEGMENT,
}
_PB_TO_KIND = {v: k for k, v in _KIND_TO_PB.items()}
SESSION_EXPIRY_CHECK_S = 5.0
#: ``FetchDataResponsePB.data``: appended by the source after the rest of the answer, taken
#: from the received answer by the target.
_DATA_FIELD = tablet_copy_pb2.FetchDataResponsePB.DESCRIPTOR.fields_by_name["data"].number


#: Connections the data channel serves at once (each target copy uses
#: ``tablet_copy_chunks_in_flight_max`` of them).
DATA_CHANNEL_CONNECTIONS_MAX = 64
#: A data channel connection with no request for this long is closed (a download keeps its
#: connections busy until it ends, then closes them; this is for targets that died).
DATA_CHANNEL_IDLE_TIMEOUT_MS = 60_000


def _data_channel(settings: ServerSettings, host: str) -> _native.CopyDataServer | None:
    """The data channel of a server without TLS (docs/tablet-copy.md), on ``host`` (its RPC
    host) and ``tablet_copy_data_channel_port``; None when the setting is off or the server
    uses TLS (the channel has no encryption: copies then go over FetchData)."""
    if not settings.tablet_copy_data_channel or settings.security_dir:
        return None
    return _native.CopyDataServer(
        host,
        settings.tablet_copy_data_channel_port,
        chunk_bytes_max=settings.tablet_copy_chunk_bytes,
        connections_max=DATA_CHANNEL_CONNECTIONS_MAX,
        idle_timeout_ms=DATA_CHANNEL_IDLE_TIMEOUT_MS,
    )


def job_to_pb(job: CopyJob) -> tablet_copy_pb2.TabletCopyJobPB:
    """The ``TabletCopyJobPB`` of a job."""
    return tablet_copy_pb2.TabletCopyJobPB(
        job_id=job.job_id,
        tablet_id=job.tablet_id,
        source_uuid=job.source_uuid,
        source_addr=job.source_addr,
        state=job.state.value,
        bytes_done=job.progress.bytes_done,
        bytes_total=job.progress.bytes_total,
        rate_bytes_per_s=job.rate_bytes_per_s,
        elapsed_s=job.elapsed_s,
        error=job.error,
    )


def _job_row(job: CopyJob) -> tuple[Cell, ...]:
    """One copy job as a row of ``/tablet-copies``."""
    done, total = job.progress.bytes_done, job.progress.bytes_total
    bar = f'<progress value="{done}" max="{max(total, 1)}"></progress> '
    progress = Markup(bar + f"{human_bytes(done)} of {human_bytes(total)}")
    running = job.state.value == "RUNNING"
    cancel = form_button("/tablet-copies/cancel", "Cancel", {"id": job.job_id}) if running else ""
    return (
        code(job.job_id),
        code(job.tablet_id),
        code(job.source_addr),
        state(job.state.value),
        progress,
        f"{human_bytes(job.rate_bytes_per_s)}/s",
        f"{job.elapsed_s:.1f} s",
        cancel,
        job.error,
    )


def fetch_data_answer(file: _native.CopyFile, offset: int, length: int) -> bytes:
    """The serialized ``FetchDataResponsePB`` of the chunk at ``offset`` (blocking: a read)."""

    def prefix(crc32c: int, _length: int) -> bytes:
        chunk = tablet_copy_pb2.DataChunkPB(
            offset=offset, total_data_length_bytes=file.length, crc32c=crc32c
        )
        return tablet_copy_pb2.FetchDataResponsePB(chunk=chunk).SerializeToString()

    return file.read_message(offset, length, _DATA_FIELD, prefix)


def chunk_from_answer(answer: bytes) -> DataChunk:
    """The chunk of a serialized ``FetchDataResponsePB``, its data a view into ``answer``;
    raises the answer's error if it has one."""
    try:
        head, data_range = _native.split_proto_field(answer, _DATA_FIELD)
        pb = tablet_copy_pb2.FetchDataResponsePB.FromString(head)
    except Exception as exc:  # a field running past the end, protobuf's DecodeError
        raise CorruptionError(f"malformed FetchData answer: {exc}") from None
    raise_for_response(pb)
    start, end = data_range if data_range is not None else (0, 0)
    chunk = pb.chunk
    return DataChunk(
        chunk.offset, memoryview(answer)[start:end], chunk.total_data_length_bytes, chunk.crc32c
    )


class GrpcCopySource:
    """A ``CopySource`` over gRPC to the source server (one channel per copy)."""

    def __init__(self, my_uuid: str, source_uuid: str, address: str, settings: RpcSettings) -> None:
        self._my_uuid = my_uuid
        self._source_uuid = source_uuid
        self._host = split_host_port(address)[0]
        self._proxy = ServerProxy(address, settings)

    async def begin(self, tablet_id: str) -> CopySessionInfo:
        """BeginTabletCopySession."""
        proxy = self._proxy
        pb = await proxy.admin_call(
            proxy.tablet_copy.BeginTabletCopySession,
            tablet_copy_pb2.BeginTabletCopySessionRequestPB(
                dest_uuid=self._source_uuid, requestor_uuid=self._my_uuid, tablet_id=tablet_id
            ),
        )
        return CopySessionInfo(
            session_id=pb.session_id,
            idle_timeout_ms=pb.session_idle_timeout_ms,
            superblock=pb.superblock,
            cmeta=pb.cmeta,
            rowset_manifest=pb.rowset_manifest,
            last_flushed_index=pb.last_flushed_index,
            rowset_files=tuple(DataFile(f.file_name, f.size_bytes) for f in pb.rowset_files),
            wal_segments=tuple(DataFile(f.file_name, f.size_bytes) for f in pb.wal_segments),
            # The channel listens on the source's RPC host: the one this copy reached it at.
            data_channel_address=(
                join_host_port(self._host, pb.data_channel_port) if pb.data_channel_port else ""
            ),
            data_channel_token=pb.data_channel_token,
        )

    async def fetch(
        self, session_id: str, kind: DataKind, name: str, offset: int, max_length_bytes: int
    ) -> DataChunk:
        """FetchData; the chunk's data is a view into the received answer."""
        proxy = self._proxy
        request = tablet_copy_pb2.FetchDataRequestPB(
            dest_uuid=self._source_uuid,
            session_id=session_id,
            data_id=tablet_copy_pb2.DataIdPB(type=_KIND_TO_PB[kind], file_name=name),
            offset=offset,
            max_length_bytes=max_length_bytes,
        )
        answer = await proxy.call_serialized(
            proxy.fetch_data_serialized, request, proxy.settings.admin_timeout_ms
        )
        return chunk_from_answer(answer)

    async def end(self, session_id: str, success: bool) -> None:
        """EndTabletCopySession."""
        proxy = self._proxy
        await proxy.call(
            proxy.tablet_copy.EndTabletCopySession,
            tablet_copy_pb2.EndTabletCopySessionRequestPB(
                dest_uuid=self._source_uuid, session_id=session_id, is_success=success
            ),
        )

    async def close(self) -> None:
        """Closes the channel."""
        await self._proxy.close()


class TabletCopy:
    """The tablet-copy component of one server (see the module docstring)."""

    def __init__(
        self,
        server_uuid: str,
        settings: ServerSettings,
        tablets: TabletManager,
        *,
        start_replica: StartReplica,
        stop_replica: StopReplica,
    ) -> None:
        self.uuid = server_uuid
        self.settings = settings
        self.tablets = tablets
        self.io = CopyIoPool(settings.tablet_copy_io_threads_max)
        host = split_host_port(settings.rpc_bind)[0]
        self.channel = _data_channel(settings, host)
        self.sessions = CopySessionManager(
            RealClock(),
            idle_timeout_ms=settings.tablet_copy_session_idle_timeout_ms,
            chunk_bytes=settings.tablet_copy_chunk_bytes,
            channel=self.channel,
            channel_address="" if self.channel is None else join_host_port(host, self.channel.port),
        )
        self.jobs = TabletCopyJobs(
            tablets,
            connect=lambda uuid, addr: GrpcCopySource(
                server_uuid, uuid, addr, settings.rpc_settings()
            ),
            stop_replica=stop_replica,
            start_replica=start_replica,
            io=self.io,
            options=DownloadOptions(
                chunk_bytes=settings.tablet_copy_chunk_bytes,
                parallel_files_max=settings.tablet_copy_parallel_files_max,
                chunks_in_flight_max=settings.tablet_copy_chunks_in_flight_max,
                rate_bytes_per_s=settings.tablet_copy_rate_bytes_per_s,
                use_data_channel=settings.tablet_copy_data_channel,
                channel_chunk_bytes=settings.tablet_copy_data_channel_chunk_bytes,
                channel_timeout_ms=settings.rpc_admin_timeout_ms,
            ),
            concurrency_max=settings.tablet_copy_concurrency_max,
        )
        self.corrupt_chunks_left = settings.tablet_copy_inject_corrupt_chunks
        if self.channel is not None:
            self.channel.inject_corrupt_chunks(self.corrupt_chunks_left)
        # Bytes of chunks served as a source in FetchData answers (``bytes_served``).
        self._rpc_bytes_served = 0
        self._group: asyncio.TaskGroup | None = None
        self._vivifying: set[tuple[str, str]] = set()  # (tablet, peer) with a call in flight
        self._proxies: dict[str, ServerProxy] = {}

    @property
    def bytes_served(self) -> int:
        """Bytes of chunks served as a source, over RPC and the data channel (/metrics)."""
        on_channel = 0 if self.channel is None else self.channel.bytes_served
        return self._rpc_bytes_served + on_channel

    def count_served(self, n: int) -> None:
        """Counts ``n`` bytes of a FetchData answer in ``bytes_served``."""
        self._rpc_bytes_served += n

    # --- life cycle ---------------------------------------------------------------------------

    def start(self, group: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """Starts the background loops in ``group``; returns them (cancel them to stop)."""
        self._group = group
        self.jobs.attach(group)
        return [
            group.create_task(self._expire_sessions_loop(), name="copy-session-expiry"),
            group.create_task(self._wal_gc_loop(), name="wal-gc"),
        ]

    async def close(self) -> None:
        """Cancels running copies, ends every source session and closes the channels."""
        self.jobs.cancel_all()
        self.jobs.attach(None)
        self._group = None
        self.sessions.close_all()
        if self.channel is not None:
            self.channel.close()
        proxies, self._proxies = self._proxies, {}
        for proxy in proxies.values():
            await proxy.close()
        self.io.close()

    async def _expire_sessions_loop(self) -> None:
        while True:
            await asyncio.sleep(SESSION_EXPIRY_CHECK_S)
            self.sessions.expire_idle()

    async def _wal_gc_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.wal_gc_interval_ms / 1000)
            for replica in self.tablets.replicas():
                try:
                    removed, first = await asyncio.to_thread(replica.gc_wal)
                except NyalaError as exc:
                    log.warning("WAL GC of tablet %s failed: %s", replica.tablet_id, exc)
                    continue
                if removed:
                    log.info(
                        "WAL GC of tablet %s: %d segments removed, first index %d",
                        replica.tablet_id,
                        removed,
                        first,
                    )

    # --- auto-vivification (leader side) ------------------------------------------------------

    def hook_replica(self, replica: TabletReplica) -> None:
        """Connects a started replica's runtime and transport to auto-vivification."""
        runtime, transport = replica.runtime, replica.transport
        if runtime is None:
            return
        runtime.on_start_copy = lambda effect: self._on_start_copy(replica, effect)
        if isinstance(transport, GrpcTransport):
            transport.on_tablet_not_found = runtime.peer_needs_copy
            transport.on_tablet_failed = runtime.peer_failed

    def _on_start_copy(self, replica: TabletReplica, effect: StartTabletCopy) -> None:
        key = (replica.tablet_id, effect.peer_uuid)
        group = self._group
        if group is None or key in self._vivifying:
            return
        self._vivifying.add(key)
        group.create_task(self._send_start_copy(replica, effect, key))

    def _start_copy_request(
        self, replica: TabletReplica, effect: StartTabletCopy
    ) -> tuple[str, tablet_copy_pb2.StartTabletCopyRequestPB] | None:
        """The follower's address and the request, or None if either end left the config."""
        runtime, wal = replica.runtime, replica.wal
        if runtime is None or wal is None:
            return None
        config = runtime.core.active_config
        peer, me = config.peer(effect.peer_uuid), config.peer(self.uuid)
        if peer is None or me is None or not peer.address or not me.address:
            return None
        host, port = split_host_port(me.address)
        request = tablet_copy_pb2.StartTabletCopyRequestPB(
            dest_uuid=effect.peer_uuid,
            tablet_id=replica.tablet_id,
            copy_peer_uuid=self.uuid,
            copy_peer_addr=common_pb2.HostPortPB(host=host, port=port),
            caller_term=effect.term,
            caller_log_first_index=wal.first_index(),
        )
        seen = effect.target_last_op_id
        if seen is not None:
            request.target_last_op_id.CopyFrom(common_pb2.OpIdPB(term=seen.term, index=seen.index))
        return peer.address, request

    async def _send_start_copy(
        self, replica: TabletReplica, effect: StartTabletCopy, key: tuple[str, str]
    ) -> None:
        try:
            built = self._start_copy_request(replica, effect)
            if built is None:
                return
            address, request = built
            proxy = self._proxy(address)
            response = await proxy.call(proxy.tablet_copy.StartTabletCopy, request)
            log.info(
                "tablet %s: %s copies it from here (job %s)",
                replica.tablet_id,
                effect.peer_uuid,
                response.job_id,
            )
        except (TabletFailedError, CorruptionError) as exc:
            # Its replica failed or its metadata is damaged: no copy can start there, and
            # waiting does not help (health FAILED_UNRECOVERABLE, so the master replaces it).
            runtime = replica.runtime
            if runtime is not None:
                runtime.peer_failed(effect.peer_uuid, f"tablet copy refused: {exc}")
        except NyalaError as exc:
            log.debug("StartTabletCopy of %s on %s: %s", key[0], key[1], exc)
        finally:
            self._vivifying.discard(key)

    def _proxy(self, address: str) -> ServerProxy:
        proxy = self._proxies.get(address)
        if proxy is None:
            proxy = self._proxies[address] = ServerProxy(address, self.settings.rpc_settings())
        return proxy

    # --- visibility ---------------------------------------------------------------------------

    async def http_page(self, request: HttpRequest, frame: PageFrame) -> HttpResponse:
        """``/tablet-copies``: every copy job (with progress and, while it runs, a cancel
        button) and the open source sessions; JSON unless a browser asks (``wants_json``)."""
        if wants_json(request):
            body = json.dumps(
                {
                    "server_uuid": self.uuid,
                    "jobs": [job.to_json() for job in self.jobs.jobs()],
                    "source_sessions": self.sessions.session_ids(),
                },
                indent=1,
            )
            return HttpResponse(200, body.encode() + b"\n", "application/json")
        jobs = [_job_row(job) for job in reversed(self.jobs.jobs())]
        headers = ("job", "tablet", "source", "state", "progress", "rate", "elapsed", "", "error")
        sessions = [(code(sid),) for sid in self.sessions.session_ids()]
        return frame.render(
            "Tablet copies",
            heading("Copies onto this server"),
            table(headers, jobs),
            heading("Sessions served as a source"),
            table(("session",), sessions),
            paragraph(
                "As JSON: ", link("/tablet-copies", "/tablet-copies?format=json", format="json")
            ),
        )

    def http_post_routes(self, frame: Callable[[], PageFrame]) -> dict[str, Route]:
        """The web UI's actions on copies: ``POST /tablet-copies/cancel`` (form field ``id``)
        cancels a running job, as CancelTabletCopy does, and returns to the list."""

        async def cancel(request: HttpRequest) -> HttpResponse:
            job_id = request.param("id")
            try:
                self.jobs.cancel(job_id)
            except (NotFoundError, IllegalStateError) as exc:
                status = 404 if isinstance(exc, NotFoundError) else 409
                page = frame().render("Cancel failed", paragraph(str(exc)), status=status)
                return page
            log.info("tablet copy job %s cancelled from the web UI", job_id)
            return HttpResponse(303, b"", headers=(("Location", "/tablet-copies"),))

        return {"/tablet-copies/cancel": cancel}

    def service(self, metrics: RpcMetrics) -> TabletCopyService:
        """The RPC service over this component (register it with ``add_tablet_copy_service``)."""
        return TabletCopyService(self, metrics)


def add_tablet_copy_service(servicer: TabletCopyService, server: grpc.aio.Server) -> None:
    """Registers the TabletCopyService, FetchData answering with the bytes its handler
    serialized (``fetch_data_answer``)."""
    override = override_serializers(server, {}, frozenset({"FetchData"}))
    tablet_copy_pb2_grpc.add_TabletCopyServiceServicer_to_server(servicer, override)


class TabletCopyService(ServiceBase, tablet_copy_pb2_grpc.TabletCopyServiceServicer):
    """The TabletCopyService RPCs (proto/nyala/tablet_copy.proto)."""

    def __init__(self, copy: TabletCopy, metrics: RpcMetrics) -> None:
        super().__init__(copy.uuid, metrics)
        self._copy = copy

    @unary(tablet_copy_pb2.BeginTabletCopySessionResponsePB)
    async def BeginTabletCopySession(
        self,
        request: tablet_copy_pb2.BeginTabletCopySessionRequestPB,
        context: Context[
            tablet_copy_pb2.BeginTabletCopySessionRequestPB,
            tablet_copy_pb2.BeginTabletCopySessionResponsePB,
        ],
    ) -> tablet_copy_pb2.BeginTabletCopySessionResponsePB:
        replica = self._copy.tablets.replica(request.tablet_id)
        info = await self._copy.io.run(self._copy.sessions.begin, request.requestor_uuid, replica)
        response = tablet_copy_pb2.BeginTabletCopySessionResponsePB(
            session_id=info.session_id,
            session_idle_timeout_ms=info.idle_timeout_ms,
            superblock=info.superblock,
            cmeta=info.cmeta,
            rowset_manifest=info.rowset_manifest,
            last_flushed_index=info.last_flushed_index,
        )
        cmeta = decode_cmeta(info.cmeta)
        response.initial_cstate.current_term = cmeta.current_term
        response.initial_cstate.committed_config.CopyFrom(config_to_pb(cmeta.committed_config))
        for f in info.rowset_files:
            response.rowset_files.add(file_name=f.name, size_bytes=f.size_bytes)
        for f in info.wal_segments:
            response.wal_segments.add(file_name=f.name, size_bytes=f.size_bytes)
            seqno = f.name.removeprefix("wal-")
            if seqno.isdigit():
                response.wal_segment_seqnos.append(int(seqno))
        if info.data_channel_address:
            response.data_channel_port = split_host_port(info.data_channel_address)[1]
            response.data_channel_token = info.data_channel_token
        return response

    # The answer is serialized here (the method is registered with its response serializer
    # replaced, ``add_tablet_copy_service``), hence bytes where the generated base says a message.
    @unary_serialized(tablet_copy_pb2.FetchDataResponsePB)
    async def FetchData(  # type: ignore[override]
        self,
        request: tablet_copy_pb2.FetchDataRequestPB,
        context: Context[tablet_copy_pb2.FetchDataRequestPB, bytes],
    ) -> bytes:
        kind = _PB_TO_KIND.get(request.data_id.type)
        if kind is None:
            raise InvalidArgumentError(f"unknown data id type {request.data_id.type}")
        sessions = self._copy.sessions
        file = sessions.file(request.session_id, kind, request.data_id.file_name)
        length = sessions.chunk_length(request.max_length_bytes)
        answer = await self._copy.io.run(fetch_data_answer, file, request.offset, length)
        if self._copy.corrupt_chunks_left > 0 and length > 0:
            self._copy.corrupt_chunks_left -= 1
            damaged = bytearray(answer)  # after the CRC: the target must notice
            damaged[-1] ^= 0xFF
            answer = bytes(damaged)
        self._copy.count_served(len(answer))
        return answer

    @unary(tablet_copy_pb2.EndTabletCopySessionResponsePB)
    async def EndTabletCopySession(
        self,
        request: tablet_copy_pb2.EndTabletCopySessionRequestPB,
        context: Context[
            tablet_copy_pb2.EndTabletCopySessionRequestPB,
            tablet_copy_pb2.EndTabletCopySessionResponsePB,
        ],
    ) -> tablet_copy_pb2.EndTabletCopySessionResponsePB:
        await self._copy.io.run(self._copy.sessions.end, request.session_id)
        return tablet_copy_pb2.EndTabletCopySessionResponsePB()

    @unary(tablet_copy_pb2.StartTabletCopyResponsePB)
    async def StartTabletCopy(
        self,
        request: tablet_copy_pb2.StartTabletCopyRequestPB,
        context: Context[
            tablet_copy_pb2.StartTabletCopyRequestPB, tablet_copy_pb2.StartTabletCopyResponsePB
        ],
    ) -> tablet_copy_pb2.StartTabletCopyResponsePB:
        addr = request.copy_peer_addr
        seen = request.target_last_op_id if request.HasField("target_last_op_id") else None
        job = self._copy.jobs.start(
            request.tablet_id,
            request.copy_peer_uuid,
            join_host_port(addr.host, addr.port) if addr.host else "",
            request.caller_term,
            request.caller_log_first_index,
            target_last_op_id=None if seen is None else OpId(seen.term, seen.index),
        )
        return tablet_copy_pb2.StartTabletCopyResponsePB(job_id=job.job_id)

    @unary(tablet_copy_pb2.ListTabletCopiesResponsePB, allow_empty_dest=True)
    async def ListTabletCopies(
        self,
        request: tablet_copy_pb2.ListTabletCopiesRequestPB,
        context: Context[
            tablet_copy_pb2.ListTabletCopiesRequestPB, tablet_copy_pb2.ListTabletCopiesResponsePB
        ],
    ) -> tablet_copy_pb2.ListTabletCopiesResponsePB:
        return tablet_copy_pb2.ListTabletCopiesResponsePB(
            jobs=[job_to_pb(job) for job in self._copy.jobs.jobs()]
        )

    @unary(tablet_copy_pb2.CancelTabletCopyResponsePB, allow_empty_dest=True)
    async def CancelTabletCopy(
        self,
        request: tablet_copy_pb2.CancelTabletCopyRequestPB,
        context: Context[
            tablet_copy_pb2.CancelTabletCopyRequestPB, tablet_copy_pb2.CancelTabletCopyResponsePB
        ],
    ) -> tablet_copy_pb2.CancelTabletCopyResponsePB:
        job = self._copy.jobs.cancel(request.job_id)
        return tablet_copy_pb2.CancelTabletCopyResponsePB(job=job_to_pb(job))
