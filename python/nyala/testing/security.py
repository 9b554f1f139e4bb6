"""The security material of a secure ``MiniCluster``: a cluster CA under the cluster's
directory, a security directory per server (masters get the CA, tablet servers a join
credential), and credentials for the test process (an admin) and for any user a test makes.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from nyala.rpc.settings import RpcSettings
from nyala.security import files, pki
from nyala.security.identity import Identity, Kind


class ClusterSecurity:
    """A cluster CA and what it issued, under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.ca = pki.ClusterCa.create()
        self.ca.save(directory / "ca")
        #: The credentials of the test process: an admin.
        self.admin_dir = self.credentials("admin", kind=Kind.ADMIN)
        self.admin_settings = RpcSettings(tls=files.load_client_tls(self.admin_dir))

    def master_dir(self, name: str) -> Path:
        """A master's security directory: the CA's certificate and key."""
        directory = self.directory / name
        self.ca.save(directory)
        return directory

    def tserver_dir(self, name: str) -> Path:
        """A tablet server's security directory: the CA's certificate and a join credential."""
        directory = self.directory / name
        self.join_credential(directory)
        return directory

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
