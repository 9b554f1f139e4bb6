"""Tablet copy with real tserver processes (issue 8, "Show it").

Default suite: a replica added after the leader GC'd its WAL (small segments, no retention) is
auto-vivified by a tablet copy, promoted and, elected, serves every row; a corrupted chunk is
detected and fetched again; a rogue StartTabletCopy with a stale term is refused; a throttled
copy is listed and cancelled, leaving a TOMBSTONED replica; a replica added to a tablet whose
leader is written to all along (WAL segments many copy chunks long) is copied on the first try
and serves every acknowledged row (issue 31: a live segment read chunk by chunk used to give a
log that did not open, and the copy was retried for as long as the writes went on). Marked
``slow``: killing the source mid-copy (the target is TOMBSTONED, then copied from the next
leader), and killing the target mid-copy (after a restart it votes from its tombstone and later
recovers).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner

from nyala import errors
from nyala._proto import (
    common_pb2,
    consensus_pb2,
    metadata_pb2,
    tablet_copy_pb2,
    tserver_admin_pb2,
)
from nyala.cli import main
from nyala.schema import Column, Schema
from nyala.testing import MiniCluster, dump_logs
from nyala.testing.mini_cluster import LOOPBACK, ServerProcess
from nyala.testing.tablet_ops import scan, write_to_leader

SCHEMA = Schema([Column("id", "int64"), Column("v", "string", nullable=True)], ["id"])
TABLET = "c" * 32
DEADLINE_S = 60.0
# Small WAL segments, no retention, frequent flush and GC: the leader's WAL start moves on fast.
GC_FLAGS = (
    "--wal-segment-bytes",
    "65536",
    "--wal-min-segments-to-retain",
    "0",
    "--wal-gc-interval-ms",
    "200",
    "--flush-interval-ms",
    "300",
)


@pytest.fixture(params=["data-channel", "fetch-data"])
def cluster4(request: pytest.FixtureRequest) -> Iterator[MiniCluster]:
    """Four tablet servers with forced WAL GC; a source corrupts its first chunk. Copies go
    over the data channel, or (``--no-tablet-copy-data-channel``) over FetchData RPCs."""
    flags = (*GC_FLAGS, "--tablet-copy-inject-corrupt-chunks", "1")
    if request.param == "fetch-data":
        flags = (*flags, "--no-tablet-copy-data-channel")
    with MiniCluster(4, tserver_flags=flags) as mini:
        yield mini
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            dump_logs(mini, sys.stderr)


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = DEADLINE_S) -> Any:
    """``check()`` until it returns something truthy (retriable errors count as no)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = check()
            if result:
                return result
        except (errors.RetriableError, errors.TimedOutError):
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def write_rows(
    cluster: MiniCluster, first: int, count: int, seq: int, *, random_bytes: int = 0
) -> None:
    ids = list(range(first, first + count))
    filler = [os.urandom(random_bytes).hex() if random_bytes else "x" * 200 for _ in ids]
    data = {"id": ids, "v": [f"value-{i:08d}-{f}" for i, f in zip(ids, filler, strict=True)]}
    result = write_to_leader(
        cluster, TABLET, SCHEMA, data, op="insert", client_id="copy-test", seq_no=seq
    )
    assert not result.per_row_errors


def cstate(ts: ServerProcess) -> Any:
    request = consensus_pb2.GetConsensusStateRequestPB(dest_uuid=ts.uuid, tablet_ids=[TABLET])
    with ts.proxy() as proxy:
        return proxy.call(proxy.consensus.GetConsensusState, request).tablets[0].cstate


def last_logged(ts: ServerProcess) -> tuple[int, int]:
    request = consensus_pb2.GetConsensusStateRequestPB(dest_uuid=ts.uuid, tablet_ids=[TABLET])
    with ts.proxy() as proxy:
        op = proxy.call(proxy.consensus.GetConsensusState, request).tablets[0].last_logged
    return op.term, op.index


