"""Security on real processes (issue 36): mutual TLS on every RPC, certificates of the cluster
CA as the credential, roles checked on every call, tablet servers enrolled with a join
credential. One secure cluster (1 master, 3 tablet servers) serves the module.
"""

from __future__ import annotations

import base64
import datetime
import http.client
import json
import socket
import ssl
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner

import nyala
from nyala import errors
from nyala._proto import (
    common_pb2,
    consensus_pb2,
    master_pb2,
    metadata_pb2,
    tablet_copy_pb2,
    tserver_admin_pb2,
    tserver_pb2,
)
from nyala.cli import main
from nyala.rowops import encode, make_op_batch
from nyala.rpc import BlockingServerProxy
from nyala.rpc.channel_wire import MAGIC
from nyala.rpc.errors import raise_for_response
from nyala.rpc.settings import RpcSettings
from nyala.security import files, identity, pki
from nyala.security.identity import Identity, Kind
from nyala.security.tokens import AuthzToken, Privilege, new_signing_key, sign_token
from nyala.testing import MiniCluster, logs_on_failure
from nyala.testing.master_ops import wait_until
from nyala.testing.mini_cluster import FAST_TSERVER_FLAGS, ServerProcess, fast_master_flags
from nyala.testing.replica_ops import tablet_states
from nyala.testing.security import ClusterSecurity

SCHEMA = nyala.Schema.parse("id:int64, v:string?", key=["id"])


def _secure_cluster(tservers: int, *master_flags: str) -> Iterator[MiniCluster]:
    mini = MiniCluster(
        tservers,
        num_masters=1,
        master_flags=fast_master_flags(*master_flags),
        tserver_flags=FAST_TSERVER_FLAGS,
        secure=True,
    )
    with logs_on_failure(mini) as started:
        yield started


@pytest.fixture(scope="module")
def cluster() -> Iterator[MiniCluster]:
    yield from _secure_cluster(3)


@pytest.fixture(scope="module")
def security(cluster: MiniCluster) -> ClusterSecurity:
    assert cluster.security is not None
    return cluster.security


@pytest.fixture(scope="module")
def table(cluster: MiniCluster, security: ClusterSecurity) -> str:
    with nyala.connect(cluster.master_addrs, credentials=security.admin_dir) as client:
        t = client.create_table(
            "secured", SCHEMA, partitioning=nyala.HashPartitioning(["id"], buckets=2), replicas=3
        )
        assert t.insert({"id": [1, 2, 3], "v": ["a", "b", "c"]}).ok
    return "secured"


def _row_count(cluster: MiniCluster, credentials: Path, table: str) -> int:
    with nyala.connect(cluster.master_addrs, credentials=credentials) as client:
        return client.table(table).scan().to_arrow().num_rows


def test_a_user_with_a_certificate_writes_and_scans_over_tls(
    cluster: MiniCluster, security: ClusterSecurity, table: str
) -> None:
    alice = security.credentials("alice")
    with nyala.connect(cluster.master_addrs, credentials=security.admin_dir) as admin:
        admin.grant(table, "alice", "select,insert,update")
    with nyala.connect(cluster.master_addrs, credentials=alice) as client:
        t = client.table(table)
        assert t.upsert({"id": [10], "v": ["x"]}).ok
        assert t.scan().to_arrow().num_rows >= 4


def test_writes_large_and_small_go_on_the_channel_under_tls(
    cluster: MiniCluster, security: ClusterSecurity
) -> None:
    """A bulk load's calls (megabytes each, more than a socket takes at once) and single rows
    from many threads, all on the tablet servers' channels under the extension's TLS; every
    row stored once, as written."""
    alice = security.credentials("alice")
    with nyala.connect(cluster.master_addrs, credentials=security.admin_dir) as admin:
        admin.create_table(
            "channel_tls", SCHEMA, partitioning=nyala.HashPartitioning(["id"], buckets=3)
        )
        admin.grant("channel_tls", "alice", "insert")
    with nyala.connect(cluster.master_addrs, credentials=alice) as client:
        table = client.table("channel_tls")
        bulk = list(range(200_000))
        table.insert({"id": bulk, "v": [f"{k:040d}" for k in bulk]}).raise_for_errors()
        singles = [[1_000_000 + k * 100 + i for i in range(100)] for k in range(8)]

        def single_rows(keys: list[int]) -> None:
            for key in keys:
                table.insert({"id": [key], "v": [f"{key:040d}"]}).raise_for_errors()

        threads = [threading.Thread(target=single_rows, args=(keys,)) for keys in singles]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert _channel_calls(client) > 0
        assert all(
            p.channel is not None and p.channel.connections > 0
            for p in client._writer._pipes.values()
        )
    with nyala.connect(cluster.master_addrs, credentials=security.admin_dir) as admin:
        rows = admin.table("channel_tls").scan().to_arrow()
    ids = rows.column("id").to_pylist()
    written = bulk + [key for keys in singles for key in keys]
    assert sorted(ids) == written
    assert rows.column("v").to_pylist() == [f"{k:040d}" for k in ids]


def test_a_client_without_credentials_is_refused(cluster: MiniCluster, table: str) -> None:
    with pytest.raises(errors.NotAuthenticatedError, match="pass credentials"):
        nyala.connect(cluster.master_addrs, timeout_ms=5_000)


def test_a_plaintext_connection_to_a_secure_server_fails(cluster: MiniCluster) -> None:
    for server in [*cluster.masters, *cluster.tservers]:
        with BlockingServerProxy(server.rpc_addr) as plain, pytest.raises(errors.NetworkError):
            plain.ping(timeout_ms=1_000)


def test_a_certificate_of_another_cluster_is_refused(cluster: MiniCluster, tmp_path: Path) -> None:
    other = ClusterSecurity(tmp_path / "other")
    mallory = other.credentials("mallory", kind=Kind.ADMIN)
    with pytest.raises(errors.NotAuthenticatedError, match="refused this client's certificate"):
        nyala.connect(cluster.master_addrs, credentials=mallory, timeout_ms=5_000)
    # A client that trusts the real CA but shows another cluster's certificate: refused too.
    forged = files.TlsSettings(
        ca_pem=(cluster.security.admin_dir / files.CA_CERT).read_bytes(),  # type: ignore[union-attr]
        cert_pem=(mallory / files.CLIENT_CERT).read_bytes(),
        key_pem=(mallory / files.CLIENT_KEY).read_bytes(),
    )
    proxy = BlockingServerProxy(cluster.tservers[0].rpc_addr, RpcSettings(tls=forged))
    with proxy, pytest.raises(errors.NetworkError):
        proxy.ping(timeout_ms=1_000)


