"""The cluster CA, certificates, identities and the method roles (issue 36), without servers."""

from __future__ import annotations

import datetime
import stat
from pathlib import Path

import pytest
from cryptography import x509

from nyala.errors import InvalidArgumentError, NotAuthorizedError
from nyala.rpc.auth import METHOD_ROLES, caller_of, required_role
from nyala.security import files, pki
from nyala.security.identity import Identity, Kind, Role
from nyala.server.settings import ServerSettings


def test_a_ca_signs_a_servers_csr_for_its_uuid_only() -> None:
    ca = pki.ClusterCa.create()
    key = pki.new_key()
    cert_pem = ca.sign_server_csr(pki.make_csr(key, "a" * 32), "a" * 32, ["127.0.0.1"])
    assert ca.verify(cert_pem) == Identity(Kind.SERVER, "a" * 32)
    cert = x509.load_pem_x509_certificate(cert_pem)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "a" * 32 + ".server.nyala" in names.get_values_for_type(x509.DNSName)
    with pytest.raises(InvalidArgumentError, match="does not name"):
        ca.sign_server_csr(pki.make_csr(key, "b" * 32), "a" * 32, [])
    with pytest.raises(InvalidArgumentError, match="not a PEM"):
        ca.sign_server_csr(b"-----BEGIN CERTIFICATE REQUEST-----\ngarbage", "a" * 32, [])
    with pytest.raises(InvalidArgumentError, match="over"):
        ca.sign_server_csr(b"x" * (pki.CSR_BYTES_MAX + 1), "a" * 32, [])


def test_another_cas_or_an_expired_certificate_does_not_verify(tmp_path: Path) -> None:
    ca, other = pki.ClusterCa.create(), pki.ClusterCa.create()
    foreign = other.issue_credentials(
        Identity(Kind.ADMIN, "mallory"), tmp_path / "m", "c.pem", "c.key", validity_s=3600
    )
    with pytest.raises(NotAuthorizedError, match="not signed"):
        ca.verify(foreign.read_bytes())
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    expired = ca.issue_credentials(
        Identity(Kind.USER, "old"),
        tmp_path / "o",
        "c.pem",
        "c.key",
        validity_s=60,
        not_before=long_ago,
    )
    with pytest.raises(NotAuthorizedError, match="expired"):
        ca.verify(expired.read_bytes())


def test_the_ca_key_is_private_and_encrypted_under_a_passphrase(tmp_path: Path) -> None:
    ca = pki.ClusterCa.create()
    ca.save(tmp_path, b"s3cret")
    key_file = tmp_path / files.CA_KEY
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert b"ENCRYPTED" in key_file.read_bytes()
    with pytest.raises(InvalidArgumentError, match="wrong or missing key file") as failure:
        pki.ClusterCa.load(tmp_path, b"wrong")
    assert "s3cret" not in str(failure.value)
    assert pki.ClusterCa.load(tmp_path, b"s3cret").cert_pem == ca.cert_pem
    assert "key=<hidden>" in repr(files.TlsSettings(b"ca", b"cert", b"KEY"))


def test_identities_parse_and_order_by_role() -> None:
    assert Identity.from_uri("nyala://server/" + "c" * 32).role is Role.SERVER
    assert Identity.from_uri("nyala://join/ts1").role is Role.NONE
    for bad in ("https://user/x", "nyala://root/x", "nyala://user/", "nyala://user/../x"):
        with pytest.raises(InvalidArgumentError):
            Identity.from_uri(bad)
    assert caller_of({"peer_uri": [b"nyala://admin/ops"]}) == Identity(Kind.ADMIN, "ops")
    assert caller_of({"x509_common_name": [b"admin:ops"]}) is None  # only the URI counts


def test_every_method_has_a_role_and_unknown_ones_need_a_server() -> None:
    assert required_role("/nyala.TabletService/Write") is Role.USER
    assert required_role("/nyala.ConsensusService/UnsafeChangeConfig") is Role.ADMIN
    assert required_role("/nyala.ConsensusService/UpdateConsensus") is Role.SERVER
    assert required_role("/nyala.TabletService/SomethingNew") is Role.SERVER
    from nyala._proto import (
        consensus_pb2,
        master_pb2,
        tablet_copy_pb2,
        tserver_admin_pb2,
        tserver_pb2,
    )

    declared = {
        f"{service.name}.{method.name}"
        for module in (master_pb2, tserver_pb2, tserver_admin_pb2, consensus_pb2, tablet_copy_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert declared == set(METHOD_ROLES)


def test_a_server_on_a_reachable_address_must_be_secure_or_say_insecure(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a loopback address"):
        ServerSettings(fs_root=tmp_path, rpc_bind="10.1.2.3:7050")
    with pytest.raises(ValueError, match="not a loopback address"):
        ServerSettings(fs_root=tmp_path, http_bind="0.0.0.0:8050")
    ServerSettings(fs_root=tmp_path, rpc_bind="10.1.2.3:7050", insecure=True)
    ServerSettings(fs_root=tmp_path, rpc_bind="[::1]:7050", http_bind="localhost:8050")
    ServerSettings(
        fs_root=tmp_path,
        rpc_bind="0.0.0.0:7050",
        http_bind="0.0.0.0:8050",
        security_dir=str(tmp_path / "sec"),
    )
