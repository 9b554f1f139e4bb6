"""A tablet server's tracked memory and its limit (Kudu's ``memory_limit_hard_bytes``).

What is tracked: every replica's MemRowSets (the active one and one being flushed), every
log cache, the open scanners (each counted at its page bound, ``scan_batch_bytes_max``:
the cursor holds about one decoded row group and one page), the cache of rowsets' key
blocks (``nyala_storage::key_blocks``, at most ``key_block_cache_mb``, and at most a quarter
of the pressure threshold below), and what open rowsets hold while open (bloom filters,
footers, sparse key indexes: ``rowset indexes``, about 1.3 bytes a stored key). The rest of the
process's resident memory counts too, as ``untracked``: the interpreter and its libraries
(about 100 MiB in an idle tablet server), gRPC and Python buffers of requests in flight, heap
not yet given back.
As in Kudu, the limit bounds the whole process, not only what a tracker sees: with only the
tracked consumers counted, a 30M-row load at a 1 GiB limit peaked at 1,256 MiB of RSS
(docs/performance.md). The server refreshes the figure every
``memory_pressure_check_interval_ms``; between refreshes each admitted write adds its size, so
a burst cannot run far past the limit unseen.

Two thresholds below the limit, as in Kudu:

* ``memory_pressure_percentage`` (60 %): MemRowSets are flushed, largest first, until the
  process's memory is below it again (the memory-pressure loop in ``nyala.tserver.server``);
* ``memory_limit_soft_percentage`` (80 %): the leader refuses new writes with the retriable
  ``ServiceUnavailableError`` (``SERVICE_UNAVAILABLE``) while the MemRowSets hold something
  to flush; the client backs off and retries under the same request id, so nothing is lost
  and nothing is applied twice. Replication
  to followers is never refused (a follower that refused would stall its tablet).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from nyala.common.process import default_memory_limit_bytes
from nyala.errors import ServiceUnavailableError

#: The key block cache may hold at most this share of the pressure threshold (1/4).
KEY_BLOCK_CACHE_PRESSURE_SHARE = 4


@dataclass(frozen=True, slots=True)
class MemoryUsage:
    """Tracked bytes by consumer."""

    memrowsets_bytes: int = 0
    log_caches_bytes: int = 0
    scanners_bytes: int = 0
    #: The cache of rowsets' key blocks (at most ``key_block_cache_mb``).
    key_blocks_bytes: int = 0
    #: What open rowsets hold while open: bloom filters (10 bits a key), Parquet footers, key
    #: ranges and sparse key indexes (``_native.rowset_index_bytes``). Not a cache: it grows
    #: with the keys the server stores, and only compaction (fewer footers) or dropping
    #: tablets makes it smaller.
    rowset_indexes_bytes: int = 0
    #: The process's resident memory that no consumer above accounts for.
    untracked_bytes: int = 0

    @property
    def tracked_bytes(self) -> int:
        return (
            self.memrowsets_bytes
            + self.log_caches_bytes
            + self.scanners_bytes
            + self.key_blocks_bytes
            + self.rowset_indexes_bytes
        )

    @property
    def total_bytes(self) -> int:
        return self.tracked_bytes + self.untracked_bytes

    def with_resident(self, resident_bytes: int) -> MemoryUsage:
        """This usage with the rest of the process's ``resident_bytes`` as untracked (none
        where the tracked consumers already exceed it: not every tracked byte is resident)."""
        return replace(self, untracked_bytes=max(0, resident_bytes - self.tracked_bytes))


class MemoryTracker:
    """The server's limit, its thresholds, and the last measured usage."""

    def __init__(
        self, limit_bytes: int, pressure_percentage: int = 60, soft_percentage: int = 80
    ) -> None:
        self.limit_bytes = limit_bytes if limit_bytes > 0 else default_memory_limit_bytes()
        self.pressure_bytes = self.limit_bytes * pressure_percentage // 100
        self.soft_limit_bytes = self.limit_bytes * soft_percentage // 100
        self.usage = MemoryUsage()
        # Bytes of writes admitted since ``usage`` was measured.
        self._admitted_bytes = 0
        #: Writes refused above the soft limit (a counter for /metrics).
        self.writes_refused = 0

    @property
    def over_pressure(self) -> bool:
        """Whether the last measurement is above the pressure threshold."""
        return self.usage.total_bytes > self.pressure_bytes

    def update(self, usage: MemoryUsage) -> None:
        """Records a fresh measurement (it includes every write admitted before it)."""
        self.usage = usage
        self._admitted_bytes = 0

    @property
    def estimated_bytes(self) -> int:
        """The last measurement plus what was admitted since."""
        return self.usage.total_bytes + self._admitted_bytes

    def admit_write(self, size_bytes: int) -> None:
        """Counts a write of ``size_bytes`` in, or refuses it (retriable) above the soft
        limit while the MemRowSets hold something a flush can free. With nothing to flush
        (the untracked rest alone over the soft limit: a limit near an idle server's own
        memory) a refusal could not make room, only stop the tablet for good; the write is
        admitted and the next measurement decides again."""
        flushable = self.usage.memrowsets_bytes + self._admitted_bytes > 0
        if flushable and self.estimated_bytes >= self.soft_limit_bytes:
            self.writes_refused += 1
            raise ServiceUnavailableError(
                f"tablet server memory {self.estimated_bytes >> 20} MiB is over its soft limit "
                f"{self.soft_limit_bytes >> 20} MiB (memory_limit_bytes "
                f"{self.limit_bytes >> 20} MiB); retry after the flushes under way"
            )
        self._admitted_bytes += size_bytes

    def key_block_cache_bytes(self, configured_bytes: int) -> int:
        """The key block cache's budget: ``configured_bytes`` (``key_block_cache_mb``), at
        most a quarter of the pressure threshold. The cache counts against the limit, and
        memory pressure flushes MemRowSets, not the cache: a cache that could fill most of
        the threshold would leave the MemRowSets no room (flushes of a few rows each, and
        writes refused), as Kudu refuses a block cache larger than its pressure threshold."""
        return min(configured_bytes, self.pressure_bytes // KEY_BLOCK_CACHE_PRESSURE_SHARE)

    def memrowsets_budget_bytes(self) -> int:
        """What the MemRowSets may hold before flushes start: the pressure threshold less the
        other consumers and the untracked rest of the process."""
        others = self.usage.total_bytes - self.usage.memrowsets_bytes
        return max(0, self.pressure_bytes - others)


#: A replica's memory as measured: (active MemRowSet bytes, bytes of a MemRowSet being
#: flushed, log cache bytes).
ReplicaBytes = tuple[int, int, int]


class ReplicaMemory:
    """Every replica's last measured memory and the totals, kept current by measuring again
    only the replicas that can have changed.

    A replica's MemRowSet and log cache change only while it is awake (writes, replication)
    and when it is flushed. So a replica is measured at every ``refresh`` while it is awake
    (``awake``: told by ``liveness_changed``), once more after it quiesces, after each flush
    (``flushed``), while a flush of it is still running, and every replica at a ``full``
    refresh (a log cache also shrinks as followers catch up, and replicas without a running
    Raft change only by being opened or closed). An idle server with 2,000 replicas spent a
    fifth of its event loop measuring each of them twice a second."""

    def __init__(self) -> None:
        self._by_tablet: dict[str, ReplicaBytes] = {}
        self.awake: set[str] = set()
        self._stale: set[str] = set()
        self.active_bytes = self.flushing_bytes = self.cache_bytes = 0

    def liveness_changed(self, tablet_id: str, awake: bool) -> None:
        """The replica woke (``awake``) or quiesced or stopped: measured at the next refresh,
        and at every one while awake."""
        self._stale.add(tablet_id)
        if awake:
            self.awake.add(tablet_id)
        else:
            self.awake.discard(tablet_id)

    def flushed(self, tablet_id: str) -> None:
        """A flush of the replica ended: measured again at the next refresh."""
        self._stale.add(tablet_id)

    def active_by_tablet(self) -> dict[str, int]:
        """Each replica's active MemRowSet bytes, as last measured."""
        return {tablet_id: m[0] for tablet_id, m in self._by_tablet.items()}

    def refresh(
        self,
        everyone: Callable[[], Iterable[str]],
        measure: Callable[[str], ReplicaBytes | None],
        *,
        full: bool,
    ) -> None:
        """Measures what may have changed (everyone's ids when ``full``); ``measure`` gives a
        replica's bytes, None for a replica that is gone."""
        if full:
            self._by_tablet = {}
            self.active_bytes = self.flushing_bytes = self.cache_bytes = 0
            todo: Iterable[str] = everyone()
            self._stale = set()
        else:
            todo, self._stale = self._stale | self.awake, set()
        for tablet_id in todo:
            old = self._by_tablet.pop(tablet_id, (0, 0, 0))
            new = measure(tablet_id)
            if new is None:
                self.awake.discard(tablet_id)
                new = (0, 0, 0)
            else:
                self._by_tablet[tablet_id] = new
                if new[1]:
                    self._stale.add(tablet_id)  # a flush runs: measured until it ended
            self.active_bytes += new[0] - old[0]
            self.flushing_bytes += new[1] - old[1]
            self.cache_bytes += new[2] - old[2]