def test_an_expired_certificate_is_refused(
    cluster: MiniCluster, security: ClusterSecurity, table: str
) -> None:
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=2)
    expired = security.credentials("old", validity_s=3600, not_before=long_ago)
    with pytest.raises(errors.NotAuthenticatedError, match="expired"):
        nyala.connect(cluster.master_addrs, credentials=expired, timeout_ms=5_000)


def test_a_user_cannot_call_admin_or_server_rpcs(
    cluster: MiniCluster, security: ClusterSecurity, table: str
) -> None:
    bob = security.credentials("bob")
    settings = RpcSettings(tls=files.load_client_tls(bob))
    ts = cluster.tservers[0]
    assert ts.uuid is not None
    with BlockingServerProxy(ts.rpc_addr, settings) as proxy:
        assert proxy.ping(ts.uuid).server_uuid == ts.uuid  # a user may ping
        with pytest.raises(errors.NotAuthorizedError, match="ADMIN role"):
            proxy.admin_call(
                proxy.admin.DeleteTablet,
                tserver_admin_pb2.DeleteTabletRequestPB(dest_uuid=ts.uuid, tablet_id="0" * 32),
            )
        with pytest.raises(errors.NotAuthorizedError, match="SERVER role"):
            proxy.call(
                proxy.consensus.RequestVote,
                consensus_pb2.VoteRequestPB(dest_uuid=ts.uuid, tablet_id="0" * 32),
            )
    # An admin may call admin RPCs (here it fails for another reason: no such tablet).
    with cluster.tservers[0].proxy() as admin:
        with pytest.raises(errors.NyalaError) as failure:
            admin.admin_call(
                admin.admin.DeleteTablet,
                tserver_admin_pb2.DeleteTabletRequestPB(dest_uuid=ts.uuid, tablet_id="0" * 32),
            )
        assert not isinstance(failure.value, errors.NotAuthorizedError)


def _server_settings(security: ClusterSecurity, ts: ServerProcess) -> RpcSettings:
    """What ``ts`` itself dials with: its server certificate."""
    directory = security.tserver_dir(ts.name)
    return RpcSettings(tls=files.load_tls(directory, files.SERVER_CERT, files.SERVER_KEY))


def _peer_channel_port(cluster: MiniCluster, security: ClusterSecurity, ts: ServerProcess) -> int:
    """``ts``'s peer channel port, asked as a peer asks (GetPeerChannel needs a server)."""
    peer = next(other for other in cluster.tservers if other is not ts)
    with BlockingServerProxy(
        ts.rpc_addr, _server_settings(security, peer), server_uuid=ts.uuid
    ) as proxy:
        request = consensus_pb2.PeerChannelRequestPB(dest_uuid=ts.uuid or "")
        return proxy.call(proxy.consensus.GetPeerChannel, request).port


