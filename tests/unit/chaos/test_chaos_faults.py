"""Fault helpers on real files and processes: the torn WAL tail, the fsync shim, the
register-read expansion and the nemesis-kind parser."""

from __future__ import annotations

import errno
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest

from nyala.chaos.disk_fault import FAULT_DIR_ENV, DiskFaults
from nyala.chaos.history import EventType, Operation
from nyala.chaos.nemesis import ALL_KINDS, tear_wal_tail
from nyala.chaos.runner import expand_register_reads
from nyala.cli.chaos import parse_kinds
from nyala.consensus.types import EntryKind
from nyala.testing.wal import Entry, Log, LogOptions

ENTRIES = 30
SYNC_ONCE = "import os; fd = os.open('x', os.O_WRONLY | os.O_CREAT); os.fsync(fd); print('ok')"


def _crash_after_appending(directory: Path) -> None:
    """A child appends durable entries and dies without closing the log (no footer)."""
    script = textwrap.dedent(
        f"""
        import os
        from nyala.consensus.types import EntryKind
        from nyala.testing.wal import Entry, Log, LogOptions
        log = Log({str(directory)!r}, "tablet-1", LogOptions(segment_size_bytes=1 << 20))
        for i in range(1, {ENTRIES} + 1):
            log.append_durable([Entry(1, i, EntryKind.WRITE, b"row-%d" % i * 7)])
        os._exit(0)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_torn_tail_is_the_end_of_the_log_and_loses_nothing_synced(
    tmp_path: Path, seed: int
) -> None:
    _crash_after_appending(tmp_path)
    newest = sorted(tmp_path.glob("wal-0*"))[-1]
    before = newest.read_bytes()
    assert tear_wal_tail(tmp_path, random.Random(seed))
    assert newest.read_bytes() != before
    with Log(tmp_path, "tablet-1", LogOptions(segment_size_bytes=1 << 20)) as log:
        entries = list(log.entries())
    assert [e.index for e in entries] == list(range(1, ENTRIES + 1))
    assert entries[-1] == Entry(1, ENTRIES, EntryKind.WRITE, b"row-%d" % ENTRIES * 7)


def test_tearing_after_a_clean_close_loses_nothing(tmp_path: Path) -> None:
    with Log(tmp_path, "tablet-1", LogOptions(segment_size_bytes=1 << 20)) as log:
        log.append_durable([Entry(1, 1, EntryKind.WRITE, b"x")])
    # The newest file is a closed segment (left alone) or a prepared empty one (torn).
    tear_wal_tail(tmp_path, random.Random(0))
    with Log(tmp_path, "tablet-1", LogOptions(segment_size_bytes=1 << 20)) as log:
        assert [e.index for e in log.entries()] == [1]


def test_fsync_shim_fails_syncs_only_while_armed(tmp_path: Path) -> None:
    faults = DiskFaults(tmp_path)
    faults.build()
    script = textwrap.dedent(
        """
        import os, sys
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
        os.write(fd, b"data")
        print(os.getpid(), flush=True)
        sys.stdin.readline()
        for sync in (os.fsync, os.fdatasync):
            try:
                sync(fd)
                print("ok", flush=True)
            except OSError as exc:
                print(exc.errno, flush=True)
        """
    )
    with faults.environment():
        child = subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "f")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
    assert child.stdin is not None
    assert child.stdout is not None
    pid = int(child.stdout.readline())
    faults.arm(pid, errno.ENOSPC)
    child.stdin.write("\n")
    child.stdin.flush()
    assert [child.stdout.readline().strip() for _ in range(2)] == [str(errno.ENOSPC)] * 2
    child.wait(timeout=10)
    faults.disarm(pid)
    assert FAULT_DIR_ENV not in os.environ


def test_fsync_shim_passes_through_when_disarmed(tmp_path: Path) -> None:
    faults = DiskFaults(tmp_path)
    faults.build()
    with faults.environment():
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                SYNC_ONCE,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
    assert out.stdout.strip() == "ok"


def test_read_all_becomes_one_read_per_key() -> None:
    read_all = Operation(3, "read-all", None, None, {0: 5, 1: None}, EventType.OK, 10, 20)
    write = Operation(1, "write", 0, 5, None, EventType.OK, 1, 2)
    ops = expand_register_reads([write, read_all], 2)
    assert ops[0] is write
    assert [(o.f, o.key, o.output, o.invoke_ns, o.complete_ns) for o in ops[1:]] == [
        ("read", 0, 5, 10, 20),
        ("read", 1, None, 10, 20),
    ]


def test_parse_kinds() -> None:
    assert parse_kinds("all", ALL_KINDS) == ALL_KINDS
    assert parse_kinds("none", ALL_KINDS) == ()
    assert parse_kinds("pause, disk", ALL_KINDS) == ("pause", "disk")
    with pytest.raises(click.BadParameter):
        parse_kinds("pause,flood", ALL_KINDS)
