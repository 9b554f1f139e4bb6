"""Scripted Raft scenarios with golden output (STYLE.md 10).

A scenario file is a sequence of blocks::

    # comments, kept as they are
    command arg key=value
    ----
    expected output (never empty: "ok" when nothing happened)

separated by blank lines. ``run_scenario`` replays the commands against a ``SimCluster`` and
returns the file as it should be; the test compares it with the file on disk, and
``pytest tests/scenarios --rewrite`` writes it back.

Commands (``a``, ``b`` are replica ids; times in ms):

- ``cluster voters=a,b,c [non-voters=d] [promote=d] [heartbeat-ms=500] [batch-bytes=N]
  [inflight-bytes=N] [quiesce=N]``: a new cluster at term 0, nobody leading (``quiesce``: a
  leader quiesces after N idle heartbeat rounds; default never)
- ``bootstrap voters=a,b,c [leader=a] [other cluster options]``: ``cluster``, ``campaign``
  ``leader`` (default: the first voter), ``deliver`` until nothing is queued, all without
  output; prints only the final ``status`` of every replica (the clock is still at 0). For
  scripts whose subject starts after a routine election; a script about the election itself
  spells out the three commands
- ``add-node d``: a new empty replica outside the config
- ``campaign a`` / ``run-election a``: an election with pre-vote / RunLeaderElection
- ``tick [ms] [a,b|-]``: advance the clock (default one heartbeat) and fire the timers of the
  named replicas (all by default; ``-`` for none)
- ``deliver [from=a] [to=b] [once]``: deliver matching queued messages until none are left
  (``once``: only those queued now), printing each; ``(lost)`` when partitioned or down
- ``drop [from=a] [to=b]``: discard queued messages
- ``partition a,b c`` / ``heal``: groups that can talk (unnamed replicas form one more group)
- ``crash a`` / ``restart a``: stop, losing the non-durable log tail / start from cmeta + log
- ``sync a [index]`` / ``auto-sync a on|off``: make the log durable / after every append
- ``propose a text``, ``read a id``, ``transfer a [b]``, ``step-down a``
- ``add-peer a d [non-voter] [promote] [cas=N]``, ``remove-peer a d [cas=N]``,
  ``modify-peer a d voter|non-voter [promote] [replace] [cas=N]``: ChangeConfig on ``a``
- ``unsafe-config a a,b``: UnsafeChangeConfig on ``a`` keeping VOTERs a, b
- ``run ms``: tick in 100 ms steps, delivering everything; prints the events
- ``server-heartbeat [a,b]``: the named (default: all running) replicas' servers send their
  server heartbeat (what each says of its quiesced replica) to every other connected replica;
  prints the replicas that are quiesced afterwards and those that woke
- ``check-silence``: replicas whose quiesced peers' servers were not heard for the minimum
  election timeout wake; prints those that woke
- ``status [a,b]``, ``timers``, ``log a``, ``applied a``: inspection (``quiesced`` is shown
  when a replica is)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nyala.consensus import ChangeType, ConfigChange, MemberType, RaftOptions, RaftPeer
from nyala.consensus.memory_log import LogEntry
from nyala.consensus.messages import (
    AppendRequest,
    AppendResponse,
    AppendStatus,
    Message,
    TimeoutNow,
    VoteRequest,
    VoteResponse,
)
from nyala.consensus.runtime.cmeta_store import FileCmetaStore
from nyala.consensus.sim_cluster import SimCluster
from nyala.consensus.types import EntryKind, decode_config
from nyala.errors import CasFailedError, NyalaError

SEPARATOR = "----"
DELIVER_ROUNDS_MAX = 10_000  # a scenario that never quiesces is a bug, not a hang
CLUSTER_OPTIONS = frozenset(
    ["voters", "non-voters", "promote", "heartbeat-ms", "batch-bytes", "inflight-bytes", "quiesce"]
)


@dataclass
class Block:
    """One command of a scenario file, with its comments and golden output."""

    comments: list[str]
    command: str
    expected: list[str]


def parse(text: str) -> list[Block]:
    """Splits a scenario file into blocks."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        comments: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith("#")):
            if lines[i].startswith("#"):
                comments.append(lines[i])
            i += 1
        if i >= len(lines):
            break
        command = lines[i]
        i += 1
        if i >= len(lines) or lines[i] != SEPARATOR:
            raise ValueError(f"line {i}: expected {SEPARATOR!r} after command {command!r}")
        i += 1
        expected: list[str] = []
        while i < len(lines) and lines[i].strip():
            expected.append(lines[i])
            i += 1
        blocks.append(Block(comments, command, expected))
    return blocks


