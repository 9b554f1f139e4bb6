"""The security material of a secure ``MiniCluster``: a cluster CA under the cluster's
directory, a security directory per server (masters get the CA, tablet servers a join
credential), and credentials for the test process (an admin) and for any user a test makes.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from nyala import _native
from nyala.rpc.settings import RpcSettings
from nyala.rpc.tls_socket import tls_config
from nyala.security import files, pki
from nyala.security.identity import Identity, Kind


class ClusterSecurity:
    """A cluster CA and what it issued, under ``directory`` (reopened if it is there)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        if pki.ClusterCa.exists(directory / "ca"):
            self.ca = pki.ClusterCa.load(directory / "ca")
        else:
            self.ca = pki.ClusterCa.create()
            self.ca.save(directory / "ca")
        #: The credentials of the test process (or the local cluster's operator): an admin.
        self.admin_dir = self.directory / "clients" / "admin-admin"
        if not (self.admin_dir / files.CLIENT_CERT).exists():
            self.credentials("admin", kind=Kind.ADMIN)
        self.admin_settings = RpcSettings(tls=files.load_client_tls(self.admin_dir))

    @staticmethod
    def exists(directory: Path) -> bool:
        """Whether ``directory`` holds a cluster CA made by this class."""
        return pki.ClusterCa.exists(directory / "ca")

    def master_dir(self, name: str) -> Path:
        """A master's security directory: the CA's certificate and key."""
        directory = self.directory / name
        if not pki.ClusterCa.exists(directory):
            self.ca.save(directory)
        return directory

    def tserver_dir(self, name: str) -> Path:
        """A tablet server's security directory: the CA's certificate and a join credential
        (a new one, unless the server already has its certificate). A master added to a
        running cluster gets one too (``MiniCluster.add_master``): it enrolls the same way."""
        directory = self.directory / name
        if not (directory / files.SERVER_CERT).exists():
            self.join_credential(directory)
        return directory

    def server_dir(self, name: str) -> Path:
        """The security directory of the server called ``name`` (``master-0``, ``tserver-1``)."""
        return self.master_dir(name) if name.startswith("master") else self.tserver_dir(name)

    def join_credential(
        self, directory: Path, *, validity_s: int = pki.JOIN_CERT_VALIDITY_S
    ) -> None:
        """Writes a join credential (and the CA's certificate) into ``directory``."""
        self.ca.issue_credentials(
            Identity(Kind.JOIN, directory.name),
            directory,
            files.JOIN_CERT,
            files.JOIN_KEY,
            validity_s=validity_s,
        )

    def credentials(
        self,
        name: str,
        *,
        kind: Kind = Kind.USER,
        validity_s: int = pki.USER_CERT_VALIDITY_S,
        not_before: datetime.datetime | None = None,
    ) -> Path:
        """A client credentials directory for ``name`` (``nyala.connect(credentials=...)``)."""
        directory = self.directory / "clients" / f"{kind.value}-{name}"
        self.ca.issue_credentials(
            Identity(kind, name),
            directory,
            files.CLIENT_CERT,
            files.CLIENT_KEY,
            validity_s=validity_s,
            not_before=not_before,
        )
        return directory


def issue_tls_config(
    ca: pki.ClusterCa,
    identity: Identity,
    *,
    server: bool,
    trust: pki.ClusterCa | None = None,
) -> _native.TlsConfig:
    """One side's configuration for the extension's TLS (``rpc.tls_socket``), with a fresh
    key and a certificate ``ca`` issues to ``identity`` (valid an hour); it trusts ``trust``'s
    certificates (default ``ca``'s). For tests that shake hands without a cluster."""
    key = pki.new_key()
    cert = ca.issue(identity, key.public_key(), validity_s=3600)
    return tls_config((trust or ca).cert_pem, pki.cert_pem(cert), pki.key_pem(key), server=server)
