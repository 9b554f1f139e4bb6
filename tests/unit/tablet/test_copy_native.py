"""The native halves of a chunk's path: ``CopyFile`` reads on a source (straight into the
answer, its buffer not zeroed first) and ``write_at`` on a target (all of a chunk at its
offset, its writeback started)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nyala import _native
from nyala.errors import CorruptionError, InvalidArgumentError, NyalaError
from nyala.server.tablet_copy import chunk_from_answer, fetch_data_answer

CHUNK = 1 << 20


@pytest.fixture
def source_file(tmp_path: Path) -> tuple[Path, bytes]:
    data = os.urandom(3 * CHUNK + 12345)  # a short last chunk
    path = tmp_path / "rs-00000001.parquet"
    path.write_bytes(data)
    return path, data


def test_reads_are_the_file_with_its_crc(source_file: tuple[Path, bytes]) -> None:
    path, data = source_file
    file = _native.CopyFile.open(str(path))
    assert (file.name, file.length) == (path.name, len(data))
    for offset in range(0, len(data) + 1, CHUNK):
        piece, crc = file.read(offset, CHUNK)
        assert piece == data[offset : offset + CHUNK]
        assert crc == _native.crc32c(piece)
    with pytest.raises(InvalidArgumentError, match="past the end"):
        file.read(len(data) + 1, CHUNK)


def test_an_answer_carries_every_byte_and_its_crc(source_file: tuple[Path, bytes]) -> None:
    path, data = source_file
    file = _native.CopyFile.open(str(path))
    for offset in (0, CHUNK, 3 * CHUNK, len(data)):
        chunk = chunk_from_answer(fetch_data_answer(file, offset, CHUNK))
        assert (chunk.offset, chunk.total_bytes) == (offset, len(data))
        assert bytes(chunk.data) == data[offset : offset + CHUNK]
        assert chunk.crc32c == _native.crc32c(chunk.data)


def test_a_malformed_answer_is_a_corruption_error(source_file: tuple[Path, bytes]) -> None:
    path, _ = source_file
    answer = fetch_data_answer(_native.CopyFile.open(str(path)), 0, CHUNK)
    with pytest.raises(CorruptionError):
        chunk_from_answer(answer[: len(answer) // 2])  # cut short: the data field overruns
    with pytest.raises(CorruptionError):
        chunk_from_answer(b"\xff" * 64)


def test_write_at_writes_every_byte_at_its_offset(tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK + 7)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        _native.write_at(fd, memoryview(data)[CHUNK:], CHUNK)  # a view into a larger answer
        _native.write_at(fd, data[:CHUNK], 0)
        _native.write_at(fd, bytearray(b"xyz"), 5)  # mutable: copied first
        os.fsync(fd)
    finally:
        os.close(fd)
    expected = data[:5] + b"xyz" + data[8:]
    assert (tmp_path / "f").read_bytes() == expected


def test_write_at_a_bad_descriptor_is_a_typed_error(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(NyalaError, match="write to fd"):
            _native.write_at(fd, b"abc", 0)
    finally:
        os.close(fd)
