"""``nyala user ...``: the users of a secure cluster (docs/security.md, "Users"), run by an
admin against the masters: ``add`` makes a user's credentials directory (its key is made here,
its certificate signed by the masters), ``remove`` revokes every certificate of a name, and
``list`` shows who was added or removed, and ``session`` (any user) writes short-lived
credentials for oneself.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from nyala.cli.cluster_client import client_for, masters_option, one_line
from nyala.cli.output import emit, emit_one, format_option


@click.group(name="user")
def group() -> None:
    """Add, remove and list the users of a secure cluster (as an admin)."""


@group.command(name="add")
@click.argument("name")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Credentials dir.")
@click.option("--admin", is_flag=True, help="An admin (replica moves, config changes, users).")
@click.option("--days", default=30, show_default=True, help="Validity of the certificate.")
@masters_option
@format_option
@one_line
def add(name: str, out: Path, admin: bool, days: int, masters: str, fmt: str) -> None:
    """Add user NAME and write OUT/{ca.pem,client.pem,client.key}: give OUT to the user, who
    connects with NYALA_CREDENTIALS=OUT (or nyala.connect(credentials=OUT))."""
    with client_for(masters) as client:
        client.add_user(name, out, admin=admin, days=days)
    emit_one({"user": name, "admin": admin, "credentials": str(out)}, fmt)


@group.command(name="remove")
@click.argument("name")
@masters_option
@format_option
@one_line
def remove(name: str, masters: str, fmt: str) -> None:
    """Remove user NAME: every certificate of that name issued before now is refused (by the
    masters at once, by the tablet servers within a heartbeat)."""
    with client_for(masters) as client:
        client.remove_user(name)
    emit_one({"removed": name}, fmt)


def _time(unix_ms: int) -> str:
    if not unix_ms:
        return ""
    return dt.datetime.fromtimestamp(unix_ms / 1000, dt.UTC).isoformat(timespec="seconds")


@group.command(name="list")
@masters_option
@format_option
@one_line
def list_users(masters: str, fmt: str) -> None:
    """Users added or removed, and join credentials revoked, by name."""
    with client_for(masters) as client:
        users = client.list_users()
    rows = [
        {
            "name": u["name"],
            "kind": u["kind"],
            "admin": u["admin"],
            "state": "REMOVED" if u["removed"] else "ACTIVE",
            "added": _time(u["added_unix_ms"]),
            "removed": _time(u["removed_unix_ms"]),
        }
        for u in users
    ]
    emit(rows, fmt, ["name", "kind", "admin", "state", "added", "removed"])


@group.command(name="session")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Credentials dir.")
@click.option(
    "--hours",
    default=24,
    show_default=True,
    help="Validity (at most 168, and never past the certificate they are issued to).",
)
@masters_option
@format_option
@one_line
def session(out: Path, hours: int, masters: str, fmt: str) -> None:
    """Write short-lived credentials for your own user to OUT (for Spark executors or a batch
    job that should not hold your long-lived key); they cannot be renewed with themselves."""
    with client_for(masters) as client:
        issued = client.issue_session_credentials(out, validity_s=hours * 3600)
    emit_one(
        {"credentials": issued["credentials"], "expires": _time(issued["expires_unix_ms"])}, fmt
    )
