"""nyala: a replicated, Arrow-native tablet store in the shape of Apache Kudu.

This module re-exports the names users reach for (DESIGN.md §9; README.md has the tour). It
imports nothing when it is imported itself: every name is loaded on first use (PEP 562), so
``import nyala.consensus`` or ``import nyala.storage`` loads neither gRPC nor the client, and
servers, the Raft core and tests pay only for what they use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nyala import errors
    from nyala._native import __version__
    from nyala.client import (
        Client,
        RowError,
        RowOutcome,
        Scanner,
        Session,
        Table,
        WriteResult,
        connect,
    )
    from nyala.common.clock import timestamp_from_datetime, timestamp_to_datetime
    from nyala.local_cluster import LocalCluster
    from nyala.partition import HashPartitioning, RangePartitioning
    from nyala.rowops import OpType
    from nyala.schema import Column, Schema

#: Public name -> the module that defines it.
_HOMES = {
    "Client": "nyala.client",
    "Column": "nyala.schema",
    "HashPartitioning": "nyala.partition",
    "LocalCluster": "nyala.local_cluster",
    "OpType": "nyala.rowops",
    "RangePartitioning": "nyala.partition",
    "RowError": "nyala.client",
    "RowOutcome": "nyala.client",
    "Scanner": "nyala.client",
    "Schema": "nyala.schema",
    "Session": "nyala.client",
    "Table": "nyala.client",
    "WriteResult": "nyala.client",
    "__version__": "nyala._native",
    "connect": "nyala.client",
    "timestamp_from_datetime": "nyala.common.clock",
    "timestamp_to_datetime": "nyala.common.clock",
}


def __getattr__(name: str) -> Any:
    if name == "errors":
        return importlib.import_module("nyala.errors")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'nyala' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES, "errors"])


__all__ = [
    "Client",
    "Column",
    "HashPartitioning",
    "LocalCluster",
    "OpType",
    "RangePartitioning",
    "RowError",
    "RowOutcome",
    "Scanner",
    "Schema",
    "Session",
    "Table",
    "WriteResult",
    "__version__",
    "connect",
    "errors",
    "timestamp_from_datetime",
    "timestamp_to_datetime",
]
