"""The tablet server's web UI pages (``nyala.server.web_ui`` holds the frame and the building
blocks): ``/tablets`` (every replica with its role, term and leader) and ``/tablet?id=`` (one
replica's consensus state: role, term, committed config with member types and the leader's
view of each follower's health, commit and applied index; its WAL segments and the anchors
that hold them; its storage). Pages only read the replicas' state.
"""

from __future__ import annotations

from nyala.consensus.core import ReplicaStatus
from nyala.consensus.types import RaftConfig
from nyala.rpc.http import HttpRequest, HttpResponse
from nyala.server.web_ui import (
    Cell,
    Markup,
    PageFrame,
    code,
    heading,
    human_bytes,
    key_values,
    link,
    paragraph,
    state,
    table,
)
from nyala.tablet import TabletManager
from nyala.tablet.replica import TabletReplica, file_bytes
from nyala.tserver.tablet_meta import PeerHealthReport, peer_health

#: The tablet server's pages, for the navigation bar.
TSERVER_NAV: tuple[tuple[str, str], ...] = (
    ("/tablets", "Tablets"),
    ("/tablet-copies", "Tablet copies"),
)


def tablet_link(tablet_id: str) -> Markup:
    """A tablet id linked to its page."""
    return link("/tablet", code(tablet_id), id=tablet_id)


class TabletServerPages:
    """The tablet server's own HTML pages over its replicas."""

    def __init__(self, tablets: TabletManager, failed_after_ms: int) -> None:
        self._tablets = tablets
        self._failed_after_ms = failed_after_ms

    def home_sections(self) -> list[Markup]:
        """What the tablet server adds to its home page: its replicas at a glance."""
        replicas = self._tablets.replicas()
        leaders = sum(
            1 for r in replicas if r.runtime is not None and r.runtime.role.name == "LEADER"
        )
        return [
            heading("Replicas"),
            key_values([("replicas", len(replicas)), ("leaders", leaders)]),
        ]

    def tablets(self, frame: PageFrame) -> HttpResponse:
        """``/tablets``: every replica on this server."""
        rows: list[tuple[Cell, ...]] = []
        for status in self._tablets.statuses(sizes=False):
            replica = self._tablets.lookup(status.tablet_id)
            runtime = None if replica is None else replica.runtime
            raft = None if runtime is None else runtime.status()
            rows.append(
                (
                    tablet_link(status.tablet_id),
                    status.table_name,
                    state(status.state),
                    status.data_state,
                    state(raft.role.name) if raft is not None else "",
                    raft.term if raft is not None else "",
                    code(raft.leader_uuid or "none") if raft is not None else "",
                    human_bytes(replica.on_disk_bytes()) if replica is not None else "",
                )
            )
        headers = ("tablet", "table", "state", "data", "role", "term", "leader", "on disk")
        return frame.render(
            "Tablets",
            table(headers, rows),
            paragraph("As JSON: ", link("/tablets", "/tablets?format=json", format="json")),
        )

    def tablet(
        self, frame: PageFrame, request: HttpRequest, anchors: dict[int, str]
    ) -> HttpResponse:
        """``/tablet?id=``: one replica's consensus state, WAL and storage. ``anchors``: the
        copy sessions' WAL anchors on it (anchor id -> session)."""
        tablet_id = request.param("id")
        replica = self._tablets.lookup(tablet_id)
        if replica is None:
            return frame.not_found(f"no replica of tablet {tablet_id!r} on this server")
        sb = replica.superblock
        parts = [
            key_values(
                [
                    ("tablet", code(tablet_id)),
                    ("table", sb.table_name),
                    ("state", state(replica.state.value)),
                    ("state reason", replica.state_reason),
                    ("data state", sb.data_state.value),
                ]
            )
        ]
        runtime = replica.runtime
        if runtime is not None:
            health = peer_health(replica, self._failed_after_ms)
            parts += _consensus_section(runtime.status(), health)
        parts += _wal_section(replica, anchors)
        parts += _storage_section(replica)
        return frame.render(f"Tablet {tablet_id}", *parts)