def data_state(ts: ServerProcess) -> str:
    request = tserver_admin_pb2.ListTabletsRequestPB(dest_uuid=ts.uuid)
    with ts.proxy() as proxy:
        response = proxy.call(proxy.admin.ListTablets, request)
    for entry in response.status_and_schema:
        if entry.tablet_status.tablet_id == TABLET:
            return str(metadata_pb2.TabletDataState.Name(entry.tablet_status.data_state))
    return "ABSENT"


def copy_jobs(ts: ServerProcess) -> list[Any]:
    with ts.proxy() as proxy:
        response = proxy.call(
            proxy.tablet_copy.ListTabletCopies, tablet_copy_pb2.ListTabletCopiesRequestPB()
        )
    return list(response.jobs)


def wal_gcd(ts: ServerProcess) -> bool:
    """The first WAL segment of the tablet is gone on ``ts``."""
    wal_dir = ts.fs_root / "wals" / TABLET
    return wal_dir.is_dir() and not (wal_dir / "wal-000000001").exists()


def fill_until_gc(cluster: MiniCluster, leader: ServerProcess, seq: int) -> int:
    """Writes 500-row batches until the leader's first WAL segment is GC'd; returns rows."""
    rows = 0
    while not wal_gcd(leader):
        write_rows(cluster, rows, 500, seq + rows // 500)
        rows += 500
        assert rows < 40_000, "the leader never GC'd its WAL"
        time.sleep(0.2)
    return rows


def peer_pb(ts: ServerProcess, member_type: int) -> Any:
    peer = metadata_pb2.RaftPeerPB(permanent_uuid=ts.uuid, member_type=member_type)
    peer.last_known_addr.host = LOOPBACK
    peer.last_known_addr.port = ts.rpc_port
    peer.attrs.promote = member_type == metadata_pb2.NON_VOTER
    return peer


def add_peer(cluster: MiniCluster, newcomer: ServerProcess) -> None:
    def add() -> Any:
        leader = cluster.leader_of(TABLET)
        request = consensus_pb2.ChangeConfigRequestPB(
            dest_uuid=leader.uuid,
            tablet_id=TABLET,
            type=consensus_pb2.ADD_PEER,
            server=peer_pb(newcomer, metadata_pb2.NON_VOTER),
        )
        with leader.proxy() as proxy:
            return proxy.call(proxy.consensus.ChangeConfig, request, timeout_ms=10_000)

    wait_for("ADD_PEER accepted", add)


def is_voter_everywhere(cluster: MiniCluster, newcomer: ServerProcess) -> bool:
    for ts in cluster.tservers:
        if not ts.is_running():
            continue
        peers = {p.permanent_uuid: p for p in cstate(ts).committed_config.peers}
        peer = peers.get(str(newcomer.uuid))
        if peer is None or peer.member_type != metadata_pb2.VOTER:
            return False
    return True


def start_copy(
    target: ServerProcess,
    source: ServerProcess,
    term: int,
    *,
    first_index: int = 0,
    seen: tuple[int, int] | None = None,
) -> Any:
    request = tablet_copy_pb2.StartTabletCopyRequestPB(
        dest_uuid=target.uuid,
        tablet_id=TABLET,
        copy_peer_uuid=source.uuid,
        copy_peer_addr=common_pb2.HostPortPB(host=LOOPBACK, port=source.rpc_port),
        caller_term=term,
        caller_log_first_index=first_index,
    )
    if seen is not None:
        request.target_last_op_id.CopyFrom(common_pb2.OpIdPB(term=seen[0], index=seen[1]))
    with target.proxy() as proxy:
        return proxy.call(proxy.tablet_copy.StartTabletCopy, request)


def test_start_copy_to_a_live_replica_that_can_catch_up_is_refused(cluster: MiniCluster) -> None:
    cluster.create_tablet(TABLET, SCHEMA, servers=cluster.tservers)
    leader = cluster.leader_of(TABLET)
    write_rows(cluster, 0, 500, 0)
    follower = next(ts for ts in cluster.tservers if ts is not leader)
    term = int(cstate(leader).current_term)
    # The leader's WAL still starts at 1: the follower can be caught up from it, whatever the
    # caller's term; copying it would throw a live log away for nothing.
    with pytest.raises(errors.IllegalStateError, match="caught up"):
        start_copy(follower, leader, term, first_index=1)
    # A caller that saw another last-logged op than the follower's (seed 000's idempotency).
    with pytest.raises(errors.IllegalStateError, match="probe it again"):
        start_copy(follower, leader, term, first_index=10**6, seen=(term, 1))
    assert copy_jobs(follower) == []
    assert data_state(follower) == "TABLET_DATA_READY"
    write_rows(cluster, 500, 10, 1)

    # A caller whose log starts just past the follower's last entry holds every entry the
    # follower lacks, but not that last entry: an AppendEntries must name its term, so only
    # a copy catches the follower up (a leader whose WAL was GC'd just after a copy it served
    # asked for another again and again while the target refused).
    wait_for("the follower caught up", lambda: last_logged(follower) == last_logged(leader))
    last = last_logged(follower)
    start_copy(follower, leader, term, first_index=last[1] + 1, seen=last)
    wait_for("the copy", lambda: [j for j in copy_jobs(follower) if j.state == "SUCCEEDED"])
    wait_for("the copy's replica running", lambda: data_state(follower) == "TABLET_DATA_READY")
    write_rows(cluster, 510, 10, 2)


def test_replica_added_after_wal_gc_is_copied_promoted_and_serves(cluster4: MiniCluster) -> None:
    members, newcomer = cluster4.tservers[:3], cluster4.tservers[3]
    cluster4.create_tablet(TABLET, SCHEMA, servers=members)
    leader = cluster4.leader_of(TABLET)
    rows = fill_until_gc(cluster4, leader, 0)

    # No CreateTablet on the newcomer: the leader finds it TABLET_NOT_FOUND (and its WAL
    # cannot replay from index 1) and auto-vivifies it by a tablet copy.
    add_peer(cluster4, newcomer)
    wait_for("the newcomer promoted to VOTER", lambda: is_voter_everywhere(cluster4, newcomer))
    jobs = copy_jobs(newcomer)
    assert [j.state for j in jobs if j.state == "SUCCEEDED"], jobs
    done = next(j for j in jobs if j.state == "SUCCEEDED")
    assert done.bytes_done >= done.bytes_total > 0
    assert data_state(newcomer) == "TABLET_DATA_READY"
    # The source's first chunk was corrupted after its CRC: the target noticed and refetched,
    # over the path the servers were told to use.
    log = newcomer.log_path.read_text()
    assert "CRC32C" in log
    channel_on = "--no-tablet-copy-data-channel" not in cluster4.tserver_flags
    assert ("were fetched again" in log) == channel_on, log
    # The data channel is one more listening port (any free one), and none when it is off;
    # the consensus peer channel is another, whatever the data channel's setting.
    with leader.proxy() as proxy:
        peer_channel = proxy.call(
            proxy.consensus.GetPeerChannel,
            consensus_pb2.PeerChannelRequestPB(dest_uuid=leader.uuid),
        ).port
    assert peer_channel in leader.listening_ports()
    others = leader.listening_ports() - {leader.rpc_port, leader.http_port, peer_channel}
    assert len(others) == (1 if channel_on else 0), others

    # Rows written after the copy reach it through Raft; elected, it serves all of them.
    write_rows(cluster4, rows, 100, 10_000)
    with newcomer.proxy() as proxy:
        proxy.call(
            proxy.consensus.RunLeaderElection,
            consensus_pb2.RunLeaderElectionRequestPB(dest_uuid=newcomer.uuid, tablet_id=TABLET),
        )
    wait_for("the newcomer leads", lambda: cstate(newcomer).leader_uuid == newcomer.uuid)
    table = wait_for("a scan on the newcomer", lambda: scan(newcomer, TABLET, SCHEMA))
    assert sorted(table.column("id").to_pylist()) == list(range(rows + 100))

    # A rogue caller with a stale term is refused, and nothing changes on the target.
    old_leader = next(ts for ts in members if ts is not newcomer)
    with pytest.raises(errors.IllegalStateError, match="term"):
        start_copy(old_leader, newcomer, 0)
    assert data_state(old_leader) == "TABLET_DATA_READY"


#: WAL segments 16 copy chunks long, copied at a rate that spreads the active segment's chunks
#: over many appends; GC as fast as GC_FLAGS.
LIVE_FLAGS = (
    *GC_FLAGS[2:],
    "--wal-segment-bytes",
    str(256 << 10),
    "--tablet-copy-chunk-bytes",
    str(16 << 10),
    "--tablet-copy-rate-bytes-per-s",
    str(2 << 20),
)


class Writer:
    """Writes 200-row batches through the leader until stopped; keeps the acknowledged ids."""

    def __init__(self, cluster: MiniCluster, first_id: int) -> None:
        self._cluster = cluster
        self._next = first_id
        self.acked: list[int] = []
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.failure is not None:
            raise self.failure

    def _run(self) -> None:
        seq = 0
        try:
            while not self._stop.is_set():
                write_rows(self._cluster, self._next, 200, 50_000 + seq)
                self.acked.extend(range(self._next, self._next + 200))
                self._next += 200
                seq += 1
        except BaseException as exc:  # reported by stop()
            self.failure = exc


def test_replica_copied_while_its_leader_is_written_succeeds_first_try(
    make_cluster: Callable[..., MiniCluster],
) -> None:
    mini = make_cluster(4, tserver_flags=LIVE_FLAGS)
    if True:
        members, newcomer = mini.tservers[:3], mini.tservers[3]
        mini.create_tablet(TABLET, SCHEMA, servers=members)
        leader = mini.leader_of(TABLET)
        with Writer(mini, 0) as writer:
            wait_for("the leader's WAL GC'd", lambda: wal_gcd(leader))
            add_peer(mini, newcomer)
            wait_for("the newcomer promoted", lambda: is_voter_everywhere(mini, newcomer), 120)
            acked_during_copy = len(writer.acked)
            wait_for("more writes", lambda: len(writer.acked) > acked_during_copy + 1_000)
        jobs = copy_jobs(newcomer)
        assert [j.state for j in jobs] == ["SUCCEEDED"], jobs  # one copy, the first try
        # Elected, the copy serves every acknowledged row.
        with newcomer.proxy() as proxy:
            proxy.call(
                proxy.consensus.RunLeaderElection,
                consensus_pb2.RunLeaderElectionRequestPB(dest_uuid=newcomer.uuid, tablet_id=TABLET),
            )
        wait_for("the newcomer leads", lambda: cstate(newcomer).leader_uuid == newcomer.uuid)
        table = wait_for("a scan on the newcomer", lambda: scan(newcomer, TABLET, SCHEMA))
        assert set(writer.acked) <= set(table.column("id").to_pylist())


def test_throttled_copy_is_listed_and_cancelled_leaving_a_tombstone() -> None:
    flags = ("--tablet-copy-rate-bytes-per-s", "65536", "--tablet-copy-chunk-bytes", "65536")
    with MiniCluster(2, tserver_flags=flags) as mini:
        source, target = mini.tservers
        mini.create_tablet(TABLET, SCHEMA, servers=[source])
        leader = mini.leader_of(TABLET)
        assert leader is source
        for seq in range(6):
            write_rows(mini, seq * 500, 500, seq)  # ~700 KiB of WAL: >10 s at 64 KiB/s
        term = int(cstate(source).current_term)
        job_id = start_copy(target, source, term).job_id
        with pytest.raises(errors.AlreadyInProgressError):
            start_copy(target, source, term)  # a repeat while it runs
        running = wait_for(
            "bytes copied", lambda: [j for j in copy_jobs(target) if j.bytes_done > 0]
        )
        assert running[0].state == "RUNNING"
        assert running[0].job_id == job_id
        assert running[0].source_uuid == source.uuid

        # Visible on /tablet-copies and through the CLI, and cancelled through the CLI.
        with urllib.request.urlopen(f"http://{target.http_addr}/tablet-copies") as page:
            listed = json.load(page)
        assert [j["id"] for j in listed["jobs"]] == [job_id]
        assert listed["jobs"][0]["state"] == "RUNNING"
        runner = CliRunner()
        out = runner.invoke(main, ["tablet-copy", "list", "--server", target.rpc_addr])
        assert out.exit_code == 0, out.output
        assert job_id in out.output
        assert "RUNNING" in out.output
        out = runner.invoke(main, ["tablet-copy", "cancel", job_id, "--server", target.rpc_addr])
        assert out.exit_code == 0, out.output
        assert f"cancelled {job_id}" in out.output
        wait_for("the job cancelled", lambda: copy_jobs(target)[0].state == "CANCELLED")
        assert data_state(target) == "TABLET_DATA_TOMBSTONED"
        out = runner.invoke(
            main, ["tablet-copy", "list", "--server", target.rpc_addr, "--format", "json"]
        )
        assert json.loads(out.output)["jobs"][0]["state"] == "CANCELLED"
        out = runner.invoke(main, ["tablet-copy", "cancel", job_id, "--server", target.rpc_addr])
        assert out.exit_code != 0  # it already ended


def test_web_ui_shows_a_copy_in_progress_and_cancels_it() -> None:
    flags = ("--tablet-copy-rate-bytes-per-s", "65536", "--tablet-copy-chunk-bytes", "65536")
    with MiniCluster(2, tserver_flags=flags) as mini:
        source, target = mini.tservers
        mini.create_tablet(TABLET, SCHEMA, servers=[source])
        assert mini.leader_of(TABLET) is source
        for seq in range(6):
            write_rows(mini, seq * 500, 500, seq)  # ~700 KiB of WAL: >10 s at 64 KiB/s
        job_id = start_copy(target, source, int(cstate(source).current_term)).job_id
        wait_for("bytes copied", lambda: [j for j in copy_jobs(target) if j.bytes_done > 0])
        page_url = f"http://{target.http_addr}/tablet-copies"
        browser = urllib.request.Request(page_url, headers={"Accept": "text/html"})
        with urllib.request.urlopen(browser) as page:
            shown = page.read().decode()
        assert job_id in shown
        assert "<progress" in shown
        assert 'action="/tablet-copies/cancel"' in shown

        # The page's Cancel button: a POST of the job id, answered by a redirect to the list.
        form = urllib.parse.urlencode({"id": job_id}).encode()
        with urllib.request.urlopen(f"{page_url}/cancel", data=form) as answer:
            assert answer.url == page_url  # followed the 303
            after = answer.read().decode()
        assert job_id in after
        wait_for("the job cancelled", lambda: copy_jobs(target)[0].state == "CANCELLED")
        assert data_state(target) == "TABLET_DATA_TOMBSTONED"
        with pytest.raises(urllib.error.HTTPError) as again:
            urllib.request.urlopen(f"{page_url}/cancel", data=form)
        assert again.value.code == 409  # it already ended


SLOW_TARGET_FLAGS = (
    "--tablet-copy-rate-bytes-per-s",
    "131072",
    "--tablet-copy-chunk-bytes",
    "65536",
)


@pytest.fixture
def cluster3(request: pytest.FixtureRequest) -> Iterator[MiniCluster]:
    """Three tablet servers with forced WAL GC."""
    with MiniCluster(3, tserver_flags=GC_FLAGS) as mini:
        yield mini
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            dump_logs(mini, sys.stderr)


def _copy_under_way(cluster: MiniCluster) -> tuple[ServerProcess, ServerProcess, int]:
    """A tablet on three servers with GC'd WAL, and a slow fourth server being copied onto
    (auto-vivified by the leader). Returns (newcomer, leader, rows)."""
    cluster.create_tablet(TABLET, SCHEMA, servers=cluster.tservers)
    leader = cluster.leader_of(TABLET)
    rows = fill_until_gc(cluster, leader, 0)
    for seq in range(16):  # ~1.6 MiB of rowsets more: >10 s at the newcomer's rate limit
        write_rows(cluster, rows, 500, 1_000 + seq, random_bytes=200)
        rows += 500
    newcomer = cluster.add_tserver(flags=SLOW_TARGET_FLAGS)
    add_peer(cluster, newcomer)
    wait_for(
        "a copy under way",
        lambda: [j for j in copy_jobs(newcomer) if j.state == "RUNNING" and j.bytes_done > 0],
    )
    return newcomer, leader, rows


@pytest.mark.slow
def test_source_killed_mid_copy_tombstones_then_another_source_copies(
    cluster3: MiniCluster,
) -> None:
    newcomer, leader, rows = _copy_under_way(cluster3)
    leader.kill()
    failed = wait_for(
        "the copy failed",
        lambda: [j for j in copy_jobs(newcomer) if j.state == "FAILED"],
    )
    assert failed[0].source_uuid == leader.uuid
    # The next leader finds it TABLET_NOT_FOUND (tombstoned) and copies it from itself.
    wait_for(
        "a copy from another source",
        lambda: [
            j
            for j in copy_jobs(newcomer)
            if j.state == "SUCCEEDED" and j.source_uuid != leader.uuid
        ],
        timeout_s=120,
    )
    wait_for("the newcomer promoted", lambda: is_voter_everywhere(cluster3, newcomer), 120)
    assert data_state(newcomer) == "TABLET_DATA_READY"
    write_rows(cluster3, rows, 10, 20_000)


@pytest.mark.slow
def test_target_killed_mid_copy_votes_after_restart_and_recovers(cluster3: MiniCluster) -> None:
    newcomer, leader, _ = _copy_under_way(cluster3)
    newcomer.kill()
    newcomer.restart()
    # Startup turned COPYING into TOMBSTONED; it still votes from its cmeta and last OpId.
    assert data_state(newcomer) in ("TABLET_DATA_TOMBSTONED", "TABLET_DATA_COPYING")
    term = int(cstate(leader).current_term) + 5
    request = consensus_pb2.VoteRequestPB(
        dest_uuid=newcomer.uuid,
        tablet_id=TABLET,
        candidate_uuid="candidate-from-the-test",
        candidate_term=term,
        candidate_status=consensus_pb2.ConsensusStatusPB(
            last_received=common_pb2.OpIdPB(term=term - 1, index=10**9)
        ),
        is_pre_election=True,
    )
    with newcomer.proxy() as proxy:
        answer = proxy.call(proxy.consensus.RequestVote, request)
    assert answer.vote_granted
    stale = consensus_pb2.VoteRequestPB()
    stale.CopyFrom(request)
    stale.candidate_term = 0
    with newcomer.proxy() as proxy:
        refused = proxy.call(proxy.consensus.RequestVote, stale)
    assert not refused.vote_granted
    # The leader keeps asking; a new copy succeeds and the newcomer is promoted.
    wait_for("the newcomer promoted", lambda: is_voter_everywhere(cluster3, newcomer), 120)
    assert data_state(newcomer) == "TABLET_DATA_READY"
