"""The fs root: one owner at a time, identity checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nyala.errors import IllegalStateError
from nyala.server.fs_manager import LOCK_FILE, FsManager


def test_a_second_owner_is_refused_with_the_holders_pid(tmp_path: Path) -> None:
    first = FsManager(tmp_path / "root")
    info = first.open()
    with pytest.raises(IllegalStateError, match=f"pid {os.getpid()}"):
        FsManager(tmp_path / "root").open()
    with pytest.raises(IllegalStateError, match="in use by another process"):
        FsManager(tmp_path / "root").lock()
    first.unlock()
    again = FsManager(tmp_path / "root")
    assert again.open().uuid == info.uuid
    again.unlock()


def test_the_lock_dies_with_its_process(tmp_path: Path) -> None:
    root = tmp_path / "root"
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from nyala.server.fs_manager import FsManager\n"
        f"FsManager(Path({str(root)!r})).open()\n"
        "os._exit(0)\n"  # no cleanup: the kernel must release the flock
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (root / LOCK_FILE).exists()
    owner = FsManager(root)
    owner.open()
    owner.unlock()
