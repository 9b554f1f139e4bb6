"""Master membership change: AddMaster and RemoveMaster on the leader (KUDU-1474).

Both are one-by-one Raft config changes of the sys catalog with a CAS on the committed config's
op index. A new master joins as a NON_VOTER with ``promote`` (it catches up from the leader's
WAL, then the leader makes it a VOTER), so a slow newcomer never holds up the majority. The
leader cannot remove itself (it would have to step down in the middle of its own change), and
the last master cannot be removed.
"""

from __future__ import annotations

import asyncio
import time

from nyala._proto import master_pb2
from nyala.consensus.membership import ChangeType, ConfigChange
from nyala.consensus.types import NO_OPID_INDEX, MemberType, RaftPeer
from nyala.errors import (
    AlreadyPresentError,
    IllegalStateError,
    InvalidArgumentError,
    NotFoundError,
    TimedOutError,
)
from nyala.master.catalog_manager import CatalogManager
from nyala.rpc import ServerProxy

#: How long AddMaster/RemoveMaster wait for their config change to commit.
CHANGE_COMMIT_TIMEOUT_MS = 20_000
_POLL_S = 0.05


async def _learn_uuid(addr: str, manager: CatalogManager) -> str:
    async with ServerProxy(addr, manager.settings.rpc_settings()) as proxy:
        answer = await proxy.call(
            proxy.master.ConnectToMaster,
            master_pb2.ConnectToMasterRequestPB(),
            timeout_ms=5_000,
        )
    return str(answer.master_uuid)


async def _await_commit(manager: CatalogManager, done: str, want_member: bool) -> None:
    deadline = time.monotonic() + CHANGE_COMMIT_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        status = manager.status()
        if status is not None and status.pending_config is None:
            member = status.committed_config.peer(done) is not None
            if member == want_member:
                return
        await asyncio.sleep(_POLL_S)
    raise TimedOutError(f"the config change for master {done} did not commit in time")


async def add_master(manager: CatalogManager, addr: str) -> str:
    """Adds the running master at ``addr``; returns its UUID once the change committed."""
    status = manager.require_sys_catalog_leader()
    config = status.committed_config
    if any(p.address == addr for p in config.peers):
        raise AlreadyPresentError(f"master {addr} is already a member")
    uuid = await _learn_uuid(addr, manager)
    if config.peer(uuid) is not None:
        raise AlreadyPresentError(f"master {uuid} is already a member")
    runtime = manager.sys_catalog.runtime
    if runtime is None:
        raise IllegalStateError("the sys catalog stopped")
    peer = RaftPeer(uuid, addr, MemberType.NON_VOTER, promote=True)
    cas = None if config.opid_index == NO_OPID_INDEX else config.opid_index
    runtime.change_config(ConfigChange(ChangeType.ADD_PEER, peer, cas_config_opid_index=cas))
    await _await_commit(manager, uuid, want_member=True)
    return uuid


async def remove_master(manager: CatalogManager, uuid: str, addr: str) -> None:
    """Removes a master named by ``uuid`` (or, when empty, by ``addr``)."""
    status = manager.require_sys_catalog_leader()
    config = status.committed_config
    peer = config.peer(uuid) if uuid else next((p for p in config.peers if p.address == addr), None)
    if peer is None:
        raise NotFoundError(f"master {uuid or addr} is not a member")
    if peer.uuid == manager.uuid:
        raise InvalidArgumentError(
            "the leader master cannot remove itself; make another master leader first"
        )
    if len(config.peers) == 1:
        raise InvalidArgumentError("the last master cannot be removed")
    runtime = manager.sys_catalog.runtime
    if runtime is None:
        raise IllegalStateError("the sys catalog stopped")
    cas = None if config.opid_index == NO_OPID_INDEX else config.opid_index
    runtime.change_config(ConfigChange(ChangeType.REMOVE_PEER, peer, cas_config_opid_index=cas))
    await _await_commit(manager, peer.uuid, want_member=False)
