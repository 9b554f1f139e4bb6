"""The tablet servers a master has heard from, and how recently (liveness).

Every master keeps this, followers included, because every tserver heartbeats to every master
(seed 002, "Heartbeat to all masters"): a newly elected leader already knows every live tserver
and places tablets on all of them at once (KUDU-1358). Nothing here is persisted.

A server's state, as listings show it: LIVE while heard within ``OVERDUE_HEARTBEATS`` of its
own heartbeat interval, UNRESPONSIVE once a heartbeat is overdue (a SIGKILLed server shows so
within 1.5 s by default), DEAD after ``tserver_unresponsive_timeout_ms``. Placement and
re-replication go by ``is_live`` (not DEAD) only, so a server that merely missed a heartbeat or
two under load keeps its replicas.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from nyala._proto import master_pb2
from nyala.rpc import join_host_port

#: A server is UNRESPONSIVE once this many of its heartbeat intervals passed without one (a
#: heartbeat goes out an interval after the previous one finished: 1.5 leaves room for it).
OVERDUE_HEARTBEATS = 1.5
#: The heartbeat interval assumed of a server that does not say (the tserver default).
HEARTBEAT_INTERVAL_MS_DEFAULT = 1_000

LIVE, UNRESPONSIVE, DEAD = "LIVE", "UNRESPONSIVE", "DEAD"


@dataclass
class TSDescriptor:
    """One tablet server as this master knows it."""

    uuid: str
    rpc_addr: str
    http_addr: str
    instance_seqno: int
    last_heartbeat_s: float  # time.monotonic() of the last heartbeat
    # (instance seqno, leader term) of the last full report processed as leader: a new
    # instance or a new term needs a new full report before incremental ones count.
    full_report_seen: tuple[int, int] | None = None
    registration: master_pb2.TSRegistrationPB = field(kw_only=True, repr=False)
    heartbeat_interval_ms: int = field(default=HEARTBEAT_INTERVAL_MS_DEFAULT, kw_only=True)

    def millis_since_heartbeat(self) -> int:
        """Milliseconds since the last heartbeat."""
        return int((time.monotonic() - self.last_heartbeat_s) * 1000)

    def to_pb(self) -> master_pb2.TSInfoPB:
        """The ``TSInfoPB`` of this server."""
        pb = master_pb2.TSInfoPB(permanent_uuid=self.uuid)
        pb.rpc_addr.CopyFrom(self.registration.rpc_addr)
        pb.http_addr.CopyFrom(self.registration.http_addr)
        return pb


class TSManager:
    """Tablet servers by UUID."""

    def __init__(self, unresponsive_timeout_ms: int) -> None:
        self._unresponsive_timeout_ms = unresponsive_timeout_ms
        self._servers: dict[str, TSDescriptor] = {}
        self._started_s = time.monotonic()

    def age_ms(self) -> int:
        """Milliseconds since this manager (this master process) started."""
        return int((time.monotonic() - self._started_s) * 1000)

    def heartbeat(
        self,
        uuid: str,
        instance_seqno: int,
        registration: master_pb2.TSRegistrationPB,
        *,
        interval_ms: int = 0,
    ) -> TSDescriptor:
        """Records a heartbeat (registering a new server or a new instance of one);
        ``interval_ms`` is the server's heartbeat interval (0: not said)."""
        rpc = join_host_port(registration.rpc_addr.host, registration.rpc_addr.port)
        http = join_host_port(registration.http_addr.host, registration.http_addr.port)
        now = time.monotonic()
        ts = self._servers.get(uuid)
        if ts is None or ts.instance_seqno != instance_seqno:
            ts = TSDescriptor(uuid, rpc, http, instance_seqno, now, registration=registration)
            self._servers[uuid] = ts
        else:
            ts.rpc_addr, ts.http_addr, ts.last_heartbeat_s = rpc, http, now
            ts.registration = registration
        ts.heartbeat_interval_ms = interval_ms or HEARTBEAT_INTERVAL_MS_DEFAULT
        return ts

    def get(self, uuid: str) -> TSDescriptor | None:
        """The server with ``uuid``, live or not."""
        return self._servers.get(uuid)

    def is_live(self, ts: TSDescriptor) -> bool:
        """Heard from within the unresponsive timeout."""
        return ts.millis_since_heartbeat() < self._unresponsive_timeout_ms

    def state(self, ts: TSDescriptor) -> str:
        """LIVE, UNRESPONSIVE (a heartbeat is overdue) or DEAD (not ``is_live``)."""
        if not self.is_live(ts):
            return DEAD
        overdue_ms = int(OVERDUE_HEARTBEATS * ts.heartbeat_interval_ms)
        return LIVE if ts.millis_since_heartbeat() <= overdue_ms else UNRESPONSIVE

    def all(self) -> list[TSDescriptor]:
        """Every known server, by UUID."""
        return sorted(self._servers.values(), key=lambda ts: ts.uuid)

    def live(self) -> list[TSDescriptor]:
        """The live servers, by UUID."""
        return [ts for ts in self.all() if self.is_live(ts)]
