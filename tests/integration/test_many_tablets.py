"""Many quiesced tablets and a tablet server SIGKILLed: its leaderships move within two
election timeouts, no acknowledged write is lost, and its restart causes no election storm.

Real processes: one master, three tablet servers, replication factor 3, default Raft timing
(500 ms heartbeats, 1.5 s election timeout) so that quiescence and its server heartbeats run as
in production. The default suite runs 60 tablets; ``-m scale`` runs 500 (issue "Thousands of
tablet replicas per server").
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request

import numpy as np
import pytest

import nyala
from nyala.testing import MiniCluster, logs_on_failure
from nyala.testing.mini_cluster import ServerProcess

SCHEMA = nyala.Schema.parse("id:int64, v:string?", key=["id"])
ELECTION_TIMEOUT_S = 1.5  # the default: 3 missed heartbeats of 500 ms
BUCKETS_PER_TABLE = 100


def _gauges(server: ServerProcess, name: str) -> dict[str, float]:
    """One per-tablet gauge of a server's /metrics, by tablet id (only that family is asked
    for: rendering every family of 500 replicas ten times a second took a third of a
    survivor's event loop, which the failover then waited for)."""
    url = f"http://{server.http_addr}/metrics?metrics={name}"
    body = urllib.request.urlopen(url, timeout=30).read()
    out = {}
    for line in body.decode().splitlines():
        if line.startswith(name + "{"):
            tablet = line.split('tablet_id="', 1)[1].split('"', 1)[0]
            out[tablet] = float(line.rsplit(" ", 1)[1])
    return out


def _led(server: ServerProcess) -> set[str]:
    return {t for t, v in _gauges(server, "nyala_tablet_is_leader").items() if v == 1.0}


def _terms(servers: list[ServerProcess]) -> dict[str, float]:
    best: dict[str, float] = {}
    for server in servers:
        for tablet, term in _gauges(server, "nyala_tablet_raft_term").items():
            best[tablet] = max(best.get(tablet, 0.0), term)
    return best


