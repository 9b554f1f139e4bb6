"""Quarantine: what a tombstone or a delete takes away from a replica, kept for a while.

Seed 000 ("Tablet deletion") has a deleted replica's data backed up before it goes, so that a
mistaken or buggy tombstone can be undone and debugged. Each tombstone or delete of a replica
that held data gets ``<fs_root>/quarantine/<tablet_id>.<time>/`` (``time`` in UTC,
``%Y%m%dT%H%M%S.%fZ``) holding

* ``superblock``: a copy of the superblock before the tombstone (metafile format, readable by
  the tools like the original);
* ``cmeta``: a copy of the consensus metadata at that moment;
* ``wal/`` and ``data/``: the replica's WAL and rowset directories, moved there (a rename: no
  copy, no extra space).

docs/operations.md ("Recovering a replica from quarantine") says how to put one back.
Quarantined replicas are purged once older than ``retention_s``, and, oldest first, while the
fs root's disk has less than ``disk_free_bytes_min`` free (``enforce``), or by hand
(``nyala local-replica quarantine purge``).

Owns: the quarantine directory and everything under it.
"""

from __future__ import annotations

import datetime
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nyala.common import metafile

log = logging.getLogger(__name__)

SUPERBLOCK_FILE = "superblock"
CMETA_FILE = "cmeta"
WAL_DIR = "wal"
DATA_DIR = "data"
_TIME_FORMAT = "%Y%m%dT%H%M%S.%fZ"
RETENTION_S_DEFAULT = 7 * 24 * 3600
DISK_FREE_BYTES_MIN_DEFAULT = 1 << 30


@dataclass(frozen=True, slots=True)
class QuarantineEntry:
    """One quarantined replica."""

    tablet_id: str
    path: Path
    created_s: float  # wall clock, from the directory's name
    size_bytes: int

    @property
    def name(self) -> str:
        """The directory's name, ``<tablet_id>.<time>``."""
        return self.path.name


def _parse_name(name: str) -> tuple[str, float] | None:
    tablet_id, dot, stamp = name.partition(".")
    if not dot:
        return None
    try:
        when = datetime.datetime.strptime(stamp, _TIME_FORMAT).replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
    return tablet_id, when.timestamp()


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Quarantine:
    """The quarantine directory of one fs root."""

    def __init__(
        self,
        root: Path,
        *,
        retention_s: int = RETENTION_S_DEFAULT,
        disk_free_bytes_min: int = DISK_FREE_BYTES_MIN_DEFAULT,
        now_s: Callable[[], float] | None = None,
        disk_free_bytes: Callable[[Path], int] | None = None,
    ) -> None:
        assert retention_s > 0
        assert disk_free_bytes_min >= 0
        self.root = root
        self.retention_s = retention_s
        self.disk_free_bytes_min = disk_free_bytes_min
        self._now_s = now_s or (lambda: datetime.datetime.now(datetime.UTC).timestamp())
        self._disk_free_bytes = disk_free_bytes or (lambda p: shutil.disk_usage(p).free)

    def new_dir(self, tablet_id: str) -> Path:
        """Creates (durably) and returns an empty quarantine directory for ``tablet_id``."""
        self.root.mkdir(exist_ok=True)
        when = datetime.datetime.fromtimestamp(self._now_s(), datetime.UTC)
        base = f"{tablet_id}.{when.strftime(_TIME_FORMAT)}"
        path = self.root / base
        n = 1
        while path.exists():  # two in the same microsecond: keep both
            path = self.root / f"{base}-{n}"
            n += 1
        path.mkdir()
        metafile.fsync_dir(self.root)
        return path

    @staticmethod
    def copy_in(qdir: Path, source: Path, name: str) -> None:
        """Copies the file ``source`` into ``qdir`` as ``name`` (durably); a missing source
        is skipped."""
        if not source.exists() or (qdir / name).exists():
            return
        tmp = qdir / f"{name}.tmp"
        shutil.copyfile(source, tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, qdir / name)
        metafile.fsync_dir(qdir)

    @staticmethod
    def move_in(qdir: Path, source: Path, name: str) -> None:
        """Moves the directory ``source`` into ``qdir`` as ``name`` (a rename, durable); a
        missing source is skipped, and one already there (a repeated roll-forward) is
        removed instead."""
        if not source.exists():
            return
        target = qdir / name
        if target.exists():
            shutil.rmtree(source)
        else:
            os.rename(source, target)
            metafile.fsync_dir(qdir)
        metafile.fsync_dir(source.parent)

    def entries(self) -> list[QuarantineEntry]:
        """Every quarantined replica, oldest first."""
        if not self.root.is_dir():
            return []
        out = []
        for path in self.root.iterdir():
            parsed = _parse_name(path.name.split("-")[0]) if path.is_dir() else None
            if parsed is not None:
                out.append(QuarantineEntry(parsed[0], path, parsed[1], _size(path)))
        return sorted(out, key=lambda e: (e.created_s, e.name))

    def purge(
        self, *, older_than_s: float | None = None, tablet_id: str | None = None
    ) -> list[QuarantineEntry]:
        """Removes the entries older than ``older_than_s`` (all if None), of ``tablet_id``
        only if given; returns them."""
        now = self._now_s()
        removed = []
        for entry in self.entries():
            if tablet_id is not None and entry.tablet_id != tablet_id:
                continue
            if older_than_s is not None and now - entry.created_s < older_than_s:
                continue
            self._remove(entry)
            removed.append(entry)
        return removed

    def enforce(self) -> list[QuarantineEntry]:
        """Purges what is past the retention, then the oldest entries while the disk is
        short of ``disk_free_bytes_min``; returns what was removed."""
        removed = self.purge(older_than_s=self.retention_s)
        for entry in self.entries():
            if self._disk_free_bytes(self.root) >= self.disk_free_bytes_min:
                break
            self._remove(entry)
            removed.append(entry)
        return removed

    def _remove(self, entry: QuarantineEntry) -> None:
        shutil.rmtree(entry.path)
        metafile.fsync_dir(self.root)
        log.info("purged quarantined replica %s (%d bytes)", entry.name, entry.size_bytes)
