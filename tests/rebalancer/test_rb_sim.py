"""The simulator's documented models, and decision quality in closed loop."""

from __future__ import annotations

import pytest

from perfbalance.topology import synthetic
from agent.bench import scenarios as sc
from agent.bench.sim import GIB, MIB, Node, Workload, simulate

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
