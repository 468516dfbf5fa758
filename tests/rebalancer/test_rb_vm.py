"""The planner and VM sandboxes (Kata, KubeVirt): capacity is the pod's vCPUs rounded up once;
moves keep the vCPUs per host NUMA node (the guest NUMA layout); a VM pod moves as a whole."""

from __future__ import annotations

from dataclasses import replace

import pytest

from perfbalance.cpuset import CpuSet
from perfbalance.model import Action, Plan, Snapshot
from perfbalance.sandbox import VmmProcess
from perfbalance.topology import Topology
from rebalancer import PlannerState, RebalancerConfig, plan
from rebalancer.constraints import apply_actions, requests_needed, sandbox_mask, violations
from rebalancer.vm import per_node, plan_vcpus, sandboxes

from rb_builders import sample, snap, topo

THRASHER = dict(cpu_usage_cores=1.0, llc_misses_per_second=2e7, llc_mpki=25.0)
VICTIM = dict(cpu_usage_cores=1.0, llc_misses_per_second=8e6, llc_mpki=5.0)
NUMA_REASON = "changes the vCPUs per host NUMA node"


def two_sockets(l3_per_socket: int) -> Topology:
    """CPUs 0-3 on node 0, 4-7 on node 1; one L3 per socket, or two (0-1 and 2-3 on node 0)."""
    return topo(cores=4, threads=1, packages=2, l3=l3_per_socket)


def cache_clash(t: Topology, sandbox: str) -> Snapshot:
    """A cache aggressor (a two-container VM pod when `sandbox` is set) and its victim on 0-1."""
    return snap(t, sample("vm-a", "0-1", pod_uid="vm", sandbox=sandbox, limit=1500, **THRASHER),
                sample("vm-b", "0-1", pod_uid="vm", sandbox=sandbox, limit=500, cpu_usage_cores=0.1),
                sample("kv", "0-1", request=500, **VICTIM))


def victim_stays(s: Snapshot) -> PlannerState:
    """Keep the victim in dwell so that only the aggressor (the VM pod) can move."""
    return PlannerState(moved_at={"kv": s.time - 10})


def targets(p: Plan) -> dict[str, str]:
    return {a.container: a.to for a in p.actions if a.kind == "cpuset"}


# -- NUMA-preserving moves: each container keeps its CPUs per host node -----------------------

@pytest.mark.parametrize("sandbox", ["kata", "kubevirt"])
def test_vm_move_that_changes_vcpus_per_numa_node_is_refused(sandbox: str) -> None:
    s = cache_clash(two_sockets(1), sandbox)  # the only other L3 domain is the other socket
    p = plan(s, RebalancerConfig(), victim_stays(s), s.time)
    assert targets(p) == {}
    assert any(c["container"] == "vm-a" and NUMA_REASON in c["rejected"]
               and "node 0: 2 -> 0, node 1: 0 -> 2" in c["rejected"] for c in p.considered)


def test_vm_move_that_keeps_vcpus_per_numa_node_is_made() -> None:
    s = cache_clash(two_sockets(2), "kata")  # L3 domain 1 (CPUs 2-3) is on the same node
    p = plan(s, RebalancerConfig(), victim_stays(s), s.time)
    moved = targets(p)
    assert moved["vm-a"] == "2-3"
    assert per_node(s.topology, CpuSet.parse(moved["vm-a"])) == per_node(s.topology, CpuSet.parse("0-1"))
    assert violations(s, p) == []


def test_container_outside_a_vm_may_change_numa_node() -> None:
    s = cache_clash(two_sockets(1), "")
    moved = targets(plan(s, RebalancerConfig(), victim_stays(s), s.time))
    assert CpuSet.parse(moved["vm-a"]) <= CpuSet.parse("4-7")


# -- a VM pod moves as a whole ----------------------------------------------------------------

def test_vm_pod_containers_move_together() -> None:
    s = cache_clash(two_sockets(2), "kata")
    p = plan(s, RebalancerConfig(), victim_stays(s), s.time)
    follower = next(a for a in p.actions if a.container == "vm-b")
    assert targets(p)["vm-b"] == targets(p)["vm-a"]
    assert "vm-b moves with its VM pod" in follower.reason


