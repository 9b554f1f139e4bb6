"""Server heartbeats: the liveness of quiesced replicas, one message per pair of servers.

Once per heartbeat interval this server tells every peer server (every other member of the
configs of the replicas it hosts) which of its replicas are quiesced and as what
(``nyala.consensus.liveness``): the tablets it leads quiesced that the peer holds a replica
of, and the tablets it follows quiesced whose leader is on the peer. A received heartbeat is
held against the local replicas it concerns; a peer that has not been heard from for the
minimum election timeout is reported silent to the replicas it kept quiesced, which wake.

The cost is per pair of servers, not per tablet: with thousands of idle replicas a server
sends one small message to each peer per interval, and no per-tablet heartbeat or timer runs.
This module owns the sending loop, the handler's work and the silence check; the Raft rules
stay in the core, and the RPC plumbing in ``nyala.server.consensus_service``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from nyala._proto import consensus_pb2
from nyala.common.clock import Clock
from nyala.consensus import liveness
from nyala.consensus.liveness import Following, Leading, QuiescedAs, ServerSilence
from nyala.consensus.runtime.raft_runtime import RaftRuntime
from nyala.consensus.types import Role
from nyala.errors import NyalaError
from nyala.rpc.channel import ServerProxy
from nyala.rpc.settings import RpcSettings
from nyala.tablet import TabletManager
from nyala.tablet.replica import TabletReplica

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Peer:
    """A peer server: its address and this server's next heartbeat to it (built in place:
    at thousands of quiesced replicas, building each entry once is most of the sending)."""

    address: str
    request: consensus_pb2.ServerHeartbeatRequestPB


#: How many heartbeat intervals the heartbeats to send are reused without a change noted,
#: and how many repeated heartbeats from a peer skip the walk over every local replica: a
#: bound on what a change that was not noted (never expected) could hide.
RECHECK_EVERY = 20


@dataclass(slots=True)
class _Received:
    """A peer's last heartbeat, fully checked at ``epoch``, and the local replicas it vouched
    for (with what it named them); ``repeats_left``: identical heartbeats that may skip the
    walk over every replica."""

    request: consensus_pb2.ServerHeartbeatRequestPB
    epoch: int
    vouched: list[tuple[RaftRuntime, QuiescedAs]]
    repeats_left: int


class ServerHeartbeats:
    """Sends this server's heartbeats, handles the peers', and reports silent peers."""

    def __init__(
        self,
        uuid: str,
        tablets: Callable[[], TabletManager | None],
        clock: Clock,
        *,
        interval_ms: int,
        silent_after_ms: int,
        rpc_settings: RpcSettings,
    ) -> None:
        self.uuid = uuid
        self._tablets = tablets
        self._clock = clock
        self._interval_ms = interval_ms
        self._silence = ServerSilence(silent_after_ms)
        self._rpc_settings = rpc_settings
        self._proxies: dict[str, ServerProxy] = {}
        self.sent = 0  # heartbeats sent (metrics, tests)
        self.received = 0
        # Bumped by every local liveness change (``note_change``); the caches below hold
        # while it stays.
        self._epoch = 0
        self._sent: tuple[int, int, dict[str, _Peer]] | None = None  # (epoch, uses left, peers)
        self._received: dict[str, _Received] = {}  # by peer: its last heartbeat, checked

    async def run(self) -> None:
        """Every interval: one heartbeat to each peer server, then the silence check. Runs
        until cancelled; closes its channels on the way out."""
        # Silence is checked more often than heartbeats are sent: a dead peer's replicas wake
        # within a fifth of an interval of the silence timeout, not a whole interval later.
        checks_per_interval = 5
        step_ms = self._interval_ms / checks_per_interval
        try:
            async with asyncio.TaskGroup() as group:
                while True:
                    peers = self._peers()
                    for peer_uuid, peer in peers.items():
                        group.create_task(self._send(peer_uuid, peer))
                    for _ in range(checks_per_interval):
                        self._check_silence(peers)
                        slept_from = self._clock.now_ms()
                        await asyncio.sleep(step_ms / 1000)
                        # Woken late: this loop was stalled, and what peers sent meanwhile
                        # still waits to be handled (``ServerSilence.excuse``).
                        # Only a stall of a heartbeat interval or more: the steady lateness
                        # of a loaded machine, excused at every check, would add up and
                        # delay noticing a dead peer.
                        stalled_ms = int(self._clock.now_ms() - slept_from - step_ms)
                        if stalled_ms >= self._interval_ms:
                            self._silence.excuse(stalled_ms)
                            log.info("event loop stalled for %d ms", stalled_ms)
        finally:
            proxies, self._proxies = self._proxies, {}
            for proxy in proxies.values():
                with contextlib.suppress(Exception):
                    await proxy.close()

    def note_change(self) -> None:
        """What a server heartbeat says of a local replica changed (it quiesced, woke, or
        stopped: ``RaftRuntime.on_liveness_change``): the heartbeats to send are built again,
        and the next heartbeat from each peer is checked against every replica again."""
        self._epoch += 1

    def handle(self, request: consensus_pb2.ServerHeartbeatRequestPB) -> None:
        """A peer's heartbeat: each local quiesced replica it concerns is vouched for or woken
        (``liveness.receive``).

        A heartbeat that says what the peer's last one said, when no local replica changed
        since and every replica that one concerned was vouched for, only records the peer as
        heard again by each of those (``RaftCore.vouched_again``): the same answer as asking
        every replica again, without walking all of them. An idle server with 2,000 replicas
        spent half of its event loop walking them for each peer's heartbeat. Every
        ``RECHECK_EVERY``-th heartbeat walks them anyway."""
        sender = request.caller_uuid
        self.received += 1
        now = self._clock.now_ms()
        self._silence.heard(sender, now)
        last = self._received.get(sender)
        if (
            last is not None
            and last.epoch == self._epoch
            and last.repeats_left > 0
            and last.request == request
        ):
            last.repeats_left -= 1
            for runtime, named_as in last.vouched:
                if not runtime.core.vouched_again(sender, now):
                    # Changed unnoticed (never expected): the full question, and a full
                    # check of the next heartbeat.
                    runtime.server_heartbeat(sender, named_as)
                    last.repeats_left = 0
            return
        named: dict[str, QuiescedAs] = {
            pb.tablet_id: Leading(pb.term, pb.commit_index) for pb in request.leading
        }
        named.update(
            (pb.tablet_id, Following(pb.leader_uuid, pb.term, pb.commit_index))
            for pb in request.following
        )
        vouched: list[tuple[RaftRuntime, QuiescedAs]] = []
        every_one_vouched = True
        for replica in self._replicas():
            local = replica.runtime
            if local is None or not local.quiesced:
                continue
            said = named.get(replica.tablet_id)
            if local.server_heartbeat(sender, said):
                assert said is not None
                vouched.append((local, said))
            elif liveness.concerns(local.core, sender):
                every_one_vouched = False  # not settled yet: ask it again next time
        if every_one_vouched:
            self._received[sender] = _Received(request, self._epoch, vouched, RECHECK_EVERY)
        else:
            self._received.pop(sender, None)

    # --- sending ----------------------------------------------------------------------------

    def _replicas(self) -> list[TabletReplica]:
        manager = self._tablets()
        return [] if manager is None else manager.replicas()

    def _peers(self) -> dict[str, _Peer]:
        """Every peer server of a hosted replica, with what this server tells it: built
        again when a replica's liveness changed (``note_change``) and every
        ``RECHECK_EVERY``-th interval (a new replica's peer is first told within that, but
        nothing depends on it until the replica quiesces, which is a change)."""
        if self._sent is not None and self._sent[0] == self._epoch and self._sent[1] > 0:
            self._sent = (self._epoch, self._sent[1] - 1, self._sent[2])
            return self._sent[2]
        epoch = self._epoch
        peers = self._build_peers()
        self._sent = (epoch, RECHECK_EVERY, peers)
        return peers

    def _build_peers(self) -> dict[str, _Peer]:
        peers: dict[str, _Peer] = {}
        for replica in self._replicas():
            runtime = replica.runtime
            if runtime is None or not runtime.running:
                continue
            core = runtime.core
            config = core.active_config
            for peer in config.peers:
                if peer.uuid != self.uuid and peer.uuid not in peers:
                    peers[peer.uuid] = _Peer(
                        peer.address,
                        consensus_pb2.ServerHeartbeatRequestPB(
                            dest_uuid=peer.uuid, caller_uuid=self.uuid
                        ),
                    )
            if not core.quiesced:
                continue
            tablet_id = replica.tablet_id
            if core.role is Role.LEADER:
                term, commit_index = core.term, core.commit_index
                for peer in config.peers:
                    if peer.uuid != self.uuid:
                        peers[peer.uuid].request.leading.add(
                            tablet_id=tablet_id, term=term, commit_index=commit_index
                        )
            elif core.leader_uuid is not None and core.leader_uuid in peers:
                peers[core.leader_uuid].request.following.add(
                    tablet_id=tablet_id,
                    leader_uuid=core.leader_uuid,
                    term=core.term,
                    commit_index=core.commit_index,
                )
        return peers

    async def _send(self, peer_uuid: str, peer: _Peer) -> None:
        request = peer.request
        proxy = self._proxies.get(peer.address)
        if proxy is None:
            proxy = self._proxies[peer.address] = ServerProxy(peer.address, self._rpc_settings)
        try:
            # As long as the peer's silence timeout: a heartbeat that reaches a busy peer late
            # still counts there (it is its whole point), so it must not expire on the way.
            await proxy.call(
                proxy.consensus.ServerHeartbeat, request, timeout_ms=self._silence.silent_after_ms
            )
            self.sent += 1
        except NyalaError as e:
            log.debug("server heartbeat to %s@%s failed: %r", peer_uuid, peer.address, e)

    def _check_silence(self, peers: dict[str, _Peer]) -> None:
        now = self._clock.now_ms()
        self._silence.watch(peers, now)
        silent = self._silence.newly_silent(now)
        if not silent:
            return
        log.info(
            "servers %s sent no server heartbeat for %d ms",
            silent,
            self._silence.silent_after_ms,
        )
        for replica in self._replicas():
            runtime = replica.runtime
            if runtime is not None and runtime.quiesced:
                for server in silent:
                    runtime.server_silent(server)
