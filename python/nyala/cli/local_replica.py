"""``nyala local-replica ...``: offline inspection and repair of the replicas in one fs root.

These commands read (and, for ``cmeta unsafe-rewrite-config`` and ``delete``, change) a
server's files directly, so the server must be stopped: each command takes the fs root's lock
first and is refused while a server holds it. ``wal dump`` reads a segment file and never
writes, so it also works on a copy of a damaged log.

``quarantine list`` shows the tombstoned replicas whose WAL, data, superblock and cmeta are
kept under ``<fs_root>/quarantine`` (``nyala.tablet.quarantine``); ``quarantine purge`` removes
them before the server's retention would (docs/operations.md says how to restore one).

``cmeta unsafe-rewrite-config`` is the offline half of catastrophic recovery after a tablet
lost a majority of its replicas (docs/operations.md): it replaces the committed Raft config
with the surviving peers so that they can elect a leader again. It can lose acknowledged writes
that only the lost replicas held, which is why it is an explicit, named-unsafe operation.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from nyala import _native
from nyala.cli.options import one_line_errors
from nyala.cli.output import emit, emit_one, format_option
from nyala.consensus.metadata import ConsensusMetadata
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.types import EntryKind, MemberType, RaftConfig, RaftPeer, config_to_dict
from nyala.errors import IllegalStateError, InvalidArgumentError, NotFoundError, NyalaError
from nyala.server.fs_manager import FsManager
from nyala.tablet.manager import TabletDirs, TabletManager, is_tablet_id
from nyala.tablet.quarantine import Quarantine, QuarantineEntry
from nyala.tablet.superblock import DataState, read_superblock

_FS_ROOT = click.option(
    "--fs-root",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="The stopped server's data root.",
)


@contextlib.contextmanager
def _locked_root(fs_root: Path) -> Iterator[FsManager]:
    """The fs root, locked against a running server while the block runs; refuses a root that
    was never formatted."""
    fs = FsManager(fs_root)
    if not fs.instance_path.exists():
        raise NotFoundError(f"{fs_root}: not a nyala fs root (no instance file)")
    fs.lock()
    try:
        fs.read_instance()
        yield fs
    finally:
        fs.unlock()


def _dirs(fs: FsManager) -> TabletDirs:
    return TabletDirs(
        tablet_meta=fs.dir("tablet-meta"),
        consensus_meta=fs.dir("consensus-meta"),
        wals=fs.dir("wals"),
        data=fs.dir("data"),
        quarantine=fs.dir("quarantine"),
    )


def _check_tablet_id(tablet_id: str) -> str:
    if not is_tablet_id(tablet_id):
        raise InvalidArgumentError(f"{tablet_id!r} is not a tablet id (32 lowercase hex digits)")
    return tablet_id


def _peer_row(peer: RaftPeer) -> str:
    kind = "V" if peer.member_type is MemberType.VOTER else "N"
    return f"{peer.uuid[:8]}({kind})"


@click.group(name="local-replica")
def group() -> None:
    """Inspect and repair replicas of a stopped server (offline, on --fs-root)."""


@group.command(name="list")
@_FS_ROOT
@format_option
@one_line_errors
def list_replicas(fs_root: Path, fmt: str) -> None:
    """List the replicas in the fs root with their data state, term and config."""
    with _locked_root(fs_root) as fs:
        rows = _replica_rows(_dirs(fs))
    emit(
        rows,
        fmt,
        [
            "tablet_id",
            "table",
            "data_state",
            "term",
            "config_index",
            "peers",
            "tombstone_last_logged",
            "reason",
        ],
    )


def _replica_rows(dirs: TabletDirs) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(dirs.tablet_meta.iterdir()):
        if not is_tablet_id(path.name):
            continue
        row: dict[str, Any] = {"tablet_id": path.name}
        try:
            sb = read_superblock(path)
            last = sb.tombstone_last_logged_opid
            row.update(
                table=sb.table_name,
                data_state=sb.data_state.value,
                tombstone_last_logged=None if last is None else str(last),
                reason=sb.state_reason,
            )
        except NyalaError as exc:
            row.update(data_state="UNREADABLE", reason=f"{type(exc).__name__}: {exc}")
        try:
            meta = FileCmetaStore(dirs.paths(path.name).cmeta).load()
            row.update(
                term=meta.current_term,
                config_index=meta.committed_config.opid_index,
                peers=[_peer_row(p) for p in meta.committed_config.peers],
            )
        except NyalaError as exc:
            row.setdefault("reason", f"cmeta: {type(exc).__name__}: {exc}")
        rows.append(row)
    return rows


@group.group(name="cmeta")
def cmeta() -> None:
    """Consensus metadata of one replica."""


def _cmeta_doc(tablet_id: str, meta: ConsensusMetadata) -> dict[str, Any]:
    return {
        "tablet_id": tablet_id,
        "current_term": meta.current_term,
        "voted_for": meta.voted_for,
        "committed_config": config_to_dict(meta.committed_config),
    }


@cmeta.command(name="print")
@click.argument("tablet_id")
@_FS_ROOT
@format_option
@one_line_errors
def cmeta_print(tablet_id: str, fs_root: Path, fmt: str) -> None:
    """Print a replica's term, vote and committed config."""
    with _locked_root(fs_root) as fs:
        meta = FileCmetaStore(_dirs(fs).paths(_check_tablet_id(tablet_id)).cmeta).load()
    emit_one(_cmeta_doc(tablet_id, meta), fmt)