def test_vm_pod_does_not_move_when_one_container_may_not() -> None:
    s = cache_clash(two_sockets(2), "kata")
    state = PlannerState(moved_at={"kv": s.time - 10, "vm-b": s.time - 10})
    p = plan(s, RebalancerConfig(), state, s.time)
    assert targets(p) == {}
    assert any(c["container"] == "vm-a" and "vm-b: dwell" in c["rejected"] for c in p.considered)


@pytest.mark.parametrize("moves, problem", [
    ({"vm-a": "2-3"}, "only ['vm-a'] of ['vm-a', 'vm-b'] move"),
    ({"vm-a": "2-3", "vm-b": "0,2"}, "to different CPUs"),
    ({"vm-a": "4-5", "vm-b": "4-5"}, NUMA_REASON),
])
def test_violations_name_broken_vm_rules(moves: dict[str, str], problem: str) -> None:
    s = cache_clash(two_sockets(2), "kata")
    actions = tuple(Action(kind="cpuset", container=c, frm="0-1", to=to, reason="test")
                    for c, to in moves.items())
    assert any(problem in v for v in violations(s, Plan(time=s.time, actions=actions)))


# -- capacity: the pod's vCPUs, rounded up once ------------------------------------------------

@pytest.mark.parametrize("sandbox, limits, requests, overhead, cpus", [
    ("kata", (750, 250), (0, 0), 0, 1),  # 0.75 + 0.25 -> 1 CPU, not ceil + ceil = 2
    ("kata", (750, 250), (0, 0), 500, 2),  # + VMM overhead 0.5 -> 1.5 -> 2
    ("kubevirt", (750, 1200), (0, 0), 0, 2),  # 1.95 -> 2, not 1 + 2 = 3
    ("kata", (None, None), (1500, 1500), 0, 1),  # no limits: 1 vCPU, whatever the requests
    ("", (750, 250), (750, 250), 500, 1),  # no VM: requests, summed and rounded once
])
def test_capacity_counts_a_vm_pod_by_its_vcpus(sandbox: str, limits: tuple[int | None, ...],
                                               requests: tuple[int, ...], overhead: int,
                                               cpus: int) -> None:
    s = snap(topo(cores=2, threads=1), *(
        sample(f"c{i}", "0", pod_uid="pod", sandbox=sandbox, limit=lim, request=req)
        for i, (lim, req) in enumerate(zip(limits, requests))))
    vms = sandboxes((c.container for c in s.containers), overhead_mcpu=overhead)
    placement = {c.id: c.container.cpuset.ids for c in s.containers}
    reqs = {c.id: c.container.request_mcpu for c in s.containers}
    assert requests_needed(placement, reqs, frozenset({0, 1}), vms) == cpus


def avx_beside_a_vm(overhead: int) -> tuple[Snapshot, RebalancerConfig]:
    """2 CPUs: AVX-512 and scalar work share both; a Kata pod (limits 0.75 + 0.25) has CPU 1."""
    s = snap(topo(cores=2, threads=1, model="AMD EPYC"),
             sample("avx", "0-1", cpu_usage_cores=0.9, avx512_heavy=1.0),
             sample("scalar", "0-1", cpu_usage_cores=0.7),
             sample("k1", "1", pod_uid="vm", sandbox="kata", limit=750, cpu_usage_cores=0.1),
             sample("k2", "1", pod_uid="vm", sandbox="kata", limit=250, cpu_usage_cores=0.1))
    return s, RebalancerConfig(avx512_license_loss={"AMD EPYC": 0.25}, vm_overhead_mcpu=overhead)


def test_vm_pod_of_one_rounded_vcpu_leaves_room_for_a_move() -> None:
    s, cfg = avx_beside_a_vm(0)  # the pod needs 1 vCPU; "scalar" (no request) may join it
    p = plan(s, cfg, None, s.time)
    assert targets(p) == {"avx": "0", "scalar": "1"}
    assert violations(s, p, vm_overhead_mcpu=0) == []


