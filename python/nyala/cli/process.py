"""Process-level set-up shared by every long-running command.

``die_with_parent_if_asked``: a process started by ``nyala.testing.MiniCluster`` gets its
parent's pid in ``NYALA_PARENT_PID`` and asks the kernel to SIGKILL it when that parent dies
(Linux ``PR_SET_PDEATHSIG``), so a crashed test run never leaves servers behind. Done in the
child after exec rather than in a ``preexec_fn``, which is unsafe in a threaded parent.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PARENT_PID_ENV = "NYALA_PARENT_PID"
_PR_SET_PDEATHSIG = 1


def die_with_parent_if_asked() -> None:
    """Arms ``PR_SET_PDEATHSIG`` if ``NYALA_PARENT_PID`` is set (see the module docstring)."""
    parent_text = os.environ.get(PARENT_PID_ENV)
    if not parent_text or not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    # The parent may have died before prctl took effect: then we were re-parented already.
    if parent_text.isdigit() and os.getppid() != int(parent_text):
        os._exit(1)
