"""Process-level set-up shared by every long-running command.

``die_with_parent_if_asked``: a process started by ``nyala.testing.MiniCluster`` (or
``nyala.LocalCluster``) gets its parent's pid in ``NYALA_PARENT_PID`` and exits as soon as that
parent is gone, so a crashed test run never leaves servers behind.

A daemon thread polls ``getppid()`` rather than arming Linux's ``PR_SET_PDEATHSIG``: the kernel
fires that signal when the *thread* that forked the child exits, so a server restarted from a
short-lived helper thread (a chaos nemesis, a test's background restart) was SIGKILLed as soon
as that thread returned. The parent *process* is what matters, and ``getppid`` tracks exactly
that: it changes (to init or a subreaper) only when the parent process dies.
"""

from __future__ import annotations

import os
import threading
import time

PARENT_PID_ENV = "NYALA_PARENT_PID"
#: How often the watchdog looks at the parent; a server outlives its parent by at most this.
PARENT_POLL_INTERVAL_S = 0.5


def die_with_parent_if_asked() -> None:
    """Starts the parent watchdog if ``NYALA_PARENT_PID`` is set (see the module docstring)."""
    parent_text = os.environ.get(PARENT_PID_ENV)
    if not parent_text or not parent_text.isdigit():
        return
    parent = int(parent_text)
    if os.getppid() != parent:
        os._exit(1)  # the parent died before we got here: we were re-parented already

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_INTERVAL_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()
