"""Tablet copy, target side: downloading a session's files in checked chunks.

``CopySource`` is what the target needs from a source server (the tablet server implements it
over gRPC; tests may use a ``CopySessionManager`` in the same process). ``download_files``
fetches up to ``parallel_files_max`` files at once, with up to ``chunks_in_flight_max`` chunks
of the copy out at once over all of them, so a single large file is fetched several chunks at
a time too (each chunk is written at its own offset). Every chunk is checked before it is
written — its offset is the one asked for, the file's length is the one the session listed
(sessions serve fixed lengths), its CRC32C matches, it is not empty before the end and does
not run past the file's length — and a chunk that fails the check is fetched again up to
``chunk_attempts_max`` times before the copy fails with ``CorruptionError``. Checks, writes
and syncs run on the copy I/O pool (``CopyIoPool``), never on the event loop. Each chunk's
writeback starts as soon as it is written; each file is fsynced, then its directory. A
``RateLimiter`` caps the bytes per second of one copy.

When the session names a data channel (``DataChannel``) the chunks come over it instead of
``CopySource.fetch``: one native call (``nyala._native.CopyDownload``, on a thread of its own)
fetches, checks, writes and syncs every file with ``chunks_in_flight_max`` connections, the
same checks and limits, and no Python per chunk; the event loop only polls its progress. If
the channel cannot be reached at all (nothing written yet), the copy falls back to
``fetch``.

Owns: the files it writes under the directories it is given, nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nyala import _native
from nyala.common import metafile
from nyala.errors import CorruptionError, InvalidArgumentError, ServiceUnavailableError
from nyala.tablet.copy_io import CopyIoPool
from nyala.tablet.copy_source import CopySessionInfo, DataChunk, DataFile, DataKind

log = logging.getLogger(__name__)

CHUNK_ATTEMPTS_MAX = 3


class CopySource(Protocol):
    """The calls a target makes on the source server of a copy."""

    async def begin(self, tablet_id: str) -> CopySessionInfo:
        """Opens a session (BeginTabletCopySession)."""
        ...

    async def fetch(
        self, session_id: str, kind: DataKind, name: str, offset: int, max_length_bytes: int
    ) -> DataChunk:
        """One chunk (FetchData)."""
        ...

    async def end(self, session_id: str, success: bool) -> None:
        """Closes the session (EndTabletCopySession)."""
        ...


class RateLimiter:
    """A token bucket over bytes: ``acquire(n)`` waits until ``n`` bytes may pass.

    ``bytes_per_s == 0`` means unlimited. The bucket holds at most one second of tokens, so a
    pause is never followed by a burst larger than that.
    """

    def __init__(self, bytes_per_s: int) -> None:
        assert bytes_per_s >= 0
        self.bytes_per_s = bytes_per_s
        self._tokens = float(bytes_per_s)
        self._last_s = time.monotonic()
        self._lock = asyncio.Lock()

    async def acquire(self, n: int) -> None:
        """Waits until ``n`` more bytes fit in the rate."""
        if self.bytes_per_s == 0:
            return
        async with self._lock:  # one waiter at a time keeps the order fair
            now = time.monotonic()
            self._tokens = min(
                float(self.bytes_per_s), self._tokens + (now - self._last_s) * self.bytes_per_s
            )
            self._last_s = now
            self._tokens -= n
            if self._tokens < 0:
                await asyncio.sleep(-self._tokens / self.bytes_per_s)


@dataclass
class Progress:
    """Bytes of one copy, updated as chunks are written."""

    bytes_total: int = 0
    bytes_done: int = 0


@dataclass(frozen=True, slots=True)
class DownloadOptions:
    """Limits of one copy's downloads, with their units."""

    chunk_bytes: int = 4 << 20
    parallel_files_max: int = 4  # files fetched at once within one session
    # Chunks requested and not yet written, over all files of one copy (memory: this many
    # chunks); a lone large file gets all of them.
    chunks_in_flight_max: int = 4
    chunk_attempts_max: int = CHUNK_ATTEMPTS_MAX
    rate_bytes_per_s: int = 0  # 0: unlimited
    # Download over the session's data channel when it has one, asking for this many bytes
    # at a time there.
    use_data_channel: bool = True
    channel_chunk_bytes: int = 512 << 10
    # Over a data channel: connecting, and each read or write on a connection, fails after
    # this long.
    channel_timeout_ms: int = 30_000

    def __post_init__(self) -> None:
        assert self.chunk_bytes > 0
        assert self.parallel_files_max > 0
        assert self.chunks_in_flight_max > 0
        assert self.chunk_attempts_max > 0
        assert self.rate_bytes_per_s >= 0
        assert self.channel_timeout_ms > 0
        assert self.channel_chunk_bytes > 0


@dataclass(frozen=True, slots=True)
class DataChannel:
    """Where a session's files are served natively: ``address`` (``host:port``) and the
    ``token`` naming the session there."""

    address: str
    token: bytes


