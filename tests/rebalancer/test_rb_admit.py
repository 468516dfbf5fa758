"""Placement at creation (rebalancer.admit): the constraints of moves, annotations as hints."""

from __future__ import annotations

from perfbalance.cpuset import CpuSet
from rb_builders import sample, snap, topo
from rebalancer.admit import AVX_ANNOTATION, LATENCY_ANNOTATION, NewContainer, Running, admit
from rebalancer.health import TARGET_ANNOTATION
from rebalancer.topoindex import TopoIndex

T = topo(cores=4, threads=2)  # CPUs 0-7, one NUMA node


def test_plain_container_gets_the_shared_pool_minus_reserved_and_dedicated() -> None:
    s = snap(T, sample("pinned", "2", exclusive=True), reserved="0", exclusive={("p", "db"): "6-7"})
    a = admit(s, NewContainer(pod_uid="q", name="web"), {})
    assert a.cpus == CpuSet.parse("1,3-5") and a.mems == CpuSet.parse("0")


def test_without_reservations_everything_is_shared() -> None:  # control for the case above
    a = admit(snap(T), NewContainer(pod_uid="q", name="web"), {})
    assert a.cpus == CpuSet.parse("0-7")


def test_container_with_kubelet_dedicated_cpus_keeps_the_kubelets_choice() -> None:
    s = snap(T, exclusive={("p", "db"): "6-7"})
    a = admit(s, NewContainer(pod_uid="p", name="db"), {})
    assert a.cpus is None and "kubelet" in a.reason


def test_avx_annotated_container_gets_whole_cores_away_from_latency_work() -> None:
    idx = TopoIndex.build(T)
    lat_core = idx.cores[idx.core_of[0]]
    running = {"lat": Running(cpus=CpuSet(lat_core), annotations={LATENCY_ANNOTATION: "true"})}
    a = admit(snap(T), NewContainer(pod_uid="q", name="avx", request_mcpu=1500,
                                    annotations={AVX_ANNOTATION: "true"}), running)
    assert a.cpus is not None and not (a.cpus.ids & lat_core)
    assert all(idx.cores[idx.core_of[c]] <= a.cpus.ids for c in a.cpus.ids)  # whole cores
    assert len(a.cpus.ids) == 2  # 1.5 CPUs requested -> 2 CPUs: one whole core of two threads


def test_latency_annotated_container_avoids_avx_cpus() -> None:
    running = {"avx": Running(cpus=CpuSet.parse("4-7"), annotations={AVX_ANNOTATION: "true"}),
               "other": Running(cpus=CpuSet.parse("0-1"))}
    a = admit(snap(T), NewContainer(pod_uid="q", name="web", annotations={LATENCY_ANNOTATION: "true"}), running)
    assert a.cpus == CpuSet.parse("0-3")


def test_a_run_queue_target_marks_latency_sensitive_work_too() -> None:
    running = {"avx": Running(cpus=CpuSet.parse("4-7"), annotations={AVX_ANNOTATION: "true"})}
    a = admit(snap(T), NewContainer(pod_uid="q", name="web", annotations={TARGET_ANNOTATION: "2ms"}), running)
    assert a.cpus == CpuSet.parse("0-3")


def test_no_shareable_cpu_leaves_the_runtime_default() -> None:
    s = snap(T, reserved="0-7")
    assert admit(s, NewContainer(pod_uid="q", name="web"), {}).cpus is None
