"""Replica management from the client (``client.admin``): the master's admin operations.

Each method sends one master RPC of master.proto's "Replica management" section and repeats
the same request until the master answers ``done`` or the admin deadline passes. The requests
are declarative and idempotent, so repeating one is always safe, also across a master failover
(the client's master connection finds the new leader and the operation carries on from the
tablet's Raft config). ``wait=False`` sends one step and returns the master's message.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeVar

from nyala import errors
from nyala._proto import master_pb2, metadata_pb2
from nyala.client.rpc import StubMethod
from nyala.rpc.messages import Addressable

if TYPE_CHECKING:
    from nyala.client.client import Client

_Req = TypeVar("_Req", bound=Addressable)

#: Pause between two steps of an operation that is not done yet.
ADMIN_POLL_S = 0.2
_MEMBER_TYPES = {"VOTER": metadata_pb2.VOTER, "NON_VOTER": metadata_pb2.NON_VOTER}


def member_type(name: str) -> metadata_pb2.MemberType.ValueType:
    """``VOTER``/``NON_VOTER`` as the ``MemberType`` value."""
    try:
        return _MEMBER_TYPES[name.upper()]
    except KeyError:
        raise errors.InvalidArgumentError(
            f"member type must be VOTER or NON_VOTER: {name!r}"
        ) from None


class ReplicaAdminMixin:
    """The replica operations of ``client.admin`` (mixed into ``nyala.client.Admin``)."""

    _client: Client

    def _until_done(
        self,
        method: StubMethod[_Req, master_pb2.ReplicaAdminResponsePB],
        request: _Req,
        *,
        wait: bool,
        timeout_s: float | None,
    ) -> str:
        client = self._client
        limit_s = timeout_s if timeout_s is not None else client.admin_timeout_ms / 1000
        deadline = time.monotonic() + limit_s
        while True:
            answer = client._master_call(method, request, admin=True)
            if answer.done or not wait:
                return str(answer.message)
            if time.monotonic() > deadline:
                name = type(request).__name__.removesuffix("RequestPB")
                raise errors.TimedOutError(f"{name} not done within {limit_s} s: {answer.message}")
            time.sleep(ADMIN_POLL_S)

    def add_replica(
        self,
        tablet_id: str,
        ts_uuid: str,
        *,
        replica_type: str = "VOTER",
        wait: bool = True,
        timeout_s: float | None = None,
    ) -> str:
        """Adds a replica on ``ts_uuid`` (a VOTER joins as a NON_VOTER and is promoted)."""
        request = master_pb2.AddReplicaRequestPB(
            tablet_id=tablet_id, ts_uuid=ts_uuid, member_type=member_type(replica_type)
        )
        return self._until_done(
            lambda s: s.master.AddReplica, request, wait=wait, timeout_s=timeout_s
        )

    def remove_replica(
        self, tablet_id: str, ts_uuid: str, *, wait: bool = True, timeout_s: float | None = None
    ) -> str:
        """Removes the replica on ``ts_uuid`` (a leader hands leadership over first)."""
        request = master_pb2.RemoveReplicaRequestPB(tablet_id=tablet_id, ts_uuid=ts_uuid)
        return self._until_done(
            lambda s: s.master.RemoveReplica, request, wait=wait, timeout_s=timeout_s
        )

    def change_replica_type(
        self,
        tablet_id: str,
        ts_uuid: str,
        replica_type: str,
        *,
        wait: bool = True,
        timeout_s: float | None = None,
        force: bool = False,
    ) -> str:
        """Makes the replica on ``ts_uuid`` a VOTER or a NON_VOTER. The leader's type is
        refused (``IllegalStateError``) unless ``force``: it then hands leadership over."""
        request = master_pb2.ChangeReplicaTypeRequestPB(
            tablet_id=tablet_id,
            ts_uuid=ts_uuid,
            member_type=member_type(replica_type),
            force=force,
        )
        return self._until_done(
            lambda s: s.master.ChangeReplicaType, request, wait=wait, timeout_s=timeout_s
        )

    def move_replica(
        self,
        tablet_id: str,
        from_ts: str,
        to_ts: str,
        *,
        wait: bool = True,
        timeout_s: float | None = None,
    ) -> str:
        """Moves a replica: add on ``to_ts``, wait for its promotion, evict ``from_ts``."""
        request = master_pb2.MoveReplicaRequestPB(
            tablet_id=tablet_id, from_ts_uuid=from_ts, to_ts_uuid=to_ts
        )
        return self._until_done(
            lambda s: s.master.MoveReplica, request, wait=wait, timeout_s=timeout_s
        )

    def step_down_leader(
        self,
        tablet_id: str,
        *,
        new_leader: str | None = None,
        abrupt: bool = False,
        wait: bool = True,
        timeout_s: float | None = None,
    ) -> str:
        """Asks the tablet leader to step down through the master (waits for ``new_leader``)."""
        request = master_pb2.TabletLeaderStepDownRequestPB(
            tablet_id=tablet_id, abrupt=abrupt, new_leader_uuid=new_leader or ""
        )
        return self._until_done(
            lambda s: s.master.TabletLeaderStepDown, request, wait=wait, timeout_s=timeout_s
        )

    def retire_tserver(
        self, ts_uuid: str, *, wait: bool = True, timeout_s: float | None = None
    ) -> str:
        """Moves every replica off ``ts_uuid`` and keeps new ones off it."""
        request = master_pb2.RetireTabletServerRequestPB(ts_uuid=ts_uuid)
        return self._until_done(
            lambda s: s.master.RetireTabletServer, request, wait=wait, timeout_s=timeout_s
        )

    def change_replication_factor(
        self, table: str, replicas: int, *, wait: bool = True, timeout_s: float | None = None
    ) -> str:
        """Sets the number of voters of every tablet of ``table``."""
        request = master_pb2.ChangeReplicationFactorRequestPB(
            table=master_pb2.TableIdentifierPB(table_name=table), num_replicas=replicas
        )
        return self._until_done(
            lambda s: s.master.ChangeReplicationFactor, request, wait=wait, timeout_s=timeout_s
        )
