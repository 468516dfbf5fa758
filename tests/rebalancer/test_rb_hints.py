"""Placement annotations in the planner: AVX-512 pre-classification, affinity, anti-affinity."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perfbalance.cpuset import CpuSet
from perfbalance.model import ContainerSample
from rebalancer import RebalancerConfig, plan

from rb_builders import avx_vs_scalar, sample, snap, topo

AVX = "perfbalance.io/avx512"
ANTI = "perfbalance.io/anti-affinity"
AFF = "perfbalance.io/affinity"


def annotate(s: ContainerSample, labels: dict[str, str] | None = None, **ann: str) -> ContainerSample:
    keys = {"avx": AVX, "anti": ANTI, "aff": AFF}
    return replace(s, container=replace(s.container, annotations={keys[k]: v for k, v in ann.items()},
                                        labels=labels or {}))


def cpuset_of(p, cid: str) -> CpuSet | None:  # type: ignore[no-untyped-def]
    to = next((a.to for a in p.actions if a.container == cid and a.kind == "cpuset"), None)
    return CpuSet.parse(to) if to is not None else None


def unmeasured_avx(annotated: bool, heavy: float | None = 0.0):  # type: ignore[no-untyped-def]
    s = avx_vs_scalar()
    metrics = dict(s.containers[0].metrics)
    if heavy is None:
        metrics.pop("avx512_heavy")
    else:
        metrics["avx512_heavy"] = heavy
    first = replace(s.containers[0], metrics=metrics)
    first = annotate(first, avx="true") if annotated else first
    return replace(s, containers=(first, *s.containers[1:]))


@pytest.mark.parametrize("annotated", [True, False])
def test_avx512_annotation_makes_an_island_in_the_first_cycle(config: RebalancerConfig, annotated: bool) -> None:
    s = unmeasured_avx(annotated)
    p = plan(s, config, None, s.time)
    island = cpuset_of(p, "avx")
    if annotated:
        assert island and s.topology.whole_cores(island) == island
        (note,) = [c for c in p.considered if c["kind"] == "avx512_annotation"]
        assert note["heavy"] and note["state"] == "preclassified"
    else:  # the control: measured scalar, no annotation, nothing to separate
        assert island is None


def test_measurement_overrules_the_annotation_after_smoothing(config: RebalancerConfig) -> None:
    s = unmeasured_avx(True)
    state, notes = None, []
    for i in range(4):
        p = plan(replace(s, time=s.time + 10 * i), config, state, s.time + 10 * i)
        state = p.state
        notes.append(next(c for c in p.considered if c["kind"] == "avx512_annotation"))
    assert notes[0]["heavy"] and not notes[-1]["heavy"]
    assert notes[-1]["state"] == "overruled" and "no 512-bit execution measured" in notes[-1]["reason"]


def test_measured_512_bit_use_confirms_the_annotation(config: RebalancerConfig) -> None:
    s = unmeasured_avx(True, heavy=1.0)
    p = plan(s, config, None, s.time)
    assert next(c for c in p.considered if c["kind"] == "avx512_annotation")["state"] == "confirmed"


def test_without_an_avx512_signal_the_annotation_holds(config: RebalancerConfig) -> None:
    s = unmeasured_avx(True, heavy=None)
    state = None
    for i in range(4):
        p = plan(replace(s, time=s.time + 10 * i), config, state, s.time + 10 * i)
        state = p.state
    note = next(c for c in p.considered if c["kind"] == "avx512_annotation")
    assert note["heavy"] and note["state"] == "unmeasured"


def two_nodes(a_cpus: str, b_cpus: str, **ann: str):  # type: ignore[no-untyped-def]
    t = topo(cores=4, threads=1, packages=2, l3=1)  # NUMA node 0: CPUs 0-3, node 1: 4-7
    a = annotate(sample("a", a_cpus, request=1000, cpu_usage_cores=1.0), **ann)
    b = annotate(sample("b", b_cpus, request=1000, cpu_usage_cores=1.0), labels={"app": "db"})
    return snap(t, a, b)


@pytest.mark.parametrize("ann, moves", [({"anti": "app=db@numa*1"}, True), ({}, False)])
def test_anti_affinity_moves_one_off_the_others_numa_node(config: RebalancerConfig, ann, moves) -> None:
    s = two_nodes("0-1", "2-3", **ann)
    p = plan(s, config, None, s.time)
    targets = {cid: cpuset_of(p, cid) for cid in ("a", "b")}
    if not moves:
        assert targets == {"a": None, "b": None}
        return
    placed = {cid: t or s.by_id()[cid].container.cpuset for cid, t in targets.items()}
    assert s.topology.nodes_of(placed["a"]).isdisjoint(s.topology.nodes_of(placed["b"]))
    a = next(a for a in p.actions if a.kind == "cpuset")
    assert a.reason.startswith("anti-affinity:") and a.detail["saved_affinity"] > 0


@pytest.mark.parametrize("ann, moves", [({"aff": "container=b@numa*1"}, True), ({}, False)])
def test_affinity_brings_them_onto_one_numa_node(config: RebalancerConfig, ann, moves) -> None:
    s = two_nodes("0-1", "4-5", **ann)
    p = plan(s, config, None, s.time)
    if not moves:
        assert p.actions == ()
        return
    placed = {cid: cpuset_of(p, cid) or s.by_id()[cid].container.cpuset for cid in ("a", "b")}
    assert s.topology.nodes_of(placed["a"]) == s.topology.nodes_of(placed["b"])


@pytest.mark.parametrize("mark, moves", [("!", False), ("*0.01", True)])
def test_hard_anti_affinity_is_a_constraint(config: RebalancerConfig, mark: str, moves: bool) -> None:
    """a wants to be next to b (node 1, dedicated CPUs: b cannot move); c, also on node 1, must not
    share a NUMA node with a."""
    t = topo(cores=4, threads=1, packages=2, l3=1)
    a = annotate(sample("a", "0-1", request=1000, cpu_usage_cores=1.0), aff="container=b@numa*5")
    b = sample("b", "4", request=1000, cpu_usage_cores=1.0, exclusive=True)
    c = annotate(sample("c", "5", request=1000, cpu_usage_cores=1.0), anti=f"container=a@numa{mark}")
    s = snap(t, a, b, c, exclusive={("pod-b", "b"): "4"})
    p = plan(s, config, None, s.time)
    assert (cpuset_of(p, "a") is not None and cpuset_of(p, "a") <= CpuSet.parse("4-7")) == moves
    if not moves:
        assert any("hard anti-affinity" in str(c.get("rejected")) for c in p.considered)


def test_pairs_are_explained_in_the_plan(config: RebalancerConfig) -> None:
    s = two_nodes("0-1", "2-3", anti="app=db@numa*1")
    p = plan(s, config, None, s.time)
    (note,) = [c for c in p.considered if c["kind"] == "anti-affinity" and "overlap" in c]
    assert note["container"] == "a" and note["other"] == "b" and note["overlap"] == 1.0 and note["cost"] == 1.0
