"""Invariants on random snapshots of random synthetic topologies (hypothesis, modest counts).

Containers share pods at random, and some pods run in a VM sandbox (Kata, KubeVirt) with random
CPU limits, so that `violations` also checks the VM rules: capacity from the pod's vCPUs,
VM pods moved whole, vCPUs per host NUMA node kept."""

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
CFG = RebalancerConfig(max_moves_per_cycle=50, vm_overhead_mcpu=250)


@st.composite
def snapshots(draw: st.DrawFn, *, vm_room: bool = False) -> Snapshot:
    """`vm_room`: two sockets with two L3 domains each, where a VM pod has somewhere to go on its
    own NUMA node (elsewhere nearly every VM move is refused for leaving its node)."""
    t = topo(cores=draw(st.integers(2 if vm_room else 1, 4)), threads=draw(st.integers(1, 2)),
             packages=2 if vm_room else draw(st.integers(1, 2)),
             l3=2 if vm_room else draw(st.integers(1, 2)),
             model=draw(st.sampled_from([SKYLAKE, "AMD EPYC"])))
    online = sorted(t.online.ids)
    reserved = set(draw(st.lists(st.sampled_from(online), max_size=1)))
    dedicated = draw(st.lists(st.sampled_from([c for c in online if c not in reserved] or online),
                              max_size=1, unique=True))
    some_cpus = st.lists(st.sampled_from(online), min_size=1, unique=True).map(set)
    vm_pods = {f"pod{p}": draw(st.sampled_from(["", "", "kata", "kubevirt"])) for p in range(3)}
    pod_cpus = {p: set(draw(st.lists(st.sampled_from(online), min_size=1, max_size=2, unique=True)))
                for p in vm_pods}  # a VM pod's containers usually share one (small, so it can move)
    samples = []
    for i in range(draw(st.integers(1, 6))):
        pod = draw(st.sampled_from(sorted(vm_pods)))
        exclusive = i == 0 and bool(dedicated)
        shares = bool(vm_pods[pod]) and draw(st.integers(0, 3)) > 0
        cpus = set(dedicated) if exclusive else pod_cpus[pod] if shares else draw(some_cpus)
        metrics = {"cpu_usage_cores": draw(st.floats(0, 2)),
                   "avx512_heavy": float(draw(st.booleans()))}
        if draw(st.booleans()):
            metrics.update(llc_misses_per_second=draw(st.floats(0, 5e7)), llc_mpki=draw(st.floats(0, 40)),
                           memory_bandwidth_bytes_per_second=draw(st.floats(0, 5e10)))
        samples.append(sample(f"c{i}", str(CpuSet(cpus)), exclusive=exclusive, pod_uid=pod,
                              sandbox=vm_pods[pod], limit=draw(st.none() | st.integers(0, 1000)),
                              request=draw(st.integers(0, 1500)), **metrics))
    exclusive = {(samples[0].container.pod_uid, "c0"): str(CpuSet(dedicated))} if dedicated else None
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
    assert violations(s, plan(s, CFG, None, s.time), vm_overhead_mcpu=CFG.vm_overhead_mcpu) == []


@settings(SETTINGS, max_examples=100)  # VM pods move in a few percent of these examples
@given(snapshots(vm_room=True))
def test_no_constraint_is_ever_violated_where_vm_pods_can_move(s: Snapshot) -> None:
    assert violations(s, plan(s, CFG, None, s.time), vm_overhead_mcpu=CFG.vm_overhead_mcpu) == []


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
