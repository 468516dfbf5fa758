"""Planner rules, one behaviour per test (tables where a rule has cases)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perfbalance.cpuset import CpuSet
from rebalancer import PlannerState, RebalancerConfig, plan
from rebalancer.constraints import violations

from rb_builders import avx_vs_scalar, sample, snap, topo


def moved(p, cid: str) -> str | None:  # type: ignore[no-untyped-def]
    return next((a.to for a in p.actions if a.container == cid and a.kind == "cpuset"), None)


def test_avx_heavy_container_gets_whole_cores(config: RebalancerConfig) -> None:
    s = avx_vs_scalar()
    p = plan(s, config, None, s.time)
    island = CpuSet.parse(moved(p, "avx") or "")
    assert island and s.topology.whole_cores(island) == island


def test_scalar_containers_leave_the_island(config: RebalancerConfig) -> None:
    s = avx_vs_scalar()
    p = plan(s, config, None, s.time)
    island = CpuSet.parse(moved(p, "avx") or "")
    assert all(CpuSet.parse(moved(p, w) or "0-7").isdisjoint(island) for w in ("web-a", "web-b"))


def test_island_action_carries_its_numbers(config: RebalancerConfig) -> None:
    s = avx_vs_scalar()
    a = next(a for a in plan(s, config, None, s.time).actions if a.container == "avx")
    assert a.benefit > 0 and a.net > config.margin and set(a.victims) == {"web-a", "web-b"}
    assert a.detail["saved_avx512"] > 0 and a.mems == "0"


@pytest.mark.parametrize("model, expected_loss", [
    ("Intel(R) Xeon(R) Gold 5120 CPU @ 2.20GHz", 0.25),
    ("Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz", 0.05),
    ("AMD EPYC 9654 96-Core Processor", 0.0),
    ("Some Future CPU", 0.10),
])
def test_license_loss_by_cpu_model(model: str, expected_loss: float) -> None:
    assert RebalancerConfig().license_loss(model) == expected_loss


def test_no_license_loss_means_no_island(config: RebalancerConfig) -> None:
    s = avx_vs_scalar(topo(model="AMD EPYC 9654"))
    assert plan(s, config, None, s.time).actions == ()


def test_missing_metrics_contribute_nothing(config: RebalancerConfig) -> None:
    s = snap(topo(), sample("a", "0-7"), sample("b", "0-7", cpu_usage_cores=1.0))
    p = plan(s, config, None, s.time)
    assert p.actions == () and p.considered == ()


@pytest.mark.parametrize("change, reason", [
    ({"margin": 10.0}, "below margin"),
    ({"max_moves_per_cycle": 0}, "cap"),
    ({"max_actions_per_cycle": 2}, "cap"),
])
def test_rejections_are_explained(change: dict, reason: str) -> None:
    s = avx_vs_scalar()
    p = plan(s, replace(RebalancerConfig(), **change), None, s.time)
    assert p.actions == () and any(reason in c["rejected"] for c in p.considered)


def test_dwell_blocks_a_second_move(config: RebalancerConfig) -> None:
    s = avx_vs_scalar()
    state = PlannerState(moved_at={"avx": s.time - 10})
    p = plan(s, config, state, s.time)
    assert p.actions == () and any("dwell" in c["rejected"] for c in p.considered)


def test_cooldown_blocks_after_rollback(config: RebalancerConfig) -> None:
    s = avx_vs_scalar()
    state = PlannerState(cooldown_until={"web-a": s.time + 100})
    p = plan(s, config, state, s.time)
    assert p.actions == () and any("cooldown" in c["rejected"] for c in p.considered)


def test_exclusive_containers_never_move(config: RebalancerConfig) -> None:
    s = snap(topo(), sample("avx", "0", exclusive=True, request=1000, cpu_usage_cores=1.0, avx512_heavy=1.0),
             sample("web", "1-7", request=500, cpu_usage_cores=2.0),
             exclusive={("pod-avx", "avx"): "0"})
    p = plan(s, config, None, s.time)
    assert moved(p, "avx") is None


def test_exclusive_avx_container_gets_its_sibling_shielded(config: RebalancerConfig) -> None:
    s = snap(topo(), sample("avx", "0", exclusive=True, request=1000, cpu_usage_cores=1.0, avx512_heavy=1.0),
             sample("web", "1-7", request=500, cpu_usage_cores=2.0),
             exclusive={("pod-avx", "avx"): "0"})
    p = plan(s, config, None, s.time)
    assert 4 not in CpuSet.parse(moved(p, "web") or "4")  # CPU 4 is CPU 0's SMT sibling


def test_kubelet_dedicated_and_reserved_cpus_are_never_used(config: RebalancerConfig) -> None:
    # 8 cores: room for the island without doubling busy work onto SMT siblings (on 4 cores
    # the squeeze into the 5 CPUs left does not pay: test_rb_smt.py)
    s = avx_vs_scalar(topo(cores=8), pool="0-15", reserved="0,8", exclusive={("pod-x", "x"): "1"})
    p = plan(s, config, None, s.time)
    assert p.actions and violations(s, p) == []
    assert all(not CpuSet.parse(a.to) & CpuSet.parse("0-1,8") for a in p.actions)


def test_requests_that_do_not_fit_block_the_island(config: RebalancerConfig) -> None:
    t = topo(cores=2)
    s = snap(t, sample("avx", "0-3", request=1000, cpu_usage_cores=1.0, avx512_heavy=1.0),
             sample("web", "0-3", request=3000, cpu_usage_cores=1.0))
    p = plan(s, config, None, s.time)
    assert p.actions == () and any("requests" in c["rejected"] for c in p.considered)


def test_cache_aggressor_moves_to_another_l3_domain(config: RebalancerConfig) -> None:
    t = topo(cores=4, threads=1, l3=2)
    s = snap(t, sample("thrasher", "0-3", request=500, cpu_usage_cores=1.0, llc_misses_per_second=2e7, llc_mpki=25.0),
             sample("kv", "0-3", request=500, cpu_usage_cores=1.0, llc_misses_per_second=8e6, llc_mpki=5.0))
    p = plan(s, config, None, s.time)
    assert p.actions and p.actions[0].detail["saved_llc"] > 0
    assert len(t.l3_domains()) == 2 and all(
        len({t.cpu(c).l3 for c in CpuSet.parse(a.to)}) == 1 for a in p.actions)


def test_rdt_class_for_aggressor_when_resctrl_is_up() -> None:
    from perfbalance.model import CollectorStatus
    cfg = RebalancerConfig(rdt_aggressor_class="squeeze")
    s = snap(topo(cores=4, threads=1), sample("thrasher", "0-3", cpu_usage_cores=1.0, llc_misses_per_second=2e7, llc_mpki=25.0),
             sample("kv", "0-3", cpu_usage_cores=1.0, llc_misses_per_second=8e6, llc_mpki=5.0),
             collectors={"resctrl": CollectorStatus(up=True)})
    p = plan(s, cfg, None, s.time)
    assert [(a.kind, a.container, a.to) for a in p.actions] == [("rdt_class", "thrasher", "squeeze")]


def test_bandwidth_hog_moves_to_the_idle_numa_node(config: RebalancerConfig) -> None:
    t = topo(cores=4, threads=1, packages=2)
    hog = dict(cpu_usage_cores=1.0, llc_misses_per_second=6e8, memory_bandwidth_bytes_per_second=4e10, llc_mpki=30.0)
    s = snap(t, sample("hog", "0-3", mems="0", **hog), sample("db", "0-3", mems="0", cpu_usage_cores=1.0,
                                                            llc_misses_per_second=1e8, llc_mpki=5.0,
                                                            memory_bandwidth_bytes_per_second=6.4e9))
    a = plan(s, config, None, s.time).actions[0]
    assert a.mems == "1" and CpuSet.parse(a.to) <= CpuSet.parse("4-7")


def test_numa_migration_cost_is_charged_when_mems_change(config: RebalancerConfig) -> None:
    t = topo(cores=4, threads=1, packages=2)
    hog = dict(cpu_usage_cores=1.0, llc_misses_per_second=6e8, memory_bandwidth_bytes_per_second=4e10, llc_mpki=30.0)
    s = snap(t, sample("hog", "0-3", mems="0", **hog), sample("db", "0-3", mems="0", cpu_usage_cores=1.0,
                                                            llc_misses_per_second=1e8, llc_mpki=5.0,
                                                            memory_bandwidth_bytes_per_second=6.4e9))
    s = replace(s, containers=tuple(replace(c, container=replace(c.container, memory_bytes=4 << 30))
                                    for c in s.containers))
    a = plan(s, config, None, s.time).actions[0]
    assert a.detail["migration_seconds"] == pytest.approx((4 << 30) / config.migration_bandwidth)


def test_two_cpu_node_without_smt_isolates_avx_on_one_cpu() -> None:
    """This development VM: 2 CPUs, one core each, AMD (no license by default; configured here)."""
    t = topo(cores=2, threads=1, model="AMD EPYC")
    s = snap(t, sample("avx", "0-1", cpu_usage_cores=1.03, avx512_heavy=1.0),
             sample("scalar", "0-1", cpu_usage_cores=0.98))
    p = plan(s, RebalancerConfig(avx512_license_loss={"AMD EPYC": 0.1}), None, s.time)
    targets = {a.container: a.to for a in p.actions}
    assert targets in ({"avx": "0", "scalar": "1"}, {"avx": "1", "scalar": "0"})


def test_amd_default_has_no_license_so_nothing_moves() -> None:
    t = topo(cores=2, threads=1, model="AMD EPYC")
    s = snap(t, sample("avx", "0-1", cpu_usage_cores=1.03, avx512_heavy=1.0),
             sample("scalar", "0-1", cpu_usage_cores=0.98))
    assert plan(s, RebalancerConfig(), None, s.time).actions == ()