def _channel_exchange(
    port: int, context: ssl.SSLContext | None, server_uuid: str, tablet_id: str
) -> consensus_pb2.ConsensusBatchResponsePB | None:
    """Opens the peer channel at ``port`` (TLS with ``context``, or plaintext), sends one
    batch of one request for ``tablet_id``, returns the first answer (None if the server
    closed the connection without one)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn: socket.socket = (
        raw
        if context is None
        else context.wrap_socket(raw, server_hostname=identity.server_dns_name(server_uuid))
    )
    with conn:
        request = consensus_pb2.ConsensusRequestPB(tablet_id=tablet_id, dest_uuid=server_uuid)
        batch = consensus_pb2.ConsensusBatchRequestPB(dest_uuid=server_uuid, caller_uuid="x")
        batch.requests.append(request.SerializeToString())
        batch.call_ids.append(1)
        data = batch.SerializeToString()
        try:
            conn.sendall(MAGIC + struct.pack(">I", len(data)) + data)
            head = _recv_exactly(conn, 4)
            if head is None:
                return None
            body = _recv_exactly(conn, struct.unpack(">I", head)[0])
        except (ConnectionError, ssl.SSLError):
            return None
    if body is None:
        return None  # not a frame (a plaintext caller gets a TLS alert, 7 bytes, and the end)
    return consensus_pb2.ConsensusBatchResponsePB.FromString(body)


def _recv_exactly(conn: socket.socket, length: int) -> bytes | None:
    data = b""
    while len(data) < length:
        chunk = conn.recv(length - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _tls_client(directory: Path, cert: str, key: str, ca: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(ca)
    context.load_cert_chain(directory / cert, directory / key)
    return context


def test_consensus_between_secure_servers_goes_over_the_peer_channel_under_mutual_tls(
    cluster: MiniCluster, security: ClusterSecurity, table: str
) -> None:
    with nyala.connect(cluster.master_addrs, credentials=security.admin_dir) as client:
        assert client.table(table).upsert({"id": [50, 51], "v": ["p", "q"]}).ok
    # The leaders sent their batches over their peers' channels.
    logs = [ts.log_path.read_text() for ts in cluster.tservers]
    assert any("goes over its peer channel" in log for log in logs)
    target = cluster.tservers[0]
    port = _peer_channel_port(cluster, security, target)
    assert port in target.listening_ports()
    assert target.uuid is not None
    ca = security.admin_dir / files.CA_CERT
    unknown_tablet = "f" * 32
    # Plaintext is not TLS: the handshake fails and nothing is answered.
    assert _channel_exchange(port, None, target.uuid, unknown_tablet) is None
    # A user's certificate (an admin's, even) is not a server's: refused, connection closed.
    admin = _tls_client(security.admin_dir, files.CLIENT_CERT, files.CLIENT_KEY, ca)
    refusal = _channel_exchange(port, admin, target.uuid, unknown_tablet)
    assert refusal is not None
    assert refusal.error.code == common_pb2.NOT_AUTHORIZED, refusal
    assert "SERVER role" in refusal.error.message
    # Another server's certificate: the batch is served (this tablet is not here).
    peer = cluster.tservers[1]
    server = _tls_client(security.tserver_dir(peer.name), files.SERVER_CERT, files.SERVER_KEY, ca)
    answer = _channel_exchange(port, server, target.uuid, unknown_tablet)
    assert answer is not None
    assert not answer.HasField("error"), answer
    assert answer.responses[0].error.code == common_pb2.TABLET_NOT_FOUND


@pytest.mark.slow
def test_a_secure_leader_killed_under_a_writer_rejoins_over_the_channels_tls() -> None:
    """SIGKILL the leader while a writer runs; the others elect over the channel (votes go
    there too), the writer goes on, and the restarted server rejoins: with a third server
    killed next, writes commit only if the restarted one takes its appends, over TLS."""
    gen = _secure_cluster(3)
    cluster = next(gen)
    try:
        assert cluster.security is not None
        credentials = cluster.security.admin_dir
        with nyala.connect(cluster.master_addrs, credentials=credentials) as client:
            table = client.create_table("killed", SCHEMA, replicas=3)
            tablet_id = table.tablets()[0].tablet_id
            acknowledged: list[int] = []
            stop = threading.Event()

            def write() -> None:
                key = 0
                while not stop.is_set():
                    ids = list(range(key, key + 200))
                    key += 200
                    if table.upsert({"id": ids, "v": ["w"] * len(ids)}).ok:
                        acknowledged.extend(ids)

            writer = threading.Thread(target=write)
            writer.start()
            try:
                time.sleep(1.5)
                leader = cluster.leader_of(tablet_id)
                others = [ts for ts in cluster.tservers if ts is not leader]
                dialled_before = _channel_dials(others, leader)
                leader.kill()
                time.sleep(1.0)
                leader.restart()
                before = len(acknowledged)
                wait_until(lambda: len(acknowledged) > before + 2_000, timeout_s=30)
            finally:
                stop.set()
                writer.join()
            third = next(ts for ts in cluster.tservers if ts is not leader and ts.is_running())
            third.kill()
            # Two of three left, one of them the restarted server: this commits only through it.
            assert table.upsert({"id": [-1], "v": ["after"]}).ok
            rows = table.scan().to_arrow()
            assert set(acknowledged) | {-1} <= set(rows.column("id").to_pylist())
            third.restart()
        # The restarted server was dialled again over its channel (a new port, TLS).
        assert _channel_dials(others, leader) > dialled_before
    finally:
        next(gen, None)  # the cluster's shutdown (and its logs on a failure)


def _channel_dials(servers: list[ServerProcess], peer: ServerProcess) -> int:
    """How many times ``servers`` opened their peer channel to ``peer`` (their logs)."""
    line = f"consensus to {peer.uuid} at "
    return sum(
        1
        for ts in servers
        for text in ts.log_path.read_text().splitlines()
        if line in text and "goes over its peer channel" in text
    )


def test_a_tablet_copy_between_secure_servers_goes_over_tls_without_a_data_channel(
    cluster: MiniCluster, security: ClusterSecurity, table: str
) -> None:
    # A secure server opens no data channel: besides its RPC and HTTP ports it listens only
    # on its consensus peer channel (mutual TLS).
    for ts in cluster.tservers:
        others = ts.listening_ports() - {ts.rpc_port, ts.http_port}
        assert others == {_peer_channel_port(cluster, security, ts)}, others
    tablet_id = sorted(tablet_states(cluster.tservers[0]))[0]
    leader = cluster.leader_of(tablet_id)
    follower = next(ts for ts in cluster.tservers if ts is not leader)
    with follower.proxy() as admin:
        admin.admin_call(
            admin.admin.DeleteTablet,
            tserver_admin_pb2.DeleteTabletRequestPB(
                dest_uuid=follower.uuid or "",
                tablet_id=tablet_id,
                delete_type=metadata_pb2.TABLET_DATA_TOMBSTONED,
            ),
        )
    # A write wakes the tablet; its leader finds the follower tombstoned and copies it back
    # there, over FetchData under TLS.
    with nyala.connect(cluster.master_addrs, credentials=security.admin_dir) as client:
        assert client.table(table).upsert({"id": list(range(100, 120)), "v": ["c"] * 20}).ok

    def copied() -> bool:
        with follower.proxy() as admin:
            jobs = admin.call(
                admin.tablet_copy.ListTabletCopies, tablet_copy_pb2.ListTabletCopiesRequestPB()
            ).jobs
        done = [j for j in jobs if j.tablet_id == tablet_id and j.state == "SUCCEEDED"]
        state = tablet_states(follower).get(tablet_id)
        return bool(done) and state == metadata_pb2.TABLET_DATA_READY

    deadline = time.monotonic() + 60
    while not copied():
        assert time.monotonic() < deadline, "the tombstoned follower was not copied back"
        time.sleep(0.2)
    assert "data channel" not in follower.log_path.read_text()  # no attempt, no fallback
    assert _row_count(cluster, security.admin_dir, table) >= 3


def test_a_tserver_without_a_join_credential_cannot_start(cluster: MiniCluster) -> None:
    assert cluster.security is not None
    ts = cluster._new_tserver()
    (Path(ts.flags[ts.flags.index("--security-dir") + 1]) / files.JOIN_CERT).unlink()
    ts.start()
    assert ts.wait_exit(timeout_s=30) != 0
    assert "no join credential" in ts.log_path.read_text()
    cluster.tservers.remove(ts)


def test_a_tserver_with_another_clusters_join_credential_cannot_register(
    cluster: MiniCluster, tmp_path: Path
) -> None:
    assert cluster.security is not None
    other = ClusterSecurity(tmp_path / "other")
    ts = cluster._new_tserver(["--enroll-timeout-ms", "3000"])
    directory = Path(ts.flags[ts.flags.index("--security-dir") + 1])
    other.join_credential(directory)  # another CA's join credential, and that CA's ca.pem
    (directory / files.CA_CERT).write_bytes(cluster.security.ca.cert_pem)
    ts.start()
    assert ts.wait_exit(timeout_s=30) != 0
    cluster.tservers.remove(ts)
    with nyala.connect(cluster.master_addrs, credentials=cluster.security.admin_dir) as client:
        assert len(client.list_tablet_servers()) == 3


def test_a_join_credential_may_only_enroll(
    cluster: MiniCluster, security: ClusterSecurity, tmp_path: Path
) -> None:
    security.join_credential(tmp_path / "joiner")
    settings = RpcSettings(tls=files.load_tls(tmp_path / "joiner", files.JOIN_CERT, files.JOIN_KEY))
    with BlockingServerProxy(cluster.masters[0].rpc_addr, settings) as proxy:
        with pytest.raises(errors.NotAuthorizedError, match="USER role"):
            proxy.call(proxy.master.ListTables, master_pb2.ListTablesRequestPB())
        with pytest.raises(errors.NotAuthorizedError, match="SERVER role"):
            proxy.call(proxy.master.TSHeartbeat, master_pb2.TSHeartbeatRequestPB(ts_uuid="f" * 32))
        key = pki.new_key()
        request = master_pb2.SignServerCertificateRequestPB(
            server_uuid="a" * 32, csr_pem=pki.make_csr(key, "b" * 32)
        )
        with pytest.raises(errors.InvalidArgumentError, match="does not name"):
            proxy.call(proxy.master.SignServerCertificate, request)
    # A user may not enroll a server.
    user = RpcSettings(tls=files.load_client_tls(security.credentials("carol")))
    with BlockingServerProxy(cluster.masters[0].rpc_addr, user) as proxy:
        request = master_pb2.SignServerCertificateRequestPB(
            server_uuid="a" * 32, csr_pem=pki.make_csr(key, "a" * 32)
        )
        with pytest.raises(errors.NotAuthorizedError, match="join credential"):
            proxy.call(proxy.master.SignServerCertificate, request)


def test_a_revoked_join_credential_enrolls_nothing(
    cluster: MiniCluster, security: ClusterSecurity, tmp_path: Path
) -> None:
    """``nyala cert revoke-join NAME`` refuses every join credential of that name made before,
    at once; another join credential still enrolls, and ``nyala user list`` shows it."""
    uuid = "c" * 32

    def enroll_with(directory: Path) -> bytes:
        tls = files.load_tls(directory, files.JOIN_CERT, files.JOIN_KEY)
        request = master_pb2.SignServerCertificateRequestPB(
            server_uuid=uuid, csr_pem=pki.make_csr(pki.new_key(), uuid)
        )
        with BlockingServerProxy(cluster.masters[0].rpc_addr, RpcSettings(tls=tls)) as proxy:
            return proxy.call(proxy.master.SignServerCertificate, request).cert_pem

    security.join_credential(tmp_path / "leaked")
    security.join_credential(tmp_path / "fresh")
    assert enroll_with(tmp_path / "leaked")
    env = {
        "NYALA_MASTERS": ",".join(cluster.master_addrs),
        "NYALA_CREDENTIALS": str(security.admin_dir),
    }
    runner = CliRunner(env=env)
    revoked = runner.invoke(main, ["cert", "revoke-join", "leaked"])
    assert revoked.exit_code == 0, revoked.stderr
    with pytest.raises(errors.NotAuthenticatedError, match="join credential 'leaked' was revoked"):
        enroll_with(tmp_path / "leaked")
    assert enroll_with(tmp_path / "fresh")
    # A user of the same name is another name: revoking the join credential leaves it alone.
    with nyala.connect(cluster.master_addrs, credentials=security.credentials("leaked")) as c:
        c.list_tables()
    listed = runner.invoke(main, ["user", "list", "--format", "json"])
    assert listed.exit_code == 0, listed.stderr
    rows = {(u["name"], u["kind"]): u["state"] for u in json.loads(listed.stdout)}
    assert rows[("leaked", "join")] == "REMOVED"
    assert ("leaked", "user") not in rows


def test_a_retried_add_user_gets_its_certificate_again(
    cluster: MiniCluster, security: ClusterSecurity
) -> None:
    """The same AddUser again (its first answer lost) is answered with a certificate for the
    same key; another key or other rights for an existing name are refused."""
    key = pki.new_key()
    dest = cluster.masters[0].uuid or ""
    request = master_pb2.AddUserRequestPB(
        dest_uuid=dest,
        name="retry",
        csr_pem=pki.make_identity_csr(key, Identity(Kind.USER, "retry")),
    )
    with BlockingServerProxy(cluster.masters[0].rpc_addr, security.admin_settings) as proxy:
        first = proxy.admin_call(proxy.master.AddUser, request)
        second = proxy.admin_call(proxy.master.AddUser, request)
        for pem in (first.cert_pem, second.cert_pem):
            assert security.ca.verify(pem) == Identity(Kind.USER, "retry")
        other = master_pb2.AddUserRequestPB(
            dest_uuid=dest,
            name="retry",
            csr_pem=pki.make_identity_csr(pki.new_key(), Identity(Kind.USER, "retry")),
        )
        with pytest.raises(errors.AlreadyPresentError, match="exists"):
            proxy.admin_call(proxy.master.AddUser, other)
        as_admin = master_pb2.AddUserRequestPB(
            dest_uuid=dest,
            name="retry",
            admin=True,
            csr_pem=pki.make_identity_csr(key, Identity(Kind.ADMIN, "retry")),
        )
        with pytest.raises(errors.AlreadyPresentError, match="exists"):
            proxy.admin_call(proxy.master.AddUser, as_admin)


def test_server_certificates_are_bound_to_their_uuid(
    cluster: MiniCluster, security: ClusterSecurity
) -> None:
    from cryptography import x509

    for server in [*cluster.masters, *cluster.tservers]:
        assert server.uuid is not None
        directory = Path(server.flags[server.flags.index("--security-dir") + 1])
        cert = x509.load_pem_x509_certificate((directory / files.SERVER_CERT).read_bytes())
        assert pki.identity_of(cert) == Identity(Kind.SERVER, server.uuid)
        # A channel that asks for this UUID gets through; one that asks for another does not.
        bound = BlockingServerProxy(server.rpc_addr, cluster.rpc_settings, server_uuid=server.uuid)
        with bound:
            _hello(bound, server.role)
        wrong = BlockingServerProxy(server.rpc_addr, cluster.rpc_settings, server_uuid="e" * 32)
        with wrong, pytest.raises(errors.NetworkError):
            _hello(wrong, server.role)


def _hello(proxy: BlockingServerProxy, role: str) -> None:
    """A call any server of ``role`` answers."""
    if role == "master":
        request = master_pb2.ConnectToMasterRequestPB()
        proxy.call(proxy.master.ConnectToMaster, request, timeout_ms=2_000)
    else:
        proxy.ping(timeout_ms=2_000)


def test_three_secure_masters_elect_and_serve(tmp_path: Path) -> None:
    """The masters' own Raft (the sys catalog) over mutual TLS, peers bound to their UUIDs."""
    mini = MiniCluster(
        1,
        num_masters=3,
        master_flags=fast_master_flags(),
        tserver_flags=FAST_TSERVER_FLAGS,
        secure=True,
    )
    with logs_on_failure(mini) as started:
        assert started.security is not None
        with nyala.connect(started.master_addrs, credentials=started.security.admin_dir) as c:
            t = c.create_table("m3", SCHEMA, replicas=1)
            assert t.insert({"id": [1, 2], "v": ["a", None]}).ok
            assert len(c.list_masters()) == 3
            c.add_user("fay", tmp_path / "fay")
            fay = RpcSettings(tls=files.load_client_tls(tmp_path / "fay"))
            for master in started.masters:
                with BlockingServerProxy(master.rpc_addr, fay) as proxy:
                    _hello(proxy, "master")
            c.remove_user("fay")
        # Follower masters refuse a removed user too, once they applied the removal (they
        # read the user records they applied every second).
        for master in started.masters:
            with BlockingServerProxy(master.rpc_addr, fay) as proxy:
                assert "revoked" in _refused_within(lambda p=proxy: _hello(p, "master"), 3.0)


