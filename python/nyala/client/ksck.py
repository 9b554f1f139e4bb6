"""ksck: a consistency check of a running cluster (``nyala cluster ksck``).

``gather`` asks every master (``ConnectToMaster``), the leader master for its tablet servers,
tables and tablet locations, and every live tablet server for the consensus state and data
state of each replica it holds. ``check`` is pure: it compares what was gathered and returns
one ``Finding`` per problem. A cluster is healthy when there is no finding:

* every master answers, all agree on one leader and on the set of masters;
* every tablet server the leader knows is live;
* per tablet: every replica of the master's record is on a live tserver and RUNNING, a leader
  exists and the replicas agree on it, every replica's committed config matches the master's
  record (same voters, same op index), and the tablet has the table's number of voters.

It uses only the RPCs (no server code), so it runs from any host.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeAlias, TypeVar

from nyala._proto import consensus_pb2, master_pb2, metadata_pb2, tserver_admin_pb2
from nyala.errors import NyalaError, TimedOutError
from nyala.rpc import BlockingServerProxy, join_host_port
from nyala.rpc.channel import BlockingMethod
from nyala.rpc.messages import Addressable, Answer

#: Deadline of each RPC ksck sends, in milliseconds.
KSCK_RPC_TIMEOUT_MS = 5_000

_Req = TypeVar("_Req")
_AddressedReq = TypeVar("_AddressedReq", bound=Addressable)
_Resp = TypeVar("_Resp", bound=Answer)
# What a tablet server says of its replicas: status and consensus state by tablet id.
_Replicas: TypeAlias = tuple[
    dict[str, tserver_admin_pb2.TabletStatusPB], dict[str, metadata_pb2.ConsensusStatePB]
]


@dataclass(frozen=True)
class Finding:
    """One problem: what it is about (``master``, ``tserver``, ``tablet``), which, and why."""

    kind: str
    subject: str
    problem: str


@dataclass
class MasterView:
    """One master's answer to ``ConnectToMaster`` (``error`` when it did not answer)."""

    addr: str
    uuid: str = ""
    role: str = ""
    leader_uuid: str = ""
    catalog_ready: bool = False
    masters: list[str] = field(default_factory=list)
    error: str = ""


@dataclass
class ReplicaView:
    """One replica as its tserver reports it (``error``: the tserver did not answer)."""

    ts_uuid: str
    state: str = ""
    data_state: str = ""
    leader_uuid: str = ""
    term: int = -1
    voters: list[str] = field(default_factory=list)
    config_opid_index: int = -1
    error: str = ""


@dataclass
class TabletView:
    """A tablet as the leader master records it, plus what its replicas report."""

    tablet_id: str
    table: str
    num_replicas: int
    leader_uuid: str
    voters: list[str]
    non_voters: list[str]
    config_opid_index: int
    replicas: list[ReplicaView] = field(default_factory=list)


@dataclass
class ClusterSnapshot:
    """Everything ``gather`` learned."""

    masters: list[MasterView]
    tservers: list[dict[str, Any]] = field(default_factory=list)
    tablets: list[TabletView] = field(default_factory=list)


def _call(addr: str, method: BlockingMethod[_Req, _Resp], request: _Req) -> _Resp:
    with BlockingServerProxy(addr) as proxy:
        return proxy.call(method(proxy), request, timeout_ms=KSCK_RPC_TIMEOUT_MS)


def _ask_master(addr: str) -> MasterView:
    try:
        request = master_pb2.ConnectToMasterRequestPB()
        answer = _call(addr, lambda p: p.master.ConnectToMaster, request)
    except NyalaError as exc:
        return MasterView(addr, error=f"{type(exc).__name__}: {exc}")
    return MasterView(
        addr,
        uuid=answer.master_uuid,
        role=master_pb2.RaftRole.Name(answer.role).removeprefix("ROLE_"),
        leader_uuid=answer.leader_uuid,
        catalog_ready=answer.catalog_ready,
        masters=sorted(join_host_port(m.rpc_addr.host, m.rpc_addr.port) for m in answer.masters),
    )


