"""A fault-injecting TCP proxy in front of each server's RPC port and consensus peer channel
(partitions and delays).

Why a proxy rather than iptables in network namespaces: it needs no privileges, works on any
CI runner, and can cut exactly one direction of one pair of processes on loopback. Servers
learn their peers' addresses only from the Raft config (``last_known_addr``), so a tablet
created with each peer's *proxy* address routes all replica-to-replica traffic through the
proxies; clients still dial the servers directly.

Every server dials every peer's proxy from 127.0.0.1, so the source of a connection cannot be
read from its address. The proxy finds it instead the way ``ss -p`` does: the peer's
ephemeral port -> its socket inode in ``/proc/net/tcp`` -> the process holding that inode.
A connection whose (source, destination) pair is cut is black-holed: accepted, never
forwarded, closed when the cut heals, so the dialer sees timeouts as on a lossy network, not
a polite refusal. Cutting a pair also closes its live connections. A delay holds every chunk
for the given time before forwarding it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from nyala.rpc.ports import free_loopback_ports

LOOPBACK = "127.0.0.1"
CHUNK_BYTES_MAX = 64 * 1024
# The name given to connections from processes that are not servers (the workload's clients).
CLIENT = "client"


def _socket_inode(local_port: int, remote_port: int) -> int | None:
    """The inode of the loopback socket from ``local_port`` to ``remote_port``. gRPC dials
    from dual-stack sockets, so IPv4-mapped connections are listed in ``tcp6``; on loopback
    the two ports identify the connection."""
    want_local, want_remote = f":{local_port:04X}", f":{remote_port:04X}"
    for table_path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table_path) as table:
            next(table)
            for line in table:
                fields = line.split()
                if fields[1].endswith(want_local) and fields[2].endswith(want_remote):
                    return int(fields[9])
    return None


def _pid_holding(inode: int, pids: list[int]) -> int | None:
    target = f"socket:[{inode}]"
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        with contextlib.suppress(OSError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    if os.readlink(f"{fd_dir}/{fd}") == target:
                        return pid
    return None


@dataclass
class _Link:
    """One proxied connection."""

    source: str
    downstream: socket.socket
    upstream: socket.socket | None

    def close(self) -> None:
        for sock in (self.downstream, self.upstream):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()


class Network:
    """The proxies of one cluster and the rules they obey (thread-safe)."""

    def __init__(self, source_of_pid: Callable[[], dict[int, str]]) -> None:
        # Maps each live server pid to its name; called at every accept (pids change on restart).
        self._source_of_pid = source_of_pid
        self._lock = threading.Lock()
        self._cut: set[tuple[str, str]] = set()  # (source, destination) pairs that are cut
        self._delay_ms: dict[str, int] = {}  # destination -> delay of each chunk, both ways
        self.proxies: dict[str, TcpProxy] = {}  # in front of each server's RPC port
        # In front of each server's consensus peer channel (docs/consensus.md), which the
        # server announces in place of its own port; the same cuts and delays apply.
        self.channel_proxies: dict[str, TcpProxy] = {}

    def add_proxy(self, name: str, target_port: int, *, channel: bool = False) -> TcpProxy:
        """Starts a proxy for server ``name`` forwarding to ``target_port`` (its RPC port, or
        with ``channel`` its peer channel's, which need not be listening yet)."""
        proxy = TcpProxy(self, name, target_port)
        (self.channel_proxies if channel else self.proxies)[name] = proxy
        proxy.start()
        return proxy

    def _every_proxy(self) -> list[TcpProxy]:
        return [*self.proxies.values(), *self.channel_proxies.values()]

    def partition(self, groups: list[set[str]]) -> None:
        """Cuts every pair of servers in different groups (both directions)."""
        cut = {
            (a, b)
            for i, ga in enumerate(groups)
            for j, gb in enumerate(groups)
            if i != j
            for a in ga
            for b in gb
        }
        self.cut(cut)

    def cut(self, pairs: set[tuple[str, str]]) -> None:
        """Cuts exactly ``pairs`` (source, destination), replacing earlier cuts."""
        with self._lock:
            self._cut = set(pairs)
        for proxy in self._every_proxy():
            proxy.enforce()

    def heal(self) -> None:
        """Removes every cut and delay."""
        with self._lock:
            self._cut = set()
            self._delay_ms = {}
        for proxy in self._every_proxy():
            proxy.enforce()

    def delay(self, destination: str, delay_ms: int) -> None:
        """Delays traffic to and from ``destination`` by ``delay_ms`` per chunk."""
        with self._lock:
            self._delay_ms[destination] = delay_ms

    def is_cut(self, source: str, destination: str) -> bool:
        with self._lock:
            return (source, destination) in self._cut

    def delay_s(self, destination: str) -> float:
        with self._lock:
            return self._delay_ms.get(destination, 0) / 1000.0

    def identify(self, peer_port: int, proxy_port: int) -> str:
        """Which process dialed: a server's name, or ``CLIENT``."""
        names = self._source_of_pid()
        inode = _socket_inode(peer_port, proxy_port)
        if inode is None:
            return CLIENT
        pid = _pid_holding(inode, list(names))
        return CLIENT if pid is None else names[pid]

    def close(self) -> None:
        for proxy in self._every_proxy():
            proxy.close()


class TcpProxy:
    """Listens on a free loopback port and forwards to one server, obeying ``Network``."""

    def __init__(self, network: Network, name: str, target_port: int) -> None:
        self.network = network
        self.name = name
        self.target_port = target_port
        self.port = free_loopback_ports(1, LOOPBACK)[0]
        self._listener = socket.create_server((LOOPBACK, self.port), backlog=64)
        self._links: list[_Link] = []
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name=f"proxy-{self.name}", daemon=True).start()

    def enforce(self) -> None:
        """Closes every link whose pair is now cut, and every black-holed link whose cut
        healed (so its dialer reconnects through the proxy)."""
        with self._lock:
            links = list(self._links)
        for link in links:
            blocked = self.network.is_cut(link.source, self.name)
            if blocked == (link.upstream is not None):
                self._drop(link)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            links = list(self._links)
        for link in links:
            self._drop(link)

    def _drop(self, link: _Link) -> None:
        link.close()
        with self._lock:
            if link in self._links:
                self._links.remove(link)

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                downstream, (_, peer_port) = self._listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._open_link, args=(downstream, peer_port), daemon=True
            ).start()

    def _open_link(self, downstream: socket.socket, peer_port: int) -> None:
        source = self.network.identify(peer_port, self.port)
        if self.network.is_cut(source, self.name):
            with self._lock:
                self._links.append(_Link(source, downstream, None))
            return  # black hole until ``enforce`` closes it
        try:
            upstream = socket.create_connection((LOOPBACK, self.target_port), timeout=5)
            upstream.settimeout(None)
        except OSError:
            downstream.close()
            return
        for sock in (downstream, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        link = _Link(source, downstream, upstream)
        with self._lock:
            self._links.append(link)
        threading.Thread(target=self._pump, args=(link, downstream, upstream), daemon=True).start()
        self._pump(link, upstream, downstream)

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(CHUNK_BYTES_MAX)
                if not data:
                    break
                delay_s = self.network.delay_s(self.name)
                if delay_s:
                    time.sleep(delay_s)
                dst.sendall(data)
        except OSError:
            pass
        self._drop(link)
