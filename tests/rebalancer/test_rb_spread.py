"""The spread policy: even CPU load across NUMA nodes, then L3 domains, without a cost model."""

from __future__ import annotations

from rb_builders import sample, snap, topo

from perfbalance.cpuset import CpuSet
from rebalancer.spread import SpreadConfig, SpreadState, plan

# 2 packages = 2 NUMA nodes, 4 cores x 2 threads each: node 0 = CPUs 0-3,8-11; node 1 = 4-7,12-15
TWO_NODES = topo(cores=4, threads=2, packages=2)


def test_busy_containers_crowded_on_one_node_are_spread_to_the_other() -> None:
    s = snap(TWO_NODES, sample("a", "0-3,8-11", cpu_usage_cores=3.0),
             sample("b", "0-3,8-11", cpu_usage_cores=3.0), sample("c", "4-7,12-15", cpu_usage_cores=0.2))
    p = plan(s, SpreadConfig(), None, 1000.0)
    assert [(a.container, a.to, a.mems) for a in p.actions] == [("a", "4-7,12-15", "1")]
    assert p.actions[0].reason.startswith("spread: node 0")
    assert p.state == SpreadState(moved_at={"a": 1000.0})


def test_balanced_nodes_are_left_alone() -> None:
    s = snap(TWO_NODES, sample("a", "0-3,8-11", cpu_usage_cores=3.0), sample("b", "4-7,12-15", cpu_usage_cores=3.0))
    assert plan(s, SpreadConfig(), None, 1000.0).actions == ()


def test_imbalance_within_tolerance_is_left_alone() -> None:
    s = snap(TWO_NODES, sample("a", "0-3,8-11", cpu_usage_cores=1.0), sample("a2", "0-3,8-11", cpu_usage_cores=0.3),
             sample("b", "4-7,12-15", cpu_usage_cores=0.8))  # imbalance 0.5 cores
    assert plan(s, SpreadConfig(tolerance_cores=0.6), None, 1000.0).actions == ()
    moved = plan(s, SpreadConfig(tolerance_cores=0.3), None, 1000.0).actions  # control
    assert [a.container for a in moved] == ["a2"]  # moving "a" would leave it worse the other way


def test_containers_spanning_both_nodes_count_in_each_and_never_move() -> None:
    s = snap(TWO_NODES, sample("wide", "0-15", cpu_usage_cores=6.0), sample("b", "0-3,8-11", cpu_usage_cores=2.0),
             sample("c", "0-3,8-11", cpu_usage_cores=1.0))  # node 0: 3 + 3 cores, node 1: 3
    p = plan(s, SpreadConfig(max_moves_per_cycle=5), None, 1000.0)
    assert [a.container for a in p.actions] == ["b"]  # b or c: 1 core apart either way, tie broken by id
    alone = snap(TWO_NODES, sample("wide", "0-15", cpu_usage_cores=6.0))
    assert plan(alone, SpreadConfig(), None, 1000.0).actions == ()


def test_l3_domains_are_balanced_within_a_node() -> None:
    t = topo(cores=4, threads=1, packages=1, l3=2)  # one node, L3 {0,1} and {2,3}
    s = snap(t, sample("a", "0-1", cpu_usage_cores=1.0), sample("b", "0-1", cpu_usage_cores=1.0))
    p = plan(s, SpreadConfig(), None, 1000.0)
    assert [(a.container, a.to) for a in p.actions] == [("a", "2-3")]
    assert "L3" in p.actions[0].reason


def test_exclusive_sandboxed_and_dwelling_containers_stay() -> None:
    s = snap(TWO_NODES, sample("x", "0", cpu_usage_cores=1.0, exclusive=True),
             sample("vm", "0-3,8-11", cpu_usage_cores=3.0, sandbox="kata"),
             sample("d", "0-3,8-11", cpu_usage_cores=3.0))
    state = SpreadState(moved_at={"d": 990.0})
    p = plan(s, SpreadConfig(dwell_seconds=60.0), state, 1000.0)
    assert p.actions == ()
    rejected = {c["container"]: c["rejected"] for c in p.considered if c["container"]}
    assert rejected["x"].startswith("exclusive") and rejected["vm"].startswith("VM-sandboxed")
    assert rejected["d"].startswith("dwell")
    later = plan(s, SpreadConfig(dwell_seconds=60.0), state, 1100.0)  # control: dwell over
    assert [a.container for a in later.actions] == ["d"]


def test_targets_leave_out_cpus_the_kubelet_dedicated() -> None:
    s = snap(TWO_NODES, sample("a", "0-3,8-11", cpu_usage_cores=3.0), sample("b", "0-3,8-11", cpu_usage_cores=3.0),
             exclusive={("pod-g", "g"): "4-5"})
    (a,) = plan(s, SpreadConfig(), None, 1000.0).actions
    assert not CpuSet.parse(a.to) & CpuSet.parse("4-5") and CpuSet.parse(a.to) <= CpuSet.parse("6-7,12-15")


def test_same_input_same_plan() -> None:
    s = snap(TWO_NODES, *[sample(f"c{i}", "0-3,8-11", cpu_usage_cores=0.5 + i / 10) for i in range(8)])
    assert plan(s, SpreadConfig(max_moves_per_cycle=3), None, 5.0) == plan(s, SpreadConfig(max_moves_per_cycle=3), None, 5.0)
    assert len(plan(s, SpreadConfig(max_moves_per_cycle=3), None, 5.0).actions) >= 2