def render(blocks: list[Block], outputs: list[list[str]]) -> str:
    """The scenario file with ``outputs`` as golden output."""
    parts = []
    for block, output in zip(blocks, outputs, strict=True):
        parts.append("\n".join([*block.comments, block.command, SEPARATOR, *output]))
    return "\n\n".join(parts) + "\n"


def run_scenario(text: str, tmp_dir: Path) -> str:
    """Replays a scenario and returns the file with the actual output."""
    blocks = parse(text)
    runner = Runner(tmp_dir)
    outputs = [runner.run(block.command) or ["ok"] for block in blocks]
    return render(blocks, outputs)


def describe(msg: Message) -> str:
    """One line for a message."""
    head = f"{msg.src}->{msg.dest}"
    match msg:
        case VoteRequest():
            kind = "PreVote" if msg.pre_election else "Vote"
            extra = " ignore-live-leader" if msg.ignore_live_leader else ""
            return f"{head} {kind} term={msg.term} last={msg.last_op_id}{extra}"
        case VoteResponse():
            kind = "PreVoteResp" if msg.pre_election else "VoteResp"
            verdict = (
                "granted" if msg.granted else f"denied {msg.denial.value if msg.denial else ''}"
            )
            return f"{head} {kind} term={msg.term} {verdict}"
        case AppendRequest():
            entries = "heartbeat"
            if msg.entries is not None:
                entries = f"entries={msg.entries.first_op_id}..{msg.entries.last_op_id}"
            quiesce = " quiesce" if msg.quiesce else ""
            return (
                f"{head} Append term={msg.term} prev={msg.preceding} {entries} "
                f"commit={msg.committed_index}{quiesce}"
            )
        case AppendResponse():
            if msg.status is AppendStatus.OK:
                detail = f"last={msg.last_received} durable={msg.durable_index}"
            elif msg.status is AppendStatus.LOG_MISMATCH:
                detail = f"hint={msg.hint_index}"
            else:
                detail = ""
            return f"{head} AppendResp term={msg.term} {msg.status.value} {detail}".rstrip()
        case TimeoutNow():
            return f"{head} TimeoutNow term={msg.term}"


def describe_entry(entry: LogEntry) -> str:
    """One line for a log entry."""
    if entry.kind is EntryKind.WRITE:
        return f"{entry.op_id} WRITE {entry.payload.decode()}"
    if entry.kind is EntryKind.CONFIG_CHANGE:
        return f"{entry.op_id} CONFIG {decode_config(entry.payload).describe()}"
    return f"{entry.op_id} NO_OP"


