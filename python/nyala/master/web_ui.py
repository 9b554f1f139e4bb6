"""The master's web UI pages (``nyala.server.web_ui`` holds the frame and the building blocks):
``/tables`` and ``/table?id=`` (tables, their tablets with partitions, replicas and leaders),
``/masters`` and ``/tablet-servers`` (with liveness). Every page reads the catalog manager's
in-memory state; nothing here writes. A follower master has no loaded catalog: its table pages
say so and name the leader.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from nyala._proto import master_pb2, metadata_pb2
from nyala.master.catalog import TableInfo
from nyala.partition import Partition as KeyPartition
from nyala.partition import PartitionSchema
from nyala.rpc.http import HttpRequest, HttpResponse
from nyala.server.web_ui import (
    Cell,
    Markup,
    PageFrame,
    code,
    heading,
    key_values,
    link,
    paragraph,
    state,
    table,
)

if TYPE_CHECKING:
    from nyala.master.catalog_manager import CatalogManager

#: The master's pages, for the navigation bar.
MASTER_NAV: tuple[tuple[str, str], ...] = (
    ("/tables", "Tables"),
    ("/tablet-servers", "Tablet servers"),
    ("/masters", "Masters"),
    ("/tablet-copies", "Tablet copies"),
)


class MasterPages:
    """The master's own HTML pages over its catalog manager."""

    def __init__(self, manager: CatalogManager) -> None:
        self._m = manager
        # A secure cluster's tablet servers serve their pages over TLS.
        self._scheme = "https" if manager.secure else "http"

    def home_sections(self) -> list[Markup]:
        """What the master adds to its home page: its place among the masters."""
        m = self._m
        status = m.status()
        leader = None if status is None else status.leader_uuid
        return [
            heading("This master"),
            key_values(
                [
                    ("leads with the catalog loaded", "yes" if m.is_ready_leader() else "no"),
                    ("leader master", code(leader or "none known")),
                    ("tables", len(m.catalog.live_tables()) if m.is_ready_leader() else "-"),
                    ("live tablet servers", len(m.ts_manager.live())),
                ]
            ),
        ]

    def _not_leader(self, frame: PageFrame, title: str) -> HttpResponse:
        status = self._m.status()
        leader = None if status is None else status.leader_uuid
        return frame.render(
            title,
            paragraph(
                "This master does not lead (or has not loaded the catalog yet); the leader is ",
                code(leader or "not known"),
                ": see ",
                link("/masters", "Masters"),
                " for its address.",
            ),
        )

    def tables(self, frame: PageFrame) -> HttpResponse:
        """``/tables``: every table, with its tablet count and state."""
        if not self._m.is_ready_leader():
            return self._not_leader(frame, "Tables")
        rows: list[tuple[Cell, ...]] = [
            (
                link("/table", t.name, id=t.table_id),
                code(t.table_id),
                state(master_pb2.SysTableState.Name(t.pb.state).removeprefix("SYS_")),
                int(t.pb.schema.version),
                int(t.pb.num_replicas),
                len(t.live_tablets()),
            )
            for t in sorted(self._m.catalog.live_tables(), key=lambda t: t.name)
        ]
        return frame.render(
            "Tables",
            table(("name", "id", "state", "schema version", "replicas", "tablets"), rows),
            paragraph("As JSON: ", link("/tables", "/tables?format=json", format="json")),
        )

    def table(self, frame: PageFrame, request: HttpRequest) -> HttpResponse:
        """``/table?id=``: one table's schema, partitioning and tablets."""
        if not self._m.is_ready_leader():
            return self._not_leader(frame, "Table")
        table_id = request.param("id")
        found = next((t for t in self._m.catalog.live_tables() if t.table_id == table_id), None)
        if found is None:
            return frame.not_found(f"no table with id {table_id!r}")
        return frame.render(
            f"Table {found.name}",
            *self._schema_section(found),
            heading("Tablets"),
            self._tablets_section(found),
        )

    @staticmethod
    def _schema_section(t: TableInfo) -> list[Markup]:
        schema = t.schema()
        partitioning = PartitionSchema.from_pb(t.pb.partition_schema)
        columns = [
            (
                code(c.name),
                c.type,
                "yes" if c.nullable else "no",
                "yes" if c.name in schema.key else "",
                "" if c.default is None else repr(c.default),
            )
            for c in schema.columns
        ]
        return [
            key_values(
                [
                    ("id", code(t.table_id)),
                    ("partitioning", partitioning.describe()),
                    ("replication factor", int(t.pb.num_replicas)),
                    ("schema version", int(t.pb.schema.version)),
                ]
            ),
            heading("Schema"),
            table(("column", "type", "nullable", "key", "default"), columns),
        ]

    def _tablets_section(self, t: TableInfo) -> Markup:
        schema = t.schema()
        partitioning = PartitionSchema.from_pb(t.pb.partition_schema)
        rows: list[tuple[Cell, ...]] = []
        for tablet in t.live_tablets():
            cstate = tablet.pb.consensus_state
            partition = KeyPartition.from_pb(tablet.pb.partition)
            leader = str(cstate.leader_uuid)
            rows.append(
                (
                    self._tablet_cell(tablet.tablet_id, leader),
                    partition.describe(partitioning, schema),
                    state(master_pb2.SysTabletState.Name(tablet.pb.state).removeprefix("SYS_")),
                    self._server_cell(leader) if leader else "none",
                    int(cstate.current_term),
                    self._replicas_cell(cstate.committed_config, leader),
                )
            )
        return table(("tablet", "partition", "state", "leader", "term", "replicas"), rows)

    def _tablet_cell(self, tablet_id: str, leader: str) -> Markup:
        """A tablet id, linked to its page on its leader's web UI (when a leader is known)."""
        ts = self._m.ts_manager.get(leader) if leader else None
        if ts is None:
            return code(tablet_id)
        return link(f"{self._scheme}://{ts.http_addr}/tablet", code(tablet_id), id=tablet_id)

    def _server_cell(self, uuid: str) -> Markup:
        """A tablet server by address, linked to its web UI, with its liveness."""
        ts = self._m.ts_manager.get(uuid)
        if ts is None:
            return Markup(code(uuid).html + " " + state("UNKNOWN").html)
        name = link(f"{self._scheme}://{ts.http_addr}/", ts.rpc_addr)
        return Markup(f"{name.html} {state(self._m.ts_manager.state(ts)).html}")

    def _replicas_cell(self, config: metadata_pb2.RaftConfigPB, leader: str) -> Markup:
        parts = []
        for peer in config.peers:
            role = "LEADER" if peer.permanent_uuid == leader else "FOLLOWER"
            member = metadata_pb2.MemberType.Name(peer.member_type)
            server = self._server_cell(str(peer.permanent_uuid)).html
            parts.append(f"{server} {state(role).html} {member}")
        return Markup("<br>".join(parts))

    def masters(self, frame: PageFrame) -> HttpResponse:
        """``/masters``: the sys catalog's config, with each master's role and, on the leader,
        each other master's health as its Raft sees it."""
        runtime = self._m.sys_catalog.runtime
        failed_after_ms = self._m.settings.follower_unavailable_considered_failed_sec * 1000
        health = {} if runtime is None else runtime.peer_health(failed_after_ms)
        rows: list[tuple[Cell, ...]] = [
            (
                code(e.permanent_uuid),
                code(f"{e.rpc_addr.host}:{e.rpc_addr.port}"),
                state(master_pb2.RaftRole.Name(e.role).removeprefix("ROLE_")),
                metadata_pb2.MemberType.Name(e.member_type),
                "this master"
                if e.permanent_uuid == self._m.uuid
                else state(health[e.permanent_uuid].value)
                if e.permanent_uuid in health
                else "known to the leader only",
            )
            for e in self._m.master_entries()
        ]
        return frame.render(
            "Masters",
            table(("uuid", "RPC address", "role", "member type", "health"), rows),
            paragraph("As JSON: ", link("/masters", "/masters?format=json", format="json")),
        )

    def tablet_servers(self, frame: PageFrame) -> HttpResponse:
        """``/tablet-servers``: every tablet server this master heard from, with liveness."""
        ts_manager = self._m.ts_manager
        counts = self._m.catalog.replica_counts() if self._m.is_ready_leader() else {}
        rows: list[tuple[Cell, ...]] = [
            (
                code(ts.uuid),
                link(f"{self._scheme}://{ts.http_addr}/", ts.http_addr),
                code(ts.rpc_addr),
                state(ts_manager.state(ts)),
                round(ts.millis_since_heartbeat() / 1000, 1),
                counts.get(ts.uuid, 0) if counts else "-",
            )
            for ts in ts_manager.all()
        ]
        headers = ("uuid", "web UI", "RPC address", "state", "s since heartbeat", "replicas")
        return frame.render(
            "Tablet servers",
            table(headers, rows),
            paragraph(
                "LIVE: heartbeats arrive; UNRESPONSIVE: a heartbeat is overdue; DEAD: silent for "
                f"{self._m.settings.tserver_unresponsive_timeout_ms / 1000:.0f} s. As JSON: ",
                link("/tablet-servers", "/tablet-servers?format=json", format="json"),
            ),
        )
