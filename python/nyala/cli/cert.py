"""``nyala cert ...``: the cluster CA and the certificates it signs (docs/security.md).

These commands work on files, on a host that holds the CA (a master's ``--security-dir``):
``init-ca`` creates the CA, ``export-ca`` prints its certificate and fingerprint (what clients
and servers trust), ``issue`` makes a user's or admin's credentials directory,
``join-credential`` makes the one-time credential a new tablet server or master enrolls with,
``list`` shows what a directory holds, and ``rotate-server`` renews a master's own certificate.
``revoke-join`` is the one that asks the masters (as an admin): it revokes a join credential.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import click

from nyala.cli.cluster_client import client_for, masters_option, one_line
from nyala.cli.options import one_line_errors
from nyala.cli.output import emit, emit_one, format_option

_CA_DIR_HELP = "Directory holding ca.pem and ca.key (a master's --security-dir)."
_PASS_HELP = "File whose content encrypts the CA key at rest (as given to the masters)."


@click.group(name="cert")
def group() -> None:
    """Create the cluster CA, issue credentials, list and export certificates."""


def _passphrase(path: Path | None) -> bytes | None:
    return None if path is None else path.read_bytes().strip()


def _ca_options(fn: click.decorators.FC) -> click.decorators.FC:
    fn = click.option(
        "--ca-key-passphrase-file",
        type=click.Path(path_type=Path, dir_okay=False, exists=True),
        default=None,
        help=_PASS_HELP,
    )(fn)
    return click.option(
        "--ca-dir", type=click.Path(path_type=Path), required=True, help=_CA_DIR_HELP
    )(fn)


@group.command(name="init-ca")
@_ca_options
@format_option
@one_line_errors
def init_ca(ca_dir: Path, ca_key_passphrase_file: Path | None, fmt: str) -> None:
    """Create the cluster CA in CA_DIR (refused if one is there); copy the directory to every
    master's --security-dir before their first start."""
    from nyala.errors import AlreadyPresentError
    from nyala.security import pki

    if pki.ClusterCa.exists(ca_dir):
        raise AlreadyPresentError(f"{ca_dir} already holds a cluster CA")
    ca = pki.ClusterCa.create()
    ca.save(ca_dir, _passphrase(ca_key_passphrase_file))
    emit_one({"ca_dir": str(ca_dir), "fingerprint": pki.fingerprint(ca.cert_pem)}, fmt)


@group.command(name="export-ca")
@click.option("--ca-dir", type=click.Path(path_type=Path), required=True, help=_CA_DIR_HELP)
@click.option("--fingerprint", "only_fingerprint", is_flag=True, help="Print the SHA-256 only.")
@one_line_errors
def export_ca(ca_dir: Path, only_fingerprint: bool) -> None:
    """Print the CA certificate (PEM), which clients and servers trust; never the key."""
    from nyala.security import files, pki

    pem = files.read_file(ca_dir / files.CA_CERT)
    click.echo(pki.fingerprint(pem) if only_fingerprint else pem.decode(), nl=only_fingerprint)


@group.command(name="issue")
@_ca_options
@click.option("--user", "name", required=True, help="User name the certificate names.")
@click.option("--admin", is_flag=True, help="An admin (replica moves, config changes).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Credentials dir.")
@click.option("--days", default=30, show_default=True, help="Validity in days.")
@format_option
@one_line_errors
def issue(
    ca_dir: Path,
    ca_key_passphrase_file: Path | None,
    name: str,
    admin: bool,
    out: Path,
    days: int,
    fmt: str,
) -> None:
    """Write OUT/{ca.pem,client.pem,client.key} for a user: nyala.connect(credentials=OUT)
    or NYALA_CREDENTIALS=OUT."""
    from nyala.security import files, pki
    from nyala.security.identity import Identity, Kind

    ca = pki.ClusterCa.load(ca_dir, _passphrase(ca_key_passphrase_file))
    identity = Identity(Kind.ADMIN if admin else Kind.USER, name)
    path = ca.issue_credentials(
        identity, out, files.CLIENT_CERT, files.CLIENT_KEY, validity_s=days * 24 * 3600
    )
    emit_one({"identity": str(identity), "credentials": str(out), "cert": str(path)}, fmt)


@group.command(name="join-credential")
@_ca_options
@click.option("--out", type=click.Path(path_type=Path), required=True, help="The tserver's dir.")
@click.option("--hours", default=24, show_default=True, help="Validity in hours.")
@click.option("--name", default=None, help="Its name (nyala cert revoke-join); OUT's name.")
@format_option
@one_line_errors
def join_credential(
    ca_dir: Path,
    ca_key_passphrase_file: Path | None,
    out: Path,
    hours: int,
    name: str | None,
    fmt: str,
) -> None:
    """Write OUT/{ca.pem,join.pem,join.key}: give OUT to a new tablet server or master as its
    --security-dir; at its first start it sends a CSR and keeps the signed certificate."""
    from nyala.security import files, pki
    from nyala.security.identity import Identity, Kind

    ca = pki.ClusterCa.load(ca_dir, _passphrase(ca_key_passphrase_file))
    identity = Identity(Kind.JOIN, name or out.resolve().name or "join")
    ca.issue_credentials(identity, out, files.JOIN_CERT, files.JOIN_KEY, validity_s=hours * 3600)
    emit_one({"identity": str(identity), "security_dir": str(out)}, fmt)


@group.command(name="revoke-join")
@click.argument("name")
@masters_option
@format_option
@one_line
def revoke_join(name: str, masters: str, fmt: str) -> None:
    """Revoke the join credentials called NAME (as an admin, against the masters): every one
    made before now is refused from now on, so no server enrolls with it. Servers already
    enrolled with it keep their certificates."""
    with client_for(masters) as client:
        client.revoke_join_credential(name)
    emit_one({"revoked_join_credential": name}, fmt)


@group.command(name="list")
@click.option("--dir", "directory", type=click.Path(path_type=Path), required=True)
@format_option
@one_line_errors
def list_certs(directory: Path, fmt: str) -> None:
    """Every certificate under DIR: whom it names, its serial and when it ends."""
    from nyala.security import pki

    now = datetime.datetime.now(datetime.UTC)
    rows = [
        {
            "identity": c.identity,
            "serial": f"{c.serial:x}",
            "not_after": c.not_after.isoformat(timespec="seconds"),
            "expired": c.not_after < now,
            "path": str(c.path),
        }
        for c in pki.list_certs(directory)
    ]
    emit(rows, fmt)


@group.command(name="rotate-server")
@click.option("--security-dir", type=click.Path(path_type=Path), required=True)
@format_option
@one_line_errors
def rotate_server(security_dir: Path, fmt: str) -> None:
    """Drop a server's own certificate so it gets a new one at its next start (a master signs
    its own; a tablet server needs a join credential in the directory again)."""
    from nyala.security import files

    removed = []
    for name in (files.SERVER_CERT, files.SERVER_KEY):
        path = security_dir / name
        if path.exists():
            path.unlink()
            removed.append(str(path))
    emit_one({"removed": removed, "next": "restart the server"}, fmt)
