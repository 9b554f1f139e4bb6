"""Tablet copy downloads: every chunk checked (offset, length, CRC32C), several chunks of one
file in flight, a source answering with shorter chunks than asked for, a corrupted chunk fetched
again, a persistently corrupted one failing the copy, and the byte-rate limit."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from nyala import _native
from nyala.errors import CorruptionError
from nyala.tablet.copy_client import (
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
) -> None:
    io = CopyIoPool(2)
    try:
        asyncio.run(download_files(source, "s", files, options, progress, io))
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
