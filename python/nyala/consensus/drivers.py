"""Membership-change drivers: add, remove and move a replica, one safe step at a time.

These are the library functions the master and the CLI call (seed 001, "Process for adding a
new node", "Moving a tablet"). Each step is a compare-and-set on the committed config, so a
driver that retries after a timeout or a leader change never applies a change twice, and two
drivers racing on one tablet cannot both win. Retriable refusals (no leader, leader stepping
down, a change still pending, an op of the new term not yet committed) are retried after
``poll_interval_ms`` until ``timeout_ms`` passes.

The drivers talk to the tablet through a ``ConsensusAdmin`` (an RPC client in production,
a simulated cluster in tests); they read time only from the injected ``Clock``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol

from nyala.common.clock import Clock
from nyala.consensus.membership import ChangeType, ConfigChange
from nyala.consensus.types import MemberType, OpId, RaftConfig, RaftPeer
from nyala.errors import CasFailedError, RetriableError, TimedOutError

Sleep = Callable[[int], Awaitable[None]]  # sleeps the given number of milliseconds


class ConsensusAdmin(Protocol):
    """The leader-facing operations a driver needs."""

    async def committed_config(self) -> RaftConfig:
        """The committed config, as the current leader knows it."""
        ...

    async def change_config(self, change: ConfigChange) -> OpId:
        """ChangeConfig at the current leader; raises its typed refusals."""
        ...


async def add_replica(
    admin: ConsensusAdmin,
    peer: RaftPeer,
    *,
    clock: Clock,
    sleep: Sleep,
    timeout_ms: int = 30_000,
    poll_interval_ms: int = 200,
) -> RaftConfig:
    """Adds ``peer`` as a NON_VOTER with ``promote`` and waits until the leader promoted it to
    VOTER in the committed config; returns that config. Idempotent."""
    deadline_ms = clock.now_ms() + timeout_ms
    joining = replace(peer, member_type=MemberType.NON_VOTER, promote=True)
    await _change_until(
        admin,
        lambda c: c.peer(peer.uuid) is not None,
        ConfigChange(ChangeType.ADD_PEER, joining),
        clock,
        sleep,
        deadline_ms,
        poll_interval_ms,
    )
    return await _wait_for(
        admin,
        lambda c: c.is_voter(peer.uuid),
        f"promotion of {peer.uuid} to VOTER",
        clock,
        sleep,
        deadline_ms,
        poll_interval_ms,
    )


async def remove_replica(
    admin: ConsensusAdmin,
    uuid: str,
    *,
    clock: Clock,
    sleep: Sleep,
    timeout_ms: int = 30_000,
    poll_interval_ms: int = 200,
) -> RaftConfig:
    """Removes ``uuid`` from the config (if the leader is ``uuid``, it hands leadership over
    first and the driver retries at the successor); returns the committed config without it."""
    deadline_ms = clock.now_ms() + timeout_ms
    return await _change_until(
        admin,
        lambda c: c.peer(uuid) is None,
        ConfigChange(ChangeType.REMOVE_PEER, RaftPeer(uuid, "")),
        clock,
        sleep,
        deadline_ms,
        poll_interval_ms,
    )


async def move_replica(
    admin: ConsensusAdmin,
    from_uuid: str,
    to_peer: RaftPeer,
    *,
    clock: Clock,
    sleep: Sleep,
    timeout_ms: int = 60_000,
    poll_interval_ms: int = 200,
) -> RaftConfig:
    """Replaces ``from_uuid`` by ``to_peer`` the safe way (3-4-3): add ``to_peer``, wait for its
    promotion, then remove ``from_uuid``. Fault tolerance never drops below the start's."""
    start_ms = clock.now_ms()
    await add_replica(
        admin,
        to_peer,
        clock=clock,
        sleep=sleep,
        timeout_ms=timeout_ms,
        poll_interval_ms=poll_interval_ms,
    )
    remaining_ms = max(0, timeout_ms - (clock.now_ms() - start_ms))
    return await remove_replica(
        admin,
        from_uuid,
        clock=clock,
        sleep=sleep,
        timeout_ms=remaining_ms,
        poll_interval_ms=poll_interval_ms,
    )


async def _change_until(
    admin: ConsensusAdmin,
    done: Callable[[RaftConfig], bool],
    change: ConfigChange,
    clock: Clock,
    sleep: Sleep,
    deadline_ms: int,
    poll_interval_ms: int,
) -> RaftConfig:
    """Proposes ``change`` with CAS until the committed config satisfies ``done``."""
    last_error: Exception | None = None
    while True:
        try:
            config = await admin.committed_config()
            if done(config):
                return config
            cas = replace(change, cas_config_opid_index=config.opid_index)
            await admin.change_config(cas)
        except (RetriableError, CasFailedError) as e:
            last_error = e  # no leader, a pending change, or the config moved: look again
        if clock.now_ms() >= deadline_ms:
            raise TimedOutError(
                f"{change.change_type.value} of {change.peer.uuid} did not commit in time"
                f" (last refusal: {last_error!r})"
            )
        await sleep(poll_interval_ms)


async def _wait_for(
    admin: ConsensusAdmin,
    done: Callable[[RaftConfig], bool],
    what: str,
    clock: Clock,
    sleep: Sleep,
    deadline_ms: int,
    poll_interval_ms: int,
) -> RaftConfig:
    while True:
        try:
            config = await admin.committed_config()
            if done(config):
                return config
        except RetriableError:
            pass
        if clock.now_ms() >= deadline_ms:
            raise TimedOutError(f"timed out waiting for {what}")
        await sleep(poll_interval_ms)
