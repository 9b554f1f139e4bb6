"""``nyala tablet-copy list|cancel``: tablet copy jobs on one tablet server (DESIGN.md §9).

Both commands talk to the server named by ``--server H:P`` through its TabletCopyService
(ListTabletCopies, CancelTabletCopy). ``list`` prints a table, or JSON with ``--format json``.
"""

from __future__ import annotations

import json
from typing import Any

import click

from nyala._proto import tablet_copy_pb2
from nyala.cli.options import one_line_errors
from nyala.rpc import BlockingServerProxy

_COLUMNS = ("job_id", "tablet_id", "source", "state", "done", "total", "rate", "elapsed", "error")


@click.group(name="tablet-copy")
def group() -> None:
    """List and cancel tablet copies onto a tablet server."""


def _job_json(pb: tablet_copy_pb2.TabletCopyJobPB) -> dict[str, Any]:
    return {
        "id": pb.job_id,
        "tablet_id": pb.tablet_id,
        "source_uuid": pb.source_uuid,
        "source_addr": pb.source_addr,
        "state": pb.state,
        "bytes_done": pb.bytes_done,
        "bytes_total": pb.bytes_total,
        "rate_bytes_per_s": round(pb.rate_bytes_per_s, 1),
        "elapsed_s": round(pb.elapsed_s, 3),
        "error": pb.error,
    }


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f}M"


def _row(job: dict[str, Any]) -> tuple[str, ...]:
    return (
        job["id"],
        job["tablet_id"],
        job["source_addr"] or job["source_uuid"],
        job["state"],
        _mib(job["bytes_done"]),
        _mib(job["bytes_total"]),
        _mib(job["rate_bytes_per_s"]) + "/s",
        f"{job['elapsed_s']:.1f}s",
        job["error"],
    )


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_COLUMNS)]
    click.echo("  ".join(c.upper().ljust(w) for c, w in zip(_COLUMNS, widths, strict=True)))
    for row in rows:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


_server_option = click.option(
    "--server", required=True, metavar="H:P", help="RPC address of the tablet server."
)


@group.command(name="list")
@_server_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@one_line_errors
def list_jobs(server: str, fmt: str) -> None:
    """List running and recently ended copy jobs on one tablet server."""
    with BlockingServerProxy(server) as proxy:
        response = proxy.admin_call(
            proxy.tablet_copy.ListTabletCopies, tablet_copy_pb2.ListTabletCopiesRequestPB()
        )
    jobs = [_job_json(pb) for pb in response.jobs]
    if fmt == "json":
        click.echo(json.dumps({"server": server, "jobs": jobs}, indent=1))
    elif jobs:
        _print_table([_row(job) for job in jobs])
    else:
        click.echo("no tablet copies")


@group.command(name="cancel")
@click.argument("job_id")
@_server_option
@one_line_errors
def cancel(job_id: str, server: str) -> None:
    """Cancel a running copy job; its replica is left TOMBSTONED."""
    with BlockingServerProxy(server) as proxy:
        response = proxy.admin_call(
            proxy.tablet_copy.CancelTabletCopy,
            tablet_copy_pb2.CancelTabletCopyRequestPB(job_id=job_id),
        )
    click.echo(f"cancelled {response.job.job_id} (tablet {response.job.tablet_id})")
