"""What a tablet server can report about its replicas from ``tablet-meta/`` alone.

Until tablets are hosted (the tablet manager of issue 7 item 3 takes this over), a server
knows its replicas only by their superblock files: each readable one is a replica that is
``NOT_STARTED``; a damaged one is ``FAILED`` with the reason, and never stops the others from
being listed. The superblock payload belongs to the tablet module and is not decoded here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nyala._proto import metadata_pb2, tserver_admin_pb2
from nyala.common import metafile
from nyala.common.metafile import MetaKind
from nyala.errors import NyalaError

_TABLET_ID_CHARS = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class TabletReport:
    """One replica as listed by ListTablets and /tablets."""

    tablet_id: str
    state: str  # a TabletState name: NOT_STARTED, RUNNING, FAILED, ...
    data_state: str  # a TabletDataState name
    state_reason: str
    on_disk_bytes: int

    def to_json(self) -> dict[str, object]:
        """The report as the /tablets page shows it."""
        return {
            "tablet_id": self.tablet_id,
            "state": self.state,
            "data_state": self.data_state,
            "state_reason": self.state_reason,
            "on_disk_bytes": self.on_disk_bytes,
        }

    def to_pb(self) -> Any:
        """The ``TabletStatusPB`` of this report."""
        return tserver_admin_pb2.TabletStatusPB(
            tablet_id=self.tablet_id,
            state=metadata_pb2.TabletState.Value(self.state),
            data_state=metadata_pb2.TabletDataState.Value(self.data_state),
            state_reason=self.state_reason,
            estimated_on_disk_bytes=self.on_disk_bytes,
        )


def is_tablet_id(name: str) -> bool:
    """True for 32 lowercase hex digits."""
    return len(name) == 32 and set(name) <= _TABLET_ID_CHARS


def list_tablet_meta(meta_dir: Path) -> list[TabletReport]:
    """A report per superblock file in ``meta_dir``, sorted by tablet id."""
    reports = []
    for path in sorted(meta_dir.iterdir()):
        if not is_tablet_id(path.name):
            continue  # temp files of an interrupted atomic write, or foreign files
        reports.append(_report(path))
    return reports


def _report(path: Path) -> TabletReport:
    try:
        metafile.read(path, MetaKind.SUPERBLOCK)
    except NyalaError as exc:
        return TabletReport(path.name, "FAILED", "TABLET_DATA_UNKNOWN", str(exc), 0)
    return TabletReport(
        path.name, "NOT_STARTED", "TABLET_DATA_UNKNOWN", "tablet hosting is not wired in yet", 0
    )
