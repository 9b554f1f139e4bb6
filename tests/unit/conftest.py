"""Fixtures shared by the unit tests: a throwaway cluster CA and a server's configuration for
the extension's TLS (``tests/unit/rpc/test_tls_socket.py``, ``tests/unit/client/
test_write_channel_connection.py``)."""

from __future__ import annotations

import pytest

from nyala import _native
from nyala.security import pki
from nyala.security.identity import Identity, Kind
from nyala.testing.security import issue_tls_config

#: The UUID the server certificate of ``server_tls`` names.
TLS_SERVER_UUID = "5" * 32


@pytest.fixture(scope="session")
def ca() -> pki.ClusterCa:
    return pki.ClusterCa.create()


@pytest.fixture(scope="session")
def server_tls(ca: pki.ClusterCa) -> _native.TlsConfig:
    return issue_tls_config(ca, Identity(Kind.SERVER, TLS_SERVER_UUID), server=True)
