"""``MiniCluster``: real nyala server processes on loopback, for tests and benchmarks.

Each server is a ``nyala tserver run`` child process (``sys.executable -m nyala.cli``) with
its own fs root and log file under the cluster's directory and its own free loopback ports,
which it keeps across restarts so peers can find it again. Processes can be killed (SIGKILL),
paused (SIGSTOP/SIGCONT), stopped gracefully (SIGTERM), restarted and wiped (a new UUID).

No process outlives its cluster: ``shutdown`` (also run by ``with`` and at interpreter exit)
kills every child, and each child exits by itself once the test process is gone (a watchdog on
its parent pid, see ``nyala.common.process``), so even ``kill -9`` of pytest leaks nothing.

With ``num_masters`` (1 or more) the cluster starts ``nyala master run`` processes first, all
given the same ``--masters`` list, and every tserver is given it too; ``leader_master`` finds
the master that serves clients.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import IO

from nyala._proto import consensus_pb2, master_pb2, metadata_pb2, tserver_admin_pb2, tserver_pb2
from nyala.common.process import PARENT_PID_ENV, default_memory_limit_bytes
from nyala.errors import NyalaError, TimedOutError
from nyala.rpc import BlockingServerProxy, join_host_port
from nyala.rpc.ports import free_loopback_ports
from nyala.rpc.settings import RpcSettings
from nyala.schema import Schema
from nyala.testing.security import ClusterSecurity

LOOPBACK = "127.0.0.1"
# Starts of a new server whose free port was taken by someone else before it could bind.
_BIND_ATTEMPTS = 3

# Every child still running, so the exit hook can kill what a test forgot.
_live_processes: set[subprocess.Popen[bytes]] = set()
_live_lock = threading.Lock()


def _kill_live_processes() -> None:
    with _live_lock:
        procs = list(_live_processes)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


atexit.register(_kill_live_processes)


class ServerProcess:
    """One server process of a ``MiniCluster`` and its fs root, ports and log."""

    def __init__(
        self,
        role: str,
        index: int,
        base_dir: Path,
        rpc_port: int,
        http_port: int,
        flags: Sequence[str],
        rpc_settings: RpcSettings | None = None,
    ) -> None:
        self.role = role
        self.index = index
        self.name = f"{role}-{index}"
        self.fs_root = base_dir / "data" / self.name
        self.log_path = base_dir / "logs" / f"{self.name}.log"
        self.rpc_port = rpc_port
        self.http_port = http_port
        self.flags = list(flags)
        # Variables added to the process's environment (taken by the next start).
        self.env: dict[str, str] = {}
        # How the test process reaches it (with an admin's certificate on a secure cluster).
        self.rpc_settings = rpc_settings or RpcSettings()
        # Learned from Ping when the process is ready; changes only by ``wipe``.
        self.uuid: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def rpc_addr(self) -> str:
        """Loopback RPC address (kept across restarts)."""
        return join_host_port(LOOPBACK, self.rpc_port)

    @property
    def http_addr(self) -> str:
        """Loopback HTTP address (kept across restarts)."""
        return join_host_port(LOOPBACK, self.http_port)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def listening_ports(self) -> set[int]:
        """The TCP ports the running process listens on (from ``/proc``: its sockets'
        inodes, looked up in its network namespace's TCP tables)."""
        proc = Path("/proc") / str(self._require_process().pid)
        inodes = set()
        for fd in (proc / "fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:  # closed meanwhile
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
        ports = set()
        for table in ("tcp", "tcp6"):
            for line in (proc / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # state LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        return ports

    def metric_by_label(self, name: str, label: str) -> dict[str, float]:
        """The samples of metric family ``name`` from the server's /metrics page (plain HTTP:
        an insecure server), keyed by the value of their label ``label``."""
        url = f"http://{self.http_addr}/metrics?metrics={name}"
        with urllib.request.urlopen(url, timeout=10) as page:
            text = page.read().decode()
        samples = {}
        marker = f'{label}="'
        for line in text.splitlines():
            if line.startswith(name + "{") and marker in line:
                labels, value = line.rsplit(" ", 1)
                samples[labels.split(marker, 1)[1].split('"', 1)[0]] = float(value)
        return samples

    def is_running(self) -> bool:
        """True while the process exists (paused counts as running)."""
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The argv that starts this server."""
        return [
            sys.executable,
            "-m",
            "nyala.cli",
            self.role,
            "run",
            "--fs-root",
            str(self.fs_root),
            "--rpc-bind",
            self.rpc_addr,
            "--http-bind",
            self.http_addr,
            *self.flags,
        ]

    def start(self) -> None:
        """Starts the process (without waiting for it to be ready)."""
        if self.is_running():
            raise NyalaError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"=== {stamp} starting: {' '.join(self.command())}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # The child asks the kernel to SIGKILL it when we die (nyala.cli reads this).
                env={**os.environ, **self.env, PARENT_PID_ENV: str(os.getpid())},
            )
        with _live_lock:
            _live_processes.add(proc)
        self._proc = proc

    def _ask_uuid(self, proxy: BlockingServerProxy) -> str:
        if self.role != "master":
            return proxy.ping(timeout_ms=500).server_uuid
        request = master_pb2.ConnectToMasterRequestPB()
        answer = proxy.call(proxy.master.ConnectToMaster, request, timeout_ms=500)
        return answer.master_uuid

    def wait_ready(self, timeout_s: float = 30.0) -> str:
        """Waits until the server answers Ping (a master: ConnectToMaster); returns (and
        records) its UUID."""
        deadline = time.monotonic() + timeout_s
        last_error: Exception | None = None
        with self.proxy() as proxy:
            while time.monotonic() < deadline:
                if not self.is_running():
                    raise NyalaError(
                        f"{self.name} exited with code {self.returncode} before it was ready; "
                        f"log {self.log_path}: {self.log_tail()}"
                    )
                try:
                    self.uuid = self._ask_uuid(proxy)
                    return self.uuid
                except NyalaError as exc:
                    last_error = exc
                    time.sleep(0.05)
        raise TimedOutError(
            f"{self.name} not ready after {timeout_s} s ({last_error}); log {self.log_path}"
        )

    def proxy(self) -> BlockingServerProxy:
        """A blocking RPC channel to this server (close it, or use ``with``)."""
        return BlockingServerProxy(self.rpc_addr, self.rpc_settings)

    def ping(self, *, timeout_ms: int = 2_000) -> tserver_pb2.PingResponsePB:
        """Ping with this server's UUID as ``dest_uuid`` (any UUID if not known yet)."""
        with self.proxy() as proxy:
            return proxy.ping(self.uuid or "", timeout_ms=timeout_ms)

    def signal(self, signum: int) -> None:
        """Sends ``signum`` to the process."""
        proc = self._require_process()
        proc.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL, and reap the process."""
        proc = self._require_process()
        proc.kill()
        self._reap(timeout_s=10.0)

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing."""
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after ``pause``."""
        self.signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM (after SIGCONT, in case it is paused) and wait; returns the exit code."""
        proc = self._require_process()
        proc.send_signal(signal.SIGCONT)
        proc.terminate()
        return self._reap(timeout_s)

    def wait_exit(self, timeout_s: float = 15.0) -> int:
        """Waits for the process to exit on its own; returns the exit code."""
        self._require_process()
        return self._reap(timeout_s)

    def restart(self, timeout_s: float = 30.0) -> str:
        """Kills the process if running, starts it again on the same root and ports."""
        if self.is_running():
            self.kill()
        self.start()
        return self.wait_ready(timeout_s)

    def wipe(self) -> None:
        """Deletes the fs root (the process must be down): the next start gets a new UUID."""
        if self.is_running():
            raise NyalaError(f"{self.name} is running; stop or kill it before wiping")
        shutil.rmtree(self.fs_root, ignore_errors=True)
        self.uuid = None

    @property
    def returncode(self) -> int | None:
        """Exit code (negative: killed by that signal); None while running or never started."""
        return None if self._proc is None else self._proc.poll()

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the log, joined with ' | ' (for error messages)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "<no log>"
        return " | ".join(text.strip().splitlines()[-lines:])

    def _require_process(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise NyalaError(f"{self.name} was never started")
        return self._proc

    def _reap(self, timeout_s: float) -> int:
        proc = self._require_process()
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise TimedOutError(f"{self.name} did not exit within {timeout_s} s") from None
        with _live_lock:
            _live_processes.discard(proc)
        return code

    def _force_down(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
        if self._proc is not None:
            with _live_lock:
                _live_processes.discard(self._proc)


class MiniCluster:
    """A set of real server processes on loopback. Use as a context manager.

    ``base_dir`` defaults to a new temp directory, deleted on shutdown unless
    ``keep_dir`` (then logs stay for a post-mortem). ``secure``: a cluster CA under
    ``base_dir/security``, every server with ``--security-dir`` (mutual TLS, roles checked),
    tablet servers enrolling with a join credential, and the test process an admin
    (``security.admin_dir`` for ``nyala.connect(credentials=...)``).

    The tablet servers share this machine: unless its flags say otherwise, each gets an equal
    share of the default memory limit (``--memory-limit-bytes``; 80 % of the machine for a
    server alone). With the whole default each, three servers under a heavy load held more
    than the machine has before any refused a write, and the kernel killed one.
    """

    def __init__(
        self,
        num_tservers: int = 3,
        *,
        num_masters: int = 0,
        base_dir: Path | None = None,
        tserver_flags: Sequence[str] = (),
        master_flags: Sequence[str] = (),
        start_timeout_s: float = 30.0,
        keep_dir: bool = False,
        secure: bool = False,
        each_tserver_flags: Sequence[Sequence[str]] = (),
        reserved_ports: Collection[int] = (),
    ) -> None:
        self._owns_dir = base_dir is None
        self.base_dir = (
            Path(tempfile.mkdtemp(prefix="nyala-mini-")) if base_dir is None else base_dir
        )
        self.keep_dir = keep_dir
        self.start_timeout_s = start_timeout_s
        self.tserver_flags = list(tserver_flags)
        # Flags of the i-th tablet server only (its own ports of something, say).
        self.each_tserver_flags = [list(flags) for flags in each_tserver_flags]
        # Ports the caller chose for its own servers' other listeners (a peer channel named in
        # ``each_tserver_flags``): never given to a server here as its RPC or HTTP port.
        self.reserved_ports = frozenset(reserved_ports)
        self.master_flags = list(master_flags)
        self._num_masters = num_masters
        self.masters: list[ServerProcess] = []
        self.tservers: list[ServerProcess] = []
        self._num_tservers = num_tservers
        self._shut_down = False
        self.security = ClusterSecurity(self.base_dir / "security") if secure else None
        self.rpc_settings = self.security.admin_settings if self.security else RpcSettings()

    def __enter__(self) -> MiniCluster:
        try:
            self.start()
        except BaseException:
            self.shutdown()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()

    @property
    def master_addrs(self) -> list[str]:
        """RPC addresses of the masters (empty until masters exist)."""
        return [m.rpc_addr for m in self.masters]

    def tserver(self, index: int) -> ServerProcess:
        """The ``index``-th tablet server."""
        return self.tservers[index]

    def start(self) -> None:
        """Starts every configured server, then waits for all of them to be ready."""
        # Every master's ports chosen in one call: masters bind only once all are listed, and
        # ports chosen one call after another may repeat (each call's sockets are closed).
        ports = free_loopback_ports(2 * self._num_masters, LOOPBACK, avoid=self.reserved_ports)
        for i in range(self._num_masters):
            self._new_master(ports=(ports[2 * i], ports[2 * i + 1]))
        for master in self.masters:
            master.flags += ["--masters", ",".join(self.master_addrs)]
            master.start()
        for master in self.masters:
            master.wait_ready(self.start_timeout_s)
        for _ in range(self._num_tservers):
            self._new_tserver()
        for ts in self.tservers:
            ts.start()
        for ts in self.tservers:
            self._wait_ready_first_time(ts)

    def add_tserver(self, *, flags: Sequence[str] = ()) -> ServerProcess:
        """Starts one more tablet server and waits until it is ready."""
        ts = self._new_tserver(flags)
        ts.start()
        self._wait_ready_first_time(ts)
        return ts

    def _wait_ready_first_time(self, server: ServerProcess) -> None:
        """Waits for a new server; if another process took its free port meanwhile, picks new
        ports and starts it again (only before its first start succeeded: later, peers know
        its address)."""
        for attempt in range(_BIND_ATTEMPTS):
            try:
                server.wait_ready(self.start_timeout_s)
                return
            except NyalaError as exc:
                if "cannot bind" not in str(exc) or attempt == _BIND_ATTEMPTS - 1:
                    raise
            server.rpc_port, server.http_port = free_loopback_ports(
                2, LOOPBACK, avoid=self.reserved_ports
            )
            server.start()

    def initial_config(
        self, servers: Sequence[ServerProcess] | None = None
    ) -> metadata_pb2.RaftConfigPB:
        """The ``RaftConfigPB`` a new tablet on ``servers`` (default: all tservers) starts with."""
        config = metadata_pb2.RaftConfigPB()
        for ts in self.tservers if servers is None else servers:
            assert ts.uuid is not None, f"{ts.name} has not started yet"
            peer = config.peers.add(permanent_uuid=ts.uuid, member_type=metadata_pb2.VOTER)
            peer.last_known_addr.host = LOOPBACK
            peer.last_known_addr.port = ts.rpc_port
        return config

    def create_tablet(
        self,
        tablet_id: str,
        schema: Schema,
        *,
        table_name: str = "t",
        servers: Sequence[ServerProcess] | None = None,
    ) -> None:
        """Sends ``CreateTablet`` with the same initial config to every replica, as the master
        will (``schema`` is a ``nyala.Schema``); raises the first refusal."""
        from nyala.rpc.schema_pb import schema_to_pb

        members = list(self.tservers if servers is None else servers)
        config = self.initial_config(members)
        for ts in members:
            request = tserver_admin_pb2.CreateTabletRequestPB(
                dest_uuid=ts.uuid or "",
                table_id=tablet_id,
                table_name=table_name,
                tablet_id=tablet_id,
                schema=schema_to_pb(schema),
                config=config,
            )
            with ts.proxy() as proxy:
                proxy.admin_call(proxy.admin.CreateTablet, request)

    def leader_of(self, tablet_id: str, *, timeout_s: float = 30.0) -> ServerProcess:
        """The running tserver that leads ``tablet_id``, once one claims it and agrees that it
        leads (asked through GetConsensusState); ``TimedOutError`` otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for ts in self.tservers:
                if not ts.is_running() or ts.uuid is None:
                    continue
                request = consensus_pb2.GetConsensusStateRequestPB(
                    dest_uuid=ts.uuid, tablet_ids=[tablet_id]
                )
                try:
                    with ts.proxy() as proxy:
                        response = proxy.call(
                            proxy.consensus.GetConsensusState, request, timeout_ms=1_000
                        )
                except NyalaError:
                    continue
                if response.tablets and response.tablets[0].cstate.leader_uuid == ts.uuid:
                    return ts
            time.sleep(0.05)
        raise TimedOutError(f"no leader of tablet {tablet_id} within {timeout_s} s")

    def shutdown(self) -> None:
        """Kills every process (SIGKILL) and removes the directory unless ``keep_dir``."""
        if self._shut_down:
            return
        self._shut_down = True
        for server in [*self.tservers, *self.masters]:
            server._force_down()
        if self._owns_dir and not self.keep_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def _new_master(
        self,
        flags: Sequence[str] = (),
        ports: tuple[int, int] | None = None,
        *,
        join: bool = False,
    ) -> ServerProcess:
        rpc_port, http_port = ports or free_loopback_ports(2, LOOPBACK, avoid=self.reserved_ports)
        name = f"master-{len(self.masters)}"
        security = self._security_flags(name, join=join)
        master = ServerProcess(
            "master",
            len(self.masters),
            self.base_dir,
            rpc_port,
            http_port,
            [*self.master_flags, *security, *flags],
            self.rpc_settings,
        )
        self.masters.append(master)
        return master

    def add_master(self, *, flags: Sequence[str] = (), join: bool = True) -> ServerProcess:
        """Starts one more master whose ``--masters`` lists the current ones and itself (it
        joins the cluster once the leader adds it: ``AddMaster``); waits until it answers. In
        a secure cluster it gets a join credential (``join``; else a copy of the CA) and
        enrolls with the other masters."""
        master = self._new_master(flags, join=join)
        master.flags += ["--masters", ",".join(self.master_addrs)]
        master.start()
        master.wait_ready(self.start_timeout_s)
        return master

    def leader_master(self, *, timeout_s: float = 30.0) -> ServerProcess:
        """The running master that leads with its catalog loaded; ``TimedOutError`` if none
        does within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for master in self.masters:
                if not master.is_running():
                    continue
                try:
                    with master.proxy() as proxy:
                        answer = proxy.call(
                            proxy.master.ConnectToMaster,
                            master_pb2.ConnectToMasterRequestPB(),
                            timeout_ms=1_000,
                        )
                except NyalaError:
                    continue
                if answer.catalog_ready:
                    return master
            time.sleep(0.05)
        raise TimedOutError(f"no leader master within {timeout_s} s")

    def _security_flags(self, name: str, *, join: bool = False) -> list[str]:
        """``--security-dir`` for a new server of a secure cluster (none otherwise); ``join``:
        a join credential, also for a master."""
        if self.security is None:
            return []
        directory = self.security.tserver_dir(name) if join else self.security.server_dir(name)
        return ["--security-dir", str(directory)]

    def _new_tserver(self, flags: Sequence[str] = ()) -> ServerProcess:
        rpc_port, http_port = free_loopback_ports(2, LOOPBACK, avoid=self.reserved_ports)
        masters = ["--masters", ",".join(self.master_addrs)] if self.masters else []
        index = len(self.tservers)
        security = self._security_flags(f"tserver-{index}")
        own = self.each_tserver_flags[index] if index < len(self.each_tserver_flags) else []
        args = [*self.tserver_flags, *masters, *security, *own, *flags]
        if not any(a.split("=", 1)[0] == MEMORY_LIMIT_FLAG for a in args):
            share = default_memory_limit_bytes() // max(1, self._num_tservers)
            args += [MEMORY_LIMIT_FLAG, str(share)]
        ts = ServerProcess(
            "tserver", index, self.base_dir, rpc_port, http_port, args, self.rpc_settings
        )
        self.tservers.append(ts)
        return ts


def dump_logs(cluster: MiniCluster, out: IO[str] = sys.stderr) -> None:
    """Writes every server's log to ``out`` (for a failing test's output).

    A one-line state of every server comes first, and the logs of servers that have exited
    come before those of running ones: a server that died on its own is the likeliest cause,
    and a CI report that keeps only the head of the output still shows it.
    """
    servers = [*cluster.masters, *cluster.tservers]
    states = [
        f"{s.name} {'running' if s.is_running() else f'exited ({s.returncode})'}" for s in servers
    ]
    out.write(f"----- server states: {', '.join(states)} -----\n")
    for server in sorted(servers, key=lambda s: s.is_running()):
        out.write(f"----- {server.name} ({server.log_path}) -----\n")
        with contextlib.suppress(FileNotFoundError):
            out.write(server.log_path.read_text(errors="replace"))


def corrupt_file(path: Path) -> None:
    """Flips bits of the byte in the middle of ``path`` (a damaged metadata file: its
    checksum no longer matches)."""
    image = bytearray(path.read_bytes())
    image[len(image) // 2] ^= 0x5A
    path.write_bytes(bytes(image))


@contextlib.contextmanager
def logs_on_failure(cluster: MiniCluster, out: IO[str] = sys.stderr) -> Iterator[MiniCluster]:
    """Starts ``cluster`` and shuts it down after the block; if the block raised, every
    server's log is written to ``out`` first (a module-scoped fixture's failure report)."""
    with cluster as mini:
        try:
            yield mini
        except BaseException:
            dump_logs(mini, out)
            raise


__all__ = [
    "LOOPBACK",
    "MiniCluster",
    "ServerProcess",
    "corrupt_file",
    "dump_logs",
    "logs_on_failure",
]


#: Raft settings for tests: 100 ms heartbeats, an election after 3 missed ones.
FAST_RAFT_FLAGS: tuple[str, ...] = (
    "--heartbeat-interval-ms",
    "100",
    "--leader-failure-max-missed-heartbeat-periods",
    "3",
)
#: Tserver settings for tests with masters: fast Raft, a master heartbeat every 200 ms.
#: A tablet server's memory limit (MiniCluster gives each its share of the machine's).
MEMORY_LIMIT_FLAG = "--memory-limit-bytes"

FAST_TSERVER_FLAGS: tuple[str, ...] = (*FAST_RAFT_FLAGS, "--master-heartbeat-interval-ms", "200")


def fast_master_flags(*extra: str) -> list[str]:
    """Master settings for tests: fast Raft, background tasks every 100 ms, then ``extra``."""
    return [*FAST_RAFT_FLAGS, "--background-task-interval-ms", "100", *extra]


def run_nyala(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Runs the ``nyala`` program as a real process (``NYALA_MASTERS`` cleared, so every
    command names its masters), capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "nyala.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "NYALA_MASTERS": ""},
    )
