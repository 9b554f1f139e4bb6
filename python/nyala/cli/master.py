"""``nyala master ...``: run a master, and list, add or remove masters."""

from __future__ import annotations

import time
from collections.abc import Iterable

import click

from nyala._proto import master_pb2, metadata_pb2
from nyala.cli.cluster import masters_option as cluster_masters_option
from nyala.cli.cluster_client import UNREACHABLE_FAIL_MS, one_line, timeout_ms
from nyala.cli.output import emit, format_option
from nyala.cli.server_run import run_command
from nyala.errors import InvalidArgumentError, NetworkError, NyalaError, TimedOutError
from nyala.master.settings import MasterSettings
from nyala.rpc import BlockingServerProxy, split_host_port

_SERVER_FIELDS = ("fs_root", "rpc_bind", "http_bind", "masters", "uuid")


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


def find_leader(addrs: list[str], timeout_s: float | None = None) -> tuple[str, str]:
    """(address, uuid) of the leader master with a loaded catalog, asking every master until
    ``timeout_s`` (default: ``--timeout``); ``NetworkError`` early if none can be reached."""
    if timeout_s is None:
        timeout_s = timeout_ms() / 1000
    start = time.monotonic()
    deadline = start + timeout_s
    last = "no master answered"
    candidates = list(addrs)
    while time.monotonic() < deadline:
        unreachable = []
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
                if isinstance(exc, NetworkError):
                    unreachable.append(last)
                continue
            if answer.catalog_ready:
                return addr, str(answer.master_uuid)
            last = f"{addr} is {master_pb2.RaftRole.Name(answer.role)}"
            # Follow the hint: a master not given on the command line may be the leader.
            for entry in answer.masters:
                hinted = f"{entry.rpc_addr.host}:{entry.rpc_addr.port}"
                if entry.permanent_uuid == answer.leader_uuid and hinted not in candidates:
                    candidates.append(hinted)
        waited_ms = (time.monotonic() - start) * 1000
        if len(unreachable) == len(candidates) and waited_ms >= UNREACHABLE_FAIL_MS:
            raise NetworkError(f"no master could be reached: {'; '.join(unreachable)}")
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
    emit(rows, fmt)


_format_option = format_option
_masters_option = cluster_masters_option


@group.command(name="list")
@_masters_option
@_format_option
@one_line
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
@one_line
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
@one_line
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