def check_chunk(chunk: DataChunk, name: str, offset: int, total_bytes: int) -> None:
    """Raises ``CorruptionError`` unless ``chunk`` is the next valid piece of ``name``, a file
    of ``total_bytes``."""
    if chunk.offset != offset:
        raise CorruptionError(f"{name}: asked for offset {offset}, got {chunk.offset}")
    if chunk.total_bytes != total_bytes:
        raise CorruptionError(
            f"{name}: the session listed {total_bytes} bytes, the chunk says {chunk.total_bytes}"
        )
    if chunk.offset + len(chunk.data) > chunk.total_bytes:
        raise CorruptionError(
            f"{name}: chunk at {chunk.offset} of {len(chunk.data)} bytes runs past the file's "
            f"{chunk.total_bytes} bytes"
        )
    if not chunk.data and chunk.offset < chunk.total_bytes:
        raise CorruptionError(f"{name}: empty chunk at {chunk.offset} of {chunk.total_bytes}")
    actual = _native.crc32c(chunk.data)
    if actual != chunk.crc32c:
        raise CorruptionError(
            f"{name}: chunk at {chunk.offset} has CRC32C {actual:#010x}, "
            f"the source sent {chunk.crc32c:#010x}"
        )


async def download_files(
    source: CopySource,
    session_id: str,
    files: Sequence[tuple[DataKind, DataFile, Path]],
    options: DownloadOptions,
    progress: Progress,
    io: CopyIoPool,
    channel: DataChannel | None = None,
) -> None:
    """Fetches every ``(kind, file, destination)`` (see the module docstring). Over a
    ``channel``, ``files`` must be all of the session's files in the order it listed them
    (rowset files, then WAL segments): that order numbers them there."""
    for _, file, dest in files:
        if dest.name != file.name or "/" in file.name or file.name in ("", ".", ".."):
            raise InvalidArgumentError(f"refusing to write a source file named {file.name!r}")
    if channel is None or not await _download_over_channel(channel, files, options, progress, io):
        await _download_over_rpc(source, session_id, files, options, progress, io)
    for directory in sorted({dest.parent for _, _, dest in files}):
        await io.run(metafile.fsync_dir, directory)


async def _open_destination(io: CopyIoPool, dest: Path) -> int:
    """``dest`` opened for the copy's writes (created, or emptied)."""
    return await io.run(os.open, dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)


async def _download_over_rpc(
    source: CopySource,
    session_id: str,
    files: Sequence[tuple[DataKind, DataFile, Path]],
    options: DownloadOptions,
    progress: Progress,
    io: CopyIoPool,
) -> None:
    """Every file through ``source.fetch``, ``parallel_files_max`` at a time."""
    fetcher = _Fetcher(source, session_id, options, progress, io)
    gate = asyncio.Semaphore(options.parallel_files_max)

    async def one(kind: DataKind, file: DataFile, dest: Path) -> None:
        async with gate:
            await fetcher.download(kind, file, dest)

    try:
        async with asyncio.TaskGroup() as group:
            for kind, file, dest in files:
                group.create_task(one(kind, file, dest))
    except ExceptionGroup as failures:
        raise failures.exceptions[0] from None  # the first failure says why the copy failed


async def _download_over_channel(
    channel: DataChannel,
    files: Sequence[tuple[DataKind, DataFile, Path]],
    options: DownloadOptions,
    progress: Progress,
    io: CopyIoPool,
) -> bool:
    """Every file over the data channel (see the module docstring), at most
    ``CHANNEL_FILES_PER_CALL`` of them open at once; False, with nothing written, if the
    channel could not be used at all (the caller then fetches over RPC). The caller syncs the
    directories."""
    numbered = list(enumerate(files))  # the session's numbers
    for start in range(0, len(numbered), CHANNEL_FILES_PER_CALL):
        batch = numbered[start : start + CHANNEL_FILES_PER_CALL]
        download = _native.CopyDownload()
        fds: list[int] = []
        try:
            for _, (_, _, dest) in batch:
                fds.append(await _open_destination(io, dest))
            pairs = zip(batch, fds, strict=True)
            targets = [(i, fd, file.size_bytes) for (i, (_, file, _)), fd in pairs]
            await _run_download(download, channel, targets, options, progress)
        except ServiceUnavailableError as exc:
            if start > 0 or download.bytes_done > 0:
                raise
            log.warning("tablet copy: %s; fetching over RPC instead", exc)
            return False
        finally:
            for fd in fds:
                os.close(fd)
            if download.chunks_refetched:
                log.warning(
                    "tablet copy over %s: %d chunks arrived damaged (CRC32C mismatch) and were "
                    "fetched again",
                    channel.address,
                    download.chunks_refetched,
                )
    return True


#: Files a download over the data channel holds open at once (a tablet may have thousands).
CHANNEL_FILES_PER_CALL = 64
CHANNEL_PROGRESS_POLL_S = 0.2


