"""``nyala tserver ...``: run a tablet server, list the cluster's tablet servers."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path
from typing import Any

import click

from nyala.cli.cluster_client import client_for, masters_option, one_line
from nyala.cli.options import given, one_line_errors, settings_options
from nyala.cli.output import emit, format_option
from nyala.cli.process import die_with_parent_if_asked
from nyala.common.config import from_mapping, read_flagfile
from nyala.tserver import TabletServer, TabletServerSettings

_SERVER_FIELDS = ("fs_root", "rpc_bind", "http_bind", "masters", "uuid")


@click.group(name="tserver")
def group() -> None:
    """Run and inspect tablet servers."""


@group.command(name="run")
@click.option("--fs-root", type=click.Path(path_type=Path), required=True, help="Data root.")
@click.option("--rpc-bind", default="127.0.0.1:7050", show_default=True, help="RPC HOST:PORT.")
@click.option("--http-bind", default="127.0.0.1:8050", show_default=True, help="HTTP HOST:PORT.")
@click.option(
    "-m",
    "--masters",
    envvar="NYALA_MASTERS",
    default="",
    help="Comma-separated master addresses (default: $NYALA_MASTERS).",
)
@click.option("--uuid", default="", help="Refuse to start unless the fs root has this UUID.")
@click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
@click.option(
    "--flagfile",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="File of 'name = value' settings; flags given on the command line win.",
)
@settings_options(TabletServerSettings, exclude=_SERVER_FIELDS)
@one_line_errors
def run(
    fs_root: Path,
    rpc_bind: str,
    http_bind: str,
    masters: str,
    uuid: str,
    log_level: str,
    flagfile: Path | None,
    **tunables: Any,
) -> None:
    """Run a tablet server in the foreground until SIGTERM or SIGINT."""
    die_with_parent_if_asked()
    logging.basicConfig(
        level=log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = from_mapping(
        TabletServerSettings,
        {
            "fs_root": fs_root,
            "rpc_bind": rpc_bind,
            "http_bind": http_bind,
            "masters": tuple(m.strip() for m in masters.split(",") if m.strip()),
            "uuid": uuid,
            **(read_flagfile(flagfile) if flagfile is not None else {}),
            **given(tunables),
        },
    )
    asyncio.run(TabletServer(settings).run())


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
