"""Consensus metadata: the documented payload, its checks, and the file store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nyala.common import metafile
from nyala.common.metafile import MetaKind
from nyala.consensus.metadata import (
    ConsensusMetadata,
    MemoryCmetaStore,
    decode_cmeta,
    encode_cmeta,
)
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.types import MemberType, RaftConfig, RaftPeer
from nyala.errors import CorruptionError, NotFoundError, NotSupportedError

CONFIG = RaftConfig(
    (
        RaftPeer("a", "h1:7050"),
        RaftPeer("b", "h2:7050"),
        RaftPeer("d", "h4:7050", MemberType.NON_VOTER, promote=True),
    ),
    opid_index=7,
)
META = ConsensusMetadata(current_term=5, voted_for="b", committed_config=CONFIG)


def test_payload_follows_the_documented_layout() -> None:
    doc = json.loads(encode_cmeta(META))
    assert doc == {
        "format": 1,
        "current_term": 5,
        "voted_for": "b",
        "committed_config": {
            "opid_index": 7,
            "peers": [
                {
                    "uuid": "a",
                    "address": "h1:7050",
                    "member_type": "VOTER",
                    "attrs": {"promote": False, "replace": False},
                },
                {
                    "uuid": "b",
                    "address": "h2:7050",
                    "member_type": "VOTER",
                    "attrs": {"promote": False, "replace": False},
                },
                {
                    "uuid": "d",
                    "address": "h4:7050",
                    "member_type": "NON_VOTER",
                    "attrs": {"promote": True, "replace": False},
                },
            ],
        },
    }
    assert decode_cmeta(encode_cmeta(META)) == META


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[]",
        b'{"format": 1, "current_term": -1, "voted_for": null, "committed_config": {}}',
        b'{"format": 1, "current_term": 1, "voted_for": 3, "committed_config": {}}',
        b'{"format": 1, "current_term": 1, "voted_for": null, "committed_config": {}}',
        b'{"format": 1, "current_term": true, "voted_for": null, "committed_config": {}}',
    ],
)
def test_malformed_payloads_are_corruption(payload: bytes) -> None:
    with pytest.raises(CorruptionError):
        decode_cmeta(payload)


def test_a_newer_format_is_not_supported() -> None:
    doc = json.loads(encode_cmeta(META))
    doc["format"] = 2
    with pytest.raises(NotSupportedError):
        decode_cmeta(json.dumps(doc).encode())


def test_file_store_round_trip_and_replace(tmp_path: Path) -> None:
    store = FileCmetaStore(tmp_path / "cmeta")
    with pytest.raises(NotFoundError):
        store.load()
    store.save(META)
    later = ConsensusMetadata(6, None, CONFIG)
    store.save(later)
    assert FileCmetaStore(tmp_path / "cmeta").load() == later
    raw = metafile.read(tmp_path / "cmeta", MetaKind.CONSENSUS_META)
    assert json.loads(raw)["current_term"] == 6


def test_file_store_detects_damage(tmp_path: Path) -> None:
    path = tmp_path / "cmeta"
    FileCmetaStore(path).save(META)
    image = bytearray(path.read_bytes())
    image[-3] ^= 0x40
    path.write_bytes(bytes(image))
    with pytest.raises(CorruptionError):
        FileCmetaStore(path).load()


def test_memory_store_counts_saves() -> None:
    store = MemoryCmetaStore()
    with pytest.raises(NotFoundError):
        store.load()
    store.save(META)
    assert store.load() == META
    assert store.saves == 1
