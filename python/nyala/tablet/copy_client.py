"""Tablet copy, target side: downloading a session's files in checked chunks.

``CopySource`` is what the target needs from a source server (the tablet server implements it
over gRPC; tests may use a ``CopySessionManager`` in the same process). ``download_files``
fetches files in parallel, each chunk by chunk in order; every chunk is checked before it is
written — its offset is the one asked for, its CRC32C matches, it is not empty before the end
and does not run past the file's length — and a chunk that fails the check is fetched again up
to ``chunk_attempts_max`` times before the copy fails with ``CorruptionError``. Each file is
fsynced, then its directory. A ``RateLimiter`` caps the bytes per second of one copy.

Owns: the files it writes under the directories it is given, nothing else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nyala import _native
from nyala.common import metafile
from nyala.errors import CorruptionError, InvalidArgumentError
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
    chunk_attempts_max: int = CHUNK_ATTEMPTS_MAX
    rate_bytes_per_s: int = 0  # 0: unlimited

    def __post_init__(self) -> None:
        assert self.chunk_bytes > 0
        assert self.parallel_files_max > 0
        assert self.chunk_attempts_max > 0
        assert self.rate_bytes_per_s >= 0


def check_chunk(chunk: DataChunk, name: str, offset: int) -> None:
    """Raises ``CorruptionError`` unless ``chunk`` is the next valid piece of ``name``."""
    if chunk.offset != offset:
        raise CorruptionError(f"{name}: asked for offset {offset}, got {chunk.offset}")
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
) -> None:
    """Fetches every ``(kind, file, destination)``, ``parallel_files_max`` at a time."""
    limiter = RateLimiter(options.rate_bytes_per_s)
    gate = asyncio.Semaphore(options.parallel_files_max)

    async def one(kind: DataKind, file: DataFile, dest: Path) -> None:
        async with gate:
            await _download_file(source, session_id, kind, file, dest, options, limiter, progress)

    try:
        async with asyncio.TaskGroup() as group:
            for kind, file, dest in files:
                group.create_task(one(kind, file, dest))
    except ExceptionGroup as failures:
        raise failures.exceptions[0] from None  # the first failure says why the copy failed
    for directory in sorted({dest.parent for _, _, dest in files}):
        await asyncio.to_thread(metafile.fsync_dir, directory)


async def _download_file(
    source: CopySource,
    session_id: str,
    kind: DataKind,
    file: DataFile,
    dest: Path,
    options: DownloadOptions,
    limiter: RateLimiter,
    progress: Progress,
) -> None:
    if dest.name != file.name or "/" in file.name or file.name in ("", ".", ".."):
        raise InvalidArgumentError(f"refusing to write a source file named {file.name!r}")
    fd = await asyncio.to_thread(
        os.open, dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644
    )
    try:
        offset, total = 0, file.size_bytes
        while offset < total:
            await limiter.acquire(min(options.chunk_bytes, total - offset))
            chunk = await _fetch_checked(source, session_id, kind, file.name, offset, options)
            await asyncio.to_thread(os.pwrite, fd, chunk.data, offset)
            offset += len(chunk.data)
            progress.bytes_done += len(chunk.data)
            if chunk.total_bytes != total:
                # A WAL segment may still grow; the image needs at least what was listed.
                progress.bytes_total += chunk.total_bytes - total
                total = chunk.total_bytes
        await asyncio.to_thread(os.fsync, fd)
    finally:
        os.close(fd)


async def _fetch_checked(
    source: CopySource,
    session_id: str,
    kind: DataKind,
    name: str,
    offset: int,
    options: DownloadOptions,
) -> DataChunk:
    for attempt in range(1, options.chunk_attempts_max + 1):
        chunk = await source.fetch(session_id, kind, name, offset, options.chunk_bytes)
        try:
            check_chunk(chunk, name, offset)
            return chunk
        except CorruptionError as exc:
            if attempt == options.chunk_attempts_max:
                raise
            log.warning("copy session %s: %s; fetching it again", session_id, exc)
    raise AssertionError("unreachable")