def test_vm_overhead_that_rounds_up_to_two_vcpus_blocks_the_move() -> None:
    s, cfg = avx_beside_a_vm(500)  # 0.5 + 0.75 + 0.25 = 1.5 -> 2 vCPUs: CPU 1 is full
    p = plan(s, cfg, None, s.time)
    assert targets(p) == {}
    assert any("within 1 need 2 CPUs" in c["rejected"] for c in p.considered)


def test_negative_limit_counts_as_no_limit() -> None:
    s = snap(topo(cores=2, threads=1), sample("c", "0", pod_uid="p", sandbox="kata", limit=-5))
    assert [sb.vcpus for sb in sandboxes((c.container for c in s.containers), overhead_mcpu=0)] == [1]


def test_vm_overhead_setting_defaults_to_the_agent_default() -> None:
    from agent.config import VmSection
    assert RebalancerConfig().vm_overhead_mcpu == VmSection().vmm_overhead_mcpu == 0


def test_exclusive_vm_container_stays_while_its_pod_mates_move() -> None:
    s = cache_clash(two_sockets(2), "kata")
    s = replace(s, containers=s.containers + (
        sample("vm-pinned", "7", pod_uid="vm", sandbox="kata", exclusive=True, limit=1000),))
    s = replace(s, kubelet=replace(s.kubelet, policy="static",
                                   exclusive={("vm", "vm-pinned"): CpuSet.parse("7")}))
    p = plan(s, RebalancerConfig(), victim_stays(s), s.time)
    assert targets(p) == {"vm-a": "2-3", "vm-b": "2-3"}
    assert violations(s, p) == []


@pytest.mark.parametrize("vm_cpus", ["0,8", "0-1,8-9"])
def test_vm_pod_evicted_from_an_avx_island_keeps_its_cpus_per_node(vm_cpus: str) -> None:
    t = topo(cores=4, threads=2, packages=2)  # node 0: CPUs 0-3 and their siblings 8-11
    s = snap(t, sample("avx", "0-3,8-11", cpu_usage_cores=1.5, avx512_heavy=1.0, request=1000),
             sample("web", "0-3,8-11", cpu_usage_cores=1.0, request=500),
             sample("k1", vm_cpus, pod_uid="vm", sandbox="kata", limit=500, cpu_usage_cores=0.3),
             sample("k2", vm_cpus, pod_uid="vm", sandbox="kata", limit=500, cpu_usage_cores=0.3))
    moved = targets(plan(s, RebalancerConfig(), None, s.time))
    island, vm = CpuSet.parse(moved["avx"]), CpuSet.parse(moved["k1"])
    assert moved["k2"] == moved["k1"] and island.isdisjoint(vm)
    assert per_node(t, vm) == per_node(t, CpuSet.parse(vm_cpus))


# -- whose cpusets make the mask: the rule the applied pinning uses (rebalancer.vm.vm_workloads) --

def vmm_in(container: str, *, busy: tuple[str, ...]) -> VmmProcess:
    return VmmProcess(pod="vm", cgroup=f"test/{container}", pid=100, comm="qemu-system-x86",
                      vcpus={0: 200, 1: 201}, helpers=(100,), container=container,
                      allowed=CpuSet.parse("0-1"), busy=busy)


def vmm_holder_beside_avx(holder: str, overhead: int) -> tuple[Snapshot, RebalancerConfig]:
    """`avx_beside_a_vm` with the VMM in a third container of the pod, `sbx`, which holds the
    shared pool 0-1 (Kata's pod sandbox container when `holder` is "kata" or unlabelled "vm";
    KubeVirt's compute container, a workload, when "kubevirt")."""
    s, cfg = avx_beside_a_vm(overhead)
    s = replace(s, containers=s.containers + (
        sample("sbx", "0-1", pod_uid="vm", sandbox=holder, cpu_usage_cores=0.2),))
    return replace(s, vmms=(vmm_in("sbx", busy=("sbx",)),)), cfg


