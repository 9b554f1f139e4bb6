"""``nyala chaos run``: a Jepsen-style fault-injection run on a local ``MiniCluster``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from nyala.chaos.client_run import CLIENT_KINDS, run_client
from nyala.chaos.nemesis import ALL_KINDS
from nyala.chaos.runner import RunConfig, run


@click.group(name="chaos")
def group() -> None:
    """Fault-injection runs that check nothing acknowledged is lost."""


@group.command(name="run")
@click.option("--duration", "duration_s", type=float, default=60.0, show_default=True,
              help="Seconds of load under faults.")  # fmt: skip
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the schedule.")
@click.option(
    "--nemesis",
    "nemesis",
    default="all",
    show_default=True,
    help=f"Comma-separated fault kinds, 'all' or 'none'. Tablet workload: {', '.join(ALL_KINDS)};"
    f" client workload: {', '.join(CLIENT_KINDS)}.",
)
@click.option(
    "--workload",
    type=click.Choice(["tablet", "client"]),
    default="tablet",
    show_default=True,
    help="tablet: registers + set on one tablet, every nemesis; client: nyala.connect inserts"
    " and DDL on 3 masters, killing and pausing masters and tservers.",
)
@click.option("--threads", type=int, default=4, show_default=True, help="Client workers.")
@click.option("--dir", "base_dir", type=click.Path(path_type=Path), default=None,
              help="Cluster directory (kept, with logs); default a temp dir, deleted.")  # fmt: skip
@click.option("--log-level", default="WARNING", show_default=True, help="Python logging level.")
def run_command(
    duration_s: float,
    seed: int,
    nemesis: str,
    workload: str,
    threads: int,
    base_dir: Path | None,
    log_level: str,
) -> None:
    """Run workloads under faults; print one summary line; exit 1 on any anomaly."""
    logging.basicConfig(
        level=log_level.upper(), stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s"
    )
    if workload == "client":
        summary_client = run_client(
            duration_s, seed, parse_kinds(nemesis, CLIENT_KINDS), threads=threads
        )
        _report(summary_client.line(), summary_client.anomalies)
        return
    kinds = parse_kinds(nemesis, ALL_KINDS)
    config = RunConfig(
        duration_s=duration_s,
        seed=seed,
        kinds=kinds,
        threads=threads,
        base_dir=base_dir,
        keep_dir=base_dir is not None,
    )
    summary = run(config)
    _report(summary.line(), summary.anomalies)


def _report(line: str, anomalies: list[str]) -> None:
    click.echo(line)
    for anomaly in anomalies:
        click.echo(f"  anomaly: {anomaly}", err=True)
    if anomalies:
        sys.exit(1)


def parse_kinds(text: str, known: tuple[str, ...]) -> tuple[str, ...]:
    """``all``, ``none`` or a comma-separated list of ``known`` kinds (validated)."""
    if text == "all":
        return known
    if text == "none":
        return ()
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = sorted(set(kinds) - set(known))
    if unknown:
        raise click.BadParameter(f"unknown kind(s) {unknown}; known: {', '.join(known)}")
    return kinds