# --- table privileges (authz tokens) ----------------------------------------------------------

#: Authz tokens live this long on the privileges cluster (REVOKE takes effect within it).
TOKEN_VALIDITY_MS = 3_000
#: And each token-signing key signs this long before the next takes over.
TSK_ROTATION_MS = 2_000


@pytest.fixture(scope="module")
def authz_cluster() -> Iterator[MiniCluster]:
    yield from _secure_cluster(
        1,
        "--authz-token-validity-ms",
        str(TOKEN_VALIDITY_MS),
        "--tsk-rotation-ms",
        str(TSK_ROTATION_MS),
    )


def test_privileges_decide_who_reads_and_writes(authz_cluster: MiniCluster) -> None:
    security = authz_cluster.security
    assert security is not None
    masters = authz_cluster.master_addrs
    alice, bob = security.credentials("alice"), security.credentials("bob")
    with nyala.connect(masters, credentials=alice) as owner:
        owned = owner.create_table("owned", SCHEMA, replicas=1)
        assert owned.insert({"id": [1, 2], "v": ["a", "b"]}).ok  # the owner has ALL
        assert _channel_calls(owner) > 0  # on the tablet server's channel, under TLS
        with nyala.connect(masters, credentials=bob) as other:
            with pytest.raises(errors.NotAuthorizedError, match="SELECT"):
                other.table("owned").scan().to_arrow()
            with pytest.raises(errors.NotAuthorizedError, match="INSERT"):
                other.table("owned").insert({"id": [3]})
            assert _channel_calls(other) > 0  # refused there, as over gRPC
            with pytest.raises(errors.NotAuthorizedError, match="lacks"):
                other.delete_table("owned")
            with pytest.raises(errors.NotAuthorizedError, match="owner"):
                other.grant("owned", "bob", "all")

            assert owner.grant("owned", "bob", "select,insert") == "SELECT,INSERT"
            time.sleep(TOKEN_VALIDITY_MS / 2 / 1000)  # bob's cached locations (and token) end
            assert other.table("owned").scan().to_arrow().num_rows == 2
            assert other.table("owned").insert({"id": [3]}).ok
            with pytest.raises(errors.NotAuthorizedError, match="UPDATE"):
                other.table("owned").upsert({"id": [1]})  # an upsert needs UPDATE too
            with pytest.raises(errors.NotAuthorizedError, match="DELETE"):
                other.table("owned").delete({"id": [1]})

            assert owner.revoke("owned", "bob", "select") == "INSERT"
            time.sleep(TOKEN_VALIDITY_MS / 1000)  # within one token lifetime
            with pytest.raises(errors.NotAuthorizedError, match="SELECT"):
                other.table("owned").scan().to_arrow()
            assert owner.table("owned").scan().to_arrow().num_rows == 3


