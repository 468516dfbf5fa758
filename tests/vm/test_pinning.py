"""One vCPU per dedicated CPU, pinned 1:1, the mapping kept, exported and
moved with the container; on the stand-in QEMU in real cgroups (2 CPUs are enough)."""

from __future__ import annotations

import pytest

from agent.export.report import CycleReport
from perfbalance.cpuset import CpuSet
from perfbalance.model import Action, KubeletState, Plan, Snapshot
from perfbalance.topology import synthetic
from rebalancer.vm import VmLayoutError
from tests.vm.conftest import ALL, QEMU

pytestmark = pytest.mark.root

ZERO, ONE = CpuSet([0]), CpuSet([1])


def place(pod, *, dedicated: str, shared: str):
    """ctr-a gets `dedicated` (static policy, exclusive), ctr-b the shared pool `shared`."""
    pod.set_cpus("ctr-a", dedicated)
    pod.set_cpus("ctr-b", shared)
    kubelet = KubeletState(policy="static", default_cpuset=CpuSet.parse(shared),
                           exclusive={(pod.uid, "ctr-a"): CpuSet.parse(dedicated)})
    return [pod.container("ctr-a", exclusive=True), pod.container("ctr-b")], kubelet


def test_dedicated_cpu_gets_one_vcpu_pinned(pod, sandboxes):
    vmm = pod.spawn(*QEMU)
    containers, kubelet = place(pod, dedicated="1", shared="0")
    report = sandboxes.sync(containers=containers, kubelet=kubelet, online=ALL)
    assert report.errors == () and report.problems == ()
    assert vmm.affinity("CPU 1/KVM") == ONE
    assert vmm.affinity("CPU 0/KVM") == ZERO


def test_helpers_avoid_the_pinned_cpu(pod, sandboxes):
    vmm = pod.spawn(*QEMU)
    containers, kubelet = place(pod, dedicated="1", shared="0")
    sandboxes.sync(containers=containers, kubelet=kubelet, online=ALL)
    for name in ("qemu-system-x86", "IO iothread1", "IO mon_iothread"):
        assert vmm.affinity(name) == ZERO, name


def test_mapping_is_exported_and_translates_host_to_guest(pod, sandboxes):
    pod.spawn(*QEMU)
    containers, kubelet = place(pod, dedicated="1", shared="0")
    sandboxes.sync(containers=containers, kubelet=kubelet, online=ALL)
    a, b = containers
    assert sandboxes.vcpu_map() == {a.id: {1: 1}}
    assert sandboxes.to_guest(a.id, ONE) == ONE
    assert sandboxes.guest_cpuset(a.id) == ONE
    assert sandboxes.guest_cpuset(b.id) == ZERO  # the unpinned vCPU
    with pytest.raises(VmLayoutError):
        sandboxes.to_guest(a.id, ZERO)


def test_mapping_and_pinning_move_with_the_container(pod, sandboxes):
    vmm = pod.spawn(*QEMU)
    containers, kubelet = place(pod, dedicated="1", shared="0")
    sandboxes.sync(containers=containers, kubelet=kubelet, online=ALL)
    containers, kubelet = place(pod, dedicated="0", shared="1")  # the rebalancer's move
    report = sandboxes.sync(containers=containers, kubelet=kubelet, online=ALL)
    a = containers[0]
    assert report.errors == ()
    assert sandboxes.vcpu_map() == {a.id: {0: 1}}  # same vCPU, new host CPU
    assert sandboxes.guest_cpuset(a.id) == ONE  # nothing changes inside the guest
    assert vmm.affinity("CPU 1/KVM") == ZERO
    assert vmm.affinity("CPU 0/KVM") == ONE
    assert vmm.affinity("IO iothread1") == ONE


def test_vcpu_map_fits_the_run_json_line(pod, sandboxes):
    pod.spawn(*QEMU)
    containers, kubelet = place(pod, dedicated="1", shared="0")
    sandboxes.sync(containers=containers, kubelet=kubelet, online=ALL)
    snap = Snapshot(time=0.0, window=1.0, node="n", containers=(),
                    topology=synthetic(packages=1, cores_per_node=2))
    line = CycleReport(cycle=1, time=0.0, snapshot=snap, plan=Plan(time=0.0),
                       vcpu_map=sandboxes.vcpu_map()).to_json()
    assert line["vcpu_map"] == {containers[0].id: {"1": 1}}


def test_without_pinning_the_dedicated_container_floats_over_the_mask(pod, cg):
    from agent.config import VmSection
    from tests.vm.conftest import Cycle
    sandboxes = Cycle(cg, VmSection(pin_exclusive=False))
    vmm = pod.spawn(*QEMU)
    containers, kubelet = place(pod, dedicated="1", shared="0")
    sandboxes.sync(containers=containers, kubelet=kubelet, online=ALL)
    assert sandboxes.vcpu_map() == {}
    assert vmm.affinity("CPU 0/KVM") == ALL and vmm.affinity("CPU 1/KVM") == ALL


def test_pinning_follows_the_plans_moves_in_the_same_cycle(pod, sandboxes):
    from perfbalance.model import ContainerSample
    vmm = pod.spawn(*QEMU)
    containers, kubelet = place(pod, dedicated="1", shared="0")
    snap = Snapshot(time=0.0, window=1.0, node="n", kubelet=kubelet,
                    topology=synthetic(packages=1, cores_per_node=2),
                    containers=tuple(ContainerSample(container=c) for c in containers))
    sandboxes.sync_snapshot(snap)
    assert vmm.affinity("CPU 1/KVM") == ONE
    a, b = containers
    moved_kubelet = KubeletState(policy="static", default_cpuset=ONE, exclusive={(pod.uid, "ctr-a"): ZERO})
    snap = Snapshot(time=1.0, window=1.0, node="n", kubelet=moved_kubelet, topology=snap.topology,
                    containers=snap.containers)
    moves = (Action(kind="cpuset", container=a.id, frm="1", to="0", reason="planned move"),
             Action(kind="cpuset", container=b.id, frm="0", to="1", reason="planned move"))
    report = sandboxes.sync_snapshot(snap, plan=Plan(time=1.0, actions=moves))
    assert report.errors == ()
    assert sandboxes.vcpu_map() == {a.id: {0: 1}}
    assert vmm.affinity("CPU 1/KVM") == ZERO and vmm.affinity("CPU 0/KVM") == ONE
