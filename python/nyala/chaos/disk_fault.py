"""Disk faults in server processes: an ``LD_PRELOAD`` shim that makes ``fsync``/``fdatasync``
fail with a chosen errno while a per-process trigger file exists.

Why a shim rather than the WAL's in-process failpoint
(``nyala.testing.wal.Log.inject_sync_failures``): a chaos run arms and disarms the fault on a
live server process from outside, at any moment, and the fault then hits every sync of that
process (WAL appender, consensus metadata, superblocks), as a dying disk would. Only the syncs
fail; the writes before them succeed, so the data may or may not be on disk and the server must
not acknowledge it.

The shim is compiled once per run with the system C compiler into the run's directory. It
reads ``$NYALA_CHAOS_FAULT_DIR/<pid>`` (an errno as text) on every sync; no file, no fault.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from nyala.errors import NotSupportedError

FAULT_DIR_ENV = "NYALA_CHAOS_FAULT_DIR"

_SHIM_SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static int injected_errno(void) {
    const char *dir = getenv("NYALA_CHAOS_FAULT_DIR");
    if (dir == NULL) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/%d", dir, (int)getpid());
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char text[16] = {0};
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    int value = n > 0 ? atoi(text) : 0;
    return value > 0 ? value : EIO;
}

int fdatasync(int fd) {
    static int (*real)(int);
    int e = injected_errno();
    if (e) { errno = e; return -1; }
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}

int fsync(int fd) {
    static int (*real)(int);
    int e = injected_errno();
    if (e) { errno = e; return -1; }
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}
"""


class DiskFaults:
    """The shim library and the trigger directory of one run."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.fault_dir = directory / "disk-faults"
        self.library = directory / "libnyala_disk_fault.so"

    def build(self) -> None:
        """Compiles the shim; ``NotSupportedError`` when there is no C compiler."""
        compiler = shutil.which("cc") or shutil.which("gcc")
        if compiler is None:
            raise NotSupportedError("disk faults need a C compiler (cc) for the LD_PRELOAD shim")
        self.fault_dir.mkdir(parents=True, exist_ok=True)
        source = self.directory / "disk_fault_shim.c"
        source.write_text(_SHIM_SOURCE)
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", "-o", str(self.library), str(source), "-ldl"],
            check=True,
            capture_output=True,
        )

    @contextlib.contextmanager
    def environment(self) -> Iterator[None]:
        """Child processes started inside get the shim (harmless without a trigger file)."""
        saved = {k: os.environ.get(k) for k in ("LD_PRELOAD", FAULT_DIR_ENV)}
        os.environ["LD_PRELOAD"] = str(self.library)
        os.environ[FAULT_DIR_ENV] = str(self.fault_dir)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def arm(self, pid: int, error: int = errno.EIO) -> None:
        """Every sync of process ``pid`` fails with ``error`` from now on."""
        path = self.fault_dir / str(pid)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(str(error))
        tmp.rename(path)

    def disarm(self, pid: int) -> None:
        """Syncs of ``pid`` succeed again."""
        with contextlib.suppress(FileNotFoundError):
            (self.fault_dir / str(pid)).unlink()