def gather(masters: Sequence[str], *, leader_wait_s: float = 10.0) -> ClusterSnapshot:
    """Asks the cluster; raises only when no master leads within ``leader_wait_s``."""
    deadline = time.monotonic() + leader_wait_s
    while True:
        views = [_ask_master(addr) for addr in masters]
        leader = next((m for m in views if m.catalog_ready), None)
        if leader is not None:
            break
        if time.monotonic() > deadline:
            return ClusterSnapshot(views)
        time.sleep(0.2)
    snapshot = ClusterSnapshot(views)
    servers = _leader_call(
        leader, lambda p: p.master.ListTabletServers, master_pb2.ListTabletServersRequestPB()
    )
    for s in servers.servers:
        addr = join_host_port(s.ts_info.rpc_addr.host, s.ts_info.rpc_addr.port)
        snapshot.tservers.append({"uuid": s.ts_info.permanent_uuid, "addr": addr, "live": s.live})
    tables = _leader_call(leader, lambda p: p.master.ListTables, master_pb2.ListTablesRequestPB())
    for table in tables.tables:
        request = master_pb2.GetTableLocationsRequestPB(
            table=master_pb2.TableIdentifierPB(table_id=table.id)
        )
        locations = _leader_call(leader, lambda p: p.master.GetTableLocations, request)
        for loc in locations.tablet_locations:
            snapshot.tablets.append(_tablet_view(table, loc))
    _ask_tservers(snapshot)
    return snapshot


def _leader_call(
    leader: MasterView, method: BlockingMethod[_AddressedReq, _Resp], request: _AddressedReq
) -> _Resp:
    request.dest_uuid = leader.uuid
    return _call(leader.addr, method, request)


def _tablet_view(
    table: master_pb2.ListTablesResponsePB.TableInfoPB, loc: master_pb2.TabletLocationsPB
) -> TabletView:
    voters = [r.ts_info.permanent_uuid for r in loc.replicas if r.member_type == metadata_pb2.VOTER]
    others = [r.ts_info.permanent_uuid for r in loc.replicas if r.member_type != metadata_pb2.VOTER]
    return TabletView(
        tablet_id=loc.tablet_id,
        table=table.name,
        num_replicas=table.num_replicas,
        leader_uuid=loc.leader_uuid,
        voters=sorted(voters),
        non_voters=sorted(others),
        config_opid_index=-1,
    )


def _ask_tservers(snapshot: ClusterSnapshot) -> None:
    by_ts: dict[str, _Replicas | str] = {}
    for ts in snapshot.tservers:
        if not ts["live"]:
            by_ts[ts["uuid"]] = "tablet server is not live"
            continue
        try:
            by_ts[ts["uuid"]] = _replicas_of(ts["uuid"], ts["addr"])
        except NyalaError as exc:
            by_ts[ts["uuid"]] = f"{type(exc).__name__}: {exc}"
    for tablet in snapshot.tablets:
        for uuid in [*tablet.voters, *tablet.non_voters]:
            tablet.replicas.append(_replica_view(uuid, tablet.tablet_id, by_ts.get(uuid)))


def _replicas_of(uuid: str, addr: str) -> _Replicas:
    listed = _call(
        addr, lambda p: p.admin.ListTablets, tserver_admin_pb2.ListTabletsRequestPB(dest_uuid=uuid)
    )
    statuses = {s.tablet_status.tablet_id: s.tablet_status for s in listed.status_and_schema}
    running = [t for t, s in statuses.items() if s.state == metadata_pb2.RUNNING]
    cstates: dict[str, metadata_pb2.ConsensusStatePB] = {}
    if running:
        request = consensus_pb2.GetConsensusStateRequestPB(dest_uuid=uuid, tablet_ids=running)
        for info in _call(addr, lambda p: p.consensus.GetConsensusState, request).tablets:
            cstates[info.tablet_id] = info.cstate
    return statuses, cstates


def _replica_view(uuid: str, tablet_id: str, found: _Replicas | str | None) -> ReplicaView:
    if found is None:
        return ReplicaView(uuid, error="tablet server unknown to the leader master")
    if isinstance(found, str):
        return ReplicaView(uuid, error=found)
    statuses, cstates = found
    status = statuses.get(tablet_id)
    if status is None:
        return ReplicaView(uuid, error="the tablet server has no replica of this tablet")
    view = ReplicaView(
        uuid,
        state=metadata_pb2.TabletState.Name(status.state),
        data_state=metadata_pb2.TabletDataState.Name(status.data_state).removeprefix(
            "TABLET_DATA_"
        ),
    )
    cstate = cstates.get(tablet_id)
    if cstate is not None:
        view.leader_uuid = cstate.leader_uuid
        view.term = cstate.current_term
        config = cstate.committed_config
        view.voters = sorted(
            p.permanent_uuid for p in config.peers if p.member_type == metadata_pb2.VOTER
        )
        view.config_opid_index = config.opid_index if config.HasField("opid_index") else -1
    return view


