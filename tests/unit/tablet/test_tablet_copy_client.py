"""Tablet copy downloads: every chunk checked (offset, length, CRC32C), several chunks of one
file in flight, a source answering with shorter chunks than asked for, a corrupted chunk fetched
again, a persistently corrupted one failing the copy, and the byte-rate limit. Over the data
channel (``nyala._native.CopyDataServer`` and ``CopyDownload``): every file arrives whole with
no FetchData, a damaged chunk is fetched again, an unreachable channel falls back to FetchData,
an ended session is an error (not a fallback), and a cancelled download returns only once
nothing writes any more."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from nyala import _native
from nyala.errors import CorruptionError, NotFoundError
from nyala.tablet import copy_client
from nyala.tablet.copy_client import (
    DataChannel,
    DownloadOptions,
    Progress,
    RateLimiter,
    check_chunk,
    download_files,
)
from nyala.tablet.copy_io import CopyIoPool
from nyala.tablet.copy_source import CopySessionInfo, DataChunk, DataFile, DataKind


class FileSource:
    """Serves files of a directory in chunks, like a source session, corrupting on demand."""

    def __init__(
        self,
        root: Path,
        corrupt_first: int = 0,
        chunk_bytes_max: int = 1 << 30,
        malformed_first: int = 0,
    ) -> None:
        self.root = root
        self.corrupt_left = corrupt_first
        self.malformed_left = malformed_first  # answers that do not parse
        self.chunk_bytes_max = chunk_bytes_max
        self.fetches = 0
        self.in_flight = 0
        self.in_flight_max = 0

    async def begin(self, tablet_id: str) -> CopySessionInfo:
        raise NotImplementedError

    async def fetch(
        self, session_id: str, kind: DataKind, name: str, offset: int, max_length_bytes: int
    ) -> DataChunk:
        self.fetches += 1
        self.in_flight += 1
        self.in_flight_max = max(self.in_flight, self.in_flight_max)
        await asyncio.sleep(0.001)  # an RPC: the other fetches go out meanwhile
        self.in_flight -= 1
        if self.malformed_left:
            self.malformed_left -= 1
            raise CorruptionError("malformed FetchData answer")  # as chunk_from_answer says
        data = (self.root / name).read_bytes()
        piece = data[offset : offset + min(max_length_bytes, self.chunk_bytes_max)]
        chunk = DataChunk(offset, piece, len(data), _native.crc32c(piece))
        if self.corrupt_left and piece:
            self.corrupt_left -= 1
            chunk = DataChunk(offset, bytes([piece[0] ^ 1]) + piece[1:], len(data), chunk.crc32c)
        return chunk

    async def end(self, session_id: str, success: bool) -> None:
        pass


def _files(src: Path, dst: Path, sizes: list[int]) -> list[tuple[DataKind, DataFile, Path]]:
    out = []
    for i, size in enumerate(sizes):
        name = f"f{i}"
        (src / name).write_bytes(os.urandom(size))
        out.append((DataKind.ROWSET_FILE, DataFile(name, size), dst / name))
    return out


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    return src, dst


def _download(
    source: FileSource,
    files: list[tuple[DataKind, DataFile, Path]],
    options: DownloadOptions,
    progress: Progress,
    channel: DataChannel | None = None,
) -> None:
    io = CopyIoPool(2)
    try:
        asyncio.run(download_files(source, "s", files, options, progress, io, channel))
    finally:
        io.close()


def test_parallel_download_reproduces_every_file(dirs: tuple[Path, Path]) -> None:
    src, dst = dirs
    files = _files(src, dst, [0, 1, 4095, 4096, 10_000, 70_001])
    progress = Progress(bytes_total=sum(f.size_bytes for _, f, _ in files))
    options = DownloadOptions(chunk_bytes=4096, parallel_files_max=3)
    _download(FileSource(src), files, options, progress)
    for _, f, dest in files:
        assert dest.read_bytes() == (src / f.name).read_bytes()
    assert progress.bytes_done == progress.bytes_total


def test_one_file_has_several_chunks_in_flight(dirs: tuple[Path, Path]) -> None:
    src, dst = dirs
    files = _files(src, dst, [100_000])
    source = FileSource(src)
    options = DownloadOptions(chunk_bytes=4096, chunks_in_flight_max=4)
    _download(source, files, options, Progress())
    assert files[0][2].read_bytes() == (src / "f0").read_bytes()
    assert source.in_flight_max == 4


def test_shorter_chunks_than_asked_for_fill_the_file(dirs: tuple[Path, Path]) -> None:
    src, dst = dirs
    files = _files(src, dst, [50_000])
    source = FileSource(src, chunk_bytes_max=3000)  # a source with a smaller chunk size
    options = DownloadOptions(chunk_bytes=8192, chunks_in_flight_max=3)
    _download(source, files, options, Progress())
    assert files[0][2].read_bytes() == (src / "f0").read_bytes()


def test_a_corrupted_chunk_is_detected_and_fetched_again(dirs: tuple[Path, Path]) -> None:
    src, dst = dirs
    files = _files(src, dst, [20_000])
    source = FileSource(src, corrupt_first=2)
    options = DownloadOptions(chunk_bytes=8192, chunk_attempts_max=3)
    _download(source, files, options, Progress())
    assert files[0][2].read_bytes() == (src / "f0").read_bytes()
    assert source.fetches == 3 + 2  # three chunks, the first one twice more


def test_a_malformed_answer_is_fetched_again(dirs: tuple[Path, Path]) -> None:
    src, dst = dirs
    files = _files(src, dst, [20_000])
    source = FileSource(src, malformed_first=2)
    options = DownloadOptions(chunk_bytes=8192, chunks_in_flight_max=1, chunk_attempts_max=3)
    _download(source, files, options, Progress())
    assert files[0][2].read_bytes() == (src / "f0").read_bytes()
    assert source.fetches == 3 + 2
    source = FileSource(src, malformed_first=3)
    with pytest.raises(CorruptionError, match="malformed"):
        _download(source, files, options, Progress())


def test_a_chunk_corrupted_every_time_fails_the_copy(dirs: tuple[Path, Path]) -> None:
    src, dst = dirs
    files = _files(src, dst, [5000])
    options = DownloadOptions(chunk_bytes=8192, chunk_attempts_max=3)
    source = FileSource(src, corrupt_first=3)
    with pytest.raises(CorruptionError, match="CRC32C"):
        _download(source, files, options, Progress())


@pytest.mark.parametrize(
    ("chunk", "match"),
    [
        (DataChunk(8, b"abc", 10, _native.crc32c(b"abc")), "asked for offset 0"),
        (DataChunk(0, b"abc", 11, _native.crc32c(b"abc")), "listed 10 bytes"),
        (DataChunk(0, b"abc", 2, _native.crc32c(b"abc")), "listed 10 bytes"),
        (DataChunk(0, b"", 10, _native.crc32c(b"")), "empty chunk"),
        (DataChunk(0, b"abc", 10, 12345), "CRC32C"),
        (DataChunk(0, memoryview(b"xabc")[1:], 10, 12345), "CRC32C"),
    ],
)
def test_check_chunk_refuses(chunk: DataChunk, match: str) -> None:
    with pytest.raises(CorruptionError, match=match):
        check_chunk(chunk, "f", 0, 10)


def test_check_chunk_refuses_a_chunk_past_the_end() -> None:
    chunk = DataChunk(8, b"abc", 10, _native.crc32c(b"abc"))
    with pytest.raises(CorruptionError, match="runs past"):
        check_chunk(chunk, "f", 8, 10)


def test_rate_limiter_holds_the_rate() -> None:
    async def run() -> float:
        limiter = RateLimiter(1_000_000)
        started = time.monotonic()
        for _ in range(30):
            await limiter.acquire(100_000)  # 3 MB: the first 1 MB is the bucket
        return time.monotonic() - started

    elapsed = asyncio.run(run())
    assert elapsed >= 1.9


# --- over the data channel ----------------------------------------------------------------

TOKEN = bytes(range(16))


def _server(
    src: Path, files: list[tuple[DataKind, DataFile, Path]], chunk_bytes_max: int = 1 << 20
) -> _native.CopyDataServer:
    server = _native.CopyDataServer(
        "127.0.0.1", 0, chunk_bytes_max=chunk_bytes_max, connections_max=8, idle_timeout_ms=60_000
    )
    server.register(TOKEN, [_native.CopyFile.open(str(src / f.name)) for _, f, _ in files])
    return server


@pytest.mark.parametrize("files_per_call", [64, 2])
def test_every_file_arrives_over_the_channel_without_fetch_data(
    dirs: tuple[Path, Path], files_per_call: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With 2 files per call, the five files take three calls, numbered as the session lists them.
    monkeypatch.setattr(copy_client, "CHANNEL_FILES_PER_CALL", files_per_call)
    src, dst = dirs
    files = _files(src, dst, [0, 1, 4095, (3 << 20) + 17, 70_001])
    server = _server(src, files)
    source = FileSource(src)
    progress = Progress(bytes_total=sum(f.size_bytes for _, f, _ in files))
    channel = DataChannel(f"127.0.0.1:{server.port}", TOKEN)
    options = DownloadOptions(channel_chunk_bytes=256 << 10, chunks_in_flight_max=4)
    _download(source, files, options, progress, channel)
    for _, f, dest in files:
        assert dest.read_bytes() == (src / f.name).read_bytes()
    assert progress.bytes_done == progress.bytes_total
    assert server.bytes_served == progress.bytes_total
    assert source.fetches == 0
    server.close()


def test_a_damaged_chunk_is_fetched_again_and_one_always_damaged_fails(
    dirs: tuple[Path, Path],
) -> None:
    src, dst = dirs
    files = _files(src, dst, [1 << 20])
    server = _server(src, files)
    channel = DataChannel(f"127.0.0.1:{server.port}", TOKEN)
    options = DownloadOptions(
        channel_chunk_bytes=256 << 10, chunks_in_flight_max=1, chunk_attempts_max=3
    )
    server.inject_corrupt_chunks(2)
    _download(FileSource(src), files, options, Progress(), channel)
    assert files[0][2].read_bytes() == (src / "f0").read_bytes()
    assert server.bytes_served == (1 << 20) + 2 * (256 << 10)  # two chunks sent twice

    server.inject_corrupt_chunks(3)
    with pytest.raises(CorruptionError, match="CRC32C"):
        _download(FileSource(src), files, options, Progress(), channel)


def test_an_unreachable_channel_falls_back_to_fetch_data(dirs: tuple[Path, Path]) -> None:
    src, dst = dirs
    files = _files(src, dst, [100_000, 5])
    server = _server(src, files)
    port = server.port
    server.close()  # nothing listens there any more
    source = FileSource(src)
    progress = Progress()
    channel = DataChannel(f"127.0.0.1:{port}", TOKEN)
    _download(source, files, DownloadOptions(chunk_bytes=8192), progress, channel)
    for _, f, dest in files:
        assert dest.read_bytes() == (src / f.name).read_bytes()
    assert source.fetches > 0
    assert progress.bytes_done == 100_005


def test_an_ended_session_fails_the_copy_instead_of_falling_back(dirs: tuple[Path, Path]) -> None:
    src, dst = dirs
    files = _files(src, dst, [10_000])
    server = _server(src, files)
    assert server.unregister(TOKEN)
    source = FileSource(src)
    channel = DataChannel(f"127.0.0.1:{server.port}", TOKEN)
    with pytest.raises(NotFoundError, match="no such copy session"):
        _download(source, files, DownloadOptions(), Progress(), channel)
    assert source.fetches == 0
    server.close()


def test_a_cancelled_download_returns_once_nothing_writes(
    dirs: tuple[Path, Path], tmp_path: Path
) -> None:
    src, dst = dirs
    files = _files(src, dst, [4 << 20])
    server = _server(src, files)
    channel = DataChannel(f"127.0.0.1:{server.port}", TOKEN)
    # 1 MB/s in 256 KiB pieces: the file would take four seconds, and a stream waits a
    # quarter of a second for each piece before it fetches and writes it.
    options = DownloadOptions(channel_chunk_bytes=256 << 10, rate_bytes_per_s=1_000_000)
    progress = Progress()
    decoy = tmp_path / "decoy"

    async def run() -> int:
        io = CopyIoPool(2)
        task = asyncio.create_task(
            download_files(FileSource(src), "s", files, options, progress, io, channel)
        )
        await asyncio.sleep(1.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The download's descriptors are closed now; a new file most likely gets one of their
        # numbers. A stream still running would write into it.
        fd = os.open(decoy, os.O_WRONLY | os.O_CREAT)
        io.close()
        return fd

    fd = asyncio.run(run())
    dest = files[0][2]
    size, mtime = dest.stat().st_size, dest.stat().st_mtime_ns
    assert 0 < progress.bytes_done < 4 << 20
    time.sleep(1.0)
    os.close(fd)
    assert decoy.stat().st_size == 0
    assert (dest.stat().st_size, dest.stat().st_mtime_ns) == (size, mtime)
    server.close()
