"""``ChaosCluster``: a ``MiniCluster`` whose replicas talk through fault-injecting proxies.

It owns the proxies (``proxy.Network``), the disk-fault shim, the tablet under test and the
bookkeeping of which servers are its members and which are spares (membership changes move
replicas between them). Everything goes through the public wire protocol.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

from nyala import errors
from nyala._proto import consensus_pb2, metadata_pb2, tserver_admin_pb2
from nyala.chaos.disk_fault import DiskFaults
from nyala.chaos.proxy import LOOPBACK, Network
from nyala.rpc.channel import BlockingMethod
from nyala.rpc.messages import Answer
from nyala.rpc.ports import free_loopback_ports
from nyala.schema import Schema
from nyala.testing.mini_cluster import MiniCluster, ServerProcess

ADMIN_TIMEOUT_MS = 10_000
# A restart replays the WAL; on a loaded 2-core machine that has taken more than 30 s.
RESTART_TIMEOUT_S = 120.0

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp", bound=Answer)


class ChaosCluster:
    """``num_tservers`` tservers; the tablet lives on the first ``replicas`` of them."""

    def __init__(
        self,
        *,
        num_tservers: int = 4,
        replicas: int = 3,
        base_dir: Path | None = None,
        keep_dir: bool = False,
        tserver_flags: tuple[str, ...] = (),
    ) -> None:
        # Tablet copies go over FetchData: the proxies sit in front of the RPC ports, and copy
        # bytes on the data channel (docs/tablet-copy.md) would cross a partition. Consensus
        # goes over the peer channel, which each server announces at a proxy of its own: the
        # port a server binds is chosen here, and the proxy in front of it made first.
        self.network = Network(self._server_pids)
        channel_ports = free_loopback_ports(num_tservers, LOOPBACK)
        each: list[list[str]] = []
        for i, port in enumerate(channel_ports):
            proxy = self.network.add_proxy(f"tserver-{i}", port, channel=True)
            each.append(
                [
                    f"--consensus-peer-channel-port={port}",
                    f"--consensus-peer-channel-advertised-port={proxy.port}",
                ]
            )
        self.mini = MiniCluster(
            num_tservers,
            base_dir=base_dir,
            keep_dir=keep_dir,
            tserver_flags=("--no-tablet-copy-data-channel", *tserver_flags),
            each_tserver_flags=each,
            reserved_ports=channel_ports,
        )
        self.replicas = replicas
        self.disk = DiskFaults(self.mini.base_dir)
        self.tablet_id = ""
        self.schema: Schema | None = None
        # The servers in the tablet's config, as far as the nemesis knows; the rest are spares.
        self.members: list[ServerProcess] = []
        self._stack = contextlib.ExitStack()
        # Every server (re)start runs on this one thread, which lives as long as the cluster:
        # a child arms PR_SET_PDEATHSIG, which fires when the *thread* that forked it exits,
        # so a server restarted from the nemesis thread would die with that thread.
        self._spawner = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spawner")

    def __enter__(self) -> ChaosCluster:
        try:
            self._stack.callback(self._spawner.shutdown)
            self._stack.callback(self.network.close)
            self.disk.build()
            self._stack.enter_context(self.disk.environment())
            self._stack.enter_context(self.mini)
            for ts in self.mini.tservers:
                self.network.add_proxy(ts.name, ts.rpc_port)
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self._stack.close()

    @property
    def tservers(self) -> list[ServerProcess]:
        return self.mini.tservers

    @property
    def spares(self) -> list[ServerProcess]:
        return [ts for ts in self.tservers if ts not in self.members]

    def _server_pids(self) -> dict[int, str]:
        return {ts.pid: ts.name for ts in self.tservers if ts.pid is not None and ts.is_running()}

    def restart(self, ts: ServerProcess) -> None:
        """Kills ``ts`` if running, starts it again and waits until it answers."""
        self._spawner.submit(ts.restart, RESTART_TIMEOUT_S).result()

    def start_fresh(self, ts: ServerProcess) -> None:
        """Kills and wipes ``ts`` (a new UUID), starts it and waits until it answers."""

        def fresh() -> None:
            if ts.is_running():
                ts.kill()
            ts.wipe()
            ts.start()
            ts.wait_ready(RESTART_TIMEOUT_S)

        self._spawner.submit(fresh).result()

    def start(self, ts: ServerProcess) -> None:
        """Starts ``ts`` without waiting for it."""
        self._spawner.submit(ts.start).result()

    def peer(
        self,
        ts: ServerProcess,
        member_type: metadata_pb2.MemberType.ValueType = metadata_pb2.VOTER,
    ) -> metadata_pb2.RaftPeerPB:
        """The ``RaftPeerPB`` of ``ts``, addressed through its proxy."""
        assert ts.uuid is not None, f"{ts.name} has not started"
        peer = metadata_pb2.RaftPeerPB(permanent_uuid=ts.uuid, member_type=member_type)
        peer.last_known_addr.host = LOOPBACK
        peer.last_known_addr.port = self.network.proxies[ts.name].port
        return peer

    def create_tablet(self, tablet_id: str, schema: Schema) -> None:
        """Creates the tablet on the first ``replicas`` servers, peers addressed by proxy."""
        from nyala.rpc.schema_pb import schema_to_pb

        self.tablet_id, self.schema = tablet_id, schema
        self.members = list(self.tservers[: self.replicas])
        config = metadata_pb2.RaftConfigPB()
        for ts in self.members:
            config.peers.append(self.peer(ts))
        for ts in self.members:
            self.create_replica(ts, config, schema_to_pb(schema))

    def create_replica(
        self,
        ts: ServerProcess,
        config: metadata_pb2.RaftConfigPB,
        schema_pb: metadata_pb2.SchemaPB | None = None,
    ) -> None:
        from nyala.rpc.schema_pb import schema_to_pb

        assert self.schema is not None
        request = tserver_admin_pb2.CreateTabletRequestPB(
            dest_uuid=ts.uuid or "",
            table_id=self.tablet_id,
            table_name="chaos",
            tablet_id=self.tablet_id,
            schema=schema_pb if schema_pb is not None else schema_to_pb(self.schema),
            config=config,
        )
        with ts.proxy() as proxy:
            proxy.admin_call(proxy.admin.CreateTablet, request, timeout_ms=ADMIN_TIMEOUT_MS)

    def cstate(
        self, ts: ServerProcess, *, timeout_ms: int = 2_000
    ) -> consensus_pb2.GetConsensusStateResponsePB.TabletConsensusInfoPB:
        """The consensus state ``ts`` reports for the tablet."""
        request = consensus_pb2.GetConsensusStateRequestPB(
            dest_uuid=ts.uuid or "", tablet_ids=[self.tablet_id]
        )
        with ts.proxy() as proxy:
            response = proxy.call(proxy.consensus.GetConsensusState, request, timeout_ms=timeout_ms)
        if not response.tablets:
            raise errors.TabletNotFoundError(f"{ts.name} has no replica of {self.tablet_id}")
        return response.tablets[0]

    def leader(self, *, timeout_s: float = 10.0) -> ServerProcess:
        """The running member that claims leadership in the highest term (a deposed leader
        cut off by a partition keeps claiming its old term); ``TimedOutError`` if none."""
        deadline = time.monotonic() + timeout_s
        while True:
            claims: list[tuple[int, int, ServerProcess]] = []
            for i, ts in enumerate(list(self.members)):
                if not ts.is_running() or ts.uuid is None:
                    continue
                with contextlib.suppress(errors.NyalaError):
                    cstate = self.cstate(ts, timeout_ms=500).cstate
                    if cstate.leader_uuid == ts.uuid:
                        claims.append((int(cstate.current_term), -i, ts))
            if claims:
                return max(claims, key=lambda claim: claim[:2])[2]
            if time.monotonic() > deadline:
                raise errors.TimedOutError(f"no leader of {self.tablet_id} in {timeout_s} s")
            time.sleep(0.05)

    def consensus_call(
        self, ts: ServerProcess, method: BlockingMethod[_Req, _Resp], request: _Req
    ) -> _Resp:
        with ts.proxy() as proxy:
            return proxy.call(method(proxy), request, timeout_ms=ADMIN_TIMEOUT_MS)

    def step_down(self, ts: ServerProcess, *, abrupt: bool) -> None:
        mode = consensus_pb2.ABRUPT if abrupt else consensus_pb2.GRACEFUL
        request = consensus_pb2.LeaderStepDownRequestPB(
            dest_uuid=ts.uuid or "", tablet_id=self.tablet_id, mode=mode
        )
        self.consensus_call(ts, lambda p: p.consensus.LeaderStepDown, request)

    def change_config(
        self,
        change_type: consensus_pb2.ChangeConfigType.ValueType,
        peer: metadata_pb2.RaftPeerPB,
        *,
        deadline_s: float = 15.0,
    ) -> consensus_pb2.ChangeConfigResponsePB:
        """Sends ``ChangeConfig`` to the leader, retrying while leadership is unsettled."""
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                leader = self.leader(timeout_s=max(0.1, deadline - time.monotonic()))
                request = consensus_pb2.ChangeConfigRequestPB(
                    dest_uuid=leader.uuid or "",
                    tablet_id=self.tablet_id,
                    type=change_type,
                    server=peer,
                )
                return self.consensus_call(leader, lambda p: p.consensus.ChangeConfig, request)
            except (errors.RetriableError, errors.IllegalStateError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def wal_dir(self, ts: ServerProcess) -> Path:
        return ts.fs_root / "wals" / self.tablet_id

    def cmeta_path(self, ts: ServerProcess) -> Path:
        return ts.fs_root / "consensus-meta" / self.tablet_id

    def running_members(self) -> Iterator[ServerProcess]:
        return (ts for ts in self.members if ts.is_running())
