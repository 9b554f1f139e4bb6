"""``nyala local-cluster start|stop|status``: a cluster of background processes on loopback,
with all data and logs under one directory (python/nyala/local_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import click

from nyala.cli.cluster_client import one_line
from nyala.cli.output import emit, emit_one, format_option

_DIR_HELP = "Directory holding the cluster's data, logs and cluster.json."


@click.group(name="local-cluster")
def group() -> None:
    """Run a cluster on this machine in the background."""


def _show(doc: dict[str, object], fmt: str) -> None:
    if fmt == "json":
        emit_one(doc, fmt)
        return
    click.echo(f"dir: {doc['dir']}")
    if "masters" in doc:
        click.echo(f"masters: {doc['masters']}   (export NYALA_MASTERS={doc['masters']})")
    if doc.get("credentials"):
        click.echo(
            f"credentials: {doc['credentials']}   "
            f"(export NYALA_CREDENTIALS={doc['credentials']}: an admin of this cluster)"
        )
    servers = doc.get("servers")
    if isinstance(servers, list):
        emit(servers, fmt)
        if doc.get("healthy") is False:
            down = [s["name"] for s in servers if not s["answering"]]
            click.echo(f"not answering: {', '.join(down)}")
    stopped = doc.get("stopped")
    if isinstance(stopped, list):
        click.echo(f"stopped: {', '.join(stopped) or '(nothing was running)'}")


@group.command(name="start")
@click.option("--dir", "directory", type=click.Path(path_type=Path), required=True, help=_DIR_HELP)
@click.option("--masters", default=3, show_default=True, help="Masters (first start only).")
@click.option("--tservers", default=3, show_default=True, help="Tablet servers (first start).")
@click.option(
    "--insecure",
    is_flag=True,
    help="First start only: no TLS and no authentication (default: a cluster CA, mutual TLS, "
    "and admin credentials under DIR/security; docs/security.md).",
)
@format_option
@one_line
def start(directory: Path, masters: int, tservers: int, insecure: bool, fmt: str) -> None:
    """Start the cluster in DIR (creating it on first use, secure unless --insecure) and wait
    for a leader master."""
    from nyala.local_cluster import start_detached

    _show(start_detached(directory, masters=masters, tservers=tservers, secure=not insecure), fmt)


@group.command(name="stop")
@click.option("--dir", "directory", type=click.Path(path_type=Path), required=True, help=_DIR_HELP)
@format_option
@one_line
def stop(directory: Path, fmt: str) -> None:
    """Stop every server of the cluster in DIR (data is kept)."""
    from nyala.local_cluster import stop_detached

    _show(stop_detached(directory), fmt)


@group.command(name="status")
@click.option("--dir", "directory", type=click.Path(path_type=Path), required=True, help=_DIR_HELP)
@format_option
@one_line
def status(directory: Path, fmt: str) -> None:
    """Show each server of the cluster in DIR (addresses, running, answering); exit 0 only
    when every server answers, 1 otherwise (after printing)."""
    from nyala.local_cluster import status as cluster_status

    doc = cluster_status(directory)
    _show(doc, fmt)
    if not doc["healthy"]:
        raise SystemExit(1)