def test_forged_foreign_or_wrong_table_tokens_are_refused(
    authz_cluster: MiniCluster, tmp_path: Path
) -> None:
    security = authz_cluster.security
    assert security is not None
    masters = authz_cluster.master_addrs
    with nyala.connect(masters, credentials=security.admin_dir) as admin:
        admin.create_table("tokens_a", SCHEMA, replicas=1)
        admin.create_table("tokens_b", SCHEMA, replicas=1)
        admin.grant("tokens_a", "dave", "all")
        tablet_b = admin.table("tokens_b").tablets()[0].tablet_id
    dave = security.credentials("dave")
    with nyala.connect(masters, credentials=dave) as client:
        token_a = client._cache.locations(client._cache.table("tokens_a")).authz_token
    assert token_a
    payload = _token_payload(token_a)
    table_a, kid = payload["table_id"], payload["kid"]
    expires_ms = int(time.time() * 1000) + 60_000
    grant_all = AuthzToken("dave", table_a, Privilege.ALL, expires_ms)
    # Signed by a key of the right number that is not this cluster's (another cluster's, or
    # an attacker's); by a key this cluster no longer keeps (0 was never made: numbers start
    # at 1); by a key far newer than any published (retriable: a server may not have heard
    # of a new key yet).
    forged = sign_token(new_signing_key(kid, 0, expires_ms), grant_all)
    dropped = sign_token(new_signing_key(0, 0, expires_ms), grant_all)
    future = sign_token(new_signing_key(kid + 1000, 0, expires_ms), grant_all)
    ts = authz_cluster.tservers[0]
    settings = RpcSettings(tls=files.load_client_tls(dave))
    with BlockingServerProxy(ts.rpc_addr, settings) as proxy:
        cases: list[tuple[bytes, type[Exception], str]] = [
            (b"", errors.NotAuthorizedError, "no authorization token"),
            (forged, errors.NotAuthorizedError, "not signed"),
            (dropped, errors.NotAuthorizedError, "no longer keeps"),
            (future, errors.ServiceUnavailableError, "not yet heard"),
            (token_a, errors.NotAuthorizedError, "another table"),
            (token_a[:-3], errors.NotAuthorizedError, "malformed|not signed"),
        ]
        for token, error, reason in cases:
            scan = tserver_pb2.ScanRequestPB(
                dest_uuid=ts.uuid or "",
                new_scan=tserver_pb2.NewScanRequestPB(tablet_id=tablet_b, authz_token=token),
            )
            with pytest.raises(error, match=reason):
                _scan(proxy, scan)


def _token_payload(token: bytes) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(base64.urlsafe_b64decode(token.split(b".")[0] + b"=="))
    return payload


def _scan(proxy: BlockingServerProxy, request: tserver_pb2.ScanRequestPB) -> None:
    for answer in proxy.tablet.Scan(request, timeout=5):
        raise_for_response(answer)


