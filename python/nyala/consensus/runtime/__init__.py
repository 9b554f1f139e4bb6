"""The I/O around the sans-I/O Raft core: ``RaftRuntime`` (the asyncio driver of one
``RaftCore``), the ``Transport`` protocol with its in-memory and gRPC implementations, wire
conversion of consensus messages, ``WalLog`` (the replica's log over the Rust WAL and log
cache) and ``FileCmetaStore``.

This subpackage may import the core, ``nyala.rpc``, the protobufs and the native extension;
the core never imports it.
"""

from __future__ import annotations

from nyala.consensus.runtime.raft_runtime import DurabilityNotifier, RaftRuntime, RuntimeOptions

__all__ = ["DurabilityNotifier", "RaftRuntime", "RuntimeOptions"]
