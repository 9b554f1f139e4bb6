"""Tablet copy over the data channel (``nyala._native.CopyDataServer`` and ``CopyDownload``,
through ``download_files``): every file arrives whole with no FetchData, a damaged chunk is
fetched again, an unreachable channel falls back to FetchData, an ended session is an error
(not a fallback), and a cancelled download returns only once nothing writes any more."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from nyala import _native
from nyala.errors import CorruptionError, NotFoundError
from nyala.tablet import copy_client
from nyala.tablet.copy_client import DataChannel, DownloadOptions, Progress, download_files
from nyala.tablet.copy_io import CopyIoPool
from nyala.tablet.copy_source import CopySessionInfo, DataChunk, DataFile, DataKind

TOKEN = bytes(range(16))


class RpcSource:
    """FetchData from a directory, counting calls: what the copy falls back to."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.fetches = 0

    async def begin(self, tablet_id: str) -> CopySessionInfo:
        raise NotImplementedError

    async def fetch(
        self, session_id: str, kind: DataKind, name: str, offset: int, max_length_bytes: int
    ) -> DataChunk:
        self.fetches += 1
        data = (self.root / name).read_bytes()
        piece = data[offset : offset + max_length_bytes]
        return DataChunk(offset, piece, len(data), _native.crc32c(piece))

    async def end(self, session_id: str, success: bool) -> None:
        pass


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    return src, dst


def _files(src: Path, dst: Path, sizes: list[int]) -> list[tuple[DataKind, DataFile, Path]]:
    out = []
    for i, size in enumerate(sizes):
        name = f"f{i}"
        (src / name).write_bytes(os.urandom(size))
        kind = DataKind.ROWSET_FILE if i % 2 else DataKind.WAL_SEGMENT
        out.append((kind, DataFile(name, size), dst / name))
    return out


def _server(
    src: Path, files: list[tuple[DataKind, DataFile, Path]], chunk_bytes_max: int = 1 << 20
) -> _native.CopyDataServer:
    server = _native.CopyDataServer(
        "127.0.0.1", 0, chunk_bytes_max=chunk_bytes_max, connections_max=8, idle_timeout_ms=60_000
    )
    server.register(TOKEN, [_native.CopyFile.open(str(src / f.name)) for _, f, _ in files])
    return server


def _download(
    source: RpcSource,
    files: list[tuple[DataKind, DataFile, Path]],
    channel: DataChannel,
    options: DownloadOptions,
    progress: Progress,
) -> None:
    io = CopyIoPool(2)
    try:
        asyncio.run(download_files(source, "s", files, options, progress, io, channel))
    finally:
        io.close()


@pytest.mark.parametrize("files_per_call", [64, 2])
def test_every_file_arrives_over_the_channel_without_fetch_data(
    dirs: tuple[Path, Path], files_per_call: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With 2 files per call, the five files take three calls, numbered as the session lists them.
    monkeypatch.setattr(copy_client, "CHANNEL_FILES_PER_CALL", files_per_call)
    src, dst = dirs
    files = _files(src, dst, [0, 1, 4095, (3 << 20) + 17, 70_001])
    server = _server(src, files)
    source = RpcSource(src)
    progress = Progress(bytes_total=sum(f.size_bytes for _, f, _ in files))
    channel = DataChannel(f"127.0.0.1:{server.port}", TOKEN)
    options = DownloadOptions(channel_chunk_bytes=256 << 10, chunks_in_flight_max=4)
    _download(source, files, channel, options, progress)
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
    _download(RpcSource(src), files, channel, options, Progress())
    assert files[0][2].read_bytes() == (src / "f0").read_bytes()
    assert server.bytes_served == (1 << 20) + 2 * (256 << 10)  # two chunks sent twice

    server.inject_corrupt_chunks(3)
    with pytest.raises(CorruptionError, match="CRC32C"):
        _download(RpcSource(src), files, channel, options, Progress())


def test_an_unreachable_channel_falls_back_to_fetch_data(dirs: tuple[Path, Path]) -> None:
    src, dst = dirs
    files = _files(src, dst, [100_000, 5])
    server = _server(src, files)
    port = server.port
    server.close()  # nothing listens there any more
    source = RpcSource(src)
    progress = Progress()
    channel = DataChannel(f"127.0.0.1:{port}", TOKEN)
    _download(source, files, channel, DownloadOptions(chunk_bytes=8192), progress)
    for _, f, dest in files:
        assert dest.read_bytes() == (src / f.name).read_bytes()
    assert source.fetches > 0
    assert progress.bytes_done == 100_005


def test_an_ended_session_fails_the_copy_instead_of_falling_back(dirs: tuple[Path, Path]) -> None:
    src, dst = dirs
    files = _files(src, dst, [10_000])
    server = _server(src, files)
    assert server.unregister(TOKEN)
    source = RpcSource(src)
    channel = DataChannel(f"127.0.0.1:{server.port}", TOKEN)
    with pytest.raises(NotFoundError, match="no such copy session"):
        _download(source, files, channel, DownloadOptions(), Progress())
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
            download_files(RpcSource(src), "s", files, options, progress, io, channel)
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
