"""Replica commands of ``nyala tablet`` and ``nyala tserver`` (DESIGN.md §9), over
``client.admin`` (``nyala.client.admin``): add-replica, remove-replica, change-replica-type,
move-replica, and ``tserver retire``. Each waits until the master reports the operation done
(``--no-wait``: one step only). ``add_tablet_commands``/``add_tserver_commands`` attach them to
the noun's group, so they live here whoever owns the group's module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from nyala.cli.cluster import master_list, masters_option
from nyala.cli.options import one_line_errors

_TYPES = click.Choice(["VOTER", "NON_VOTER"], case_sensitive=False)
_wait_option = click.option(
    "--wait/--no-wait", default=True, show_default=True, help="Wait until it is done."
)
_timeout_option = click.option(
    "--timeout-s", type=float, default=300.0, show_default=True, help="Give up after this long."
)


def _run(masters: str, action: Callable[[Any], str]) -> None:
    from nyala.client import connect

    with connect(master_list(masters)) as client:
        click.echo(action(client.admin))


@click.command(name="add-replica")
@click.argument("tablet_id")
@click.argument("ts_uuid")
@click.option("--type", "replica_type", type=_TYPES, default="VOTER", show_default=True)
@masters_option
@_wait_option
@_timeout_option
@one_line_errors
def add_replica(
    tablet_id: str, ts_uuid: str, replica_type: str, masters: str, wait: bool, timeout_s: float
) -> None:
    """Add a replica of TABLET_ID on tablet server TS_UUID."""
    _run(
        masters,
        lambda a: a.add_replica(
            tablet_id, ts_uuid, replica_type=replica_type, wait=wait, timeout_s=timeout_s
        ),
    )


@click.command(name="remove-replica")
@click.argument("tablet_id")
@click.argument("ts_uuid")
@masters_option
@_wait_option
@_timeout_option
@one_line_errors
def remove_replica(
    tablet_id: str, ts_uuid: str, masters: str, wait: bool, timeout_s: float
) -> None:
    """Remove the replica of TABLET_ID on TS_UUID."""
    _run(masters, lambda a: a.remove_replica(tablet_id, ts_uuid, wait=wait, timeout_s=timeout_s))


@click.command(name="change-replica-type")
@click.argument("tablet_id")
@click.argument("ts_uuid")
@click.argument("replica_type", type=_TYPES)
@masters_option
@_wait_option
@_timeout_option
@one_line_errors
def change_replica_type(
    tablet_id: str, ts_uuid: str, replica_type: str, masters: str, wait: bool, timeout_s: float
) -> None:
    """Make the replica of TABLET_ID on TS_UUID a VOTER or a NON_VOTER."""
    _run(
        masters,
        lambda a: a.change_replica_type(
            tablet_id, ts_uuid, replica_type, wait=wait, timeout_s=timeout_s
        ),
    )


@click.command(name="move-replica")
@click.argument("tablet_id")
@click.argument("from_ts")
@click.argument("to_ts")
@masters_option
@_wait_option
@_timeout_option
@one_line_errors
def move_replica(
    tablet_id: str, from_ts: str, to_ts: str, masters: str, wait: bool, timeout_s: float
) -> None:
    """Move the replica of TABLET_ID from FROM_TS to TO_TS (add, promote, then evict)."""
    _run(
        masters,
        lambda a: a.move_replica(tablet_id, from_ts, to_ts, wait=wait, timeout_s=timeout_s),
    )


@click.command(name="retire")
@click.argument("ts_uuid")
@masters_option
@_wait_option
@_timeout_option
@one_line_errors
def retire(ts_uuid: str, masters: str, wait: bool, timeout_s: float) -> None:
    """Move every replica off tablet server TS_UUID and keep new ones off it."""
    _run(masters, lambda a: a.retire_tserver(ts_uuid, wait=wait, timeout_s=timeout_s))


def add_tablet_commands(group: click.Group) -> None:
    """Attaches the replica commands to ``nyala tablet``."""
    for command in (add_replica, remove_replica, change_replica_type, move_replica):
        group.add_command(command)


def add_tserver_commands(group: click.Group) -> None:
    """Attaches ``retire`` to ``nyala tserver``."""
    group.add_command(retire)
