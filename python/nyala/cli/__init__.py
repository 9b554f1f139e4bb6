"""The ``nyala`` command line (DESIGN.md §9): one program, one click group per noun.

Each noun (``tserver``, later ``master``, ``table``, ``tablet``, ``local-cluster``, ``cluster``,
``local-replica``, ...) lives in its own module exposing a ``group``; ``COMMAND_MODULES`` lists
them and they are imported only when that command runs, so ``nyala --help`` stays fast and a
broken optional dependency of one noun cannot break the others.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

# noun -> module whose ``group`` implements it. Add new nouns here.
COMMAND_MODULES: dict[str, str] = {
    "chaos": "nyala.cli.chaos",
    "cert": "nyala.cli.cert",
    "master": "nyala.cli.master",
    "tablet-copy": "nyala.cli.tablet_copy",
    "tserver": "nyala.cli.tserver",
    "cluster": "nyala.cli.cluster",
    "local-replica": "nyala.cli.local_replica",
    "table": "nyala.cli.table",
    "tablet": "nyala.cli.tablet",
    "local-cluster": "nyala.cli.local_cluster",
    "remote-replica": "nyala.cli.remote_replica",
    "perf": "nyala.cli.perf",
    "user": "nyala.cli.user",
}

_SHORT_HELP: dict[str, str] = {
    "chaos": "Fault-injection runs that check nothing acknowledged is lost.",
    "cert": "The cluster CA: create it, issue credentials, list and export certificates.",
    "master": "Run, list, add and remove masters.",
    "tablet-copy": "List and cancel tablet copies onto a tablet server.",
    "tserver": "Run and inspect tablet servers.",
    "cluster": "Check (ksck) and rebalance the whole cluster.",
    "local-replica": "Inspect and repair replicas of a stopped server.",
    "table": "Create, inspect, change, read and load tables.",
    "tablet": "List tablets and manage their leaders.",
    "local-cluster": "Run a cluster on this machine in the background.",
    "remote-replica": "Operate on a replica of a live tablet server (unsafe-change-config).",
    "perf": "Load generators: measure write throughput (loadgen).",
    "user": "Add, remove and list the users of a secure cluster.",
}


class _LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMAND_MODULES)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMAND_MODULES.get(cmd_name)
        if module_name is None:
            return None
        command: Any = importlib.import_module(module_name).group
        assert isinstance(command, click.Command), module_name
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _SHORT_HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="nyala", prog_name="nyala")
def main() -> None:
    """nyala: a replicated, Arrow-native tablet store."""


__all__ = ["COMMAND_MODULES", "main"]
