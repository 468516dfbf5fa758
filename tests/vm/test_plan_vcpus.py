"""The planner's vCPU pinning (`Plan.vcpu_pinning`) from `Snapshot.vmms`: per-thread CPUs, the
stable mapping, the guest NUMA layout with the pod's hugepages, and moves that would break it."""

from __future__ import annotations

import json
from dataclasses import replace

from agent.export.report import CycleReport
from perfbalance.cpuset import CpuSet, union
from perfbalance.model import Action, Container, ContainerSample, KubeletState, Plan, Snapshot
from perfbalance.sandbox import PodHugepages, VmmProcess
from perfbalance.topology import synthetic
from rebalancer.config import RebalancerConfig
from rebalancer.context import Context
from rebalancer.decisions import Decision
from rebalancer.planner import _guest_layout_constraint
from rebalancer.state import PlannerState
from rebalancer.vm import layout_move_problem, plan_vcpus

S = CpuSet.parse
TWO_SOCKETS = synthetic(packages=2, nodes_per_package=1, cores_per_node=4, threads_per_core=2)
# node 0: CPUs 0-3,8-11; node 1: CPUs 4-7,12-15
MB2 = 2 << 20


def ctr(cid, cpus, *, exclusive=False, pod="p1"):
    return Container(id=cid, name=cid, pod_uid=pod, cgroup=f"kubepods/pod{pod}/{cid}", cpuset=S(cpus),
                     exclusive=exclusive, sandbox="kata")


def vmm(*, pod="p1", vcpus=4, hugepages=()):
    return VmmProcess(pod=pod, cgroup=f"kubepods/pod{pod}", pid=100, comm="qemu-system-x86",
                      vcpus={v: 200 + v for v in range(vcpus)}, helpers=(100, 300), hugepages=hugepages)


def snapshot(containers, vmms, *, kubelet=None):
    dedicated = {(c.pod_uid, c.name): c.cpuset for c in containers if c.exclusive}
    kubelet = kubelet or KubeletState(policy="static", default_cpuset=S("0-15") - union(dedicated.values()),
                                      exclusive=dedicated)
    return Snapshot(time=0.0, window=1.0, node="n", topology=TWO_SOCKETS, kubelet=kubelet,
                    containers=tuple(ContainerSample(container=c) for c in containers), vmms=tuple(vmms))


def test_every_thread_gets_its_cpus_by_tid():
    snap = snapshot([ctr("a", "4", exclusive=True), ctr("b", "0-1")], [vmm()])
    (p,) = plan_vcpus(snap)
    assert p.pod == "p1" and p.vmm_pid == 100
    assert p.mapping == {"a": {4: 1}}
    assert p.affinity[201] == S("4")  # vCPU 1 pinned 1:1
    assert p.affinity[200] == S("0-1")  # the others float over the mask without the pinned CPU
    assert p.affinity[100] == p.affinity[300] == snap.kubelet.default_cpuset  # helpers: shared pool


def test_a_pod_without_a_vmm_gets_no_pinning():
    assert plan_vcpus(snapshot([ctr("a", "4", exclusive=True)], [])) == ()


def test_the_previous_pinning_keeps_the_vcpu_across_a_move():
    first = plan_vcpus(snapshot([ctr("a", "5", exclusive=True), ctr("b", "0")], [vmm()]))
    vcpu = first[0].mapping["a"][5]
    moved = plan_vcpus(snapshot([ctr("a", "6", exclusive=True), ctr("b", "0")], [vmm()]), previous=first)
    assert moved[0].mapping == {"a": {6: vcpu}}


def test_pinning_follows_the_plans_cpuset_actions():
    snap = snapshot([ctr("a", "0-1"), ctr("b", "0-1")], [vmm(vcpus=2)])
    moves = [Action(kind="cpuset", container=c, frm="0-1", to="2-3", reason="test") for c in ("a", "b")]
    (p,) = plan_vcpus(snap, actions=moves)
    assert p.affinity[200] == p.affinity[201] == S("2-3")


def test_guest_numa_is_built_from_the_pinned_cpus_with_the_pods_hugepages():
    held = (PodHugepages(page_size_bytes=MB2, total=8, per_node={0: 4, 1: 4}),)
    snap = snapshot([ctr("a", "2,5", exclusive=True), ctr("b", "0")], [vmm(hugepages=held)])
    (p,) = plan_vcpus(snap)
    assert [(n.host_node, n.host_cpus, n.hugepages, n.memory_bytes) for n in p.guest_numa] == [
        (0, S("2"), 4, 4 * MB2), (1, S("5"), 4, 4 * MB2)]
    assert p.problems == ()