def _wait_quiesced(cluster: MiniCluster, tablets: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        counts = [sum(_gauges(s, "nyala_tablet_quiesced").values()) for s in cluster.tservers]
        if all(c == tablets for c in counts):
            return
        assert time.monotonic() < deadline, f"quiesced replicas per server: {counts}"
        time.sleep(0.5)


def _descriptors(server: ServerProcess) -> tuple[int, int]:
    """(descriptors open on files under the server's data directory, eventfds) of a server."""
    pid = server.pid
    assert pid is not None
    fs_root = str(server.fs_root.resolve())
    files = eventfds = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue  # closed meanwhile
        files += target.startswith(fs_root + os.sep)
        eventfds += target == "anon_inode:[eventfd]"
    return files, eventfds


def _wait_files_released(cluster: MiniCluster, tablets: int, timeout_s: float = 30) -> None:
    """Quiesced replicas hold no descriptor: none on their WAL segments (closed while idle),
    and one eventfd per server for all their durability signals instead of one each."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = [_descriptors(s) for s in cluster.tservers]
        # A server's own files (its instance lock, logs) are a few; its replicas' WALs are
        # one or more each until released.
        if all(files < 8 and eventfds < 8 for files, eventfds in found):
            return
        assert time.monotonic() < deadline, (
            f"(files, eventfds) per server with {tablets} quiesced replicas each: {found}"
        )
        time.sleep(0.5)


class _Writer(threading.Thread):
    """Upserts batches of fresh keys over every table until stopped; keeps what was acked."""

    def __init__(self, client: nyala.Client, tables: list[str]) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.tables = tables
        self.acked: dict[str, list[np.ndarray]] = {t: [] for t in tables}
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        rng = np.random.default_rng(11)
        while not self.stop.is_set():
            for name in self.tables:
                ids = rng.integers(0, 2**62, 200, dtype=np.int64)
                try:
                    result = self.client.table(name).upsert({"id": ids, "v": ["w"] * len(ids)})
                except nyala.errors.NyalaError:
                    continue  # outcome unknown across the failover: not counted as acked
                if result.ok:
                    self.acked[name].append(ids)
                else:
                    self.errors.append(AssertionError(f"{name}: {result.row_errors[:3]}"))


def _run(tablets: int, slack_s: float) -> None:
    """``slack_s``: time allowed beyond two election timeouts, for the observer (it polls every
    server's /metrics) and for the elections themselves on a machine shared with other work."""
    with (
        logs_on_failure(MiniCluster(3, num_masters=1, start_timeout_s=120)) as cluster,
        nyala.connect(cluster.master_addrs, timeout_ms=60_000, admin_timeout_ms=600_000) as client,
    ):
        tables = []
        while len(tables) * BUCKETS_PER_TABLE < tablets:
            name = f"t{len(tables)}"
            buckets = min(BUCKETS_PER_TABLE, tablets - len(tables) * BUCKETS_PER_TABLE)
            partitioning = nyala.HashPartitioning(["id"], buckets=buckets)
            client.create_table(name, SCHEMA, partitioning=partitioning, replicas=3)
            tables.append(name)
        _wait_quiesced(cluster, tablets, timeout_s=120)
        _wait_files_released(cluster, tablets)

        victim = max(cluster.tservers, key=lambda s: len(_led(s)))
        survivors = [s for s in cluster.tservers if s is not victim]
        led = _led(victim)
        assert led, "the victim leads nothing: nothing to fail over"

        writer = _Writer(client, tables)
        writer.start()
        time.sleep(1.0)
        killed_at = time.monotonic()
        victim.kill()
        while True:
            # A poll reads the servers after it starts: what it finds unmoved was unmoved at
            # its start at least, so the time that counts is the start (under load one poll
            # of every server's /metrics took over a second, which is the observer's time,
            # not the failover's).
            polled_at = time.monotonic()
            moved = set().union(*(_led(s) for s in survivors))
            if led <= moved:
                break
            waited_s = polled_at - killed_at
            assert waited_s < 2 * ELECTION_TIMEOUT_S + slack_s, (
                f"{len(led - moved)} of {len(led)} leaderships not moved after {waited_s:.1f} s"
            )
            time.sleep(0.1)
        # When each new leader was elected, from its own count of how long it has led (the
        # servers' clock is this process's CLOCK_MONOTONIC): the poll above only bounds it.
        elected_s = []
        for server in survivors:
            leading = _gauges(server, "nyala_tablet_leader_for_seconds")
            read_at = time.monotonic()
            elected_s += [read_at - leading[t] - killed_at for t in led if leading.get(t, 0) > 0]
        assert len(elected_s) == len(led)
        print(
            f"{len(led)} leaderships moved within {time.monotonic() - killed_at:.2f} s "
            f"(the last poll started at {polled_at - killed_at:.2f} s); elected after "
            f"{min(elected_s):.2f}-{max(elected_s):.2f} s (median "
            f"{sorted(elected_s)[len(elected_s) // 2]:.2f} s)"
        )
        # Two election timeouts (the bound), plus the slack for a shared machine: the
        # bound itself is met in most runs, not all (docs/consensus.md, "Split votes in a mass
        # failover": a survivor's stalled loop can hold a group of elections past it).
        assert max(elected_s) < 2 * ELECTION_TIMEOUT_S + slack_s, sorted(elected_s)[-5:]

        time.sleep(2.0)  # writes continue on the new leaders
        writer.stop.set()
        writer.join(timeout=120)
        assert not writer.errors, writer.errors[:3]

        terms_before = _terms(survivors)
        victim.restart()
        _wait_quiesced(cluster, tablets, timeout_s=180)
        _wait_files_released(cluster, tablets)  # written to, and quiesced again
        terms_after = _terms(cluster.tservers)
        changes = sum(terms_after[t] - terms_before.get(t, 0.0) for t in terms_after)
        assert changes <= len(led), f"{changes} term changes after the restart ({len(led)} led)"

        for name in tables:
            acked = writer.acked[name]
            if not acked:
                continue
            wanted = np.unique(np.concatenate(acked))
            found = client.table(name).scan(columns=["id"]).to_arrow().column("id").to_numpy()
            missing = np.setdiff1d(wanted, found)
            assert missing.size == 0, f"{name}: {missing.size} acknowledged rows lost"


def test_sixty_quiesced_tablets_fail_over_and_restart_quietly() -> None:
    # The default suite shares its machine with the rest of CI: a second of slack.
    _run(60, slack_s=1.0)


@pytest.mark.scale
def test_five_hundred_quiesced_tablets_fail_over_and_restart_quietly() -> None:
    # Not in `make test` (`make py-test-scale`, which runs each scale test alone): the issue's
    # bound exactly, two election timeouts. With votes on the peer streams the last of 176-224
    # leaderships was elected 1.76-2.01 s after the kill in 15 runs of 15 (docs/consensus.md,
    # "Votes on the peer streams"; 2.0-2.9 s before them, 3.45 s in the worst run on a loaded
    # machine, when this test allowed a second more).
    _run(500, slack_s=0.0)
