"""The agent's placement policy (rebalancer.admit through agent.nri.placement) at CreateContainer,
against a real containerd 1.7 driven through CRI. The topology is this machine's two CPUs as
one-thread cores; the kubelet's CPU manager state is given per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agent.nri.client import NriClient
from agent.nri.model import Placement
from agent.nri.placement import AdmitPolicy
from perfbalance.cpuset import CpuSet
from perfbalance.model import KubeletState, Snapshot
from perfbalance.topology import synthetic
from rebalancer.admit import AVX_ANNOTATION, LATENCY_ANNOTATION
from test_containerd_plugin import allowed

pytestmark = [pytest.mark.root, pytest.mark.slow]

TWO_CPUS = synthetic(packages=1, cores_per_node=2, threads_per_core=1, l3_per_package=1, cpu_model="test")


class Node:
    def __init__(self) -> None:
        self.kubelet = KubeletState()
        self.reserved = CpuSet()

    def snapshot(self) -> Snapshot:
        return Snapshot(time=0.0, window=1.0, node="t", topology=TWO_CPUS, containers=(), reserved=self.reserved)


@pytest.fixture
def node(containerd) -> Iterator[Node]:  # type: ignore[no-untyped-def]
    n = Node()
    policy = AdmitPolicy(snapshot=n.snapshot, kubelet=lambda: n.kubelet)
    client = NriClient(socket_path=containerd.nri_socket, name="perfbalance", index="10", policy=policy)
    client.start()
    n.client = client  # type: ignore[attr-defined]
    try:
        assert client.wait_connected(30), client.status
        yield n
    finally:
        client.stop()


def test_a_cpu_the_kubelet_dedicated_is_never_handed_out(node, kubelet) -> None:  # type: ignore[no-untyped-def]
    _, _, free_pid = kubelet.run("before", "web")  # control: nothing dedicated -> both CPUs
    node.kubelet = KubeletState(policy="static", exclusive={("some-other-pod", "db"): CpuSet.parse("1")})
    _, _, pid = kubelet.run("after", "web", cpuset="0-1")  # the kubelet asks for its shared pool
    assert allowed(free_pid) == "0-1"
    assert allowed(pid) == "0"


def test_reserved_cpus_are_never_handed_out(node, kubelet) -> None:  # type: ignore[no-untyped-def]
    node.reserved = CpuSet.parse("0")
    _, _, pid = kubelet.run("res", "web")
    assert allowed(pid) == "1"


def test_container_with_dedicated_cpus_keeps_the_kubelets_cpuset(node, kubelet) -> None:  # type: ignore[no-untyped-def]
    cfg = kubelet.pod_config("guaranteed")
    node.kubelet = KubeletState(policy="static", exclusive={(cfg.metadata.uid, "db"): CpuSet.parse("1")})
    pod_id = kubelet.run_pod(cfg)
    cid = kubelet.create(pod_id, cfg, "db", cpuset="1")
    kubelet.start(cid)
    assert allowed(kubelet.pid(cid)) == "1"


def test_avx_annotation_places_away_from_latency_sensitive_work(node, kubelet) -> None:  # type: ignore[no-untyped-def]
    lat_cfg = kubelet.pod_config("latency", annotations={LATENCY_ANNOTATION: "true"})
    lat_pod = kubelet.run_pod(lat_cfg)
    lat = kubelet.create(lat_pod, lat_cfg, "web")
    kubelet.start(lat)
    assert node.client.update({lat: Placement(cpus="0")}) == {}  # where the planner put it
    avx_cfg = kubelet.pod_config("avx", annotations={AVX_ANNOTATION: "true"})
    avx_pod = kubelet.run_pod(avx_cfg)
    avx = kubelet.create(avx_pod, avx_cfg, "crunch")
    kubelet.start(avx)
    assert allowed(kubelet.pid(avx)) == "1"
    assert allowed(kubelet.pid(lat)) == "0"