def _parse_peer(text: str, current: RaftConfig) -> RaftPeer:
    """``UUID`` (address from the current config) or ``UUID:HOST:PORT``."""
    uuid, _, address = text.partition(":")
    known = current.peer(uuid)
    if address:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise InvalidArgumentError(f"peer {text!r}: expected UUID or UUID:HOST:PORT")
    elif known is not None:
        address = known.address
    else:
        raise InvalidArgumentError(
            f"peer {uuid!r} is not in the current config; give it as UUID:HOST:PORT"
        )
    return RaftPeer(uuid=uuid, address=address, member_type=MemberType.VOTER)


@cmeta.command(name="unsafe-rewrite-config")
@click.argument("tablet_id")
@click.argument("peers", nargs=-1, required=True)
@_FS_ROOT
@format_option
@one_line_errors
def cmeta_unsafe_rewrite_config(
    tablet_id: str, peers: tuple[str, ...], fs_root: Path, fmt: str
) -> None:
    """Replace the committed config with PEERS (UUID or UUID:HOST:PORT), all as VOTERs.

    For recovery after losing a majority: run it on each surviving replica (server stopped),
    then start them; they can elect a leader among themselves. Writes that only the lost
    replicas held are gone. The config's op index is kept, so the master's compare-and-set
    view of the config stays ordered.
    """
    with _locked_root(fs_root) as fs:
        store = FileCmetaStore(_dirs(fs).paths(_check_tablet_id(tablet_id)).cmeta)
        meta = store.load()
        current = meta.committed_config
        new_peers = tuple(_parse_peer(p, current) for p in peers)
        own_uuid = fs.read_instance().uuid
        if all(p.uuid != own_uuid for p in new_peers):
            raise IllegalStateError(
                f"the new config must include this server ({own_uuid}): a replica outside its "
                "own config could never be elected"
            )
        config = RaftConfig(peers=new_peers, opid_index=current.opid_index)
        store.save(replace(meta, committed_config=config))
        saved = store.load()
    emit_one(_cmeta_doc(tablet_id, saved), fmt)


@group.command(name="delete")
@click.argument("tablet_id")
@_FS_ROOT
@click.option(
    "--clean-unsafe",
    is_flag=True,
    help="Delete everything, cmeta included, instead of leaving a tombstone that can vote.",
)
@one_line_errors
def delete(tablet_id: str, fs_root: Path, clean_unsafe: bool) -> None:
    """Tombstone a replica (data and WAL moved to the quarantine, cmeta and last-logged op id
    kept).

    With --clean-unsafe, nothing is kept: the server forgets it ever voted in this tablet,
    which is only safe if the tablet's config no longer lists this server.
    """
    kind = DataState.DELETED if clean_unsafe else DataState.TOMBSTONED
    with _locked_root(fs_root) as fs:
        manager = TabletManager(_dirs(fs))
        manager.open_all()
        try:
            manager.delete_tablet(
                _check_tablet_id(tablet_id), kind, reason="nyala local-replica delete"
            )
        finally:
            manager.shutdown()
    click.echo(f"{tablet_id}: {'deleted' if clean_unsafe else 'tombstoned'}")


