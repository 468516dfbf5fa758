"""vCPU threads run on the OR of the sandbox's containers' cpusets,
helpers on the shared pool; checked on stand-in VMMs in real cgroups with sched_getaffinity."""

from __future__ import annotations

import pytest

from perfbalance.cpuset import CpuSet
from perfbalance.model import Container, ContainerSample, KubeletState, Snapshot
from perfbalance.topology import synthetic
from tests.vm.conftest import ALL, CLOUD_HYPERVISOR, QEMU

pytestmark = pytest.mark.root

ONE, ZERO = CpuSet([1]), CpuSet([0])


def sync(sandboxes, pod, *, kubelet=KubeletState(default_cpuset=ALL), extra=()):
    containers = [pod.container("ctr-a"), pod.container("ctr-b"), *extra]
    return sandboxes.sync(containers=containers, kubelet=kubelet, online=ALL)


def test_qemu_vcpus_get_the_or_of_container_cpusets(pod, sandboxes):
    pod.set_cpus("ctr-a", "1")
    pod.set_cpus("ctr-b", "1")
    vmm = pod.spawn(*QEMU)
    report = sync(sandboxes, pod)
    assert report.errors == ()
    assert [s.vmm_pid for s in report.sandboxes] == [vmm.pid]
    assert vmm.affinity("CPU 0/KVM") == ONE
    assert vmm.affinity("CPU 1/KVM") == ONE


def test_qemu_helpers_go_to_the_shared_pool(pod, sandboxes):
    pod.set_cpus("ctr-a", "1")
    pod.set_cpus("ctr-b", "1")
    vmm = pod.spawn(*QEMU)
    sync(sandboxes, pod)
    for name in ("qemu-system-x86", "IO iothread1", "IO mon_iothread"):
        assert vmm.affinity(name) == ALL, name


def test_mask_follows_a_container_cpuset_update(pod, sandboxes):
    pod.set_cpus("ctr-a", "1")
    pod.set_cpus("ctr-b", "1")
    vmm = pod.spawn(*QEMU)
    sync(sandboxes, pod)
    assert vmm.affinity("CPU 0/KVM") == ONE
    pod.set_cpus("ctr-a", "0")
    pod.set_cpus("ctr-b", "0")
    sync(sandboxes, pod)
    assert vmm.affinity("CPU 0/KVM") == ZERO
    assert vmm.affinity("CPU 1/KVM") == ZERO
    pod.set_cpus("ctr-b", "1")
    sync(sandboxes, pod)
    assert vmm.affinity("CPU 0/KVM") == ALL
    assert vmm.affinity("CPU 1/KVM") == ALL


def test_sync_is_idempotent(pod, sandboxes):
    pod.set_cpus("ctr-a", "0")
    pod.set_cpus("ctr-b", "0")
    pod.spawn(*QEMU)
    first = sync(sandboxes, pod)
    second = sync(sandboxes, pod)
    assert first.writes > 0
    assert second.writes == 0


def test_a_thread_moved_by_someone_else_is_put_back(pod, sandboxes):
    import os
    pod.set_cpus("ctr-a", "1")
    pod.set_cpus("ctr-b", "1")
    vmm = pod.spawn(*QEMU)
    sync(sandboxes, pod)
    os.sched_setaffinity(vmm.tids["CPU 1/KVM"], {0})
    report = sync(sandboxes, pod)
    assert report.writes == 1
    assert vmm.affinity("CPU 1/KVM") == ONE


def test_helpers_stay_off_cpus_dedicated_to_other_containers(pod, sandboxes):
    pod.set_cpus("ctr-a", "0")
    pod.set_cpus("ctr-b", "0")
    vmm = pod.spawn(*QEMU)
    kubelet = KubeletState(policy="static", default_cpuset=ZERO,
                           exclusive={("other-pod", "db"): ONE})
    other = Container(id="other-db", name="db", pod_uid="other-pod", cgroup="elsewhere/db",
                      cpuset=ONE, exclusive=True)
    report = sync(sandboxes, pod, kubelet=kubelet, extra=[other])
    assert report.errors == ()
    for name in ("qemu-system-x86", "IO iothread1", "IO mon_iothread"):
        assert vmm.affinity(name) == ZERO, name
    assert vmm.affinity("CPU 0/KVM") == ZERO


def test_cloud_hypervisor_vcpus_follow_the_mask(pod, sandboxes):
    pod.set_cpus("ctr-a", "0")
    pod.set_cpus("ctr-b", "0")
    vmm = pod.spawn(*CLOUD_HYPERVISOR)
    sync(sandboxes, pod)
    assert vmm.affinity("vcpu0") == ZERO
    assert vmm.affinity("vcpu1") == ZERO
    pod.set_cpus("ctr-a", "1")
    pod.set_cpus("ctr-b", "1")
    sync(sandboxes, pod)
    assert vmm.affinity("vcpu0") == ONE
    assert vmm.affinity("vcpu1") == ONE


def test_cloud_hypervisor_helpers_stay_off_dedicated_cpus(pod, sandboxes):
    pod.set_cpus("ctr-a", "1")
    pod.set_cpus("ctr-b", "1")
    vmm = pod.spawn(*CLOUD_HYPERVISOR)
    kubelet = KubeletState(policy="static", default_cpuset=ALL, exclusive={("x", "y"): ZERO})
    sync(sandboxes, pod, kubelet=kubelet)
    for name in ("cloud-hyperviso", "http-server", "signal_handler", "_disk0_q0"):
        assert vmm.affinity(name) == ONE, name


def test_the_vmm_cgroup_cpuset_bounds_every_thread_and_is_noted_not_an_error(pod, sandboxes):
    pod.cg.write(pod.ctr("sandbox"), "cpuset", "cpuset.cpus", "0")
    pod.set_cpus("ctr-a", "1")
    pod.set_cpus("ctr-b", "1")
    vmm = pod.spawn(*QEMU)
    report = sync(sandboxes, pod)
    assert report.errors == () and report.problems == ()
    (p,) = report.sandboxes
    assert any("sandbox mask 1 lies outside the VMM's cgroup cpuset 0" in n for n in p.notes), p.notes
    assert vmm.affinity("CPU 0/KVM") == vmm.affinity("qemu-system-x86") == ZERO


def test_a_cgroup_narrowed_after_discovery_is_reported_not_raised(pod, sandboxes):
    pod.set_cpus("ctr-a", "1")
    pod.set_cpus("ctr-b", "1")
    vmm = pod.spawn(*QEMU)
    containers = [pod.container("ctr-a"), pod.container("ctr-b")]
    found = sandboxes.discovery.find(containers)  # the VMM's cgroup still allows 0-1
    pod.cg.write(pod.ctr("sandbox"), "cpuset", "cpuset.cpus", "0")
    snap = Snapshot(time=0.0, window=1.0, node="n", topology=synthetic(packages=1, cores_per_node=2),
                    kubelet=KubeletState(default_cpuset=ALL), vmms=found.vmms,
                    containers=tuple(ContainerSample(container=c) for c in containers))
    report = sandboxes.sync_snapshot(snap)
    assert any(f"tid {vmm.tids['CPU 0/KVM']}" in e and "EINVAL" in e for e in report.errors)
    assert vmm.affinity("CPU 0/KVM") == ZERO  # the kernel kept it inside its cpuset