def test_a_long_running_writer_outlives_its_tokens_and_signing_keys(
    authz_cluster: MiniCluster,
) -> None:
    """Tokens expire every TOKEN_VALIDITY_MS and the signing key changes every
    TSK_ROTATION_MS; the client renews its token with the locations and the tablet server
    keeps each key until its tokens expired, so a writer that runs through several of both
    never sees a refusal."""
    security = authz_cluster.security
    assert security is not None
    erin = security.credentials("erin")
    with nyala.connect(authz_cluster.master_addrs, credentials=erin) as client:
        table = client.create_table("long_writer", SCHEMA, replicas=1)
        deadline = time.monotonic() + 4 * TOKEN_VALIDITY_MS / 1000
        written = 0
        kids = set()
        while time.monotonic() < deadline:
            assert table.upsert({"id": [written], "v": ["x"]}).ok
            kids.add(_token_payload(client._cache.locations(table._info).authz_token)["kid"])
            written += 1
            time.sleep(0.02)
        assert table.scan().to_arrow().num_rows == written
    assert len(kids) >= 4, f"signing keys seen: {sorted(kids)}"


def test_grant_and_revoke_on_the_command_line(authz_cluster: MiniCluster) -> None:
    security = authz_cluster.security
    assert security is not None
    env = {
        "NYALA_MASTERS": ",".join(authz_cluster.master_addrs),
        "NYALA_CREDENTIALS": str(security.admin_dir),
    }
    runner = CliRunner(env=env)
    created = runner.invoke(
        main, ["table", "create", "cli_t", "--schema", "id:int64", "--key", "id", "--replicas", "1"]
    )
    assert created.exit_code == 0, created.stderr
    granted = runner.invoke(
        main, ["table", "grant", "cli_t", "frank", "select,update", "--format", "json"]
    )
    assert json.loads(granted.stdout)["privileges"] == "SELECT,UPDATE"
    revoked = runner.invoke(
        main, ["table", "revoke", "cli_t", "frank", "update", "--format", "json"]
    )
    assert json.loads(revoked.stdout)["privileges"] == "SELECT"
    bad = runner.invoke(main, ["table", "grant", "cli_t", "frank", "read"])
    assert bad.exit_code == 1
    assert "unknown privilege 'read'" in bad.stderr


# --- users (nyala user add/remove/list) -------------------------------------------------------


def _channel_calls(client: nyala.Client) -> int:
    """Write calls ``client`` made on the tablet servers' channels."""
    pipes = client._writer._pipes.values()
    return sum(p.channel.calls for p in pipes if p.channel is not None)


def _refused_within(action: Callable[[], object], seconds: float) -> str:
    """Calls ``action`` until it is refused as unauthenticated (the reason is returned), at
    most ``seconds``. (A raw streaming call raises gRPC's error, not nyala's.)"""
    deadline = time.monotonic() + seconds
    while True:
        try:
            action()
        except errors.NotAuthenticatedError as exc:
            return str(exc)
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.UNAUTHENTICATED:
                return str(exc.details())
            raise
        except errors.NyalaError as exc:  # e.g. its token expired meanwhile: not a revocation
            raise AssertionError(f"served until {exc!r} after the user was removed") from None
        assert time.monotonic() < deadline, "still served after the user was removed"
        time.sleep(0.05)


def test_a_removed_user_is_refused_everywhere_and_can_be_added_again(
    authz_cluster: MiniCluster, tmp_path: Path
) -> None:
    """``nyala user add`` issues working credentials; ``remove`` revokes them on the master at
    once and on the tablet servers within a heartbeat, also on connections already open, and
    also certificates made offline by ``nyala cert issue``; a user added again gets new
    credentials that work while the old ones stay refused."""
    security = authz_cluster.security
    assert security is not None
    masters = authz_cluster.master_addrs
    env = {"NYALA_MASTERS": ",".join(masters), "NYALA_CREDENTIALS": str(security.admin_dir)}
    runner = CliRunner(env=env)
    gina_dir = tmp_path / "gina"
    added = runner.invoke(main, ["user", "add", "gina", "--out", str(gina_dir), "--days", "2"])
    assert added.exit_code == 0, added.stderr
    assert (gina_dir / files.CLIENT_KEY).stat().st_mode & 0o077 == 0
    clobber = runner.invoke(main, ["user", "add", "zed", "--out", str(security.admin_dir)])
    assert clobber.exit_code == 1
    assert "already holds credentials" in clobber.stderr
    again = runner.invoke(main, ["user", "add", "gina", "--out", str(tmp_path / "gina2")])
    assert again.exit_code == 1
    assert "exists" in again.stderr
    offline = security.credentials("hank")  # `nyala cert issue` on a master's host

    gina = nyala.connect(masters, credentials=gina_dir)
    hank = nyala.connect(masters, credentials=offline)
    try:
        table = gina.create_table("ginas", SCHEMA, replicas=1)
        assert table.insert({"id": [1], "v": ["a"]}).ok
        with nyala.connect(masters, credentials=security.admin_dir) as admin:
            admin.grant("ginas", "hank", "select")
        assert hank.table("ginas").scan().to_arrow().num_rows == 1

        ts = authz_cluster.tservers[0]
        tablet_id = table.tablets()[0].tablet_id
        token = gina._cache.locations(table._info).authz_token
        proxy = BlockingServerProxy(ts.rpc_addr, RpcSettings(tls=files.load_client_tls(gina_dir)))
        scan = tserver_pb2.ScanRequestPB(
            dest_uuid=ts.uuid or "",
            new_scan=tserver_pb2.NewScanRequestPB(tablet_id=tablet_id, authz_token=token),
        )
        # A write on gina's channel connection to the tablet server, bypassing the master.
        pipe = gina._writer.pipe(ts.rpc_addr)
        ops = encode(make_op_batch({"id": [2], "v": ["b"]}, "upsert", table.schema)).to_pybytes()
        seq_nos = iter(range(1_000_000, 2_000_000))

        def channel_write() -> object:
            seq_no = next(seq_nos)
            request = tserver_pb2.WriteRequestPB(
                dest_uuid=ts.uuid or "",
                tablet_id=tablet_id,
                schema_version=table.schema.version,
                authz_token=token,
                request_id=common_pb2.RequestIdPB(
                    client_id=gina.client_id, seq_no=seq_no, first_incomplete_seq_no=seq_no
                ),
            )
            return pipe.write(request, ops, 10_000)

        channel_write()
        assert pipe.channel is not None
        calls_before = pipe.channel.calls
        with proxy:
            _scan(proxy, scan)  # gina's open connection to the tablet server works
            for name in ("gina", "hank"):
                removed = runner.invoke(main, ["user", "remove", name])
                assert removed.exit_code == 0, removed.stderr
            # The master refuses at once; the tablet server within a heartbeat (200 ms), on
            # the connection gina opened before.
            with pytest.raises(errors.NotAuthenticatedError, match="revoked"):
                gina.list_tables()
            with pytest.raises(errors.NotAuthenticatedError, match="revoked"):
                hank.list_tables()
            assert "revoked" in _refused_within(lambda: _scan(proxy, scan), 1.0)
            # Her channel connection too: each write there is checked as a gRPC call is.
            assert "revoked" in _refused_within(channel_write, 1.0)
            assert pipe.channel.calls > calls_before
    finally:
        gina.close()
        hank.close()

    listed = runner.invoke(main, ["user", "list", "--format", "json"])
    states = {u["name"]: u["state"] for u in json.loads(listed.stdout)}
    assert states == {"gina": "REMOVED", "hank": "REMOVED"}

    new_dir = tmp_path / "gina-new"
    readded = runner.invoke(main, ["user", "add", "gina", "--out", str(new_dir)])
    assert readded.exit_code == 0, readded.stderr
    with nyala.connect(masters, credentials=new_dir) as client:
        # Her table and privileges belong to her name, as in Kudu (row 2 came on her
        # channel connection before the removal).
        assert client.table("ginas").scan().to_arrow().num_rows == 2
    with (
        pytest.raises(errors.NotAuthenticatedError, match="revoked"),
        nyala.connect(masters, credentials=gina_dir) as old,
    ):
        old.list_tables()
    with nyala.connect(masters, credentials=security.admin_dir) as admin:
        states = {u["name"]: u["removed"] for u in admin.list_users()}
    assert states == {"gina": False, "hank": True}