def test_hugepages_on_the_wrong_host_node_are_a_problem():
    held = (PodHugepages(page_size_bytes=MB2, total=8, per_node={0: 8}),)
    (p,) = plan_vcpus(snapshot([ctr("a", "2,5", exclusive=True), ctr("b", "0")], [vmm(hugepages=held)]))
    assert any("host node 1" in x and "needs 4 hugepages" in x and "holds 0" in x for x in p.problems)


def test_without_pinned_vcpus_there_is_no_guest_numa_layout():
    (p,) = plan_vcpus(snapshot([ctr("a", "0-1"), ctr("b", "0-1")], [vmm()]))
    assert p.guest_numa == () and p.mapping == {}


def test_a_move_taking_a_vcpu_to_another_host_node_is_refused():
    before = [ctr("a", "2,5", exclusive=True)]
    after = [ctr("a", "2,3", exclusive=True)]
    why = layout_move_problem(topology=TWO_SOCKETS, vmm=vmm(), before=before, after=after)
    assert why is not None and "guest NUMA layout" in why and "node 1 -> 0" in why
    same_nodes = [ctr("a", "3,6", exclusive=True)]
    assert layout_move_problem(topology=TWO_SOCKETS, vmm=vmm(), before=before, after=same_nodes) is None


def test_a_move_leaving_a_guest_node_without_its_hugepages_is_refused():
    held = (PodHugepages(page_size_bytes=MB2, total=4, per_node={0: 2, 1: 2}),)
    before = [ctr("a", "2,5", exclusive=True)]
    fine = layout_move_problem(topology=TWO_SOCKETS, vmm=vmm(hugepages=held), before=before,
                               after=[ctr("a", "3,6", exclusive=True)])
    assert fine is None
    short = (PodHugepages(page_size_bytes=MB2, total=4, per_node={0: 4}),)
    already = layout_move_problem(topology=TWO_SOCKETS, vmm=vmm(hugepages=short), before=before,
                                  after=[ctr("a", "3,6", exclusive=True)])
    assert already is None  # not broken by the move: it was so before (and is reported as a problem)


def test_the_planner_refuses_a_decision_that_breaks_the_layout_and_says_why():
    containers = [ctr("a", "2,5", exclusive=True), ctr("b", "0-1")]
    snap = snapshot(containers, [vmm()])
    ctx = Context.build(snap, RebalancerConfig(), PlannerState(), {}, 0.0)
    d = Decision(kind="test", primary="a", reason="test", cpus={"a": frozenset({2, 3})})
    why = _guest_layout_constraint(ctx, ctx.base, d)
    assert "guest NUMA layout would break" in why and "pod p1" in why


def test_run_json_exports_the_guest_numa_and_hugepages():
    held = (PodHugepages(page_size_bytes=MB2, total=2, per_node={0: 1, 1: 1}),)
    snap = snapshot([ctr("a", "2,5", exclusive=True), ctr("b", "0")], [vmm(hugepages=held)])
    pinning = plan_vcpus(snap)
    line = json.loads(json.dumps(CycleReport(cycle=1, time=0.0, snapshot=snap, plan=Plan(time=0.0),
                                             vcpu_pinning=pinning).to_json()))
    sb = line["vm_sandboxes"]["p1"]
    assert [(n["host_node"], n["host_cpus"], n["hugepages"]) for n in sb["guest_numa"]] == [(0, "2", 1), (1, "5", 1)]
    assert sb["hugepages"] == [{"page_size_bytes": MB2, "total": 2, "per_node": {"0": 1, "1": 1}}]
    assert Snapshot.from_json(line).vmms == snap.vmms  # `perfbalance plan` replays the threads found


def test_metrics_export_guest_nodes_and_hugepages_per_host_node():
    from agent.export.prometheus import _guest_numa
    held = (PodHugepages(page_size_bytes=MB2, total=6, per_node={0: 2, 1: 4}),)
    snap = snapshot([ctr("a", "2,5", exclusive=True), ctr("b", "0")], [vmm(hugepages=held)])
    report = CycleReport(cycle=1, time=0.0, snapshot=snap, plan=Plan(time=0.0), vcpu_pinning=plan_vcpus(snap))
    fams = {f.name: f for f in _guest_numa(report)}
    vcpus = {(s.labels["guest_node"], s.labels["host_node"]): s.value
             for s in fams["perfbalance_vm_guest_numa_vcpus"].samples}
    assert vcpus == {("0", "0"): 1, ("1", "1"): 1}
    held_series = {s.labels["host_node"]: s.value for s in fams["perfbalance_vm_hugepages"].samples}
    assert held_series == {"0": 2, "1": 4}