class Runner:
    """Executes scenario commands against one ``SimCluster``."""

    def __init__(self, tmp_dir: Path) -> None:
        self.tmp_dir = tmp_dir
        self._cluster: SimCluster | None = None
        self._commands: dict[str, Callable[[list[str], dict[str, str]], list[str]]] = {
            name.removeprefix("cmd_").replace("_", "-"): getattr(self, name)
            for name in dir(self)
            if name.startswith("cmd_")
        }

    @property
    def cluster(self) -> SimCluster:
        assert self._cluster is not None, "the scenario must start with 'cluster'"
        return self._cluster

    def run(self, command: str) -> list[str]:
        words = command.split()
        name, args = words[0], words[1:]
        positional = [a for a in args if "=" not in a]
        named = dict(a.split("=", 1) for a in args if "=" in a)
        handler = self._commands.get(name)
        if handler is None:
            raise ValueError(f"unknown scenario command {name!r}")
        try:
            out = handler(positional, named)
        except CasFailedError as e:
            out = [f"error: CasFailedError: {e} (committed_opid_index={e.committed_opid_index})"]
        except NyalaError as e:
            out = [f"error: {type(e).__name__}: {e}"]
        finally:
            self._process_all()  # a refused request may still have produced effects
        if self._cluster is not None:
            out = out + self.cluster.drain_events()
        return out

    def _process_all(self) -> None:
        if self._cluster is None:
            return
        for node in self.cluster.nodes.values():
            if node.alive:
                self.cluster.process(node)

    def _settle(self) -> None:
        """What ``run`` does after a command, with the events discarded."""
        self._process_all()
        self.cluster.drain_events()

    # --- commands ---------------------------------------------------------------------------

    def cmd_cluster(self, args: list[str], kw: dict[str, str]) -> list[str]:
        unknown = sorted(kw.keys() - CLUSTER_OPTIONS)
        if args or unknown:
            raise ValueError(f"cluster: unknown arguments {args + unknown}")
        voters = kw["voters"].split(",")
        non_voters = kw["non-voters"].split(",") if "non-voters" in kw else []
        promote = kw["promote"].split(",") if "promote" in kw else []
        options = RaftOptions(
            heartbeat_interval_ms=int(kw.get("heartbeat-ms", "500")),
            batch_bytes_max=int(kw.get("batch-bytes", str(1024 * 1024))),
            peer_inflight_bytes_max=int(kw.get("inflight-bytes", str(4 * 1024 * 1024))),
            failed_follower_timeout_ms=5_000,
            quiesce_after_idle_heartbeats=int(kw.get("quiesce", "0")),
        )
        self._cluster = SimCluster(
            voters,
            non_voters,
            promote=promote,
            options=options,
            store_factory=lambda uuid: FileCmetaStore(self.tmp_dir / f"cmeta-{uuid}"),
        )
        self.cluster.drain_events()
        return []

    def cmd_bootstrap(self, args: list[str], kw: dict[str, str]) -> list[str]:
        """``cluster``, ``campaign``, ``deliver`` with each step settled as ``run`` settles a
        command, so everything after it replays exactly as after the three commands."""
        options = dict(kw)
        leader = options.pop("leader", kw["voters"].split(",")[0])
        self.cmd_cluster(args, options)
        self._settle()
        self.cmd_campaign([leader], {})
        self._settle()
        self.cmd_deliver([], {})
        self._settle()
        core = self.cluster.node(leader).running()
        # deliver left no message behind; a failed election belongs in a script that shows it
        assert core.role.value == "LEADER", f"bootstrap: {leader} did not become leader"
        return self.cmd_status([], {})

    def cmd_add_node(self, args: list[str], kw: dict[str, str]) -> list[str]:
        self.cluster.add_node(args[0])
        return []

    def cmd_campaign(self, args: list[str], kw: dict[str, str]) -> list[str]:
        node = self.cluster.node(args[0])
        node.running().campaign()
        self.cluster.process(node)
        return []

    def cmd_run_election(self, args: list[str], kw: dict[str, str]) -> list[str]:
        node = self.cluster.node(args[0])
        node.running().run_leader_election()
        self.cluster.process(node)
        return []

    def cmd_tick(self, args: list[str], kw: dict[str, str]) -> list[str]:
        delta_ms = self.cluster.options.heartbeat_interval_ms
        uuids = None
        for arg in args:
            if arg.isdigit():
                delta_ms = int(arg)
            elif arg == "-":
                uuids = []  # only the clock moves
            else:
                uuids = arg.split(",")
        self.cluster.tick(delta_ms, uuids)
        return [f"time={self.cluster.clock.now_ms()}"]

    def cmd_deliver(self, args: list[str], kw: dict[str, str]) -> list[str]:
        def matches(msg: Message) -> bool:
            return ("from" not in kw or msg.src == kw["from"]) and (
                "to" not in kw or msg.dest == kw["to"]
            )

        out: list[str] = []
        budget = len(self.cluster.queue) if "once" in args else DELIVER_ROUNDS_MAX
        while budget > 0:
            position = next((i for i, m in enumerate(self.cluster.queue) if matches(m)), None)
            if position is None:
                break
            budget -= 1
            msg, arrived = self.cluster.deliver_one(position)
            out.append(describe(msg) + ("" if arrived else "  (lost)"))
            out.extend(self.cluster.drain_events())
        assert budget > 0 or "once" in args, "messages kept coming: the scenario never settles"
        return out

    def cmd_drop(self, args: list[str], kw: dict[str, str]) -> list[str]:
        queue = self.cluster.queue
        keep = [
            m
            for m in queue
            if ("from" in kw and m.src != kw["from"]) or ("to" in kw and m.dest != kw["to"])
        ]
        dropped = len(queue) - len(keep)
        self.cluster.queue = keep
        return [f"dropped {dropped} messages"]

    def cmd_partition(self, args: list[str], kw: dict[str, str]) -> list[str]:
        self.cluster.partition([a.split(",") for a in args])
        return []

    def cmd_heal(self, args: list[str], kw: dict[str, str]) -> list[str]:
        self.cluster.heal()
        return []

    def cmd_crash(self, args: list[str], kw: dict[str, str]) -> list[str]:
        self.cluster.crash(args[0])
        return []

    def cmd_restart(self, args: list[str], kw: dict[str, str]) -> list[str]:
        self.cluster.restart(args[0])
        return []

    def cmd_sync(self, args: list[str], kw: dict[str, str]) -> list[str]:
        self.cluster.sync(args[0], int(args[1]) if len(args) > 1 else None)
        return []

    def cmd_auto_sync(self, args: list[str], kw: dict[str, str]) -> list[str]:
        self.cluster.node(args[0]).auto_sync = args[1] == "on"
        return []

    def cmd_propose(self, args: list[str], kw: dict[str, str]) -> list[str]:
        node = self.cluster.node(args[0])
        op_id = node.running().propose(" ".join(args[1:]).encode())
        self.cluster.process(node)
        return [f"{args[0]}: proposed {op_id}"]

    def cmd_read(self, args: list[str], kw: dict[str, str]) -> list[str]:
        node = self.cluster.node(args[0])
        node.running().read(int(args[1]))
        self.cluster.process(node)
        return []

    def cmd_transfer(self, args: list[str], kw: dict[str, str]) -> list[str]:
        node = self.cluster.node(args[0])
        successor = node.running().transfer_leadership(args[1] if len(args) > 1 else None)
        self.cluster.process(node)
        return [f"{args[0]}: transferring leadership to {successor}"]

    def cmd_step_down(self, args: list[str], kw: dict[str, str]) -> list[str]:
        node = self.cluster.node(args[0])
        node.running().step_down()
        self.cluster.process(node)
        return []

    def _change(self, leader: str, change: ConfigChange) -> list[str]:
        node = self.cluster.node(leader)
        op_id = node.running().change_config(change)
        self.cluster.process(node)
        return [f"{leader}: config change appended at {op_id}"]

    def cmd_add_peer(self, args: list[str], kw: dict[str, str]) -> list[str]:
        member_type = MemberType.NON_VOTER if "non-voter" in args else MemberType.VOTER
        peer = RaftPeer(args[1], f"{args[1]}:7050", member_type, promote="promote" in args)
        cas = int(kw["cas"]) if "cas" in kw else None
        return self._change(args[0], ConfigChange(ChangeType.ADD_PEER, peer, cas))

    def cmd_remove_peer(self, args: list[str], kw: dict[str, str]) -> list[str]:
        cas = int(kw["cas"]) if "cas" in kw else None
        peer = RaftPeer(args[1], "")
        return self._change(args[0], ConfigChange(ChangeType.REMOVE_PEER, peer, cas))

    def cmd_modify_peer(self, args: list[str], kw: dict[str, str]) -> list[str]:
        member_type = MemberType.NON_VOTER if "non-voter" in args else MemberType.VOTER
        peer = RaftPeer(
            args[1], "", member_type, promote="promote" in args, replace="replace" in args
        )
        cas = int(kw["cas"]) if "cas" in kw else None
        return self._change(args[0], ConfigChange(ChangeType.MODIFY_PEER, peer, cas))

    def cmd_unsafe_config(self, args: list[str], kw: dict[str, str]) -> list[str]:
        node = self.cluster.node(args[0])
        op_id = node.running().unsafe_change_config(args[1].split(","))
        self.cluster.process(node)
        return [f"{args[0]}: unsafe config appended at {op_id}"]

    def cmd_run(self, args: list[str], kw: dict[str, str]) -> list[str]:
        total_ms = int(args[0])
        step_ms = 100
        out: list[str] = []
        for _ in range(0, total_ms, step_ms):
            self.cluster.tick(step_ms)
            out.extend(self.cluster.drain_events())
            rounds = 0
            while self.cluster.queue:
                self.cluster.deliver_one()
                out.extend(self.cluster.drain_events())
                rounds += 1
                assert rounds < DELIVER_ROUNDS_MAX, "messages kept coming"
        out.append(f"time={self.cluster.clock.now_ms()}")
        return out

    def cmd_status(self, args: list[str], kw: dict[str, str]) -> list[str]:
        uuids = args[0].split(",") if args else sorted(self.cluster.nodes)
        out = []
        for uuid in uuids:
            node = self.cluster.node(uuid)
            if node.core is None:
                out.append(f"{uuid} DOWN last={node.log.last_op_id()}")
                continue
            s = node.core.status()
            pending = f" pending={s.pending_config.describe()}" if s.pending_config else ""
            transfer = f" transfer->{s.transfer_target}" if s.transfer_target else ""
            quiesced = " quiesced" if node.core.quiesced else ""
            out.append(
                f"{uuid} {s.role.value} term={s.term} leader={s.leader_uuid or '-'} "
                f"vote={s.voted_for or '-'} last={s.last_op_id} durable={s.durable_index} "
                f"commit={s.commit_index} applied={s.last_applied} "
                f"config={s.committed_config.describe()}{pending}{transfer}{quiesced}"
            )
        return out

    def cmd_timers(self, args: list[str], kw: dict[str, str]) -> list[str]:
        out = []
        now = self.cluster.clock.now_ms()
        for uuid, node in sorted(self.cluster.nodes.items()):
            if node.core is not None and node.core.role.value != "LEADER":
                core = node.core
                if core.quiesced:
                    out.append(f"{uuid} quiesced: no election timer")
                    continue
                out.append(
                    f"{uuid} election in {core.election_deadline_ms - now} ms "
                    f"(failed elections: {core.failed_elections})"
                )
        return out

    def cmd_server_heartbeat(self, args: list[str], kw: dict[str, str]) -> list[str]:
        before = self._quiesced()
        running = [u for u, n in sorted(self.cluster.nodes.items()) if n.alive]
        for uuid in args[0].split(",") if args else running:
            self.cluster.server_heartbeat(uuid)
        return self._quiescence_change(before)

    def cmd_check_silence(self, args: list[str], kw: dict[str, str]) -> list[str]:
        before = self._quiesced()
        self.cluster.check_silence()
        return self._quiescence_change(before)

    def _quiesced(self) -> set[str]:
        return {u for u, n in self.cluster.nodes.items() if n.core is not None and n.core.quiesced}

    def _quiescence_change(self, before: set[str]) -> list[str]:
        after = self._quiesced()
        out = [f"{u}: woke" for u in sorted(before - after)]
        return [*out, f"quiesced: {','.join(sorted(after)) or '-'}"]

    def cmd_log(self, args: list[str], kw: dict[str, str]) -> list[str]:
        entries = self.cluster.node(args[0]).log.entries()
        return [describe_entry(e) for e in entries] or ["(empty)"]

    def cmd_applied(self, args: list[str], kw: dict[str, str]) -> list[str]:
        applied = self.cluster.node(args[0]).applied
        return [describe_entry(e) for e in applied] or ["(nothing applied)"]
