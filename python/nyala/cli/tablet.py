"""``nyala tablet ...``: list tablets and ask a tablet's leader to step down.

Replica moves (add/remove/change-replica-type/move-replica) arrive with the replica
management commands.
"""

from __future__ import annotations

import click

from nyala.cli.cluster_client import client_for, masters_option, one_line
from nyala.cli.output import emit, emit_one, format_option


@click.group(name="tablet")
def group() -> None:
    """List tablets and manage their leaders."""


@group.command(name="list")
@click.option("--table", "table_name", default=None, help="Only this table's tablets.")
@masters_option
@format_option
@one_line
def list_tablets(table_name: str | None, masters: str, fmt: str) -> None:
    """List tablets with their partition, leader and replicas."""
    with client_for(masters) as client:
        tablets = client.admin.list_tablets(table_name)
    if fmt == "json":
        emit(tablets, fmt)
        return
    rows = [
        {
            **t,
            "replicas": [f"{r['uuid'][:8]}@{r['addr']}" for r in t["replicas"]],
            "leader": t["leader"][:8],
        }
        for t in tablets
    ]
    emit(rows, fmt, columns=["table", "tablet_id", "partition", "leader", "replicas"])


@group.command(name="leader-step-down")
@click.argument("tablet_id")
@click.option("--new-leader", default=None, help="UUID of the replica to hand leadership to.")
@click.option("--abrupt", is_flag=True, help="Step down at once; the replicas elect anew.")
@masters_option
@format_option
@one_line
def leader_step_down(
    tablet_id: str, new_leader: str | None, abrupt: bool, masters: str, fmt: str
) -> None:
    """Ask the leader of TABLET_ID to step down."""
    with client_for(masters) as client:
        client.admin.leader_step_down(tablet_id, new_leader=new_leader, abrupt=abrupt)
    emit_one({"tablet_id": tablet_id, "stepped_down": True}, fmt)


# Replica commands (add/remove/move/change-type) live with the replica admin code.
from nyala.cli.tablet_admin import add_tablet_commands  # noqa: E402

add_tablet_commands(group)
