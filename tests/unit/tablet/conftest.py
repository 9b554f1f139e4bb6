"""Fixtures shared by the tablet tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from nyala.tablet import TabletDirs


@pytest.fixture
def dirs(tmp_path: Path) -> TabletDirs:
    """A tablet server's directories for its replicas, empty, under ``tmp_path``."""
    d = TabletDirs(
        tablet_meta=tmp_path / "tablet-meta",
        consensus_meta=tmp_path / "consensus-meta",
        wals=tmp_path / "wals",
        data=tmp_path / "data",
    )
    for p in (d.tablet_meta, d.consensus_meta, d.wals, d.data):
        p.mkdir()
    return d


@pytest.fixture
def quarantined_dirs(dirs: TabletDirs, tmp_path: Path) -> TabletDirs:
    """``dirs`` with a quarantine directory (created on first use, as by a server)."""
    return dataclasses.replace(dirs, quarantine=tmp_path / "quarantine")
