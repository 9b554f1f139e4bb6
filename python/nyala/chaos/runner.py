"""One chaos run: a cluster, the workloads, the nemesis, the final read, the checks, and the
summary line.

The summary line is the run's record (it goes into ``docs/reliability.md``)::

    chaos seed=7 duration_s=60 ops ok=812 failed=3 indeterminate=21 \
faults kill-one=2,partition=3 anomalies=0

``anomalies`` must be 0: it counts non-linearizable register keys, lost / duplicated / phantom
set elements, stale set reads, inserts applied twice, and misbehaviour the nemesis saw.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from nyala import errors
from nyala.chaos.cluster import ChaosCluster
from nyala.chaos.history import EventType, History, Operation, counts
from nyala.chaos.linearizability import check_registers
from nyala.chaos.nemesis import ALL_KINDS, Nemesis
from nyala.chaos.set_checker import check_set
from nyala.chaos.workloads import (
    SET_BASE,
    TabletClient,
    Workload,
    check_snapshot_reads,
    schema,
)

log = logging.getLogger(__name__)

TABLET_ID = "c4a05c4a05c4a05c4a05c4a05c4a05c4"
FINAL_READ_DEADLINE_S = 90.0


@dataclass(frozen=True)
class RunConfig:
    """What to run: how long, which faults, which seed."""

    duration_s: float = 60.0
    seed: int = 0
    kinds: tuple[str, ...] = ALL_KINDS
    threads: int = 4
    num_tservers: int = 4
    register_keys: int = 5
    base_dir: Path | None = None
    keep_dir: bool = False
    gap_s: tuple[float, float] = (0.5, 2.0)
    hold_s: tuple[float, float] = (1.0, 4.0)


@dataclass
class RunSummary:
    """The outcome of a run."""

    seed: int
    duration_s: float
    ops: dict[str, int]
    faults: Counter[str]
    anomalies: list[str] = field(default_factory=list)
    register_keys_checked: int = 0
    set_acknowledged: int = 0
    set_recovered: int = 0
    snapshot_reads: int = 0

    def line(self) -> str:
        """The one-line summary."""
        faults = ",".join(f"{k}={n}" for k, n in sorted(self.faults.items())) or "none"
        return (
            f"chaos seed={self.seed} duration_s={self.duration_s:.0f} ops ok={self.ops['ok']}"
            f" failed={self.ops['fail']} indeterminate={self.ops['info']}"
            f" snapshot_reads={self.snapshot_reads} faults {faults}"
            f" anomalies={len(self.anomalies)}"
        )


def expand_register_reads(ops: list[Operation], keys: int) -> list[Operation]:
    """Turns each ``read-all`` (one scan) into one ``read`` per register key, with the
    scan's times: per-key linearizability is what the checker judges."""
    out: list[Operation] = []
    for op in ops:
        if op.f != "read-all":
            out.append(op)
            continue
        for key in range(keys):
            value = op.output.get(key) if op.status is EventType.OK else None
            out.append(
                Operation(
                    op.process, "read", key, None, value, op.status, op.invoke_ns, op.complete_ns
                )
            )
    return out


def final_read(cluster: ChaosCluster) -> list[tuple[int, int]]:
    """A scan after the faults stopped, retried until the healed cluster answers."""
    client = TabletClient(cluster, "chaos-final-read")
    deadline = time.monotonic() + FINAL_READ_DEADLINE_S
    while True:
        try:
            return client.scan()
        except errors.NyalaError as exc:
            if time.monotonic() > deadline:
                raise errors.TimedOutError(
                    f"final read failed for {FINAL_READ_DEADLINE_S} s ({exc}); "
                    f"members: {describe_members(cluster)}"
                ) from exc
            time.sleep(0.2)


