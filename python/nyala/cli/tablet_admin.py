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

from nyala.cli.cluster import connect_cli
from nyala.cli.cluster_client import MASTERS_HELP, one_line
from nyala.cli.output import emit_one, format_option

_TYPES = click.Choice(["VOTER", "NON_VOTER"], case_sensitive=False)
_wait_option = click.option(
    "--wait/--no-wait", default=True, show_default=True, help="Wait until it is done."
)
masters_option = click.option(
    "-m", "--masters", envvar="NYALA_MASTERS", default="", help=MASTERS_HELP
)
#: The replica moves wait for the master to finish: their --timeout is longer.
WAIT_TIMEOUT_S = 300.0
_timeout_option = click.option(
    "--timeout",
    "--timeout-s",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=WAIT_TIMEOUT_S,
    show_default=True,
    metavar="SECONDS",
    help="Give up after this many seconds.",
)


def _run(masters: str, timeout_s: float, fmt: str, action: Callable[[Any], str]) -> None:
    with connect_cli(masters, default_timeout_ms=round(timeout_s * 1000)) as client:
        message = action(client.admin)
    if fmt == "json":
        emit_one({"message": message}, fmt)
    else:
        click.echo(message)


@click.command(name="add-replica")
@click.argument("tablet_id")
@click.argument("ts_uuid")
@click.option("--type", "replica_type", type=_TYPES, default="VOTER", show_default=True)
@masters_option
@_wait_option
@_timeout_option
@format_option
@one_line
def add_replica(
    tablet_id: str,
    ts_uuid: str,
    replica_type: str,
    masters: str,
    wait: bool,
    timeout_s: float,
    fmt: str,
) -> None:
    """Add a replica of TABLET_ID on tablet server TS_UUID."""
    _run(
        masters,
        timeout_s,
        fmt,
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
@format_option
@one_line
def remove_replica(
    tablet_id: str, ts_uuid: str, masters: str, wait: bool, timeout_s: float, fmt: str
) -> None:
    """Remove the replica of TABLET_ID on TS_UUID."""
    _run(
        masters,
        timeout_s,
        fmt,
        lambda a: a.remove_replica(tablet_id, ts_uuid, wait=wait, timeout_s=timeout_s),
    )


@click.command(name="change-replica-type")
@click.argument("tablet_id")
@click.argument("ts_uuid")
@click.argument("replica_type", type=_TYPES)
@click.option("--force", is_flag=True, help="Also the leader's: it hands leadership over first.")
@masters_option
@_wait_option
@_timeout_option
@format_option
@one_line
def change_replica_type(
    tablet_id: str,
    ts_uuid: str,
    replica_type: str,
    force: bool,
    masters: str,
    wait: bool,
    timeout_s: float,
    fmt: str,
) -> None:
    """Make the replica of TABLET_ID on TS_UUID a VOTER or a NON_VOTER (not the leader's,
    unless --force)."""
    _run(
        masters,
        timeout_s,
        fmt,
        lambda a: a.change_replica_type(
            tablet_id, ts_uuid, replica_type, wait=wait, timeout_s=timeout_s, force=force
        ),
    )


@click.command(name="move-replica")
@click.argument("tablet_id")
@click.argument("from_ts")
@click.argument("to_ts")
@masters_option
@_wait_option
@_timeout_option
@format_option
@one_line
def move_replica(
    tablet_id: str, from_ts: str, to_ts: str, masters: str, wait: bool, timeout_s: float, fmt: str
) -> None:
    """Move the replica of TABLET_ID from FROM_TS to TO_TS (add, promote, then evict)."""
    _run(
        masters,
        timeout_s,
        fmt,
        lambda a: a.move_replica(tablet_id, from_ts, to_ts, wait=wait, timeout_s=timeout_s),
    )


@click.command(name="retire")
@click.argument("ts_uuid")
@masters_option
@_wait_option
@_timeout_option
@format_option
@one_line
def retire(ts_uuid: str, masters: str, wait: bool, timeout_s: float, fmt: str) -> None:
    """Move every replica off tablet server TS_UUID and keep new ones off it."""
    _run(
        masters, timeout_s, fmt, lambda a: a.retire_tserver(ts_uuid, wait=wait, timeout_s=timeout_s)
    )


def add_tablet_commands(group: click.Group) -> None:
    """Attaches the replica commands to ``nyala tablet``."""
    for command in (add_replica, remove_replica, change_replica_type, move_replica):
        group.add_command(command)


def add_tserver_commands(group: click.Group) -> None:
    """Attaches ``retire`` to ``nyala tserver``."""
    group.add_command(retire)
