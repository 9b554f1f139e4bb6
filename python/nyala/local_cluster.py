"""Clusters on this machine: ``nyala.LocalCluster`` for Python programs, and the state behind
``nyala local-cluster start|stop|status``.

``LocalCluster`` is a context manager over ``nyala.testing.MiniCluster`` (real server processes
on loopback, killed when the context ends or the Python process dies) that also hands out a
connected client. The command line's cluster must outlive the command that started it, so its
servers are started detached (no parent-death signal) and described in ``DIR/cluster.json``
(roles, ports, pids); the same ports are reused on the next start, because replicas find each
other by address.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nyala import errors
from nyala.client import Client, connect
from nyala.common.process import PARENT_PID_ENV
from nyala.rpc import BlockingServerProxy, join_host_port
from nyala.rpc.ports import free_loopback_ports
from nyala.rpc.settings import RpcSettings
from nyala.testing.mini_cluster import LOOPBACK, MiniCluster
from nyala.testing.security import ClusterSecurity

#: Raft and heartbeat settings for a responsive single-machine cluster.
LOCAL_RAFT_FLAGS = ["--heartbeat-interval-ms", "200"]
STATE_FILE = "cluster.json"
START_TIMEOUT_S = 60.0


class LocalCluster:
    """Masters and tablet servers as child processes, with a connected ``client``.

    ``with nyala.LocalCluster(masters=1, tservers=3, path=dir) as cluster:`` starts them and
    waits for a leader master; data and logs go under ``path`` (kept) or a temp directory
    (deleted). Every process is killed when the block ends. ``secure``: mutual TLS and
    roles on every RPC (docs/security.md), the ``client`` an admin.
    """

    def __init__(
        self,
        masters: int = 1,
        tservers: int = 3,
        path: str | Path | None = None,
        *,
        master_flags: list[str] | None = None,
        tserver_flags: list[str] | None = None,
        secure: bool = False,
    ) -> None:
        if masters < 1 or masters % 2 == 0:
            raise errors.InvalidArgumentError("masters must be odd and at least 1")
        if tservers < 1:
            raise errors.InvalidArgumentError("tservers must be at least 1")
        base = None if path is None else Path(path)
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        self.mini = MiniCluster(
            tservers,
            num_masters=masters,
            base_dir=base,
            master_flags=master_flags if master_flags is not None else LOCAL_RAFT_FLAGS,
            tserver_flags=tserver_flags if tserver_flags is not None else LOCAL_RAFT_FLAGS,
            keep_dir=base is not None,
            secure=secure,
        )
        self._client: Client | None = None

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        """Starts every server and waits for a leader master with a loaded catalog."""
        try:
            self.mini.start()
            self.mini.leader_master(timeout_s=START_TIMEOUT_S)
        except BaseException:
            self.mini.shutdown()
            raise

    def stop(self) -> None:
        """Closes the client and kills every server."""
        if self._client is not None:
            self._client.close()
            self._client = None
        self.mini.shutdown()

    @property
    def masters(self) -> str:
        """The master addresses, as ``nyala.connect`` and ``--masters`` take them."""
        return ",".join(self.mini.master_addrs)

    @property
    def client(self) -> Client:
        """A client connected to this cluster (created on first use)."""
        if self._client is None:
            security = self.mini.security
            credentials = None if security is None else security.admin_dir
            self._client = connect(self.masters, timeout_ms=30_000, credentials=credentials)
        return self._client

    @property
    def path(self) -> Path:
        """The directory holding data and logs."""
        return self.mini.base_dir


# --- the command line's detached cluster -------------------------------------------------------


@dataclass
class ServerRecord:
    """One server of a detached local cluster, as ``cluster.json`` stores it."""

    role: str
    index: int
    rpc_port: int
    http_port: int
    pid: int = 0

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    @property
    def rpc_addr(self) -> str:
        return join_host_port(LOOPBACK, self.rpc_port)


def _load(directory: Path) -> list[ServerRecord]:
    path = directory / STATE_FILE
    try:
        doc = json.loads(path.read_text())
        return [ServerRecord(**entry) for entry in doc["servers"]]
    except FileNotFoundError:
        raise errors.NotFoundError(f"no local cluster in {directory} (no {STATE_FILE})") from None
    except (ValueError, KeyError, TypeError) as err:
        raise errors.CorruptionError(f"{path} is malformed: {err}") from None


def _save(directory: Path, servers: list[ServerRecord]) -> None:
    path = directory / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"servers": [asdict(s) for s in servers]}, indent=2))
    os.replace(tmp, path)


def _alive(record: ServerRecord, directory: Path) -> bool:
    """True if ``record.pid`` runs and is this cluster's server (not a recycled pid)."""
    if record.pid <= 0:
        return False
    try:
        cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(directory / "data" / record.name).encode() in cmdline


#: Where a detached local cluster keeps its CA, its servers' security directories and the
#: operator's (admin) credentials: ``DIR/security/clients/admin-admin``.
SECURITY_DIR = "security"


