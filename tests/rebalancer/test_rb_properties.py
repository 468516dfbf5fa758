"""Invariants on random snapshots of random synthetic topologies (hypothesis, modest counts)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfbalance.cpuset import CpuSet
from perfbalance.model import Snapshot
from rebalancer import RebalancerConfig, plan
from rebalancer.constraints import violations

from rb_builders import SKYLAKE, sample, snap, topo

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CFG = RebalancerConfig(max_moves_per_cycle=50)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    t = topo(cores=draw(st.integers(1, 4)), threads=draw(st.integers(1, 2)),
             packages=draw(st.integers(1, 2)), l3=draw(st.integers(1, 2)),
             model=draw(st.sampled_from([SKYLAKE, "AMD EPYC"])))
    online = sorted(t.online.ids)
    reserved = set(draw(st.lists(st.sampled_from(online), max_size=1)))
    dedicated = draw(st.lists(st.sampled_from([c for c in online if c not in reserved] or online),
                              max_size=1, unique=True))
    samples = []
    for i in range(draw(st.integers(1, 6))):
        exclusive = i == 0 and bool(dedicated)
        cpus = set(dedicated) if exclusive else set(draw(st.lists(st.sampled_from(online), min_size=1, unique=True)))
        metrics = {"cpu_usage_cores": draw(st.floats(0, 2)),
                   "avx512_heavy": float(draw(st.booleans()))}
        if draw(st.booleans()):
            metrics.update(llc_misses_per_second=draw(st.floats(0, 5e7)), llc_mpki=draw(st.floats(0, 40)),
                           memory_bandwidth_bytes_per_second=draw(st.floats(0, 5e10)))
        samples.append(sample(f"c{i}", str(CpuSet(cpus)), exclusive=exclusive,
                              request=draw(st.integers(0, 1500)), **metrics))
    exclusive = {("pod-c0", "c0"): str(CpuSet(dedicated))} if dedicated else None
    return snap(t, *samples, reserved=str(CpuSet(reserved)), exclusive=exclusive)


def applied(s: Snapshot, actions) -> Snapshot:  # type: ignore[no-untyped-def]
    to = {a.container: a for a in actions if a.kind == "cpuset"}
    return replace(s, containers=tuple(
        replace(c, container=replace(c.container, cpuset=CpuSet.parse(to[c.id].to),
                                     mems=CpuSet.parse(to[c.id].mems))) if c.id in to else c
        for c in s.containers))


@SETTINGS
@given(snapshots())
def test_no_constraint_is_ever_violated(s: Snapshot) -> None:
    assert violations(s, plan(s, CFG, None, s.time)) == []


@SETTINGS
@given(snapshots())
def test_planning_on_the_planned_state_proposes_nothing(s: Snapshot) -> None:
    p1 = plan(s, CFG, None, s.time)
    p2 = plan(applied(s, p1.actions), CFG, p1.state, s.time)
    assert p2.actions == ()


@SETTINGS
@given(snapshots())
def test_same_input_same_plan(s: Snapshot) -> None:
    a, b = plan(s, CFG, None, s.time), plan(s, CFG, None, s.time)
    assert a.actions == b.actions and a.considered == b.considered and a.state == b.state
