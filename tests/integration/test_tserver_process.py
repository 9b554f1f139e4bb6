"""Three real ``nyala tserver run`` processes through MiniCluster: identity, liveness,
signals, restarts and refusals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from nyala import errors
from nyala._proto import tserver_admin_pb2
from nyala.common import metafile
from nyala.testing import MiniCluster


def _http_get(addr: str, path: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(f"http://{addr}{path}", timeout=5) as response:
        body = response.read().decode()
        return response.status, response.headers["Content-Type"], body


def test_all_servers_are_ready_with_distinct_uuids_and_answer_ping(cluster: MiniCluster) -> None:
    uuids = [ts.uuid for ts in cluster.tservers]
    assert len(set(uuids)) == 3
    for ts in cluster.tservers:
        assert ts.uuid is not None
        assert len(ts.uuid) == 32
        response = ts.ping()
        assert response.server_uuid == ts.uuid
        assert response.uptime_s > 0
        # The UUID the server answers with is the one in its instance file.
        assert ts.uuid in (ts.fs_root / "instance").read_bytes().decode(errors="replace")
        for sub in ("wals", "tablet-meta", "consensus-meta", "data"):
            assert (ts.fs_root / sub).is_dir()


def test_a_request_for_another_server_is_refused_with_wrong_server_uuid(
    cluster: MiniCluster,
) -> None:
    first, second = cluster.tserver(0), cluster.tserver(1)
    assert second.uuid is not None
    with first.proxy() as proxy:
        with pytest.raises(errors.WrongServerUuidError, match=second.uuid):
            proxy.ping(second.uuid)
        request = tserver_admin_pb2.ListTabletsRequestPB(dest_uuid=second.uuid)
        with pytest.raises(errors.WrongServerUuidError):
            proxy.admin_call(proxy.admin.ListTablets, request)
        ok = proxy.admin_call(
            proxy.admin.ListTablets, tserver_admin_pb2.ListTabletsRequestPB(dest_uuid=first.uuid)
        )
        assert list(ok.status_and_schema) == []


def test_sigterm_shuts_down_cleanly(cluster: MiniCluster) -> None:
    ts = cluster.tserver(2)
    assert ts.stop() == 0
    log = ts.log_path.read_text()
    assert "received SIGTERM" in log
    assert f"tserver {ts.uuid} stopped" in log
    assert "Traceback" not in log
    with pytest.raises(errors.NetworkError):
        ts.ping(timeout_ms=1_000)
    # The others are unaffected.
    assert cluster.tserver(0).ping().server_uuid == cluster.tserver(0).uuid


def test_sigint_also_shuts_down_cleanly(cluster: MiniCluster) -> None:
    ts = cluster.tserver(1)
    ts.signal(signal.SIGINT)
    assert ts.wait_exit() == 0


def test_sigkill_and_restart_keeps_the_uuid(cluster: MiniCluster) -> None:
    ts = cluster.tserver(0)
    before = ts.uuid
    ts.kill()
    assert ts.returncode == -signal.SIGKILL
    assert ts.restart() == before
    assert ts.ping().server_uuid == before


def test_wipe_gives_a_new_uuid(cluster: MiniCluster) -> None:
    ts = cluster.tserver(1)
    before = ts.uuid
    ts.kill()
    ts.wipe()
    assert not ts.fs_root.exists()
    ts.start()
    after = ts.wait_ready()
    assert after != before
    assert ts.ping().server_uuid == after


def test_a_paused_server_times_out_and_recovers_on_resume(cluster: MiniCluster) -> None:
    ts = cluster.tserver(2)
    ts.pause()
    try:
        with pytest.raises(errors.TimedOutError):
            ts.ping(timeout_ms=300)
    finally:
        ts.resume()
    assert ts.ping().server_uuid == ts.uuid


def test_a_corrupted_instance_file_refuses_to_start_with_one_clear_line(
    cluster: MiniCluster,
) -> None:
    ts = cluster.tserver(0)
    assert ts.stop() == 0
    instance = ts.fs_root / "instance"
    image = bytearray(instance.read_bytes())
    image[-3] ^= 0xFF  # inside the payload: the payload checksum no longer matches
    instance.write_bytes(bytes(image))
    log_size = ts.log_path.stat().st_size
    ts.start()
    assert ts.wait_exit() == 1
    output = ts.log_path.read_bytes()[log_size:].decode().strip().splitlines()
    error_lines = [line for line in output if line.startswith("nyala: error:")]
    assert len(error_lines) == 1, output
    assert str(instance) in error_lines[0]
    assert "CorruptionError" in error_lines[0]
    assert "checksum" in error_lines[0]
    assert "Traceback" not in "\n".join(output)
    assert instance.read_bytes() == bytes(image)  # nothing was "repaired" behind our back


def test_a_root_formatted_for_another_uuid_is_refused(cluster: MiniCluster) -> None:
    ts = cluster.tserver(1)
    assert ts.stop() == 0
    ts.flags.extend(["--uuid", "0" * 32])
    ts.start()
    assert ts.wait_exit() == 1
    last = ts.log_tail(1)
    assert "IllegalStateError" in last
    assert f"formatted for server {ts.uuid}" in last


def test_a_newer_instance_format_is_refused(cluster: MiniCluster) -> None:
    ts = cluster.tserver(2)
    assert ts.stop() == 0
    instance = ts.fs_root / "instance"
    payload = f'{{"format_version": 99, "uuid": "{ts.uuid}"}}'.encode()
    metafile.write_atomic(instance, metafile.MetaKind.INSTANCE, payload)
    ts.start()
    assert ts.wait_exit() == 1
    last = ts.log_tail(1)
    assert "NotSupportedError" in last
    assert "newer" in last


def test_healthz_metrics_and_tablets_pages(cluster: MiniCluster) -> None:
    ts = cluster.tserver(0)
    status, _, body = _http_get(ts.http_addr, "/healthz")
    assert (status, body) == (200, "ok\n")
    ts.ping()
    status, content_type, body = _http_get(ts.http_addr, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    assert "# TYPE nyala_rpc_requests_total counter" in body
    assert 'nyala_rpc_requests_total{method="Ping",code="OK"}' in body
    assert "nyala_server_uptime_seconds " in body
    # Kudu's filter: only the families asked for.
    query = "/metrics?metrics=nyala_server_uptime_seconds,nyala_rpc_requests_total"
    status, _, body = _http_get(ts.http_addr, query)
    assert status == 200
    families = {line.split()[2] for line in body.splitlines() if line.startswith("# TYPE")}
    assert families == {"nyala_server_uptime_seconds", "nyala_rpc_requests_total"}
    status, content_type, body = _http_get(ts.http_addr, "/tablets")
    assert status == 200
    assert content_type == "application/json"
    assert f'"server_uuid": "{ts.uuid}"' in body


def test_no_process_outlives_a_killed_test_runner(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from nyala.testing import MiniCluster
        cluster = MiniCluster(2, base_dir=Path({str(tmp_path)!r}))
        cluster.start()
        print(" ".join(str(ts.pid) for ts in cluster.tservers), flush=True)
        time.sleep(60)
        """
    )
    runner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert runner.stdout is not None
        pids = [int(p) for p in runner.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        runner.kill()
        runner.wait()
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in pids if _alive(pid)]
        time.sleep(0.05)
    assert alive == []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_cluster_shutdown_leaves_no_process() -> None:
    with MiniCluster(2) as mini:
        pids = [ts.pid for ts in mini.tservers]
        base_dir = mini.base_dir
    assert all(pid is not None and not _alive(pid) for pid in pids)
    assert not base_dir.exists()


def test_a_root_with_data_but_no_instance_file_is_refused(cluster: MiniCluster) -> None:
    ts = cluster.tserver(0)
    assert ts.stop() == 0
    cmeta = ts.fs_root / "consensus-meta" / ("c" * 32)
    cmeta.write_bytes(b"a replica's consensus metadata")
    (ts.fs_root / "instance").unlink()
    ts.start()
    assert ts.wait_exit() == 1
    last = ts.log_tail(1)
    assert "IllegalStateError" in last
    assert str(ts.fs_root / "instance") in last
    assert "consensus-meta" in last
    assert not (ts.fs_root / "instance").exists()  # no new identity was minted
    assert cmeta.exists()
