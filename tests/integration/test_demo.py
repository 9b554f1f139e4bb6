"""``make demo``'s job, small: every step's check passes (``demo OK``), and after the SIGKILL
the master's tablet list names only live leaders and lists the killed server UNRESPONSIVE."""

from __future__ import annotations

import os
import subprocess
import sys


def test_the_demo_passes_and_shows_only_live_leaders_after_the_kill() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "nyala.cli.demo", "--rows", "20000", "--batch-rows", "2000"],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ.copy(),
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "demo OK"
    killed = next(i for i, line in enumerate(lines) if line.startswith("SIGKILLed "))
    header = next(i for i in range(killed, len(lines)) if lines[i].startswith("TABLET ID"))
    leaders = {line.split()[-1] for line in lines[header + 1 : header + 5]}
    servers = [line.split() for line in lines[header + 5 : header + 9]]  # header + 3 tservers
    assert servers[0][0] == "UUID"
    by_uuid = {row[0]: row[2] for row in servers[1:]}
    dead = [uuid for uuid, state in by_uuid.items() if state == "UNRESPONSIVE"]
    assert len(dead) == 1, by_uuid
    assert dead[0] not in leaders
    assert leaders <= set(by_uuid)
