"""``FileCmetaStore``: a replica's consensus metadata on disk.

It makes the state of ``nyala.consensus.metadata`` durable with ``nyala.common.metafile``
(atomic replace, checksums, fsync of the file and its directory) under
``MetaKind.CONSENSUS_META``; the encoding is the core's (``encode_cmeta``/``decode_cmeta``), so
the simulation's memory store and this file store hold the same bytes.
"""

from __future__ import annotations

from pathlib import Path

from nyala.common import metafile
from nyala.common.metafile import MetaKind
from nyala.consensus.metadata import ConsensusMetadata, decode_cmeta, encode_cmeta


class FileCmetaStore:
    """Cmeta in ``<fs_root>/consensus-meta/<tablet_id>`` (DESIGN.md §6)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> ConsensusMetadata:
        """Reads and checks the file."""
        payload = metafile.read(self.path, MetaKind.CONSENSUS_META)
        return decode_cmeta(payload, name=str(self.path))

    def save(self, meta: ConsensusMetadata) -> None:
        """Atomic replace with fsync of the file and its directory."""
        metafile.write_atomic(self.path, MetaKind.CONSENSUS_META, encode_cmeta(meta))
