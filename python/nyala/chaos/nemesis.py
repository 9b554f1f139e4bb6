"""Nemeses: the faults of a chaos run, chosen and timed by a seeded random schedule.

Each fault kind is a function that breaks something and returns how to heal it. The schedule
runs one fault at a time: a quiet gap, a fault, a hold, the heal. Faults that restart a
server wait until it answers again, so the next fault starts from a whole cluster and a
majority is never lost for longer than one hold (``kill-all`` loses it on purpose).

Kinds: ``kill-one``, ``kill-minority``, ``kill-all`` (SIGKILL, then restart), ``pause``
(SIGSTOP/SIGCONT), ``partition`` (through the proxies), ``delay``, ``step-down``,
``membership`` (move a replica to a spare server: add as a promotable NON_VOTER, wait for
promotion, remove the old one), ``disk`` (every sync fails with EIO or ENOSPC; the server is
restarted with a healthy disk afterwards), ``torn-tail`` (a crash leaves a half-written frame
after the newest WAL segment's data), ``corrupt-meta`` (a byte of consensus metadata flips
while the server is down: it must refuse that replica, never start it blank; the file is
then restored).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import random
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from nyala import errors
from nyala._proto import consensus_pb2, metadata_pb2
from nyala.chaos.cluster import ChaosCluster
from nyala.testing.mini_cluster import ServerProcess

log = logging.getLogger(__name__)

Heal = Callable[[], None]

ALL_KINDS = (
    "kill-one",
    "kill-minority",
    "kill-all",
    "pause",
    "partition",
    "delay",
    "step-down",
    "membership",
    "disk",
    "torn-tail",
    "corrupt-meta",
)

PROMOTION_TIMEOUT_S = 30.0
FRAME_MAGIC = b"NYWB"
FRAME_HEADER_BYTES = 32
SEGMENT_HEADER_BYTES = 128


def _nothing() -> None:
    pass


class Nemesis:
    """Injects the faults of ``kinds`` into ``cluster`` on a schedule drawn from ``seed``."""

    def __init__(
        self,
        cluster: ChaosCluster,
        seed: int,
        kinds: tuple[str, ...] = ALL_KINDS,
        *,
        gap_s: tuple[float, float] = (0.5, 2.0),
        hold_s: tuple[float, float] = (1.0, 4.0),
    ) -> None:
        unknown = set(kinds) - set(ALL_KINDS)
        if unknown:
            raise errors.InvalidArgumentError(f"unknown nemesis kind(s) {sorted(unknown)}")
        self.cluster = cluster
        self.rng = random.Random(seed)
        self.kinds = tuple(kinds)
        self.gap_s = gap_s
        self.hold_s = hold_s
        self.faults: Counter[str] = Counter()
        # Misbehaviour seen while injecting (e.g. a corrupted cmeta accepted): anomalies.
        self.anomalies: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chaos-nemesis")
        self._thread.start()

    def stop(self) -> None:
        """Stops the schedule after the current fault is healed."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.rng.uniform(*self.gap_s)):
                if not self.kinds:
                    continue
                self.inject(self.rng.choice(self.kinds))
        except BaseException as exc:
            log.exception("nemesis failed")
            self.error = exc

    def inject(self, kind: str) -> None:
        """One fault of ``kind``: break, hold, heal."""
        log.info("nemesis: %s", kind)
        heal = getattr(self, "_" + kind.replace("-", "_"))()
        self.faults[kind] += 1
        self._stop.wait(self.rng.uniform(*self.hold_s))
        heal()
        self.heal_all()

    def heal_all(self) -> None:
        """Network healed, no disk fault, every member running and answering."""
        self.cluster.network.heal()
        for ts in self.cluster.members:
            if ts.pid is not None:
                self.cluster.disk.disarm(ts.pid)
            if not ts.is_running():
                self.cluster.restart(ts)

    # --- choices ---------------------------------------------------------------------------

    def _leader_or_none(self) -> ServerProcess | None:
        try:
            return self.cluster.leader(timeout_s=3.0)
        except errors.TimedOutError:
            return None

    def _one(self, prefer_leader: float = 0.5) -> ServerProcess:
        if self.rng.random() < prefer_leader:
            leader = self._leader_or_none()
            if leader is not None:
                return leader
        return self.rng.choice(self.cluster.members)

    def _minority(self) -> list[ServerProcess]:
        members = list(self.cluster.members)
        size = self.rng.randint(1, (len(members) - 1) // 2)
        return self.rng.sample(members, size)

    # --- process faults --------------------------------------------------------------------

    def _kill(self, victims: list[ServerProcess]) -> Heal:
        for ts in victims:
            ts.kill()

        def heal() -> None:
            for ts in victims:
                self.cluster.restart(ts)

        return heal

    def _kill_one(self) -> Heal:
        return self._kill([self._one()])

    def _kill_minority(self) -> Heal:
        return self._kill(self._minority())

    def _kill_all(self) -> Heal:
        return self._kill(list(self.cluster.members))

    def _pause(self) -> Heal:
        victims = [self._one()] if self.rng.random() < 0.5 else self._minority()
        for ts in victims:
            ts.pause()

        def heal() -> None:
            for ts in victims:
                ts.resume()

        return heal

    # --- network faults --------------------------------------------------------------------

    def _partition(self) -> Heal:
        members = [ts.name for ts in self.cluster.members]
        if self.rng.random() < 0.5:
            leader = self._leader_or_none()
            minority = {leader.name if leader else self.rng.choice(members)}
        else:
            minority = {ts.name for ts in self._minority()}
        rest = set(members) - minority
        self.cluster.network.partition([minority, rest])
        return self.cluster.network.heal

    def _delay(self) -> Heal:
        for ts in self._minority():
            self.cluster.network.delay(ts.name, self.rng.randint(20, 200))
        return self.cluster.network.heal

    # --- consensus faults ------------------------------------------------------------------

    def _step_down(self) -> Heal:
        leader = self._leader_or_none()
        if leader is not None:
            with contextlib.suppress(errors.NyalaError):
                self.cluster.step_down(leader, abrupt=self.rng.random() < 0.5)
        return _nothing

    def _membership(self) -> Heal:
        """Moves one follower's replica to a spare: add-then-remove (3-4-3)."""
        leader = self._leader_or_none()
        spares = self.cluster.spares
        followers = [ts for ts in self.cluster.members if ts is not leader]
        if leader is None or not spares or not followers:
            return _nothing
        spare, leaving = self.rng.choice(spares), self.rng.choice(followers)
        self.cluster.start_fresh(spare)
        if not self._add_and_promote(spare):
            return _nothing
        self.cluster.members.append(spare)
        try:
            self.cluster.change_config(
                consensus_pb2.REMOVE_PEER,
                metadata_pb2.RaftPeerPB(permanent_uuid=leaving.uuid or ""),
            )
        except errors.NyalaError as exc:
            # Four voters now (still safe); there is no spare left for another move.
            log.warning("nemesis: remove of %s failed: %s", leaving.name, exc)
            return _nothing
        self.cluster.members.remove(leaving)
        log.info("nemesis: moved a replica from %s to %s", leaving.name, spare.name)
        leaving.kill()  # a spare from now on; wiped before it is used again
        return _nothing

    def _add_and_promote(self, spare: ServerProcess) -> bool:
        leader = self.cluster.leader()
        config = metadata_pb2.RaftConfigPB()
        config.CopyFrom(self.cluster.cstate(leader).cstate.committed_config)
        joining = self.cluster.peer(spare, metadata_pb2.NON_VOTER)
        joining.attrs.promote = True
        config.peers.append(joining)
        self.cluster.create_replica(spare, config)
        try:
            self.cluster.change_config(consensus_pb2.ADD_PEER, joining)
        except errors.NyalaError as exc:
            log.warning("nemesis: add of %s failed: %s", spare.name, exc)
            spare.kill()
            return False
        deadline = time.monotonic() + PROMOTION_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(errors.NyalaError):
                config = self.cluster.cstate(self.cluster.leader()).cstate.committed_config
                for peer in config.peers:
                    if peer.permanent_uuid == spare.uuid and peer.member_type == metadata_pb2.VOTER:
                        return True
            time.sleep(0.2)
        self.anomalies.append(f"membership: {spare.name} not promoted in {PROMOTION_TIMEOUT_S} s")
        with contextlib.suppress(errors.NyalaError):
            self.cluster.change_config(
                consensus_pb2.REMOVE_PEER, metadata_pb2.RaftPeerPB(permanent_uuid=spare.uuid or "")
            )
        spare.kill()
        return False

    # --- disk faults -----------------------------------------------------------------------

    def _disk(self) -> Heal:
        victim = self._one()
        pid = victim.pid
        assert pid is not None
        self.cluster.disk.arm(pid, self.rng.choice([errno.EIO, errno.ENOSPC]))

        def heal() -> None:
            # A replica whose sync failed must stop; the operator replaces the disk and
            # restarts it. Disarm only after the kill, so nothing syncs in between.
            victim.kill()
            self.cluster.disk.disarm(pid)
            self.cluster.restart(victim)

        return heal

    def _torn_tail(self) -> Heal:
        victim = self._one()
        victim.kill()
        tear_wal_tail(self.cluster.wal_dir(victim), self.rng)

        def heal() -> None:
            self.cluster.restart(victim)

        return heal

    def _corrupt_meta(self) -> Heal:
        victim = self._one()
        victim.kill()
        path = self.cluster.cmeta_path(victim)
        original = path.read_bytes()
        damaged = bytearray(original)
        damaged[self.rng.randrange(len(damaged))] ^= 1 << self.rng.randrange(8)
        path.write_bytes(bytes(damaged))
        self.cluster.start(victim)
        served = self._serves_tablet(victim)
        log.info("nemesis: %s with a damaged cmeta serves the tablet: %s", victim.name, served)
        if served:
            self.anomalies.append(f"corrupt-meta: {victim.name} served a replica with bad cmeta")

        def heal() -> None:
            victim.kill()
            path.write_bytes(original)
            self.cluster.restart(victim)

        return heal

    def _serves_tablet(self, ts: ServerProcess) -> bool:
        """True if ``ts`` comes up and reports a replica of the tablet. Refusing to start, or
        starting without that replica (failed, not listed), is the right answer."""
        try:
            ts.wait_ready(timeout_s=60.0)
        except errors.NyalaError as exc:
            log.info("nemesis: %s refused to start: %s", ts.name, exc)
            return False
        try:
            self.cluster.cstate(ts)
        except errors.NyalaError as exc:
            log.info("nemesis: %s does not serve the tablet: %s", ts.name, exc)
            return False
        return True


def tear_wal_tail(wal_dir: Path, rng: random.Random) -> bool:
    """Writes a frame header and part of a payload with a bad checksum right after the last
    frame of the newest segment: what a crash during an unsynced write leaves. Returns False
    when there is no segment to tear (nothing written yet)."""
    segments = sorted(p for p in wal_dir.glob("wal-*") if p.name[4:].isdigit())
    if not segments:
        return False
    path = segments[-1]
    data = path.read_bytes()
    offset = SEGMENT_HEADER_BYTES
    if len(data) < offset:
        return False
    sequence = struct.unpack_from("<Q", data, 16)[0]
    while offset + FRAME_HEADER_BYTES <= len(data) and data[offset : offset + 4] == FRAME_MAGIC:
        payload_bytes = struct.unpack_from("<I", data, offset + 16)[0]
        offset += FRAME_HEADER_BYTES + payload_bytes
    if data[offset : offset + 4] != bytes(4):
        return False  # a footer (closed segment) or something unknown: leave it alone
    payload_bytes = rng.randint(64, 8192)
    header = bytearray(FRAME_HEADER_BYTES)
    header[0:4] = FRAME_MAGIC
    header[4] = 1
    struct.pack_into("<QIIII", header, 8, sequence, payload_bytes, 1, rng.getrandbits(32), 0)
    torn = bytes(header) + rng.randbytes(rng.randint(0, payload_bytes))
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(torn)
    return True