def _consensus_section(st: ReplicaStatus, health: dict[str, PeerHealthReport]) -> list[Markup]:
    status = key_values(
        [
            ("role", state(st.role.name)),
            ("term", st.term),
            ("leader", code(st.leader_uuid or "none")),
            ("voted for", code(st.voted_for or "")),
            ("last op id", f"{st.last_op_id.term}.{st.last_op_id.index}"),
            ("durable index", st.durable_index),
            ("commit index", st.commit_index),
            ("applied index", st.last_applied),
            ("quiesced", "yes" if st.quiesced else "no"),
            ("leadership transfer to", code(st.transfer_target or "")),
        ]
    )
    parts = [heading("Consensus"), status, heading("Committed config")]
    parts.append(_config_table(st.committed_config, st, health))
    if st.pending_config is not None:
        parts += [heading("Pending config"), _config_table(st.pending_config, st, health)]
    return parts


def _config_table(
    config: RaftConfig, st: ReplicaStatus, health: dict[str, PeerHealthReport]
) -> Markup:
    rows: list[tuple[Cell, ...]] = []
    for peer in config.peers:
        if peer.uuid == st.uuid:
            seen: Cell = "this replica"
        elif peer.uuid in health:
            report = health[peer.uuid]
            seen = Markup(state(report.health.value).html + " " + code(report.reason).html)
        else:
            seen = "known to the leader only"
        flags = [f for f, on in (("promote", peer.promote), ("replace", peer.replace)) if on]
        role = "LEADER" if peer.uuid == st.leader_uuid else "FOLLOWER"
        rows.append(
            (
                code(peer.uuid),
                code(peer.address),
                peer.member_type.value,
                state(role),
                ", ".join(flags),
                seen,
            )
        )
    caption = "bootstrap config" if config.opid_index < 0 else f"op index {config.opid_index}"
    headers = ("uuid", "address", "member type", "role", "flags", "health")
    return table(headers, rows, caption=caption)


def _wal_section(replica: TabletReplica, anchors: dict[int, str]) -> list[Markup]:
    wal = replica.wal
    if wal is None:
        return [heading("WAL"), paragraph("not open")]
    sizes = [(path, file_bytes(path)) for path in wal.segment_paths()]
    segments: list[tuple[Cell, ...]] = [
        (code(path.name), size, human_bytes(size)) for path, size in sizes
    ]
    cache = wal.cache_stats()
    owners = {replica.storage_anchor: "storage: first op not flushed to rowsets"}
    anchor_rows: list[tuple[Cell, ...]] = [
        (anchor_id, index, owners.get(anchor_id) or _session_owner(anchors.get(anchor_id)))
        for anchor_id, index in wal.anchors()
    ]
    return [
        heading("WAL"),
        key_values(
            [
                ("first index held", wal.first_index()),
                ("segments", len(segments)),
                ("bytes", sum(size for _, size in sizes)),
                ("log cache", f"{cache.entries} entries, {human_bytes(cache.bytes)}"),
            ]
        ),
        table(("segment", "bytes", ""), segments, caption="segments, oldest first"),
        table(("anchor", "keeps index", "held by"), anchor_rows, caption="log anchors"),
    ]


def _session_owner(session_id: str | None) -> str:
    return "unknown" if session_id is None else f"tablet copy session {session_id}"


def _storage_section(replica: TabletReplica) -> list[Markup]:
    storage = replica.storage
    if storage is None:
        return []
    stats = storage.stats()
    return [
        heading("Storage"),
        key_values(
            [
                ("MemRowSet rows", stats["mem_rows"]),
                ("MemRowSet bytes", stats["mem_bytes"]),
                ("rowsets", stats["rowsets"]),
                ("rows in rowsets", stats["disk_rows"]),
                ("rowset bytes", stats.get("data_bytes", 0)),
                ("last flushed index", stats["last_flushed_index"]),
                ("rows scanned", replica.rows_scanned),
            ]
        ),
    ]
