"""Metadata files: atomic replace, and every kind of damage is a typed error."""

from __future__ import annotations

from pathlib import Path

import pytest

from nyala import _native
from nyala.common import metafile
from nyala.common.metafile import MetaKind
from nyala.errors import CorruptionError, NotFoundError, NotSupportedError


def test_crc32c_matches_the_castagnoli_check_value() -> None:
    assert _native.crc32c(b"123456789") == 0xE3069283
    assert _native.crc32c(b"6789", _native.crc32c(b"12345")) == 0xE3069283
    assert _native.crc32c(bytearray(b"123456789")) == 0xE3069283


def test_round_trip_and_replace(tmp_path: Path) -> None:
    path = tmp_path / "cmeta"
    metafile.write_atomic(path, MetaKind.CONSENSUS_META, b"first")
    metafile.write_atomic(path, MetaKind.CONSENSUS_META, b"second, longer")
    assert metafile.read(path, MetaKind.CONSENSUS_META) == b"second, longer"
    assert [p.name for p in tmp_path.iterdir()] == ["cmeta"]


def test_absent_file_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        metafile.read(tmp_path / "missing", MetaKind.SUPERBLOCK)


def test_every_flipped_bit_and_every_truncation_is_detected(tmp_path: Path) -> None:
    image = metafile.encode(MetaKind.SUPERBLOCK, b'{"state": "READY"}')
    for bit in range(len(image) * 8):
        damaged = bytearray(image)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises((CorruptionError, NotSupportedError)):
            metafile.decode(MetaKind.SUPERBLOCK, bytes(damaged))
    for length in range(len(image)):
        with pytest.raises(CorruptionError):
            metafile.decode(MetaKind.SUPERBLOCK, image[:length])


def test_a_file_of_another_kind_is_refused() -> None:
    image = metafile.encode(MetaKind.INSTANCE, b"x")
    with pytest.raises(CorruptionError, match="expected SUPERBLOCK"):
        metafile.decode(MetaKind.SUPERBLOCK, image)
