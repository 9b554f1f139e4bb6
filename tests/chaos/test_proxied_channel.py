"""The chaos suite's proxies cut and delay consensus on the peer channel (docs/consensus.md,
"The peer channel"): each server announces its channel at a proxy of its own, so a partition
that cuts a leader off deposes it. In the default suite: without it, every chaos run would
test the gRPC stream only, or none of its partitions would cut the channel."""

from __future__ import annotations

import time

from nyala.chaos.cluster import ChaosCluster
from nyala.chaos.workloads import TabletClient, schema

TABLET = "c4a0c4a0c4a0c4a0c4a0c4a0c4a0c4a0"


def test_a_partition_cuts_the_peer_channel_and_deposes_the_leader() -> None:
    with ChaosCluster(num_tservers=3) as cluster:
        cluster.create_tablet(TABLET, schema())
        leader = cluster.leader(timeout_s=30)
        client = TabletClient(cluster, "channel")
        client.write({"id": [1], "v": [1]}, "upsert")
        sent = leader.metric_by_label("nyala_consensus_peer_batches_sent_total", "transport")
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