@group.group(name="quarantine")
def quarantine() -> None:
    """Tombstoned replicas kept under <fs_root>/quarantine."""


def _quarantine_row(entry: QuarantineEntry, now_s: float) -> dict[str, Any]:
    return {
        "name": entry.name,
        "tablet_id": entry.tablet_id,
        "created": datetime.datetime.fromtimestamp(entry.created_s, datetime.UTC).isoformat(),
        "age_s": round(now_s - entry.created_s),
        "size_bytes": entry.size_bytes,
        "path": str(entry.path),
    }


_QUARANTINE_COLUMNS = ["name", "created", "age_s", "size_bytes"]


@quarantine.command(name="list")
@_FS_ROOT
@format_option
@one_line_errors
def quarantine_list(fs_root: Path, fmt: str) -> None:
    """List the quarantined replicas, oldest first."""
    with _locked_root(fs_root) as fs:
        entries = Quarantine(fs.dir("quarantine")).entries()
    now = time.time()
    emit([_quarantine_row(e, now) for e in entries], fmt, _QUARANTINE_COLUMNS)


@quarantine.command(name="purge")
@_FS_ROOT
@click.option("--tablet", "tablet_id", default=None, help="Only this tablet's entries.")
@click.option(
    "--older-than-s", type=click.IntRange(min=0), default=None, help="Only entries this old."
)
@click.option("--all", "purge_all", is_flag=True, help="Every entry (of --tablet, if given).")
@format_option
@one_line_errors
def quarantine_purge(
    fs_root: Path, tablet_id: str | None, older_than_s: int | None, purge_all: bool, fmt: str
) -> None:
    """Remove quarantined replicas: those older than --older-than-s, or --all."""
    if (older_than_s is None) == (not purge_all):
        raise InvalidArgumentError("give exactly one of --older-than-s and --all")
    if tablet_id is not None:
        _check_tablet_id(tablet_id)
    with _locked_root(fs_root) as fs:
        removed = Quarantine(fs.dir("quarantine")).purge(
            older_than_s=older_than_s, tablet_id=tablet_id
        )
    now = time.time()
    emit([_quarantine_row(e, now) for e in removed], fmt, _QUARANTINE_COLUMNS)


@group.group(name="wal")
def wal() -> None:
    """WAL segments."""


@wal.command(name="dump")
@click.argument("path", type=click.Path(path_type=Path, exists=True))
@click.option("--entries/--no-entries", default=True, show_default=True, help="One row per entry.")
@format_option
@one_line_errors
def wal_dump(path: Path, entries: bool, fmt: str) -> None:
    """Print what a WAL segment (or every segment of a WAL directory) holds; read-only."""
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    rows: list[dict[str, Any]] = []
    for file in files:
        if file.name.startswith("."):
            continue
        tablet, seq, file_len, valid_end, footer, batches = _native.wal_dump_segment(
            os.fspath(file)
        )
        summary: dict[str, Any] = {
            "segment": file.name,
            "tablet_id": tablet,
            "sequence": seq,
            "file_bytes": file_len,
            "valid_end": valid_end,
            "closed": footer is not None,
            "entries": sum(len(b[2]) for b in batches),
            "min_index": footer[1] if footer else None,
            "max_index": footer[2] if footer else None,
        }
        if not entries:
            rows.append(summary)
            continue
        for offset, kind, batch_entries, last_kept in batches:
            if kind == "truncate":
                assert last_kept is not None
                rows.append(
                    {
                        "segment": file.name,
                        "offset": offset,
                        "kind": "TRUNCATE",
                        "term": last_kept[0],
                        "index": last_kept[1],
                    }
                )
            for term, index, entry_type, payload_bytes in batch_entries:
                rows.append(
                    {
                        "segment": file.name,
                        "offset": offset,
                        "kind": EntryKind(entry_type).name,
                        "term": term,
                        "index": index,
                        "payload_bytes": payload_bytes,
                    }
                )
    columns = (
        ["segment", "offset", "kind", "term", "index", "payload_bytes"]
        if entries
        else list(rows[0])
        if rows
        else None
    )
    emit(rows, fmt, columns)


__all__ = ["group"]