def planned_mask(s: Snapshot, p: Plan, overhead: int) -> CpuSet:
    (sb,) = sandboxes((c.container for c in s.containers), overhead_mcpu=overhead, vmms=s.vmms)
    return CpuSet(sandbox_mask(apply_actions(s, p.actions), sb))


@pytest.mark.parametrize("holder, workloads, mask", [
    ("kata", ("k1", "k2"), "1"),  # Kata per-container: the pod sandbox container is no workload
    ("vm", ("k1", "k2"), "1"),  # unlabelled, the other containers without host processes: the same
    ("kubevirt", ("k1", "k2", "sbx"), "0-1"),  # control: KubeVirt's compute container is the workload
])
def test_the_planner_mask_is_the_mask_the_pinning_applies(holder: str, workloads: tuple[str, ...],
                                                          mask: str) -> None:
    s, _ = vmm_holder_beside_avx(holder, 0)
    (sb,) = sandboxes((c.container for c in s.containers), overhead_mcpu=0, vmms=s.vmms)
    assert sb.workloads == workloads and sb.members == ("k1", "k2", "sbx")
    (pinning,) = plan_vcpus(s)
    assert planned_mask(s, Plan(time=s.time), 0) == pinning.affinity[200] == CpuSet.parse(mask)


def test_the_vmm_in_the_pods_only_container_counts() -> None:
    s = snap(topo(cores=2, threads=1), sample("vmc", "0-1", pod_uid="vm", sandbox="vm", limit=1500))
    s = replace(s, vmms=(vmm_in("vmc", busy=("vmc",)),))  # control: nothing else to run the vCPUs
    (sb,) = sandboxes((c.container for c in s.containers), overhead_mcpu=0, vmms=s.vmms)
    assert sb.workloads == ("vmc",) and sb.vcpus == 2
    assert planned_mask(s, Plan(time=s.time), 0) == plan_vcpus(s)[0].affinity[200] == CpuSet.parse("0-1")


def test_the_kata_sandbox_container_adds_nothing_to_the_vcpus() -> None:
    s, _ = vmm_holder_beside_avx("kata", 500)
    s = replace(s, containers=tuple(replace(c, container=replace(c.container, limit_mcpu=2000))
                                    if c.id == "sbx" else c for c in s.containers))
    (kata,) = sandboxes((c.container for c in s.containers), overhead_mcpu=500, vmms=s.vmms)
    assert kata.vcpus == 2  # 0.5 + 0.75 + 0.25, not + the pause container's 2
    (unknown,) = sandboxes((c.container for c in s.containers), overhead_mcpu=500)
    assert unknown.vcpus == 4  # control: without the VMM's facts every container counts, as before


def test_a_move_onto_the_kata_vcpus_counts_them_although_the_sandbox_container_is_wider() -> None:
    s, _ = vmm_holder_beside_avx("kata", 500)  # 2 vCPUs on CPU 1 alone (the applied mask)
    onto = Plan(time=s.time, actions=(Action(kind="cpuset", container="scalar", frm="0-1", to="1",
                                             reason="test"),))
    assert any("scalar: requests within 1 need 2 CPUs" in v
               for v in violations(s, onto, vm_overhead_mcpu=500))
    s, _ = vmm_holder_beside_avx("kubevirt", 500)  # control: the vCPUs may use 0-1, room on 1
    assert not [v for v in violations(s, onto, vm_overhead_mcpu=500) if "scalar" in v]


@pytest.mark.parametrize("overhead, made", [(0, True), (500, False)])
def test_a_kata_pod_with_its_sandbox_container_moves_by_its_vcpus(overhead: int, made: bool) -> None:
    s, cfg = vmm_holder_beside_avx("kata", overhead)
    p = plan(s, cfg, None, s.time)
    assert violations(s, p, vm_overhead_mcpu=overhead) == []
    if made:  # 1 vCPU on CPU 1: "scalar" may join it; the sandbox container follows its pod
        assert targets(p) == {"avx": "0", "scalar": "1", "sbx": "1", "k1": "1", "k2": "1"}
        assert planned_mask(s, p, overhead) == plan_vcpus(s, actions=p.actions)[0].affinity[200]
    else:  # 2 vCPUs fill CPU 1: the sandbox container's CPU 0 is not theirs to count on
        assert targets(p) == {}
        assert any("within 1 need 2 CPUs" in c["rejected"] for c in p.considered)


