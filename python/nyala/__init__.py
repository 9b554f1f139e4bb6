"""nyala: a replicated, Arrow-native tablet store in the shape of Apache Kudu.

The public API grows issue by issue; see README.md for the tour. This module re-exports the
names users reach for (DESIGN.md §9) and must not import heavy optional dependencies (pyspark,
pandas). ``LocalCluster`` is imported on first use: it pulls in the process machinery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nyala import errors
from nyala._native import __version__
from nyala.client import Client, RowError, Scanner, Session, Table, WriteResult, connect
from nyala.partition import HashPartitioning, RangePartitioning
from nyala.rowops import OpType
from nyala.schema import Column, Schema

if TYPE_CHECKING:
    from nyala.local_cluster import LocalCluster


def __getattr__(name: str) -> Any:
    if name == "LocalCluster":
        from nyala.local_cluster import LocalCluster

        return LocalCluster
    raise AttributeError(f"module 'nyala' has no attribute {name!r}")


__all__ = [
    "Client",
    "Column",
    "HashPartitioning",
    "LocalCluster",
    "OpType",
    "RangePartitioning",
    "RowError",
    "Scanner",
    "Schema",
    "Session",
    "Table",
    "WriteResult",
    "__version__",
    "connect",
    "errors",
]
