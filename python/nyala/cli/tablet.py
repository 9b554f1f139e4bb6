"""``nyala tablet ...``: list tablets, ask a tablet's leader to step down, and change its Raft
config directly (``change-config``, with a compare-and-set on the config's op index).

Replica moves through the master (add/remove/change-replica-type/move-replica) live in
``nyala.cli.tablet_admin``.
"""

from __future__ import annotations

import click

from nyala.cli.cluster_client import client_for, masters_option, one_line
from nyala.cli.output import emit, emit_one, format_option, replica_label


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
            "replicas": [replica_label(r["uuid"], t["replicas"]) for r in t["replicas"]],
            "leader": replica_label(t["leader"], t["replicas"]),
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


@group.command(name="change-config")
@click.argument("tablet_id")
@click.argument(
    "change", type=click.Choice(["ADD_PEER", "REMOVE_PEER", "MODIFY_PEER"], case_sensitive=False)
)
@click.argument("ts_uuid")
@click.option(
    "--type",
    "replica_type",
    type=click.Choice(["VOTER", "NON_VOTER"], case_sensitive=False),
    default=None,
    help="Member type (ADD_PEER default: NON_VOTER promoted once caught up).",
)
@click.option(
    "--cas-config-opid-index",
    type=int,
    default=None,
    help="Apply only if the committed config's op index is still this (else CasFailedError).",
)
@masters_option
@format_option
@one_line
def change_config(
    tablet_id: str,
    change: str,
    ts_uuid: str,
    replica_type: str | None,
    cas_config_opid_index: int | None,
    masters: str,
    fmt: str,
) -> None:
    """Raft ChangeConfig on TABLET_ID's leader: ADD_PEER, REMOVE_PEER or MODIFY_PEER of the
    replica on TS_UUID (Kudu's change_config; the master is not asked and may undo a change
    that leaves the tablet over- or under-replicated). Prints the new config."""
    with client_for(masters) as client:
        config = client.admin.change_config(
            tablet_id,
            change,
            ts_uuid,
            replica_type=replica_type,
            cas_config_opid_index=cas_config_opid_index,
        )
    if fmt == "json":
        emit_one({"tablet_id": tablet_id, **config}, fmt)
        return
    click.echo(f"tablet {tablet_id}: config at op index {config['opid_index']}")
    emit(config["peers"], fmt)


# Replica commands (add/remove/move/change-type) live with the replica admin code.
from nyala.cli.tablet_admin import add_tablet_commands  # noqa: E402

add_tablet_commands(group)
