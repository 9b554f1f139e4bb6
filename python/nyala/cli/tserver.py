"""``nyala tserver ...``: run a tablet server, list the cluster's tablet servers."""

from __future__ import annotations

import click

from nyala.cli.cluster_client import client_for, masters_option, one_line
from nyala.cli.output import emit, format_option
from nyala.cli.server_run import run_command
from nyala.tserver import TabletServer, TabletServerSettings

_SERVER_FIELDS = ("fs_root", "rpc_bind", "http_bind", "masters", "uuid")


@click.group(name="tserver")
def group() -> None:
    """Run and inspect tablet servers."""


async def _serve(settings: TabletServerSettings) -> None:
    await TabletServer(settings).run()


group.add_command(
    run_command(
        TabletServerSettings,
        _serve,
        "Run a tablet server in the foreground until SIGTERM or SIGINT.",
    )
)


@group.command(name="list")
@masters_option
@format_option
@one_line
def list_tservers(masters: str, fmt: str) -> None:
    """List the tablet servers the leader master knows."""
    with client_for(masters) as client:
        emit(client.list_tablet_servers(), fmt)


# `retire` lives with the replica admin code.
from nyala.cli.tablet_admin import add_tserver_commands  # noqa: E402

add_tserver_commands(group)