def test_the_kubevirt_compute_container_keeps_its_cpus_per_numa_node() -> None:
    s, cfg = vmm_holder_beside_avx("kubevirt", 0)  # control: compute runs the vCPUs
    p = plan(s, cfg, None, s.time)
    assert targets(p) == {}
    assert any("sbx (kata pod vm)" in c["rejected"] and NUMA_REASON in c["rejected"] for c in p.considered)


def with_pinned_workload(s: Snapshot) -> Snapshot:
    """The pod also has a container with dedicated CPU 0, which its sandbox container holds."""
    s = replace(s, containers=s.containers + (
        sample("kp", "0", pod_uid="vm", sandbox="kata", exclusive=True, limit=1000),))
    return replace(s, kubelet=replace(s.kubelet, policy="static", exclusive={("vm", "kp"): CpuSet.parse("0")}))


def test_the_kata_sandbox_container_may_not_move_off_its_pods_dedicated_cpus() -> None:
    s = with_pinned_workload(vmm_holder_beside_avx("kata", 0)[0])
    onto = Plan(time=s.time, actions=tuple(Action(kind="cpuset", container=c, frm=f, to="1", reason="test")
                                           for c, f in (("sbx", "0-1"), ("k1", "1"), ("k2", "1"))))
    assert any("sandbox container sbx would hold 1, without the dedicated CPUs 0" in v
               for v in violations(s, onto))
    s, _ = vmm_holder_beside_avx("kata", 0)  # control: nothing pinned, the same move is sound
    assert not [v for v in violations(s, onto) if "sandbox container" in v]


def clash_with_sandbox_container(*, pinned: bool) -> Snapshot:
    """`cache_clash` (2 L3s per socket) with the VMM in the pod sandbox container `sbx`, and, when
    `pinned`, a pod-mate with dedicated CPU 7, which `sbx` holds too."""
    s = cache_clash(two_sockets(2), "kata")
    extra = (sample("sbx", "0-1,7" if pinned else "0-1", pod_uid="vm", sandbox="kata", cpu_usage_cores=0.1),)
    if pinned:
        extra += (sample("vm-pinned", "7", pod_uid="vm", sandbox="kata", exclusive=True, limit=1000),)
        s = replace(s, kubelet=replace(s.kubelet, policy="static",
                                       exclusive={("vm", "vm-pinned"): CpuSet.parse("7")}))
    vmm = replace(vmm_in("sbx", busy=("sbx",)), allowed=CpuSet.parse("0-1,7" if pinned else "0-1"))
    return replace(s, containers=s.containers + extra, vmms=(vmm,))


def test_the_kata_sandbox_container_follows_its_pods_move() -> None:
    s = clash_with_sandbox_container(pinned=False)
    p = plan(s, RebalancerConfig(), victim_stays(s), s.time)
    assert targets(p) == {"vm-a": "2-3", "vm-b": "2-3", "sbx": "2-3"} and violations(s, p) == []
    (pinning,) = plan_vcpus(s, actions=p.actions)
    assert pinning.affinity[200] == planned_mask(s, p, 0) == CpuSet.parse("2-3") and pinning.notes == ()


def test_a_kata_pod_whose_sandbox_container_would_drop_its_dedicated_cpus_stays() -> None:
    s = clash_with_sandbox_container(pinned=True)  # vm-pinned's vCPU needs CPU 7 in sbx's cgroup
    p = plan(s, RebalancerConfig(), victim_stays(s), s.time)
    assert targets(p) == {}
    assert any("sandbox container sbx would hold 2-3, without the dedicated CPUs 7" in c["rejected"]
               for c in p.considered)
