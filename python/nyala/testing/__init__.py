"""Test support: real multi-process clusters on loopback (``MiniCluster``)."""

from __future__ import annotations

from nyala.testing.mini_cluster import MiniCluster, ServerProcess, dump_logs, logs_on_failure

__all__ = ["MiniCluster", "ServerProcess", "dump_logs", "logs_on_failure"]
