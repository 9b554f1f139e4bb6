"""``nyala cluster``: whole-cluster checks and maintenance (ksck, rebalance).

``ksck`` exits 0 only when the cluster is healthy (``nyala.client.ksck`` says what that means),
1 when it found problems, so scripts can gate on it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from nyala.cli.cluster_client import client_for, one_line, timeout_ms, timeout_option
from nyala.cli.output import format_option, render_table
from nyala.client import ksck as ksck_module
from nyala.errors import InvalidArgumentError
from nyala.rpc import split_host_port

_MASTERS_HELP = "Comma-separated master addresses (default: $NYALA_MASTERS)."


def master_list(masters: str) -> list[str]:
    """The ``-m/--masters`` value as a list of checked HOST:PORT."""
    addrs = [m.strip() for m in masters.split(",") if m.strip()]
    if not addrs:
        raise InvalidArgumentError("no masters given: pass -m/--masters or set NYALA_MASTERS")
    for addr in addrs:
        split_host_port(addr)
    return addrs


_masters = click.option("-m", "--masters", envvar="NYALA_MASTERS", default="", help=_MASTERS_HELP)


def masters_option(fn: Any) -> Any:
    """``-m/--masters`` (checked by ``master_list``) and ``--timeout``."""
    return timeout_option(_masters(fn))


#: change-replication-factor waits for the master to move replicas: a longer --timeout.
CHANGE_REPLICATION_FACTOR_TIMEOUT_S = 300.0


def _masters_waiting(fn: Any) -> Any:
    """``masters_option`` whose ``--timeout`` defaults to (and says) the longer wait."""
    return timeout_option(_masters(fn), default_s=CHANGE_REPLICATION_FACTOR_TIMEOUT_S)


def connect_cli(masters: str, *, default_timeout_ms: int | None = None) -> Any:
    """``cluster_client.client_for`` of the checked ``-m/--masters`` list."""
    return client_for(master_list(masters), default_timeout_ms=default_timeout_ms)


@click.group(name="cluster")
def group() -> None:
    """Check and maintain the whole cluster."""


@group.command(name="ksck")
@masters_option
@format_option
@one_line
def ksck(masters: str, fmt: str) -> None:
    """Check masters, tablet servers and every tablet's replicas; exit 0 only when healthy."""
    snapshot, findings = ksck_module.run(master_list(masters), leader_wait_s=timeout_ms() / 1000)
    if fmt == "json":
        click.echo(json.dumps(ksck_module.to_json(snapshot, findings), indent=1))
    else:
        _print_report(snapshot, findings)
    sys.exit(0 if not findings else 1)


def _print_report(
    snapshot: ksck_module.ClusterSnapshot, findings: list[ksck_module.Finding]
) -> None:
    masters = [
        {"addr": m.addr, "uuid": m.uuid, "role": m.role or "UNREACHABLE", "leader": m.leader_uuid}
        for m in snapshot.masters
    ]
    click.echo(render_table(masters))
    click.echo()
    if snapshot.tservers:
        click.echo(render_table(snapshot.tservers))
        click.echo()
    if findings:
        click.echo(
            render_table(
                [{"kind": f.kind, "subject": f.subject, "problem": f.problem} for f in findings]
            )
        )
        click.echo()
    live = sum(1 for ts in snapshot.tservers if ts["live"])
    bad_tablets = len({f.subject for f in findings if f.kind == "tablet"})
    verdict = "HEALTHY" if not findings else f"UNHEALTHY: {len(findings)} problem(s)"
    click.echo(
        f"{len(snapshot.masters)} masters, {live}/{len(snapshot.tservers)} tablet servers live, "
        f"{len(snapshot.tablets)} tablets ({bad_tablets} with problems): {verdict}"
    )


@group.command(name="change-replication-factor")
@click.argument("table")
@click.argument("replicas", type=int)
@_masters_waiting
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until done.")
@one_line
def change_replication_factor(table: str, replicas: int, masters: str, wait: bool) -> None:
    """Set the number of voters of every tablet of TABLE (odd)."""
    limit_ms = timeout_ms(round(CHANGE_REPLICATION_FACTOR_TIMEOUT_S * 1000))
    with connect_cli(masters, default_timeout_ms=limit_ms) as client:
        click.echo(
            client.admin.change_replication_factor(
                table, replicas, wait=wait, timeout_s=limit_ms / 1000
            )
        )


@group.command(name="rebalance")
@masters_option
@click.option("--max-moves", type=int, default=100, show_default=True, help="Stop after this many.")
@click.option("--dry-run", is_flag=True, help="Only print the next move.")
@format_option
@one_line
def rebalance(masters: str, max_moves: int, dry_run: bool, fmt: str) -> None:
    """Move replicas, one at a time, until every table's replicas are spread evenly (live
    tservers differ by at most one) over the live tablet servers."""
    from nyala.client.rebalance import rebalance as run_rebalance

    addrs = master_list(masters)
    with connect_cli(masters) as client:
        moves = run_rebalance(client, addrs, max_moves=max_moves, dry_run=dry_run)
    rows = [
        {"table": m.table, "tablet_id": m.tablet_id, "from": m.from_ts, "to": m.to_ts}
        for m in moves
    ]
    if fmt == "json":
        click.echo(json.dumps({"moves": rows, "dry_run": dry_run}, indent=1))
        return
    if rows:
        click.echo(render_table(rows))
    verb = "would move" if dry_run else "moved"
    click.echo(f"{verb} {len(rows)} replica(s)")
