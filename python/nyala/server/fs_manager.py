"""The file-system root of one server: its identity (``instance``) and its directories.

Layout (DESIGN.md §6)::

    <fs_root>/instance          server UUID and format version (metafile, MetaKind.INSTANCE)
    <fs_root>/instance.lock     flock held while a process owns the root (holds its pid)
    <fs_root>/wals/             one directory of WAL segments per tablet
    <fs_root>/tablet-meta/      one superblock per tablet
    <fs_root>/consensus-meta/   one cmeta per tablet
    <fs_root>/data/             one directory of rowsets per tablet
    <fs_root>/quarantine/       tombstoned replicas' WAL, data, superblock and cmeta, kept for a
                                while (``nyala.tablet.quarantine``)

This module owns the instance file and the directory layout; the files inside the tablet
directories belong to the tablet, WAL and consensus code. A root that has tablet data but no
instance file is refused: minting a new UUID over old consensus metadata would make the server
an amnesiac impostor (seed 000, "Other Failure Recovery").

One process at a time owns a root: ``open`` (and ``lock`` for offline tools) take an exclusive
``flock`` on ``instance.lock`` that the kernel releases when the process dies, so a crashed
server never leaves a stale lock, while a second server or an offline ``nyala local-replica``
command on a live root is refused instead of corrupting it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import uuid as uuid_lib
from dataclasses import dataclass
from pathlib import Path

from nyala.common import metafile
from nyala.common.metafile import MetaKind
from nyala.errors import (
    CorruptionError,
    IllegalStateError,
    InvalidArgumentError,
    NotFoundError,
    NotSupportedError,
)

log = logging.getLogger(__name__)

INSTANCE_FORMAT_VERSION = 1
INSTANCE_FILE = "instance"
LOCK_FILE = "instance.lock"
SUBDIRS = ("wals", "tablet-meta", "consensus-meta", "data", "quarantine")


@dataclass(frozen=True)
class InstanceInfo:
    """What the instance file says about this server."""

    uuid: str  # 32 lowercase hex characters; never changes for the life of the root
    format_version: int


def new_server_uuid() -> str:
    """A fresh server UUID: 32 lowercase hex digits."""
    return uuid_lib.uuid4().hex


def _valid_uuid(text: str) -> bool:
    return len(text) == 32 and all(c in "0123456789abcdef" for c in text)


class FsManager:
    """Opens (formatting on first start) the fs root of one server."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock_fd: int | None = None

    @property
    def instance_path(self) -> Path:
        """Where the instance file lives."""
        return self.root / INSTANCE_FILE

    def dir(self, name: str) -> Path:
        """One of the layout's directories (``wals``, ``tablet-meta``, ...)."""
        assert name in SUBDIRS, name
        return self.root / name

    def open(self, expected_uuid: str = "") -> InstanceInfo:
        """Reads the instance file, or formats an empty root; refuses anything else.

        Raises ``InvalidArgumentError`` for a malformed ``expected_uuid``,
        ``IllegalStateError`` if the root belongs to another UUID or holds data without an
        instance file, ``CorruptionError``/``NotSupportedError`` if the instance file is damaged
        or newer than this build.
        """
        if expected_uuid and not _valid_uuid(expected_uuid):
            raise InvalidArgumentError(f"--uuid {expected_uuid!r} is not 32 lowercase hex digits")
        self.root.mkdir(parents=True, exist_ok=True)
        self.lock()
        try:
            info = self._read_instance()
        except NotFoundError:
            info = self._format(expected_uuid)
        if expected_uuid and info.uuid != expected_uuid:
            raise IllegalStateError(
                f"{self.instance_path}: fs root is formatted for server {info.uuid}, "
                f"not {expected_uuid}"
            )
        for name in SUBDIRS:
            # Idempotent: a crash between formatting and here leaves some directories missing.
            self.dir(name).mkdir(exist_ok=True)
        return info

    def lock(self) -> None:
        """Takes the root's exclusive lock for this process (idempotent).

        ``IllegalStateError`` naming the holder's pid if another process owns the root.
        """
        if self._lock_fd is not None:
            return
        path = self.root / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise IllegalStateError(
                    f"{self.root}: in use by another process (pid {holder}); stop it first"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def unlock(self) -> None:
        """Releases the lock taken by ``open`` or ``lock``."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def read_instance(self) -> InstanceInfo:
        """The instance file's contents (``NotFoundError`` if the root is not formatted)."""
        return self._read_instance()

    def _read_instance(self) -> InstanceInfo:
        payload = metafile.read(self.instance_path, MetaKind.INSTANCE)
        name = str(self.instance_path)
        try:
            fields = json.loads(payload)
            server_uuid = fields["uuid"]
            version = fields["format_version"]
        except (ValueError, KeyError, TypeError):
            raise CorruptionError(f"{name}: instance payload is not valid") from None
        if not isinstance(version, int) or not isinstance(server_uuid, str):
            raise CorruptionError(f"{name}: instance payload has fields of the wrong type")
        if version > INSTANCE_FORMAT_VERSION:
            raise NotSupportedError(
                f"{name}: instance format version {version} is newer than this build's "
                f"({INSTANCE_FORMAT_VERSION})"
            )
        if not _valid_uuid(server_uuid):
            raise CorruptionError(f"{name}: server uuid {server_uuid!r} is malformed")
        return InstanceInfo(uuid=server_uuid, format_version=version)

    def _format(self, expected_uuid: str) -> InstanceInfo:
        leftovers = [
            n for n in SUBDIRS if (self.root / n).is_dir() and any((self.root / n).iterdir())
        ]
        if leftovers:
            raise IllegalStateError(
                f"{self.instance_path}: missing, but the fs root holds data in "
                f"{', '.join(leftovers)}; refusing to start with a new identity"
            )
        info = InstanceInfo(uuid=expected_uuid or new_server_uuid(), format_version=1)
        payload = json.dumps(
            {"uuid": info.uuid, "format_version": info.format_version}, sort_keys=True
        ).encode()
        for name in SUBDIRS:
            self.dir(name).mkdir(exist_ok=True)
        # The instance file is written last: its presence means the root is formatted.
        metafile.write_atomic(self.instance_path, MetaKind.INSTANCE, payload)
        metafile.fsync_dir(self.root)
        if self.root.parent != self.root:
            metafile.fsync_dir(self.root.parent)
        log.info("formatted fs root %s for server %s", self.root, info.uuid)
        return info