def _security(directory: Path) -> ClusterSecurity | None:
    """The local cluster's security material, if it is a secure cluster."""
    path = directory / SECURITY_DIR
    return ClusterSecurity(path) if ClusterSecurity.exists(path) else None


def _rpc_settings(security: ClusterSecurity | None) -> RpcSettings:
    return RpcSettings() if security is None else security.admin_settings


def _command(
    record: ServerRecord, directory: Path, masters: str, security: ClusterSecurity | None
) -> list[str]:
    flags = [] if security is None else ["--security-dir", str(security.server_dir(record.name))]
    return [
        sys.executable,
        "-m",
        "nyala.cli",
        record.role,
        "run",
        "--fs-root",
        str(directory / "data" / record.name),
        "--rpc-bind",
        record.rpc_addr,
        "--http-bind",
        join_host_port(LOOPBACK, record.http_port),
        "--masters",
        masters,
        *LOCAL_RAFT_FLAGS,
        *flags,
    ]


def start_detached(
    directory: Path, *, masters: int = 3, tservers: int = 3, secure: bool = True
) -> dict[str, Any]:
    """Starts (or restarts) the local cluster in ``directory`` in the background; returns its
    status once a leader master serves. A new cluster is secure unless ``secure`` is False
    (a restarted one stays as it was made)."""
    directory = directory.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        servers = _load(directory)
    except errors.NotFoundError:
        if secure:
            ClusterSecurity(directory / SECURITY_DIR)
        if masters < 1 or masters % 2 == 0:
            raise errors.InvalidArgumentError("--masters must be odd and at least 1") from None
        ports = free_loopback_ports(2 * (masters + tservers), LOOPBACK)
        roles = [("master", i) for i in range(masters)] + [("tserver", i) for i in range(tservers)]
        servers = [
            ServerRecord(role, i, ports[2 * n], ports[2 * n + 1])
            for n, (role, i) in enumerate(roles)
        ]
    master_addrs = ",".join(s.rpc_addr for s in servers if s.role == "master")
    security = _security(directory)
    env = {k: v for k, v in os.environ.items() if k != PARENT_PID_ENV}
    for record in servers:
        if _alive(record, directory):
            continue
        log_path = directory / "logs" / f"{record.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                _command(record, directory, master_addrs, security),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
            )
        record.pid = proc.pid
    _save(directory, servers)
    credentials = None if security is None else security.admin_dir
    deadline = time.monotonic() + START_TIMEOUT_S
    _wait_for_leader(master_addrs, START_TIMEOUT_S, credentials)
    # Tablet servers answer a little after the leader master (a secure one enrolls first).
    doc = status(directory)
    while not doc["healthy"] and time.monotonic() < deadline:
        time.sleep(0.2)
        doc = status(directory)
    return doc


def _wait_for_leader(masters: str, timeout_s: float, credentials: Path | None) -> None:
    client = connect(masters, timeout_ms=int(timeout_s * 1000), credentials=credentials)
    client.close()


def stop_detached(directory: Path, *, timeout_s: float = 30.0) -> dict[str, Any]:
    """Stops every server of the local cluster in ``directory`` (SIGTERM, then SIGKILL)."""
    directory = directory.resolve()
    servers = _load(directory)
    running = [s for s in servers if _alive(s, directory)]
    for record in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(_alive(s, directory) for s in running):
        time.sleep(0.1)
    for record in running:
        if _alive(record, directory):
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGKILL)
    for record in servers:
        record.pid = 0
    _save(directory, servers)
    return {"dir": str(directory), "stopped": [s.name for s in running]}


def status(directory: Path) -> dict[str, Any]:
    """Each server of the local cluster in ``directory``: RPC and HTTP addresses, pid,
    running, answering; ``healthy`` when every server answers."""
    directory = directory.resolve()
    servers = _load(directory)
    security = _security(directory)
    rows = []
    for record in servers:
        alive = _alive(record, directory)
        answering = False
        if alive:
            with (
                contextlib.suppress(errors.NyalaError),
                BlockingServerProxy(record.rpc_addr, _rpc_settings(security)) as proxy,
            ):
                if record.role == "tserver":
                    proxy.ping(timeout_ms=1_000)
                else:
                    from nyala._proto import master_pb2

                    proxy.call(
                        proxy.master.ConnectToMaster,
                        master_pb2.ConnectToMasterRequestPB(),
                        timeout_ms=1_000,
                    )
                answering = True
        rows.append(
            {
                "name": record.name,
                "role": record.role,
                "rpc_addr": record.rpc_addr,
                "http_addr": join_host_port(LOOPBACK, record.http_port),
                "pid": record.pid if alive else None,
                "running": alive,
                "answering": answering,
            }
        )
    masters = ",".join(s.rpc_addr for s in servers if s.role == "master")
    healthy = all(row["answering"] for row in rows)
    credentials = None if security is None else str(security.admin_dir)
    return {
        "dir": str(directory),
        "masters": masters,
        "credentials": credentials,
        "healthy": healthy,
        "servers": rows,
    }


__all__ = ["LocalCluster", "start_detached", "status", "stop_detached"]
