"""``nyala cert ...`` on files (issue 36): create the CA, issue credentials, list, export."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from click.testing import CliRunner

from nyala.cli import main
from nyala.security import files, pki


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["cert", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_cert_commands(tmp_path: Path) -> None:
    ca_dir = tmp_path / "ca"
    code, out, _ = _run("init-ca", "--ca-dir", str(ca_dir), "--format", "json")
    assert code == 0
    fingerprint = json.loads(out)["fingerprint"]
    assert stat.S_IMODE((ca_dir / files.CA_KEY).stat().st_mode) == 0o600
    code, _, err = _run("init-ca", "--ca-dir", str(ca_dir))
    assert code == 1
    assert "already holds a cluster CA" in err

    code, out, _ = _run("export-ca", "--ca-dir", str(ca_dir), "--fingerprint")
    assert out.strip() == fingerprint
    code, out, _ = _run("export-ca", "--ca-dir", str(ca_dir))
    assert out.startswith("-----BEGIN CERTIFICATE-----")
    assert "PRIVATE KEY" not in out

    alice = tmp_path / "alice"
    assert _run("issue", "--ca-dir", str(ca_dir), "--user", "alice", "--out", str(alice))[0] == 0
    ops = tmp_path / "ops"
    assert (
        _run("issue", "--ca-dir", str(ca_dir), "--user", "ops", "--admin", "--out", str(ops))[0]
        == 0
    )
    ts = tmp_path / "ts1"
    assert _run("join-credential", "--ca-dir", str(ca_dir), "--out", str(ts))[0] == 0
    ca = pki.ClusterCa.load(ca_dir)
    assert str(ca.verify((alice / files.CLIENT_CERT).read_bytes())) == "user:alice"
    assert str(ca.verify((ops / files.CLIENT_CERT).read_bytes())) == "admin:ops"
    assert str(ca.verify((ts / files.JOIN_CERT).read_bytes())) == "join:ts1"

    code, out, _ = _run("list", "--dir", str(tmp_path), "--format", "json")
    names = sorted(row["identity"] for row in json.loads(out))
    assert names == ["(CA)", "(CA)", "(CA)", "(CA)", "admin:ops", "join:ts1", "user:alice"]

    (ts / files.SERVER_CERT).write_bytes(b"x")
    (ts / files.SERVER_KEY).write_bytes(b"x")
    assert _run("rotate-server", "--security-dir", str(ts))[0] == 0
    assert not (ts / files.SERVER_CERT).exists()