async def _run_download(
    download: _native.CopyDownload,
    channel: DataChannel,
    targets: list[tuple[int, int, int]],
    options: DownloadOptions,
    progress: Progress,
) -> None:
    """Runs ``download`` on a thread of its own, polling its bytes into ``progress``, until it
    finished. Whatever happens to the caller, it returns (or raises) only after the download's
    threads stopped: they write through the caller's descriptors."""
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()

    def settle(error: BaseException | None) -> None:
        if finished.done():
            return
        if error is None:
            finished.set_result(None)
        else:
            finished.set_exception(error)

    def body() -> None:
        error: BaseException | None = None
        try:
            download.run(
                channel.address,
                channel.token,
                targets,
                chunk_bytes=options.channel_chunk_bytes,
                streams=options.chunks_in_flight_max,
                attempts=options.chunk_attempts_max,
                rate_bytes_per_s=options.rate_bytes_per_s,
                timeout_ms=options.channel_timeout_ms,
            )
        except BaseException as exc:  # handed to the event loop, which raises it
            error = exc
        loop.call_soon_threadsafe(settle, error)

    base = progress.bytes_done
    threading.Thread(target=body, name="tablet-copy-download", daemon=True).start()
    try:
        while not finished.done():
            await asyncio.wait({finished}, timeout=CHANNEL_PROGRESS_POLL_S)
            progress.bytes_done = base + download.bytes_done
    except BaseException:
        download.cancel()
        while not finished.done():  # cancelled again meanwhile: keep waiting for the threads
            try:
                await asyncio.wait({finished})
            except asyncio.CancelledError:
                continue
        finished.exception()  # retrieved: the caller's cancellation is what propagates
        raise
    finished.result()


class _Fetcher:
    """The downloads of one copy: its rate, its chunks in flight and its progress."""

    def __init__(
        self,
        source: CopySource,
        session_id: str,
        options: DownloadOptions,
        progress: Progress,
        io: CopyIoPool,
    ) -> None:
        self._source = source
        self._session_id = session_id
        self._options = options
        self._progress = progress
        self._io = io
        self._limiter = RateLimiter(options.rate_bytes_per_s)
        self._in_flight = asyncio.Semaphore(options.chunks_in_flight_max)

    async def download(self, kind: DataKind, file: DataFile, dest: Path) -> None:
        """One file: its chunks fetched by up to ``chunks_in_flight_max`` workers, each
        written at its offset, then the file synced."""
        chunk_bytes = self._options.chunk_bytes
        offsets = iter(range(0, file.size_bytes, chunk_bytes))  # shared: each taken once
        fd = await _open_destination(self._io, dest)
        try:

            async def worker() -> None:
                for offset in offsets:
                    length = min(chunk_bytes, file.size_bytes - offset)
                    async with self._in_flight:
                        await self._copy_range(kind, file, fd, offset, length)

            chunks = -(-file.size_bytes // chunk_bytes)
            async with asyncio.TaskGroup() as group:
                for _ in range(min(chunks, self._options.chunks_in_flight_max)):
                    group.create_task(worker())
            await self._io.run(os.fsync, fd)
        except ExceptionGroup as failures:
            raise failures.exceptions[0] from None
        finally:
            os.close(fd)

    async def _copy_range(
        self, kind: DataKind, file: DataFile, fd: int, offset: int, length: int
    ) -> None:
        """Fetches and writes ``length`` bytes at ``offset`` (in several chunks if the source
        answers with shorter ones than asked for)."""
        end = offset + length
        while offset < end:
            await self._limiter.acquire(end - offset)
            written = await self._fetch_and_write(kind, file, fd, offset, end - offset)
            offset += written
            self._progress.bytes_done += written

    async def _fetch_and_write(
        self, kind: DataKind, file: DataFile, fd: int, offset: int, length: int
    ) -> int:
        attempts = self._options.chunk_attempts_max
        for attempt in range(1, attempts + 1):
            try:
                # A malformed answer is a CorruptionError too: fetched again like a bad CRC.
                chunk = await self._source.fetch(self._session_id, kind, file.name, offset, length)
                return await self._io.run(_check_and_write, fd, chunk, file, offset)
            except CorruptionError as exc:
                if attempt == attempts:
                    raise
                log.warning("copy session %s: %s; fetching it again", self._session_id, exc)
        raise AssertionError("unreachable")


def _check_and_write(fd: int, chunk: DataChunk, file: DataFile, offset: int) -> int:
    """Checks ``chunk`` (``check_chunk``) and writes it at its offset, starting its writeback
    at once (``_native.write_at``: the disk writes while later chunks arrive, and the file's
    fsync has little left to do); returns its length."""
    check_chunk(chunk, file.name, offset, file.size_bytes)
    _native.write_at(fd, chunk.data, offset)  # and its writeback started
    return len(chunk.data)
