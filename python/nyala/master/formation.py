"""How a master finds the sys catalog's Raft config at start, and refuses a wrong one.

* A master with a sys-catalog replica on disk compares the replica's committed config with
  ``--masters``: the same set of addresses, or it refuses to start (a typo in ``--masters``
  would otherwise split the cluster or strand this master).
* A master with an empty fs root asks every configured master (``ConnectToMaster``, which any
  master answers before it has a catalog). If one of them already hosts the catalog, that
  config is adopted: unchanged when it lists this master (an initial master that started late),
  with this master appended as a promotable NON_VOTER when it does not (a master being added,
  which the leader then adds with ``AddMaster``). Otherwise every master must have answered
  with its UUID, and the config is all of them as VOTERs, ordered by address, so every initial
  master computes the same config.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from nyala._proto import master_pb2, metadata_pb2
from nyala.consensus.types import MemberType, RaftConfig, RaftPeer
from nyala.errors import IllegalStateError, InvalidArgumentError, NyalaError, TimedOutError
from nyala.rpc import ServerProxy, join_host_port
from nyala.rpc.settings import RpcSettings

log = logging.getLogger(__name__)

_ASK_TIMEOUT_MS = 2_000
_RETRY_S = 0.2


def check_masters_match(config: RaftConfig, masters: Sequence[str]) -> None:
    """``IllegalStateError`` unless ``masters`` names exactly the config's addresses."""
    on_disk = sorted(p.address for p in config.peers)
    given = sorted(set(masters))
    if on_disk != given:
        raise IllegalStateError(
            f"--masters {','.join(given)} does not match the sys catalog's Raft config on disk "
            f"({','.join(on_disk)}); start the master with --masters {','.join(on_disk)}"
        )


def own_address(rpc_bind: str, masters: Sequence[str]) -> str:
    """This master's entry of ``masters``: its ``--rpc-bind``, which must be listed."""
    if rpc_bind not in masters:
        raise InvalidArgumentError(
            f"--masters {','.join(masters)} does not list this master's --rpc-bind {rpc_bind}"
        )
    return rpc_bind


def config_from_entries(entries: Sequence[master_pb2.MasterEntryPB]) -> RaftConfig:
    """The config described by ``MasterEntryPB``s (no op index: an initial config)."""
    peers = []
    for e in entries:
        member = (
            MemberType.NON_VOTER if e.member_type == metadata_pb2.NON_VOTER else MemberType.VOTER
        )
        peers.append(
            RaftPeer(
                uuid=e.permanent_uuid,
                address=join_host_port(e.rpc_addr.host, e.rpc_addr.port),
                member_type=member,
                promote=member is MemberType.NON_VOTER,
            )
        )
    return RaftConfig(peers=tuple(peers))


async def _ask(addr: str, settings: RpcSettings) -> master_pb2.ConnectToMasterResponsePB | None:
    try:
        async with ServerProxy(addr, settings) as proxy:
            request = master_pb2.ConnectToMasterRequestPB()
            return await proxy.call(
                proxy.master.ConnectToMaster, request, timeout_ms=_ASK_TIMEOUT_MS
            )
    except NyalaError as exc:
        log.info("master %s not answering yet: %s", addr, exc)
        return None


async def discover_config(
    own_uuid: str, own_addr: str, masters: Sequence[str], settings: RpcSettings, timeout_ms: int
) -> RaftConfig:
    """The initial config of this master's new sys-catalog replica (module docstring)."""
    if list(masters) == [own_addr]:
        return RaftConfig(peers=(RaftPeer(own_uuid, own_addr),))
    deadline = time.monotonic() + timeout_ms / 1000
    uuids: dict[str, str] = {own_addr: own_uuid}
    while time.monotonic() < deadline:
        others = [a for a in masters if a != own_addr]
        answers = await asyncio.gather(*(_ask(a, settings) for a in others))
        for addr, answer in zip(others, answers, strict=True):
            if answer is None:
                continue
            if answer.masters:
                config = config_from_entries(answer.masters)
                if config.peer(own_uuid) is None:
                    log.info("joining the existing masters %s", [p.address for p in config.peers])
                    joiner = RaftPeer(own_uuid, own_addr, MemberType.NON_VOTER, promote=True)
                    config = RaftConfig(peers=(*config.peers, joiner))
                return config
            uuids[addr] = answer.master_uuid
        if len(uuids) == len(set(masters)):
            peers = tuple(RaftPeer(uuids[a], a) for a in sorted(uuids))
            return RaftConfig(peers=peers)
        await asyncio.sleep(_RETRY_S)
    missing = sorted(set(masters) - set(uuids))
    raise TimedOutError(f"masters {missing} did not answer within {timeout_ms} ms")
