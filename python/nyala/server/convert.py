"""Conversions between the tablet layer's types and their protobuf forms (metadata.proto).

Owns only the mapping; validation of the converted values stays with the types themselves
(``Schema``, ``RaftConfig``), so a malformed request fails with the same typed error as a
malformed call from Python.
"""

from __future__ import annotations

from nyala._proto import common_pb2, metadata_pb2
from nyala.consensus.types import NO_OPID_INDEX, MemberType, RaftConfig, RaftPeer
from nyala.errors import InvalidArgumentError
from nyala.rpc.errors import join_host_port, split_host_port
from nyala.tablet.superblock import Partition


def partition_from_pb(pb: metadata_pb2.PartitionPB) -> Partition:
    """The ``Partition`` of a ``PartitionPB``."""
    return Partition(
        hash_buckets=tuple(pb.hash_buckets),
        key_start=bytes(pb.partition_key_start),
        key_end=bytes(pb.partition_key_end),
    )


def partition_to_pb(partition: Partition) -> metadata_pb2.PartitionPB:
    """The ``PartitionPB`` of a ``Partition``."""
    return metadata_pb2.PartitionPB(
        hash_buckets=list(partition.hash_buckets),
        partition_key_start=partition.key_start,
        partition_key_end=partition.key_end,
    )


def config_from_pb(pb: metadata_pb2.RaftConfigPB) -> RaftConfig:
    """The ``RaftConfig`` of a ``RaftConfigPB``; ``InvalidArgumentError`` if malformed."""
    peers = []
    for p in pb.peers:
        if not p.permanent_uuid:
            raise InvalidArgumentError("a config peer has no permanent_uuid")
        if p.member_type == metadata_pb2.NON_VOTER:
            member_type = MemberType.NON_VOTER
        elif p.member_type == metadata_pb2.VOTER:
            member_type = MemberType.VOTER
        else:
            raise InvalidArgumentError(f"peer {p.permanent_uuid} has no member_type")
        address = join_host_port(p.last_known_addr.host, p.last_known_addr.port)
        peers.append(
            RaftPeer(
                uuid=p.permanent_uuid,
                address=address,
                member_type=member_type,
                promote=p.attrs.promote,
                replace=p.attrs.replace,
            )
        )
    index = pb.opid_index if pb.HasField("opid_index") else NO_OPID_INDEX
    return RaftConfig(peers=tuple(peers), opid_index=index)


def peer_from_pb(
    pb: metadata_pb2.RaftPeerPB, *, default_member_type: MemberType | None = None
) -> RaftPeer:
    """The ``RaftPeer`` of a ``RaftPeerPB`` in a ChangeConfig request.

    Unlike a config's peers, the address may be absent (REMOVE_PEER/MODIFY_PEER name the peer by
    uuid only); an unset member type takes ``default_member_type`` or is ``InvalidArgumentError``.
    """
    if not pb.permanent_uuid:
        raise InvalidArgumentError("the peer has no permanent_uuid")
    if pb.member_type == metadata_pb2.NON_VOTER:
        member_type = MemberType.NON_VOTER
    elif pb.member_type == metadata_pb2.VOTER:
        member_type = MemberType.VOTER
    elif default_member_type is not None:
        member_type = default_member_type
    else:
        raise InvalidArgumentError(f"peer {pb.permanent_uuid} has no member_type")
    address = ""
    if pb.HasField("last_known_addr") and pb.last_known_addr.host:
        address = join_host_port(pb.last_known_addr.host, pb.last_known_addr.port)
    return RaftPeer(
        uuid=pb.permanent_uuid,
        address=address,
        member_type=member_type,
        promote=pb.attrs.promote,
        replace=pb.attrs.replace,
    )


def config_to_pb(config: RaftConfig) -> metadata_pb2.RaftConfigPB:
    """The ``RaftConfigPB`` of a ``RaftConfig``."""
    pb = metadata_pb2.RaftConfigPB()
    if config.opid_index != NO_OPID_INDEX:
        pb.opid_index = config.opid_index
    for p in config.peers:
        host, port = split_host_port(p.address)
        peer = pb.peers.add(
            permanent_uuid=p.uuid,
            member_type=metadata_pb2.VOTER if p.is_voter else metadata_pb2.NON_VOTER,
        )
        peer.last_known_addr.CopyFrom(common_pb2.HostPortPB(host=host, port=port))
        peer.attrs.promote = p.promote
        peer.attrs.replace = p.replace
    return pb