def test_only_admins_manage_users(authz_cluster: MiniCluster, tmp_path: Path) -> None:
    security = authz_cluster.security
    assert security is not None
    with nyala.connect(authz_cluster.master_addrs, credentials=security.credentials("ivy")) as c:
        with pytest.raises(errors.NotAuthorizedError, match="ADMIN"):
            c.add_user("mallory", tmp_path / "m", admin=True)
        with pytest.raises(errors.NotAuthorizedError, match="ADMIN"):
            c.remove_user("ivy")
        with pytest.raises(errors.NotAuthorizedError, match="ADMIN"):
            c.list_users()
    assert not (tmp_path / "m").exists()


# --- the HTTP pages -----------------------------------------------------------------------


def _https_get(
    addr: str, path: str, security: ClusterSecurity, credentials: Path | None
) -> tuple[int, bytes]:
    """GET over TLS, checking the server against the cluster CA, with a client certificate
    when ``credentials`` is given."""
    context = ssl.create_default_context(cadata=security.ca.cert_pem.decode())
    if credentials is not None:
        context.load_cert_chain(credentials / files.CLIENT_CERT, credentials / files.CLIENT_KEY)
    try:
        with urllib.request.urlopen(f"https://{addr}{path}", context=context, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_http_pages_are_tls_and_need_a_certificate_except_healthz(
    cluster: MiniCluster, security: ClusterSecurity, tmp_path: Path
) -> None:
    user = security.credentials("olga")
    join = security.credentials("j1", kind=Kind.JOIN)
    for server in (cluster.masters[0], cluster.tservers[0]):
        addr = server.http_addr
        assert _https_get(addr, "/healthz", security, None)[0] == 200
        status, body = _https_get(addr, "/metrics", security, None)
        assert status == 401
        assert b"client certificate" in body
        status, body = _https_get(addr, "/metrics", security, user)
        assert status == 200
        assert b"# TYPE" in body
        assert _https_get(addr, "/", security, security.admin_dir)[0] == 200
        assert _https_get(addr, "/varz", security, join)[0] == 403
        # Plain HTTP gets no page.
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://{addr}/healthz", timeout=10).read()
        # Another cluster's certificate fails the handshake.
        other = ClusterSecurity(tmp_path / "other")
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            _https_get(addr, "/metrics", security, other.credentials("olga"))


def test_http_actions_need_an_admin(cluster: MiniCluster, security: ClusterSecurity) -> None:
    """POST (the web UI's actions, such as cancelling a tablet copy) needs the admin role."""
    context = ssl.create_default_context(cadata=security.ca.cert_pem.decode())
    user = security.credentials("pia")
    context.load_cert_chain(user / files.CLIENT_CERT, user / files.CLIENT_KEY)
    request = urllib.request.Request(
        f"https://{cluster.tservers[0].http_addr}/tablet-copies/cancel",
        data=b"id=no-such-job",
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=context, timeout=10)
    assert refused.value.code == 403
    admin = ssl.create_default_context(cadata=security.ca.cert_pem.decode())
    admin.load_cert_chain(
        security.admin_dir / files.CLIENT_CERT, security.admin_dir / files.CLIENT_KEY
    )
    with pytest.raises(urllib.error.HTTPError) as unknown:
        urllib.request.urlopen(request, context=admin, timeout=10)
    assert unknown.value.code == 404  # allowed, and there is no such copy job


# --- session credentials ---------------------------------------------------------------------


def test_session_credentials_work_expire_and_cannot_renew_themselves(
    authz_cluster: MiniCluster, tmp_path: Path
) -> None:
    security = authz_cluster.security
    assert security is not None
    masters = authz_cluster.master_addrs
    quinn = security.credentials("quinn")
    with nyala.connect(masters, credentials=quinn) as client:
        table = client.create_table("quinns", SCHEMA, replicas=1)
        assert table.insert({"id": [1], "v": ["a"]}).ok
        issued = client.issue_session_credentials(tmp_path / "s", validity_s=3600)
        short = client.issue_session_credentials(tmp_path / "short", validity_s=2)
        with pytest.raises(errors.InvalidArgumentError, match="7 days"):
            client.issue_session_credentials(tmp_path / "long", validity_s=8 * 24 * 3600)
        with pytest.raises(errors.AlreadyPresentError, match="already holds credentials"):
            client.issue_session_credentials(quinn)  # would overwrite quinn's own key
    now_ms = time.time() * 1000
    assert now_ms + 3_500_000 < issued["expires_unix_ms"] < now_ms + 3_700_000
    assert (tmp_path / "s" / files.CLIENT_KEY).stat().st_mode & 0o077 == 0

    # The session credentials are quinn's: her table, her privileges.
    with nyala.connect(masters, credentials=tmp_path / "s") as session:
        assert session.table("quinns").scan().to_arrow().num_rows == 1
        assert session.table("quinns").insert({"id": [2], "v": ["b"]}).ok
        with pytest.raises(errors.NotAuthorizedError, match="renewed"):
            session.issue_session_credentials(tmp_path / "again")
    # Never past the certificate they came from.
    brief = security.credentials("quinn", validity_s=400)  # starts 5 minutes ago: ~100 s left
    with nyala.connect(masters, credentials=brief) as client:
        capped = client.issue_session_credentials(tmp_path / "capped", validity_s=3600)
    assert capped["expires_unix_ms"] < time.time() * 1000 + 101_000
    # Expired: refused at the handshake.
    time.sleep(max(0.0, (short["expires_unix_ms"] - time.time() * 1000) / 1000) + 1.5)
    with pytest.raises(errors.NotAuthenticatedError):
        nyala.connect(masters, credentials=tmp_path / "short").list_tables()
    # Removing the user revokes them.
    with nyala.connect(masters, credentials=security.admin_dir) as admin:
        admin.remove_user("quinn")
    with (
        pytest.raises(errors.NotAuthenticatedError, match="revoked"),
        nyala.connect(masters, credentials=tmp_path / "s") as session,
    ):
        session.list_tables()


# --- the CA in the sys catalog ---------------------------------------------------------------


def _cluster_with_ca_key_file(
    tmp_path: Path, passphrase: bytes
) -> tuple[MiniCluster, ClusterSecurity]:
    """A secure cluster (one master, one tablet server, not started) whose masters keep the CA
    key encrypted under a key file (``--ca-key-passphrase-file``), the first master's copy
    too."""
    passphrase_file = tmp_path / "ca.pass"
    passphrase_file.write_bytes(passphrase + b"\n")
    passphrase_file.chmod(0o600)
    mini = MiniCluster(
        1,
        num_masters=1,
        base_dir=tmp_path / "cluster",
        master_flags=fast_master_flags("--ca-key-passphrase-file", str(passphrase_file)),
        tserver_flags=FAST_TSERVER_FLAGS,
        secure=True,
    )
    security = mini.security
    assert security is not None
    security.ca.save(security.directory / "master-0", passphrase)  # the master's copy
    return mini, security


def test_a_master_that_lost_its_ca_key_takes_it_back_from_the_sys_catalog(
    tmp_path: Path,
) -> None:
    """The leader stores the CA in the sys catalog, its key encrypted under the operator's key
    file; a master restarted without its ca.key serves with its certificate and, once it
    leads, takes the key back (0600, still encrypted) and signs again."""
    mini, security = _cluster_with_ca_key_file(tmp_path, b"correct horse battery")
    master_dir = security.directory / "master-0"
    with logs_on_failure(mini) as cluster:
        master = cluster.masters[0]
        wait_until(
            lambda: (
                "stored the cluster CA in the sys catalog (with its key encrypted)"
                in master.log_path.read_text()
            ),
            timeout_s=30,
            what="the CA stored in the sys catalog",
        )
        with nyala.connect(cluster.master_addrs, credentials=security.admin_dir) as admin:
            table = admin.create_table("ca_kept", SCHEMA, replicas=1)
            assert table.insert({"id": [1], "v": ["a"]}).ok
        master.stop()
        (master_dir / files.CA_KEY).unlink()
        master.restart()
        with nyala.connect(cluster.master_addrs, credentials=security.admin_dir) as admin:
            admin.add_user("sam", tmp_path / "sam")  # the master signs again
            assert admin.table("ca_kept").scan().to_arrow().num_rows == 1
        key_file = master_dir / files.CA_KEY
        assert key_file.stat().st_mode & 0o077 == 0
        with pytest.raises(errors.InvalidArgumentError, match="cannot read the CA key"):
            pki.ClusterCa.load(master_dir)  # encrypted at rest: not readable without the file
        restored = pki.ClusterCa.load(master_dir, b"correct horse battery")
        assert pki.fingerprint(restored.cert_pem) == pki.fingerprint(security.ca.cert_pem)
        with nyala.connect(cluster.master_addrs, credentials=tmp_path / "sam") as sam:
            assert sam.list_tables() is not None


def test_masters_added_later_enroll_with_a_join_credential_and_one_leads(
    tmp_path: Path,
) -> None:
    """A master added to a running cluster needs no copy of the CA: given a join credential it
    enrolls with the other masters, catches up, and once it leads takes the CA's key from the
    sys catalog (encrypted under the operator's key file) and signs."""
    mini, security = _cluster_with_ca_key_file(tmp_path, b"a passphrase for the CA key")
    with logs_on_failure(mini) as cluster:
        first = cluster.masters[0]
        wait_until(
            lambda: "stored the cluster CA in the sys catalog" in first.log_path.read_text(),
            timeout_s=30,
            what="the CA stored in the sys catalog",
        )
        with nyala.connect(cluster.master_addrs, credentials=security.admin_dir) as admin:
            table = admin.create_table("before_new_masters", SCHEMA, replicas=1)
            assert table.insert({"id": [1, 2], "v": ["a", "b"]}).ok
        env = {"NYALA_CREDENTIALS": str(security.admin_dir)}
        runner = CliRunner(env=env)
        for _ in range(2):
            new = cluster.add_master()
            assert new.uuid is not None
            directory = Path(new.flags[new.flags.index("--security-dir") + 1])
            assert not (directory / files.CA_KEY).exists()
            cert = (directory / files.SERVER_CERT).read_bytes()
            assert security.ca.verify(cert) == Identity(Kind.SERVER, new.uuid)
            # The signing master says which credential enrolled which server.
            signed = f"signed the certificate of server {new.uuid} for join:{directory.name}"
            assert signed in first.log_path.read_text()
            running = ",".join(m.rpc_addr for m in cluster.masters if m is not new)
            added = runner.invoke(main, ["master", "add", new.rpc_addr, "-m", running])
            assert added.exit_code == 0, added.output
        with nyala.connect(cluster.master_addrs, credentials=security.admin_dir) as admin:
            wait_until(
                lambda: [m["member_type"] for m in admin.list_masters()] == ["VOTER"] * 3,
                timeout_s=30,
                what="both new masters promoted to VOTER",
            )
        first.kill()
        leader = cluster.leader_master(timeout_s=30)
        assert leader is not first
        with nyala.connect(cluster.master_addrs, credentials=security.admin_dir) as admin:
            assert admin.table("before_new_masters").scan().to_arrow().num_rows == 2
            admin.add_user("uma", tmp_path / "uma")  # the new leader signs
        leader_dir = Path(leader.flags[leader.flags.index("--security-dir") + 1])
        assert (leader_dir / files.CA_KEY).stat().st_mode & 0o077 == 0
        with nyala.connect(cluster.master_addrs, credentials=tmp_path / "uma") as uma:
            assert [t["name"] for t in uma.list_tables()] == ["before_new_masters"]
