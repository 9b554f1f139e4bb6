"""Jepsen-style fault injection for nyala: histories, checkers, nemeses, workloads, a runner.

``history`` records what clients saw (invoke / ok / fail / info events); ``linearizability``
and ``set_checker`` judge a history; ``proxy`` and ``nemesis`` break a ``MiniCluster`` on a
seeded schedule; ``workloads`` drive it; ``runner`` ties them together and prints the summary
line. This package only reads the cluster through its public wire protocol and process
handles: it must never reach into a server's memory.
"""

from __future__ import annotations
