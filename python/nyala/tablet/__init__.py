"""Tablet replicas: superblock and data states, the tablet manager, replica lifecycle."""

from __future__ import annotations

from nyala.tablet.manager import TabletDirs, TabletManager, TabletStatus
from nyala.tablet.superblock import DataState, Partition, Superblock

__all__ = [
    "DataState",
    "Partition",
    "Superblock",
    "TabletDirs",
    "TabletManager",
    "TabletStatus",
]
