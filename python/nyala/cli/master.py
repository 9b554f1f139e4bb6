"""``nyala master ...``: run a master, and list, add or remove masters."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable

import click

from nyala._proto import master_pb2, metadata_pb2
from nyala.cli.options import one_line_errors
from nyala.cli.server_run import run_command
from nyala.errors import InvalidArgumentError, NyalaError, TimedOutError
from nyala.master.settings import MasterSettings
from nyala.rpc import BlockingServerProxy, split_host_port

_SERVER_FIELDS = ("fs_root", "rpc_bind", "http_bind", "masters", "uuid")
_MASTERS_HELP = "Comma-separated master addresses (default: $NYALA_MASTERS)."


@click.group(name="master")
def group() -> None:
    """Run and manage masters."""


async def _serve(settings: MasterSettings) -> None:
    from nyala.master import MasterServer

    await MasterServer(settings).run()


group.add_command(
    run_command(MasterSettings, _serve, "Run a master in the foreground until SIGTERM or SIGINT.")
)


def _master_list(masters: str) -> list[str]:
    addrs = [m.strip() for m in masters.split(",") if m.strip()]
    if not addrs:
        raise InvalidArgumentError("no masters given: pass -m/--masters or set NYALA_MASTERS")
    for addr in addrs:
        split_host_port(addr)
    return addrs


def find_leader(addrs: list[str], timeout_s: float = 15.0) -> tuple[str, str]:
    """(address, uuid) of the leader master with a loaded catalog, asking every master."""
    deadline = time.monotonic() + timeout_s
    last = "no master answered"
    candidates = list(addrs)
    while time.monotonic() < deadline:
        for addr in list(candidates):
            try:
                with BlockingServerProxy(addr) as proxy:
                    answer = proxy.call(
                        proxy.master.ConnectToMaster,
                        master_pb2.ConnectToMasterRequestPB(),
                        timeout_ms=2_000,
                    )
            except NyalaError as exc:
                last = f"{addr}: {exc}"
                continue
            if answer.catalog_ready:
                return addr, str(answer.master_uuid)
            last = f"{addr} is {master_pb2.RaftRole.Name(answer.role)}"
            # Follow the hint: a master not given on the command line may be the leader.
            for entry in answer.masters:
                hinted = f"{entry.rpc_addr.host}:{entry.rpc_addr.port}"
                if entry.permanent_uuid == answer.leader_uuid and hinted not in candidates:
                    candidates.append(hinted)
        time.sleep(0.2)
    raise TimedOutError(f"no leader master among {','.join(addrs)} ({last})")


def _print_masters(entries: Iterable[master_pb2.MasterEntryPB], fmt: str) -> None:
    rows = [
        {
            "uuid": e.permanent_uuid,
            "rpc_addr": f"{e.rpc_addr.host}:{e.rpc_addr.port}",
            "role": master_pb2.RaftRole.Name(e.role).removeprefix("ROLE_"),
            "member_type": metadata_pb2.MemberType.Name(e.member_type),
        }
        for e in entries
    ]
    if fmt == "json":
        click.echo(json.dumps(rows, indent=1))
        return
    click.echo(f"{'uuid':32}  {'rpc_addr':21}  {'role':15}  member_type")
    for r in rows:
        click.echo(f"{r['uuid']:32}  {r['rpc_addr']:21}  {r['role']:15}  {r['member_type']}")


_format_option = click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
_masters_option = click.option(
    "-m", "--masters", envvar="NYALA_MASTERS", default="", help=_MASTERS_HELP
)


@group.command(name="list")
@_masters_option
@_format_option
@one_line_errors
def list_masters(masters: str, fmt: str) -> None:
    """List the masters of the cluster with their roles."""
    addr, uuid = find_leader(_master_list(masters))
    with BlockingServerProxy(addr) as proxy:
        answer = proxy.call(
            proxy.master.ListMasters, master_pb2.ListMastersRequestPB(dest_uuid=uuid)
        )
    _print_masters(answer.masters, fmt)


@group.command(name="add")
@_masters_option
@click.argument("address")
@one_line_errors
def add_master(masters: str, address: str) -> None:
    """Add the running master at ADDRESS (HOST:PORT) to the cluster."""
    host, port = split_host_port(address)
    addr, uuid = find_leader(_master_list(masters))
    request = master_pb2.AddMasterRequestPB(dest_uuid=uuid)
    request.rpc_addr.host, request.rpc_addr.port = host, port
    with BlockingServerProxy(addr) as proxy:
        answer = proxy.admin_call(proxy.master.AddMaster, request)
    click.echo(f"added master {answer.master_uuid} at {address}")


@group.command(name="remove")
@_masters_option
@click.argument("master")
@one_line_errors
def remove_master(masters: str, master: str) -> None:
    """Remove MASTER (a UUID or HOST:PORT) from the cluster."""
    addr, uuid = find_leader(_master_list(masters))
    request = master_pb2.RemoveMasterRequestPB(dest_uuid=uuid)
    if ":" in master:
        request.rpc_addr.host, request.rpc_addr.port = split_host_port(master)
    else:
        request.master_uuid = master
    with BlockingServerProxy(addr) as proxy:
        proxy.admin_call(proxy.master.RemoveMaster, request)
    click.echo(f"removed master {master}")
