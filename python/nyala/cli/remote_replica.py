"""``nyala remote-replica ...``: operations on one replica of a live tablet server, by its
address (Kudu's ``kudu remote_replica``).

``unsafe-change-config TS TABLET PEER...`` is the online half of catastrophic recovery (seed 001,
"Restoring availability after catastrophic data loss"): the replica of TABLET on the tablet
server at TS forces a config of only the PEER uuids (all VOTERs, a subset of its committed
config, itself included) at a new term, bypassing Raft, and campaigns; left alone it leads at
once. Whatever only the dropped replicas had is lost; the master re-replicates the rest. The
offline half is ``nyala local-replica cmeta unsafe-rewrite-config``.
"""

from __future__ import annotations

import click

from nyala.cli.cluster_client import one_line, timeout_ms, timeout_option
from nyala.cli.output import emit_one, format_option


@click.group(name="remote-replica")
def group() -> None:
    """Operate on a replica of a live tablet server."""


@group.command(name="unsafe-change-config")
@click.argument("ts_addr", metavar="TS")
@click.argument("tablet_id", metavar="TABLET")
@click.argument("peers", nargs=-1, required=True, metavar="PEER...")
@timeout_option
@format_option
@one_line
def unsafe_change_config(ts_addr: str, tablet_id: str, peers: tuple[str, ...], fmt: str) -> None:
    """DANGEROUS: make the replica of TABLET on tablet server TS (HOST:PORT) adopt a config of
    only the VOTERs PEER... (uuids), bypassing Raft; it then elects itself or a new leader
    among them. Entries only the other replicas had are lost. No master is needed."""
    from nyala._proto import consensus_pb2, metadata_pb2
    from nyala.rpc import BlockingServerProxy

    deadline_ms = timeout_ms()
    with BlockingServerProxy(ts_addr) as proxy:
        ts_uuid = proxy.ping(timeout_ms=deadline_ms).server_uuid
        request = consensus_pb2.UnsafeChangeConfigRequestPB(
            dest_uuid=ts_uuid, tablet_id=tablet_id, caller_id="nyala remote-replica"
        )
        for peer in peers:
            request.new_config.peers.add(permanent_uuid=peer, member_type=metadata_pb2.VOTER)
        proxy.call(proxy.consensus.UnsafeChangeConfig, request, timeout_ms=deadline_ms)
    emit_one({"tserver": ts_uuid, "tablet_id": tablet_id, "voters": list(peers)}, fmt)


__all__ = ["group"]