# -- whose cpusets make the mask, and the VMM cgroup's cpuset as a bound --------------------------

def kata_layout(*, busy=("sandbox",), kind="vm"):
    """Kata's per-container layout: the VMM in the pod sandbox container's cgroup (the pod's CPUs),
    the workload container's host cgroup empty."""
    cs = [replace(ctr("sandbox", "0-7"), sandbox=kind), replace(ctr("a", "4"), sandbox=kind)]
    return snapshot(cs, [replace(vmm(vcpus=2), container="sandbox", allowed=S("0-7"), busy=busy)])


def test_the_pod_sandbox_container_holding_the_vmm_does_not_widen_the_mask():
    (p,) = plan_vcpus(kata_layout())
    assert p.affinity[200] == p.affinity[201] == S("4")  # the workload container's cpuset only
    assert set(p.guest_cpusets) == {"a"}  # the sandbox container is no workload of the guest


def test_kata_metadata_marks_the_vmm_container_as_the_sandbox_even_with_host_processes():
    (p,) = plan_vcpus(kata_layout(busy=("a", "sandbox"), kind="kata"))
    assert p.affinity[200] == S("4")


def test_the_vmm_container_counts_when_another_container_has_host_processes():
    (p,) = plan_vcpus(kata_layout(busy=("a", "sandbox")))  # control: a KubeVirt-like pod with a sidecar
    assert p.affinity[200] == S("0-7")


def test_kubevirt_metadata_keeps_the_compute_container_in_the_mask():
    (p,) = plan_vcpus(kata_layout(kind="kubevirt"))  # control: compute is the workload
    assert p.affinity[200] == S("0-7")


def kubevirt_layout(*, allowed, previous=()):
    """KubeVirt: the VMM in the compute container, whose cgroup holds its dedicated CPU 5 only."""
    compute = replace(ctr("compute", "5", exclusive=True), sandbox="kubevirt")
    snap = snapshot([compute], [replace(vmm(vcpus=2), container="compute", allowed=S(allowed),
                                        busy=("compute",))])
    return plan_vcpus(snap, previous=previous)


def test_helpers_and_unpinned_vcpus_stay_within_the_vmm_cgroup_when_the_pool_lies_outside():
    (p,) = kubevirt_layout(allowed="5")
    assert p.mapping == {"compute": {5: 1}}  # 1:1 pinning of the dedicated CPU kept
    assert p.affinity[201] == S("5")
    assert p.affinity[200] == p.affinity[100] == p.affinity[300] == S("5")  # not the pool
    assert p.problems == ()  # not an error of every cycle ...
    assert p.notes == ("the shared pool 0-4,6-15 lies outside the VMM's cgroup cpuset 5; "
                       "helper threads run on 5 instead",)  # ... but said


def test_helpers_go_to_the_pool_when_the_vmm_cgroup_covers_it():
    (p,) = kubevirt_layout(allowed="0-15")  # control: the same pod, the VMM's cgroup wide
    assert p.affinity[201] == S("5")
    assert p.affinity[100] == p.affinity[200] == S("0-4,6-15")
    assert p.notes == ()


def test_the_bound_keeps_the_vcpu_mapping_across_cycles():
    first = kubevirt_layout(allowed="5")
    again = kubevirt_layout(allowed="5", previous=first)
    assert again[0].mapping == first[0].mapping == {"compute": {5: 1}}


def test_dedicated_cpus_outside_the_vmm_cgroup_are_not_pinned_and_noted():
    (p,) = kubevirt_layout(allowed="6-7")
    assert p.mapping == {}
    assert all(cpus <= S("6-7") for cpus in p.affinity.values())
    assert any("dedicated CPUs 5 lie outside the VMM's cgroup cpuset 6-7" in n for n in p.notes)


def test_an_unknown_vmm_cgroup_cpuset_bounds_nothing():
    (p,) = kubevirt_layout(allowed="")  # as before: helpers on the pool
    assert p.affinity[100] == S("0-4,6-15") and p.notes == ()


def test_the_vmm_facts_round_trip_through_json():
    v = replace(vmm(), container="compute", allowed=S("5"), busy=("compute",))
    assert VmmProcess.from_json(json.loads(json.dumps(v.to_json()))) == v


def test_the_bound_follows_the_vmm_container_when_the_cycle_moves_it():
    moves = [Action(kind="cpuset", container=c, frm=f, to=t, reason="test")
             for c, f, t in (("sandbox", "0-7", "8-11"), ("a", "4", "9"))]
    (p,) = plan_vcpus(kata_layout(), actions=moves)  # the pod moves whole, its sandbox included
    assert p.affinity[200] == S("9") and p.notes == ()  # not held back by the old cgroup cpuset
