"""Atomically replaced, checksummed metadata files (instance, superblock, consensus metadata).

Every metadata file in an fs root goes through this module (DESIGN.md §6): a reader either sees
the complete old contents or the complete new ones, and any damage is a ``CorruptionError``
naming the file, never a silent default.

On-disk layout (little-endian), 24-byte header then the payload:

====== ===== =====================================================================
offset bytes field
====== ===== =====================================================================
0      4     magic ``b"NYMF"``
4      2     container format version (1)
6      2     kind: which metadata this is (``MetaKind``), so files cannot be swapped
8      8     payload length in bytes
16     4     CRC32C of the payload
20     4     CRC32C of bytes 0..20
====== ===== =====================================================================

This module owns the container only; callers choose the payload encoding.
"""

from __future__ import annotations

import enum
import os
import struct
from pathlib import Path

from nyala._native import crc32c
from nyala.errors import CorruptionError, NotFoundError, NotSupportedError

MAGIC = b"NYMF"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<4sHHQII")
HEADER_BYTES = _HEADER.size
payload_bytes_max = 64 * 1024 * 1024  # metadata is small; a bigger length is damage


class MetaKind(enum.IntEnum):
    """Which metadata a file holds; checked on read."""

    INSTANCE = 1
    SUPERBLOCK = 2
    CONSENSUS_META = 3
    MASTER_CONFIG = 4
    ROWSET_MANIFEST = 5  # written by the Rust storage engine (rust/storage/src/manifest.rs)


def encode(kind: MetaKind, payload: bytes) -> bytes:
    """The file image for ``payload``."""
    head = struct.pack("<4sHHQI", MAGIC, FORMAT_VERSION, int(kind), len(payload), crc32c(payload))
    return head + struct.pack("<I", crc32c(head)) + payload


def decode(kind: MetaKind, image: bytes, *, name: str = "<memory>") -> bytes:
    """The payload of a file image, after checking every field of the header."""
    if len(image) < HEADER_BYTES:
        raise CorruptionError(f"{name}: metadata file is {len(image)} bytes, shorter than a header")
    magic, version, found_kind, length, payload_crc, header_crc = _HEADER.unpack_from(image)
    if magic != MAGIC:
        raise CorruptionError(f"{name}: bad magic {magic!r}, expected {MAGIC!r}")
    if crc32c(image[: HEADER_BYTES - 4]) != header_crc:
        raise CorruptionError(f"{name}: header checksum mismatch")
    if version > FORMAT_VERSION:
        raise NotSupportedError(f"{name}: metadata format version {version} is newer than ours")
    if found_kind != int(kind):
        raise CorruptionError(f"{name}: holds metadata kind {found_kind}, expected {kind.name}")
    if length > payload_bytes_max or HEADER_BYTES + length != len(image):
        raise CorruptionError(
            f"{name}: payload length {length} does not match file size {len(image)}"
        )
    payload = image[HEADER_BYTES:]
    if crc32c(payload) != payload_crc:
        raise CorruptionError(f"{name}: payload checksum mismatch")
    return payload


def write_atomic(path: Path, kind: MetaKind, payload: bytes) -> None:
    """Replaces ``path`` with ``payload``: write a temp file, fsync, rename, fsync the dir."""
    image = encode(kind, payload)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(image)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read(path: Path, kind: MetaKind) -> bytes:
    """The payload of ``path``; ``NotFoundError`` if absent, ``CorruptionError`` if damaged."""
    try:
        image = path.read_bytes()
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such metadata file") from None
    return decode(kind, image, name=str(path))


def fsync_dir(directory: Path) -> None:
    """Makes a rename or unlink in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
