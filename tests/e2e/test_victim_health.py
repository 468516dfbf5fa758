"""Victim health closes the loop on real cgroups: measured run-queue latency moves and judges.

A latency container (short bursts, sleeps) is pinned with a busy neighbour on one CPU. Real
collectors (cgroup_stats, runqlat BPF) fill the snapshot each cycle, the real planner decides,
and its cpuset actions (moves and rollbacks) are written to the real cgroups, as the agent does.
The topology is `perfbalance.topology.synthetic` with this machine's CPU count (one core per
CPU, one NUMA node): a stand-in for sysfs discovery that does not change what is measured.

The machine is shared with other jobs, so assertions are ratios with generous margins, the test
cgroups run under a high-weight parent (tests/victimload.py), and no wall-clock time is asserted.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from perfbalance.cgroupfs import Cgroupfs
from collectors.cgroupstats import CgroupStatsCollector
from collectors.config import RunqlatConfig
from collectors.runqlat import RunqlatCollector
from perfbalance.cpuset import CpuSet
from perfbalance.host import HostPaths
from perfbalance.model import Container, ContainerSample, Plan, Snapshot
from perfbalance.topology import synthetic
from rebalancer import RebalancerConfig, plan
from rebalancer.health import measure
from rebalancer.latency import measured_loss
from rebalancer.state import PlannerState
from tests.victimload import BUSY, LATENCY, Group, bounded

pytestmark = [pytest.mark.root, pytest.mark.bpf, pytest.mark.slow]

INTERVAL = 2.0
CFG = RebalancerConfig(latency_targets={"lat": 0.002}, settle_seconds=3 * INTERVAL, dwell_seconds=0.0,
                       smoothing_alpha=1.0, cooldown_seconds=600.0)


class MiniAgent:
    """collect -> snapshot -> plan -> write cpusets, every INTERVAL seconds (the agent's cycle)."""

    def __init__(self, group: Group, containers: list[Container], run_dir: str) -> None:
        self.group, self.containers = group, {c.id: c for c in containers}
        self.topology = synthetic(packages=1, cores_per_node=os.cpu_count() or 2, threads_per_core=1)
        self.collectors: list[Any] = [CgroupStatsCollector(cgroupfs=group.fs),
                                      RunqlatCollector(config=RunqlatConfig(max_keys=256),
                                                       host=HostPaths(run_dir=run_dir), cgroupfs=group.fs)]
        self.state: PlannerState | None = None
        self.plans: list[Plan] = []
        self.metrics: list[dict[str, dict[str, float]]] = []

    def start(self) -> None:
        for c in self.collectors:
            st = c.start()
            if not st.up:
                pytest.skip(f"{c.name} unavailable: {st.reason}")
        self._collect()

    def close(self) -> None:
        for c in self.collectors:
            c.close()

    def _collect(self) -> dict[str, dict[str, float]]:
        now, out = time.time(), {cid: {} for cid in self.containers}
        for col in self.collectors:
            for cid, m in col.collect(list(self.containers.values()), now).items():
                out[cid].update(m)
        return out

    def cycle(self) -> Plan:
        time.sleep(INTERVAL)
        metrics = self._collect()
        self.metrics.append(metrics)
        snap = Snapshot(time=time.time(), window=INTERVAL, node="victim-test", topology=self.topology,
                        containers=tuple(ContainerSample(container=c, metrics=metrics[cid])
                                         for cid, c in self.containers.items()))
        p = plan(snap, CFG, self.state, snap.time)
        self.state = p.state
        self.plans.append(p)
        for a in p.actions:
            if a.kind in ("cpuset", "rollback"):
                self.pin(self.containers[a.container], a.to)
        return p

    def pin(self, c: Container, cpus: str) -> None:
        self.group.fs.write(c.cgroup, "cpuset", "cpuset.cpus", cpus)
        self.containers[c.id] = replace(c, cpuset=CpuSet.parse(cpus))


@pytest.fixture
def group() -> Iterator[Group]:
    g = Group(Cgroupfs(), "e2e")
    try:
        yield g
    finally:
        g.close()


def start(group: Group, tmp_path: Any, *, quota: bool) -> MiniAgent:
    """lat and hog (two busy loops) pinned together on the last CPU. Without a quota hog has 32x
    lat's weight (a big batch pod beside a small service): lat waits behind it. With one, lat's
    own quota (10 ms per 100 ms, half of what it wants) holds it back and hog has 1/16 of its
    weight (lat preempts it as soon as it may run), so lat gets its quota whether it shares the
    CPU or not: a move cannot help."""
    lat, hog = group.new("lat", shares=1024), group.new("hog", shares=2 if quota else 32768)
    if quota:
        group.fs.write(lat.cgroup, "cpu", "cpu.cfs_period_us", "100000")
        group.fs.write(lat.cgroup, "cpu", "cpu.cfs_quota_us", "10000")
    agent = MiniAgent(group, [lat, hog], str(tmp_path))
    last = str((os.cpu_count() or 2) - 1)
    for c in (lat, hog):
        agent.pin(c, last)
    for _ in range(2):
        group.run(hog, bounded(BUSY, 120))
    group.run(lat, bounded(LATENCY, 120))
    agent.start()
    return agent


def run_until_judged(agent: MiniAgent, cycles: int = 12) -> tuple[Plan, dict[str, Any]]:
    """Cycles until the first decision about `lat` has been evaluated: (deciding plan, note)."""
    decided: Plan | None = None
    for _ in range(cycles):
        p = agent.cycle()
        if decided is None and any(a.container == "lat" or "lat" in a.victims for a in p.actions):
            decided = p
        note = next((c for c in p.considered if c.get("kind") == "evaluation" and "realized" in c), None)
        if decided is not None and note is not None:
            return decided, note
    raise AssertionError(f"no decision judged in {cycles} cycles: {[p.considered[:3] for p in agent.plans]}")


def p99(m: dict[str, dict[str, float]]) -> float:
    return m["lat"]["runqueue_latency_p99_seconds"]


def mean(m: dict[str, dict[str, float]]) -> float:
    return m["lat"]["runqueue_latency_mean_seconds"]


def loss(m: dict[str, float], cid: str) -> float:
    """A container's measured health loss in one window (the planner smooths with alpha 1)."""
    h = measure(m, min_waits=CFG.health_min_waits)
    assert h is not None
    return measured_loss(h, CFG.latency_targets.get(cid), cost=CFG.latency_breach_cost, cap=CFG.latency_breach_cap)


@pytest.mark.timeout(240)
def test_separating_the_victim_drops_its_measured_p99_and_the_gain_is_that_measurement(
        group: Group, tmp_path: Any) -> None:
    agent = start(group, tmp_path, quota=False)
    try:
        decided, note = run_until_judged(agent)
    finally:
        agent.close()
    at = agent.plans.index(decided)
    before, after = agent.metrics[at], agent.metrics[-1]
    assert not agent.containers["lat"].cpuset & agent.containers["hog"].cpuset, "not separated"
    assert p99(after) * 3 < p99(before), (p99(before), p99(after))
    assert mean(after) * 5 < mean(before), (mean(before), mean(after))
    assert note["method"] == "health" and note["rejected"] == "kept: the move helped", note
    pending = next(p for p in decided.state.pending if p.decision == note["decision"])
    assert "lat" in pending.health_before, pending
    # the realized gain is the measured drop of the victims' health loss, window by window
    assert note["realized"] == pytest.approx(sum(b - loss(after[v], v) for v, b in pending.health_before.items()),
                                             rel=1e-4, abs=1e-4)
    assert note["realized"] > 0.25 * note["predicted"]
    assert not [a for p in agent.plans for a in p.actions if a.kind == "rollback"]


@pytest.mark.timeout(240)
def test_a_move_that_cannot_help_a_quota_throttled_victim_is_rolled_back_by_the_measurement(
        group: Group, tmp_path: Any) -> None:
    agent = start(group, tmp_path, quota=True)
    try:
        decided, note = run_until_judged(agent)
    finally:
        agent.close()
    moved = {a.container: a.frm for a in decided.actions if a.kind == "cpuset"}
    rollbacks = {a.container: a for p in agent.plans for a in p.actions if a.kind == "rollback"}
    assert note["method"] == "health" and note["rejected"] == "rolled back", note
    assert note["realized"] < 0.25 * note["predicted"], note
    assert {c: a.to for c, a in rollbacks.items()} == moved  # back where they were
    reason = next(iter(rollbacks.values())).reason
    assert "lat throttled" in reason and "own CPU quota" in reason, reason
    assert agent.containers["lat"].cpuset & agent.containers["hog"].cpuset, "rollback not in force"
