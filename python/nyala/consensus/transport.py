"""How replicas of one tablet reach each other: the ``Transport`` protocol the ``RaftRuntime``
drives, an in-memory network (benchmarks and tests of the runtime), and the gRPC client side
(``GrpcTransport``). Delivery is best effort: Raft tolerates loss, duplication is not produced.

A transport owns its connections and tasks; it never interprets a message beyond routing it
and never touches the log or the core. ``run`` is started by the runtime inside its task group
and ends by cancellation (STYLE.md 15).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Protocol

from nyala.consensus.messages import Message

Deliver = Callable[[Message], None]
"""The runtime's inbound callback: queues a message, never blocks."""


class Transport(Protocol):
    """One replica's connection to its peers."""

    async def run(self, deliver: Deliver) -> None:
        """Hands inbound messages to ``deliver`` until cancelled."""
        ...

    def send(self, message: Message) -> None:
        """Queues ``message`` for ``message.dest``; never blocks; may drop it."""
        ...


class InMemoryNetwork:
    """Replicas in one process and one event loop; messages keep their Python objects.

    Each destination gets one delivery callback per loop turn for everything queued to it, so
    a burst of sends costs one scheduling, not one per message. ``isolate`` drops everything
    to and from a replica (a crash or a partition, as the caller sees fit).
    """

    def __init__(self) -> None:
        self._endpoints: dict[str, Deliver] = {}
        self._queues: dict[str, deque[Message]] = {}
        self._flush_scheduled: set[str] = set()
        self._isolated: set[str] = set()
        self.messages_sent = 0
        self.messages_dropped = 0

    def transport(self, uuid: str) -> InMemoryTransport:
        """The transport of replica ``uuid``."""
        return InMemoryTransport(self, uuid)

    def isolate(self, uuid: str) -> None:
        """Drops every message to or from ``uuid`` until ``heal``."""
        self._isolated.add(uuid)

    def heal(self, uuid: str | None = None) -> None:
        """Ends the isolation of ``uuid`` (of everybody when None)."""
        if uuid is None:
            self._isolated.clear()
        else:
            self._isolated.discard(uuid)

    def _attach(self, uuid: str, deliver: Deliver) -> None:
        self._endpoints[uuid] = deliver
        self._queues.setdefault(uuid, deque())

    def _detach(self, uuid: str) -> None:
        self._endpoints.pop(uuid, None)
        queue = self._queues.get(uuid)
        if queue:
            self.messages_dropped += len(queue)
            queue.clear()

    def _post(self, message: Message) -> None:
        dest = message.dest
        if dest not in self._endpoints or {dest, message.src} & self._isolated:
            self.messages_dropped += 1
            return
        self.messages_sent += 1
        self._queues[dest].append(message)
        if dest not in self._flush_scheduled:
            self._flush_scheduled.add(dest)
            asyncio.get_running_loop().call_soon(self._flush, dest)

    def _flush(self, dest: str) -> None:
        self._flush_scheduled.discard(dest)
        deliver = self._endpoints.get(dest)
        queue = self._queues[dest]
        if deliver is None:
            self.messages_dropped += len(queue)
            queue.clear()
            return
        while queue:
            deliver(queue.popleft())


class InMemoryTransport:
    """One replica's end of an ``InMemoryNetwork``."""

    def __init__(self, network: InMemoryNetwork, uuid: str) -> None:
        self._network = network
        self.uuid = uuid

    async def run(self, deliver: Deliver) -> None:
        """Attaches to the network until cancelled; a detached replica receives nothing."""
        self._network._attach(self.uuid, deliver)
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            self._network._detach(self.uuid)

    def send(self, message: Message) -> None:
        """Queues ``message``; dropped if its destination is not attached or isolated."""
        assert message.src == self.uuid, (message.src, self.uuid)
        if self.uuid not in self._network._endpoints:
            self._network.messages_dropped += 1
            return
        self._network._post(message)