def check(snapshot: ClusterSnapshot) -> list[Finding]:
    """Every problem in ``snapshot`` (empty: healthy)."""
    return [
        *_check_masters(snapshot.masters),
        *_check_tservers(snapshot.tservers),
        *(f for t in snapshot.tablets for f in _check_tablet(t)),
    ]


def _check_masters(masters: list[MasterView]) -> list[Finding]:
    out = [Finding("master", m.addr, f"unreachable: {m.error}") for m in masters if m.error]
    answered = [m for m in masters if not m.error]
    leaders = {m.leader_uuid for m in answered}
    if not any(m.catalog_ready for m in answered):
        out.append(Finding("master", "cluster", "no master leads with a loaded catalog"))
    if len(leaders) > 1:
        out.append(Finding("master", "cluster", f"masters disagree on the leader: {leaders}"))
    configs = {tuple(m.masters) for m in answered}
    if len(configs) > 1:
        out.append(Finding("master", "cluster", "masters disagree on the set of masters"))
    return out


def _check_tservers(tservers: list[dict[str, Any]]) -> list[Finding]:
    return [
        Finding("tserver", f"{ts['uuid']} ({ts['addr']})", "not live (no recent heartbeat)")
        for ts in tservers
        if not ts["live"]
    ]


def _check_tablet(tablet: TabletView) -> list[Finding]:
    subject = f"{tablet.tablet_id} (table {tablet.table})"
    out: list[Finding] = []

    def bad(problem: str) -> None:
        out.append(Finding("tablet", subject, problem))

    healthy = []
    for r in tablet.replicas:
        if r.error:
            bad(f"replica on {r.ts_uuid}: {r.error}")
        elif r.state != "RUNNING" or r.data_state != "READY":
            bad(f"replica on {r.ts_uuid} is {r.state}/{r.data_state}")
        else:
            healthy.append(r)
    if len(tablet.voters) < tablet.num_replicas:
        bad(f"under-replicated: {len(tablet.voters)} voters of {tablet.num_replicas}")
    if len(tablet.voters) > tablet.num_replicas:
        bad(f"over-replicated: {len(tablet.voters)} voters of {tablet.num_replicas}")
    claimed = {r.leader_uuid for r in healthy if r.leader_uuid}
    healthy_voters = [r for r in healthy if r.ts_uuid in tablet.voters]
    if len(healthy_voters) < len(tablet.voters) // 2 + 1:
        # A leader without a majority cannot commit anything: it is no leader at all.
        bad(f"no leader: only {len(healthy_voters)} of {len(tablet.voters)} voters healthy")
    elif not claimed or not any(r.leader_uuid == r.ts_uuid for r in healthy):
        bad("no leader")
    elif len(claimed) > 1:
        bad(f"replicas disagree on the leader: {sorted(claimed)}")
    for r in healthy:
        if r.voters != tablet.voters:
            bad(
                f"config disagreement: replica on {r.ts_uuid} has voters {r.voters}, "
                f"the master has {tablet.voters}"
            )
    indexes = {r.config_opid_index for r in healthy}
    if len(indexes) > 1:
        bad(f"replicas disagree on the committed config's op index: {sorted(indexes)}")
    return out


def run(
    masters: Sequence[str], *, leader_wait_s: float = 10.0
) -> tuple[ClusterSnapshot, list[Finding]]:
    """``gather`` then ``check``."""
    if not masters:
        raise TimedOutError("no masters given")
    snapshot = gather(masters, leader_wait_s=leader_wait_s)
    return snapshot, check(snapshot)


def to_json(snapshot: ClusterSnapshot, findings: list[Finding]) -> dict[str, Any]:
    """The report as plain data (``--format json``)."""
    return {
        "healthy": not findings,
        "masters": [asdict(m) for m in snapshot.masters],
        "tservers": snapshot.tservers,
        "tablets": [asdict(t) for t in snapshot.tablets],
        "findings": [asdict(f) for f in findings],
    }
