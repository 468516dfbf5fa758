"""Memory bandwidth as offered load: a stream measured on a saturated node draws more elsewhere."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.bench import judge
from agent.bench import scenarios as sc
from perfbalance.model import Snapshot
from rebalancer import RebalancerConfig, plan
from rebalancer.costmodel import loaded_latency_factor
from rebalancer.demand import offered
from rebalancer.inputs import View
from rebalancer.topoindex import TopoIndex

from rb_builders import topo

CFG = RebalancerConfig(memory_bandwidth_per_node=4e9)


def _view(cid: str, cpus: frozenset[int], *, bandwidth: float, ips: float | None, mpki: float) -> View:
    return View(id=cid, usage=1.0, request_mcpu=0, heavy=False, misses=bandwidth / 64, mpki=mpki,
                occupancy=None, bandwidth=bandwidth, memory_bytes=0, ips_per_core=ips, exclusive=False,
                rdt_class="", cpuset=cpus, mems=frozenset())


def _phi(u: float) -> float:
    return loaded_latency_factor(u, CFG.bandwidth_knee_low, CFG.bandwidth_knee_high)


@pytest.mark.parametrize("measured,grows", [(3.2e9, True), (1.0e9, False)])  # 80 % of 4 GB/s; 25 %
def test_a_stream_on_a_loaded_node_offers_more_than_it_got(measured: float, grows: bool) -> None:
    idx = TopoIndex.build(topo(cores=4, threads=1, packages=2))
    node0 = idx.nodes[0]
    v = _view("s", node0, bandwidth=measured, ips=3e8, mpki=40.0)
    got = offered({"s": v}, {"s": node0}, idx, CFG, _phi)["s"].bandwidth
    # at 80 %: each instruction waits 40/1000 x 45 ns x 0.5 more than at idle latency
    t_now = 1 / 3e8
    want = measured * t_now / (t_now - 40 / 1000 * 45e-9 * 0.5) if grows else measured
    assert got == pytest.approx(want)


def test_without_the_pmu_the_measured_bandwidth_stays() -> None:
    idx = TopoIndex.build(topo(cores=4, threads=1, packages=2))
    v = _view("s", idx.nodes[0], bandwidth=3.2e9, ips=None, mpki=0.0)
    assert offered({"s": v}, {"s": idx.nodes[0]}, idx, CFG, _phi)["s"] == v


def _no_pmu(s: Snapshot) -> Snapshot:
    drop = {"instructions_per_second"}  # the LLC signals stay: only the stall estimate goes
    return replace(s, containers=tuple(replace(c, metrics={k: x for k, x in c.metrics.items() if k not in drop})
                                       for c in s.containers))


def test_two_throttled_streams_are_not_packed_onto_one_node() -> None:
    # bandwidth_hog on the independent simulator's node: two streams, a database and an API on
    # NUMA node 0, whose queueing holds each stream to ~0.83 GB/s of 4 GB/s
    s = sc.bandwidth_hog()
    snap = judge.snapshot(s.node, s.workloads, s.initial, time=0.0)
    node1 = s.node.topology.nodes()[1].ids

    def on_node1(p) -> set[str]:  # type: ignore[no-untyped-def]
        return {a.container for a in p.actions if a.kind == "cpuset" and set(map(int, a.to.split(","))) <= node1}
    moved = on_node1(plan(snap, s.planner, None, 0.0))
    assert len(moved & {"stream-0", "stream-1"}) == 1
    # control: taken at their throttled rates (no instruction count to undo the stall), both look
    # small enough to share node 1
    assert {"stream-0", "stream-1"} <= on_node1(plan(_no_pmu(snap), s.planner, None, 0.0))
