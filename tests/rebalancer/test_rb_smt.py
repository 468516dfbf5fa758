"""SMT sibling sharing in the cost model: two busy hyperthreads of one core are not two cores."""

from __future__ import annotations

import pytest

from perfbalance.cpuset import CpuSet
from rebalancer import RebalancerConfig, plan
from rebalancer.context import Context
from rebalancer.inputs import smooth
from rebalancer.smt import lost as smt_lost
from rebalancer.state import PlannerState
from rebalancer.topoindex import TopoIndex

from rb_builders import avx_vs_scalar, sample, snap, topo

NO_SMT = RebalancerConfig(smt_speed=1.0)  # every hyperthread a full CPU (the model before)


def moved(p, cid: str) -> str | None:  # type: ignore[no-untyped-def]
    return next((a.to for a in p.actions if a.container == cid and a.kind == "cpuset"), None)


def _index(cores: int = 4, threads: int = 2) -> TopoIndex:
    return TopoIndex.build(topo(cores=cores, threads=threads))


# 4 cores x 2 threads: CPU c and c + 4 are siblings
@pytest.mark.parametrize("loads,lost", [
    ({0: 1.0, 4: 1.0}, 0.8),  # two busy siblings: 1.2 cores of work from 2 threads
    ({0: 1.0}, 0.0),  # an idle sibling costs nothing
    ({0: 0.5, 4: 0.5}, 0.0),  # one core's worth of load: the scheduler runs it one thread at a time
    ({0: 1.0, 4: 0.5}, 0.4),  # a pinned busy loop: its sibling's work always overlaps it
    ({0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}, 0.0),  # four busy threads on four separate cores
])
def test_sibling_loss(loads: dict[int, float], lost: float) -> None:
    idx = _index()
    assert smt_lost(loads, idx, 0.6) == pytest.approx(lost)


def _smt_part(s, config: RebalancerConfig) -> float:  # type: ignore[no-untyped-def]
    ctx = Context.build(s, config, PlannerState(), smooth(s, {}, config.smoothing_alpha), s.time)
    return ctx.base_eval.parts.get("smt", 0.0)


def test_busy_containers_on_sibling_threads_are_charged_and_on_separate_cores_not() -> None:
    t = topo(cores=4)
    doubled = snap(t, sample("a", "0", cpu_usage_cores=1.0), sample("b", "4", cpu_usage_cores=1.0))
    apart = snap(t, sample("a", "0", cpu_usage_cores=1.0), sample("b", "1", cpu_usage_cores=1.0))
    assert _smt_part(doubled, RebalancerConfig()) == pytest.approx(0.8)
    assert _smt_part(apart, RebalancerConfig()) == 0.0
    assert "smt" not in Context.build(doubled, NO_SMT, PlannerState(), smooth(doubled, {}, 0.5),
                                      doubled.time).base_eval.parts


def test_no_smt_term_on_a_node_without_smt() -> None:
    s = snap(topo(cores=4, threads=1), sample("a", "0", cpu_usage_cores=1.0), sample("b", "0", cpu_usage_cores=1.0))
    ctx = Context.build(s, RebalancerConfig(), PlannerState(), smooth(s, {}, 0.5), s.time)
    assert not ctx.model.smt_on and "smt" not in ctx.base_eval.parts


def test_island_threads_get_separate_physical_cores_when_idle_cores_exist() -> None:
    t = topo(cores=8)  # CPU c and c + 8 are siblings
    s = snap(t, sample("avx", "0-15", request=1000, cpu_usage_cores=2.0, avx512_heavy=1.0),
             sample("web-a", "0-15", request=500, cpu_usage_cores=1.0),
             sample("web-b", "0-15", request=500, cpu_usage_cores=1.0))
    island = CpuSet.parse(moved(plan(s, RebalancerConfig(), None, s.time), "avx") or "")
    assert len(island) == 4 and len({c % 8 for c in island.ids}) == 2  # two whole cores
    # control: with every hyperthread a full CPU, the two CPUs of one core are enough
    packed = CpuSet.parse(moved(plan(s, NO_SMT, None, s.time), "avx") or "")
    assert len(packed) == 2 and len({c % 8 for c in packed.ids}) == 1


def test_squeezing_busy_work_onto_siblings_is_declined_where_it_only_pays_without_smt() -> None:
    # 4 cores: reserved core 0, CPU 1 dedicated; an island there leaves 3.5 CPUs of demand on
    # 5 CPUs of 3 cores, where now it spreads over all 4 cores: the sharing costs more than the
    # licence saves
    s = avx_vs_scalar(pool="0-7", reserved="0,4", exclusive={("pod-x", "x"): "1"})
    p = plan(s, RebalancerConfig(), None, s.time)
    assert p.actions == ()
    assert any("below margin" in str(c.get("rejected")) for c in p.considered if c["kind"] == "avx512_island")
    assert moved(plan(s, NO_SMT, None, s.time), "avx") == "2,6"  # control
