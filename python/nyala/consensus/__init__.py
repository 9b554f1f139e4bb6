"""The Raft control plane of a tablet replica: roles, elections (pre-vote, vote withholding),
failure detection, replication and commit, leadership transfer, ReadIndex reads and one-by-one
membership change. Sans-I/O: ``RaftCore`` takes messages and ticks and returns effects; the log
(``RaftLog``), cmeta store (``CmetaStore``) and clock are injected. The core modules must not
open sockets or files, read the clock, import gRPC, protobufs or the native extension, or look
inside WRITE payloads; ``sim_cluster`` runs replicas in one process on a manual clock.

Everything that does I/O lives in the ``runtime`` subpackage: the asyncio driver, the gRPC
transport and wire conversion, the WAL-backed log and the cmeta file store.
"""

from __future__ import annotations

from nyala.consensus.core import RaftCore, ReplicaStatus, bootstrap_cmeta
from nyala.consensus.effects import (
    Apply,
    ConfigCommitted,
    Effect,
    LogTruncated,
    ReadFailed,
    ReadReady,
    RoleChanged,
    Send,
)
from nyala.consensus.log import AppendResult, EntryBatch, RaftLog
from nyala.consensus.membership import ChangeType, ConfigChange
from nyala.consensus.memory_log import MemoryLog
from nyala.consensus.messages import Message
from nyala.consensus.metadata import (
    CmetaStore,
    ConsensusMetadata,
    MemoryCmetaStore,
)
from nyala.consensus.options import RaftOptions
from nyala.consensus.types import EntryKind, MemberType, OpId, RaftConfig, RaftPeer, Role

__all__ = [
    "AppendResult",
    "Apply",
    "ChangeType",
    "CmetaStore",
    "ConfigChange",
    "ConfigCommitted",
    "ConsensusMetadata",
    "Effect",
    "EntryBatch",
    "EntryKind",
    "LogTruncated",
    "MemberType",
    "MemoryCmetaStore",
    "MemoryLog",
    "Message",
    "OpId",
    "RaftConfig",
    "RaftCore",
    "RaftLog",
    "RaftOptions",
    "RaftPeer",
    "ReadFailed",
    "ReadReady",
    "ReplicaStatus",
    "Role",
    "RoleChanged",
    "Send",
    "bootstrap_cmeta",
]