def describe_members(cluster: ChaosCluster) -> str:
    """Each member's view of the tablet (for a failure message)."""
    views = []
    for ts in cluster.members:
        try:
            state = cluster.cstate(ts)
            cstate = state.cstate
            voters = [p.permanent_uuid[:6] for p in cstate.committed_config.peers]
            view = (
                f"term={cstate.current_term} leader={cstate.leader_uuid[:6]} "
                f"committed={state.committed_index} config={voters}"
            )
        except errors.NyalaError as exc:
            view = f"unreachable ({exc.__class__.__name__})"
        views.append(f"{ts.name}/{(ts.uuid or '?')[:6]} pid={ts.pid} {view}")
    return "; ".join(views)


def run(config: RunConfig) -> RunSummary:
    """Runs the workloads under the nemesis for ``config.duration_s`` and checks the result."""
    with ChaosCluster(
        num_tservers=config.num_tservers, base_dir=config.base_dir, keep_dir=config.keep_dir
    ) as cluster:
        cluster.create_tablet(TABLET_ID, schema())
        cluster.leader(timeout_s=30.0)
        workload = Workload(
            cluster, config.seed, threads=config.threads, register_keys=config.register_keys
        )
        nemesis = Nemesis(
            cluster, config.seed, config.kinds, gap_s=config.gap_s, hold_s=config.hold_s
        )
        started = time.monotonic()
        workload.start()
        nemesis.start()
        try:
            time.sleep(config.duration_s)
        finally:
            nemesis.stop()
            nemesis.heal_all()
            workload.stop()
        elapsed = time.monotonic() - started
        rows = final_read(cluster)
        if config.keep_dir:
            save_history(cluster.mini.base_dir / "history-registers.jsonl", workload.registers)
            save_history(cluster.mini.base_dir / "history-set.jsonl", workload.set)
    return _check(config, workload, nemesis, rows, elapsed)


def save_history(path: Path, history: History) -> None:
    """Writes the events as JSON lines, for a post-mortem of an anomaly."""
    with path.open("w") as out:
        for event in history.events():
            record = {
                "type": event.type.value,
                "process": event.process,
                "time_ns": event.time_ns,
                "f": event.f,
                "key": event.key,
                "value": event.value,
            }
            out.write(json.dumps(record, default=repr) + "\n")


def _check(
    config: RunConfig,
    workload: Workload,
    nemesis: Nemesis,
    rows: list[tuple[int, int]],
    elapsed_s: float,
) -> RunSummary:
    register_ops = workload.registers.operations()
    set_ops = workload.set.operations()
    ops = counts(
        [op for op in register_ops if op.f == "write"] + [op for op in set_ops if op.f == "add"]
    )
    summary = RunSummary(config.seed, elapsed_s, ops, nemesis.faults)
    linear = check_registers(expand_register_reads(register_ops, config.register_keys))
    summary.register_keys_checked = len(linear.keys)
    for key in linear.keys:
        if key.valid is False:
            summary.anomalies.append(f"register {key.key} not linearizable (near {key.culprit})")
        elif key.valid is None:
            summary.anomalies.append(f"register {key.key}: checker gave up ({key.states} states)")
    # The final read of the registers is one more read, after everything.
    result = check_set(set_ops, [i for i, _ in rows if i >= SET_BASE])
    summary.set_acknowledged, summary.set_recovered = result.acknowledged, result.recovered
    for name in ("lost", "duplicated", "phantom"):
        for element in getattr(result, name):
            summary.anomalies.append(f"set: {name} {element}")
    if result.stale_reads:
        summary.anomalies.append(f"set: {result.stale_reads} stale reads")
    if result.future_reads:
        summary.anomalies.append(f"set: {result.future_reads} reads saw unwritten elements")
    ids = [i for i, _ in rows]
    if len(ids) != len(set(ids)):
        summary.anomalies.append("final read: duplicate keys")
    for element in workload.stats.double_applied:
        summary.anomalies.append(f"set: insert of {element} applied twice")
    summary.snapshot_reads = len(workload.stats.snapshot_reads)
    summary.anomalies.extend(check_snapshot_reads(workload.stats))
    summary.anomalies.extend(nemesis.anomalies)
    if nemesis.error is not None:
        summary.anomalies.append(f"nemesis crashed: {nemesis.error!r}")
    return summary
