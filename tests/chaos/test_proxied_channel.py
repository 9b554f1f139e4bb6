"""The chaos suite's proxies cut and delay consensus on the peer channel (docs/consensus.md,
"The peer channel"): each server announces its channel at a proxy of its own, so a partition
that cuts a leader off deposes it. In the default suite: without it, every chaos run would
test the gRPC stream only, or none of its partitions would cut the channel."""

from __future__ import annotations

import time
import urllib.request

from nyala.chaos.cluster import ChaosCluster
from nyala.chaos.workloads import TabletClient, schema
from nyala.testing.mini_cluster import ServerProcess

TABLET = "c4a0c4a0c4a0c4a0c4a0c4a0c4a0c4a0"


def _batches_sent(ts: ServerProcess) -> dict[str, float]:
    url = f"http://{ts.http_addr}/metrics?metrics=nyala_consensus_peer_batches_sent_total"
    with urllib.request.urlopen(url, timeout=5) as page:
        text = page.read().decode()
    sent = {}
    for line in text.splitlines():
        if line.startswith("nyala_consensus_peer_batches_sent_total{"):
            labels, value = line.rsplit(" ", 1)
            sent[labels.split('"')[1]] = float(value)
    return sent


def test_a_partition_cuts_the_peer_channel_and_deposes_the_leader() -> None:
    with ChaosCluster(num_tservers=3) as cluster:
        cluster.create_tablet(TABLET, schema())
        leader = cluster.leader(timeout_s=30)
        client = TabletClient(cluster, "channel")
        client.write({"id": [1], "v": [1]}, "upsert")
        sent = _batches_sent(leader)
        assert sent["channel"] > 0, sent
        assert sent["grpc"] == 0, sent
        term = int(cluster.cstate(leader).cstate.current_term)

        others = {ts.name for ts in cluster.members if ts is not leader}
        cluster.network.partition([{leader.name}, others])
        # Cut off, the leader's heartbeats no longer reach the others: one of them is elected.
        deadline = time.monotonic() + 30
        while True:
            new = cluster.leader(timeout_s=30)
            if new is not leader:
                break
            assert time.monotonic() < deadline, "the cut-off leader was never replaced"
            time.sleep(0.2)
        assert int(cluster.cstate(new).cstate.current_term) > term

        cluster.network.heal()
        client.write({"id": [2], "v": [2]}, "upsert")
