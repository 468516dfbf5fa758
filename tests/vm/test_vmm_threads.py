"""Recognising a VM sandbox: the VMM among a pod's processes and its threads by name."""

from __future__ import annotations

import pytest

from agent.config import VmSection
from agent.discover.vmm import classify, compile_patterns, vcpu_index
from perfbalance.cpuset import CpuSet
from perfbalance.model import KubeletState
from tests.vm.conftest import ALL, CLOUD_HYPERVISOR, QEMU

DEFAULT = compile_patterns(VmSection().vcpu_patterns)


@pytest.mark.parametrize("comm,index", [
    ("CPU 0/KVM", 0), ("CPU 13/KVM", 13), ("vcpu0", 0), ("vcpu7", 7), ("fc_vcpu 3", 3),
    ("IO iothread1", None), ("qemu-system-x86", None), ("vhost-1234", None), ("http-server", None),
    ("CPU 0/KVMx", None), ("vcpu", None),
])
def test_default_patterns_read_the_vcpu_index(comm, index):
    assert vcpu_index(comm, DEFAULT) == index


def test_configured_pattern_adds_a_vmm():
    patterns = compile_patterns((*VmSection().vcpu_patterns, r"^vcpu_(\d+)$"))
    assert vcpu_index("vcpu_4", patterns) == 4


def test_classify_splits_vcpus_from_helpers():
    comms = {100: "qemu-system-x86", 101: "CPU 1/KVM", 102: "CPU 0/KVM", 103: "IO iothread1",
             104: "vhost-100"}
    t = classify(100, comms, DEFAULT, vhost={200: "vhost-100"})
    assert t.vcpus == {0: 102, 1: 101}
    assert t.helpers == (100, 103, 104, 200)


def test_duplicate_vcpu_index_keeps_one_vcpu():
    t = classify(1, {1: "x", 5: "vcpu0", 6: "vcpu0"}, DEFAULT)
    assert t.vcpus == {0: 5}
    assert 6 in t.helpers


@pytest.mark.root
def test_finds_the_qemu_standin_in_the_pod_cgroup(pod, sandboxes):
    vmm = pod.spawn(*QEMU)
    found = sandboxes.find_vmm(pod.rel)
    assert found is not None
    assert found.pid == vmm.pid
    assert found.vcpus == {0: vmm.tids["CPU 0/KVM"], 1: vmm.tids["CPU 1/KVM"]}
    assert set(found.helpers) == {vmm.tids[n] for n in ("qemu-system-x86", "IO iothread1", "IO mon_iothread")}


@pytest.mark.root
def test_finds_the_cloud_hypervisor_standin(pod, sandboxes):
    vmm = pod.spawn(*CLOUD_HYPERVISOR)
    found = sandboxes.find_vmm(pod.rel)
    assert found is not None and found.pid == vmm.pid
    assert found.vcpus == {0: vmm.tids["vcpu0"], 1: vmm.tids["vcpu1"]}


@pytest.mark.root
def test_a_pod_without_a_vmm_is_left_alone(pod, sandboxes):
    other = pod.spawn("postgres", ["bgwriter", "walwriter"])
    before = {n: other.affinity(n) for n in other.tids}
    pod.set_cpus("ctr-a", "1")
    report = sandboxes.sync(containers=[pod.container("ctr-a")], online=ALL,
                            kubelet=KubeletState(default_cpuset=ALL))
    assert report.sandboxes == () and report.writes == 0
    assert {n: other.affinity(n) for n in other.tids} == before


@pytest.mark.root
def test_vcpu_named_threads_find_an_unnamed_vmm_in_a_labelled_pod(pod, sandboxes):
    vmm = pod.spawn("runtime-rs", ["vcpu0", "vcpu1", "vmm"])  # e.g. a VMM built into the shim
    found = sandboxes.find_vmm(pod.rel, scan_threads=True)
    assert found is not None and found.pid == vmm.pid
    assert sandboxes.find_vmm(pod.rel, scan_threads=False) is None


@pytest.mark.root
def test_kernel_vhost_worker_in_the_pod_is_a_helper(pod, sandboxes):
    pod.set_cpus("ctr-a", "1")
    pod.set_cpus("ctr-b", "1")
    vmm = pod.spawn(*QEMU)
    vhost = pod.spawn(f"vhost-{vmm.pid}", [])  # stands for the kernel's vhost-<qemu pid> worker
    kubelet = KubeletState(policy="static", default_cpuset=CpuSet([0]))
    report = sandboxes.sync(containers=[pod.container("ctr-a"), pod.container("ctr-b")],
                            kubelet=kubelet, online=ALL)
    assert vhost.pid in report.sandboxes[0].helpers
    assert vhost.affinity(f"vhost-{vmm.pid}") == CpuSet([0])
