"""The simulator's documented models, and decision quality in closed loop."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perfbalance.topology import synthetic
from rebalancer import plan
from agent.bench import scenarios as sc
from agent.bench.sim import GIB, MIB, Node, Workload, simulate, snapshot

from rb_builders import topo


def test_avx_license_slows_scalar_work_on_the_same_core() -> None:
    node = Node(topology=topo(cores=1, threads=2), license_loss=0.2)
    ws = [Workload(id="avx", demand=1.0, avx512=True), Workload(id="web", demand=1.0)]
    shared = simulate(node, ws, {"avx": frozenset({0}), "web": frozenset({1})})  # SMT siblings
    assert shared["web"].freq == pytest.approx(0.8)


def test_separate_cores_keep_full_frequency() -> None:
    node = Node(topology=topo(cores=2, threads=1), license_loss=0.2)
    ws = [Workload(id="avx", demand=1.0, avx512=True), Workload(id="web", demand=1.0)]
    perf = simulate(node, ws, {"avx": frozenset({0}), "web": frozenset({1})})
    assert perf["web"].freq == 1.0 and perf["web"].perf == pytest.approx(1.0)


def test_thrasher_in_the_same_l3_raises_the_victims_misses() -> None:
    node = Node(topology=synthetic(packages=1, cores_per_node=2, l3_per_package=2, l3_size_bytes=8 * MIB))
    victim = Workload(id="kv", demand=1.0, mpki_ref=6.0, working_set=6 * MIB)
    thrasher = Workload(id="t", demand=1.0, mpki_ref=40.0, working_set=512 * MIB)
    same = simulate(node, [victim, thrasher], {"kv": frozenset({0}), "t": frozenset({0, 1})})
    apart = simulate(node, [victim, thrasher], {"kv": frozenset({0}), "t": frozenset({1})})
    assert same["kv"].mpki > apart["kv"].mpki


def test_loaded_memory_slows_everyone_on_the_node() -> None:
    node = Node(topology=topo(cores=2, threads=1), bandwidth_per_node=5e9)
    hog = Workload(id="hog", demand=1.0, mpki_ref=60.0, working_set=4 * GIB)
    db = Workload(id="db", demand=1.0, mpki_ref=5.0, working_set=1 * GIB)
    alone = simulate(node, [db], {"db": frozenset({0})})
    loaded = simulate(node, [db, hog], {"db": frozenset({0}), "hog": frozenset({1})})
    assert loaded["db"].cpi > alone["db"].cpi


@pytest.mark.parametrize("make", [sc.avx512_small, sc.cache_thrasher, sc.bandwidth_hog])
def test_perfbalance_is_within_5_percent_of_the_optimum(make) -> None:  # type: ignore[no-untyped-def]
    s = make()
    opt = sc.run_optimum(s)
    assert opt is not None
    assert sc.run_perfbalance(s).throughput >= 0.95 * opt.throughput


@pytest.mark.parametrize("make", [sc.avx512_small, sc.avx512_large, sc.kubelet_static])
def test_most_avoidable_avx512_slowdown_is_removed(make) -> None:  # type: ignore[no-untyped-def]
    s = make()
    none, pb = sc.run_none(s).victim_slowdown, sc.run_perfbalance(s).victim_slowdown
    floor = sc.ideal_without_avx_penalty(s).victim_slowdown
    assert none - floor > 0.01 and (none - pb) >= 0.9 * (none - floor)


def test_placement_tag_never_moves_running_containers() -> None:
    assert sc.run_placement_tag(sc.avx512_large()).victim_slowdown == sc.run_none(sc.avx512_large()).victim_slowdown


def test_steady_state_stays_steady_under_noise() -> None:
    early, late = sc.steady_moves(sc.avx512_large(), cycles=400, settle_cycles=30, noise=0.05)
    assert early > 0 and late == 0


def test_optimum_is_none_when_too_large() -> None:
    assert sc.run_optimum(sc.avx512_large()) is None


# -- affinity and anti-affinity scenarios -------------------------------------------------------------

def test_partners_in_one_l3_domain_run_faster_than_across_nodes() -> None:
    node = Node(topology=synthetic(packages=2, cores_per_node=2, l3_size_bytes=16 * MIB))
    ws = [Workload(id="p", demand=1.0, talks_to=(("c", 2.0),)), Workload(id="c", demand=1.0, talks_to=(("p", 2.0),))]
    near = simulate(node, ws, {"p": frozenset({0}), "c": frozenset({1})})
    far = simulate(node, ws, {"p": frozenset({0}), "c": frozenset({2})})
    assert near["c"].perf == pytest.approx(1.0) and far["c"].perf < 0.9


def test_without_partners_distance_does_not_matter() -> None:  # the control
    node = Node(topology=synthetic(packages=2, cores_per_node=2, l3_size_bytes=16 * MIB))
    ws = [Workload(id="p", demand=1.0), Workload(id="c", demand=1.0)]
    near = simulate(node, ws, {"p": frozenset({0}), "c": frozenset({1})})
    far = simulate(node, ws, {"p": frozenset({0}), "c": frozenset({2})})
    assert near["c"].perf == far["c"].perf


def test_the_snapshot_carries_pod_labels_and_annotations() -> None:
    s = sc.anti_affinity()
    c = snapshot(s.node, s.workloads, s.initial, time=0.0).by_id()["stream-0"].container
    assert (c.pod, c.namespace, c.name, c.pod_uid) == ("stream-0", "prod", "main", "uid-stream-0")
    assert c.labels == {"app": "stream"} and c.annotations == {sc.ANTI: "app=stream@numa*0.5"}


def without(s: sc.Scenario, strip: str) -> sc.Scenario:
    """The scenario with its annotations gone ("all") or their hard marks dropped ("!")."""
    ws = tuple(replace(w, annotations={} if strip == "all" else
                       {k: v.replace("!", "") for k, v in w.annotations.items()}) for w in s.workloads)
    return replace(s, workloads=ws)


def outcomes(s: sc.Scenario, ran: sc.Scenario) -> dict[tuple[str, str], bool]:
    """The pairs of `s` (as annotated) judged in the final layout of a closed loop over `ran`."""
    cpus = final_layout(ran)
    return {(p.a, p.b): p.ok for p in sc.pair_outcomes(s, cpus)}


def final_layout(s: sc.Scenario) -> dict[str, frozenset[int]]:
    cpus, classes, state = dict(s.initial), {}, None
    for cycle in range(s.cycles):
        p = plan(snapshot(s.node, s.workloads, cpus, classes, time=cycle * 10.0), s.planner, state, cycle * 10.0)
        state = p.state
        sc.apply(p.actions, cpus, classes)
    return cpus


@pytest.mark.parametrize("annotated", [True, False])
def test_anti_affine_streams_end_on_different_numa_nodes(annotated: bool) -> None:
    s = sc.anti_affinity()
    got = outcomes(s, s if annotated else without(s, "all"))
    assert got[("stream-0", "stream-1")] is annotated  # without the term the planner sees no reason
    assert not any(p.ok for p in sc.run_none(s).pairs)


@pytest.mark.parametrize("strip, kept", [("", True), ("!", False)])
def test_the_hard_pair_never_shares_a_numa_node(strip: str, kept: bool) -> None:
    s = sc.hard_anti_affinity()
    got = outcomes(s, without(s, strip) if strip else s)
    assert got[("kv-0", "kv-1")] is kept  # soft, the affinity to web wins and kv-1 joins kv-0's node
    if kept:
        r = sc.run_perfbalance(s)
        assert r.hard_rises == 0 and sc.run_optimum(s).pairs[0].ok


@pytest.mark.parametrize("annotated", [True, False])
def test_affine_pairs_end_together(annotated: bool) -> None:
    s = sc.affinity()
    got = outcomes(s, s if annotated else without(s, "all"))
    assert got == {("api", "db"): annotated, ("consumer", "producer"): annotated}


@pytest.mark.parametrize("make", sc.AFFINITY_SCENARIOS)
def test_affinity_scenarios_are_within_5_percent_of_the_optimum(make) -> None:  # type: ignore[no-untyped-def]
    s = make()
    assert sc.run_perfbalance(s).throughput >= 0.95 * sc.run_optimum(s).throughput


@pytest.mark.parametrize("make", sc.AFFINITY_SCENARIOS)
def test_affinity_scenarios_do_not_ping_pong(make) -> None:  # type: ignore[no-untyped-def]
    early, late = sc.steady_moves(make(), cycles=300, settle_cycles=50, noise=0.05)
    assert late == 0
