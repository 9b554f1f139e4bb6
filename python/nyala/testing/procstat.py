"""What processes have used so far, from Linux ``/proc/PID/stat``: for benchmarks that report
what an operation costs (CPU, first-touched memory) rather than only how fast it went, which
a busy machine's scheduling changes."""

from __future__ import annotations

import os
from collections.abc import Iterable

# Fields of /proc/PID/stat after the command name, counted from 0 (state is 0).
_MINFLT, _UTIME, _STIME = 7, 11, 12


def _fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds the processes ``pids`` used so far, together."""
    ticks = 0
    for pid in pids:
        fields = _fields(pid)
        ticks += int(fields[_UTIME]) + int(fields[_STIME])
    return ticks / os.sysconf("SC_CLK_TCK")


def status_field(pid: int, name: str) -> int:
    """An integer field of ``/proc/PID/status`` (``Threads``; sizes such as ``VmRSS`` in KiB)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise KeyError(name)


def rss_kib(pid: int) -> int:
    """The resident memory of process ``pid`` in KiB."""
    return status_field(pid, "VmRSS")


def faulted_bytes(pids: Iterable[int]) -> int:
    """Memory the processes ``pids`` touched for the first time so far (minor faults × page
    size), which the kernel zero-fills: docs/performance.md, "Copies and first-touched
    memory"."""
    faults = sum(int(_fields(pid)[_MINFLT]) for pid in pids)
    return faults * os.sysconf("SC_PAGE_SIZE")
