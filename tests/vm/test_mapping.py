"""The pure host CPU <-> vCPU mapping and sandbox plans, on topologies larger than this host."""

from __future__ import annotations

import pytest

from perfbalance.cpuset import CpuSet
from perfbalance.model import Container, KubeletState
from perfbalance.topology import synthetic
from rebalancer.vm import VmLayoutError, map_vcpus, plan_sandbox, shared_pool, to_guest, to_host

S = CpuSet.parse
TWO_SOCKETS = synthetic(packages=2, nodes_per_package=1, cores_per_node=4, threads_per_core=2)
# node 0: CPUs 0-3,8-11; node 1: CPUs 4-7,12-15


def ctr(cid, cpus, *, exclusive=False):
    return Container(id=cid, cgroup=f"pod/{cid}", cpuset=S(cpus), exclusive=exclusive)


def test_dedicated_host_cpus_become_guest_vcpus_after_the_guest_vcpu():
    """A on host CPU 4, B on 5-6, VM vCPUs 0-3: vCPU 0 stays for the guest, 1-3 map 1:1."""
    p = map_vcpus(exclusive={"A": S("4"), "B": S("5-6")}, vcpus=range(4))
    assert p.mapping == {"A": {4: 1}, "B": {5: 2, 6: 3}}
    assert to_guest(p.mapping["B"], S("5-6")) == S("2-3")
    assert to_host(p.mapping["B"], S("2-3")) == S("5-6")


def test_unchanged_cpus_keep_their_vcpus():
    prev = {"A": {4: 3}, "B": {5: 1, 6: 2}}
    p = map_vcpus(exclusive={"A": S("4"), "B": S("5-6")}, vcpus=range(4), previous=prev)
    assert p.mapping == prev


def test_a_moved_container_keeps_its_vcpu_indices():
    prev = {"B": {5: 2, 6: 3}}
    p = map_vcpus(exclusive={"B": S("9-10")}, vcpus=range(4), previous=prev)
    assert sorted(p.mapping["B"].values()) == [2, 3]


def test_a_partly_moved_container_keeps_the_unmoved_pair():
    p = map_vcpus(exclusive={"B": S("5,7")}, vcpus=range(4), previous={"B": {5: 2, 6: 3}})
    assert p.mapping == {"B": {5: 2, 7: 3}}


def test_released_vcpus_are_reused_on_the_same_host_node():
    prev = {"B": {0: 1, 4: 2}}  # vCPU 1 on node 0, vCPU 2 on node 1
    p = map_vcpus(exclusive={"B": S("5,9")}, vcpus=range(3), previous=prev, topology=TWO_SOCKETS)
    assert p.mapping == {"B": {5: 2, 9: 1}}  # node-1 CPU 5 takes the node-1 vCPU


def test_a_growing_container_does_not_take_vcpus_another_released():
    prev = {"A": {1: 1}, "B": {2: 2}}
    # In one cycle A grows to 1-2 and B moves from 2 to 3: B keeps its vCPU 2, A takes a free one.
    p = map_vcpus(exclusive={"A": S("1-2"), "B": S("3")}, vcpus=range(4), previous=prev)
    assert p.mapping == {"A": {1: 1, 2: 3}, "B": {3: 2}}


def test_system_vcpus_are_pinned_last():
    assert map_vcpus(exclusive={"A": S("6")}, vcpus=range(3), system_vcpus=1).mapping == {"A": {6: 1}}
    assert map_vcpus(exclusive={"A": S("6-7")}, vcpus=range(2), system_vcpus=1).mapping == \
        {"A": {6: 1, 7: 0}}


def test_too_few_vcpus_leaves_the_container_unpinned_and_says_why():
    p = map_vcpus(exclusive={"A": S("4-6"), "B": S("8")}, vcpus=range(2))
    assert "A" not in p.mapping
    assert p.mapping == {"B": {8: 1}}
    assert any("container A" in m and "3 dedicated CPUs" in m for m in p.problems)


def test_to_guest_refuses_unmapped_host_cpus():
    with pytest.raises(VmLayoutError) as e:
        to_guest({4: 1}, S("4-5"), container="A")
    assert "5" in str(e.value) and "A" in str(e.value)


def test_shared_pool_is_default_minus_reserved_and_dedicated():
    kubelet = KubeletState(policy="static", default_cpuset=S("0-7"),
                           exclusive={("p", "c"): S("4-5")})
    others = [ctr("x", "6", exclusive=True), ctr("y", "0-7")]
    assert shared_pool(online=S("0-15"), kubelet=kubelet, reserved=S("0"), containers=others) == S("1-3,7")


def test_shared_pool_without_static_policy_is_all_online_but_reserved():
    assert shared_pool(online=S("0-3"), kubelet=KubeletState(), reserved=S("0")) == S("1-3")


def test_plan_mask_is_the_or_of_the_containers():
    plan = plan_sandbox(containers=[ctr("a", "2"), ctr("b", "5-6")], vcpus=range(2), pool=S("0-7"))
    assert plan.mask == S("2,5-6")
    assert plan.vcpu_affinity == {0: S("2,5-6"), 1: S("2,5-6")}
    assert plan.helper_affinity == S("0-7")


def test_plan_pins_dedicated_and_floats_the_rest_off_them():
    plan = plan_sandbox(containers=[ctr("a", "4-5", exclusive=True), ctr("b", "0-3")],
                        vcpus=range(4), pool=S("0-3"))
    assert plan.vcpu_affinity == {0: S("0-3"), 1: S("4"), 2: S("5"), 3: S("0-3")}
    assert plan.guest_cpusets == {"a": S("1-2"), "b": S("0,3")}


def test_only_dedicated_containers_float_the_guest_vcpus_on_the_pool():
    plan = plan_sandbox(containers=[ctr("a", "4", exclusive=True)], vcpus=range(2), pool=S("0-1"))
    assert plan.vcpu_affinity == {0: S("0-1"), 1: S("4")}


def test_empty_pool_falls_back_and_is_reported():
    plan = plan_sandbox(containers=[ctr("a", "2-3")], vcpus=range(2), pool=CpuSet())
    assert plan.helper_affinity == S("2-3")
    assert any("shared pool is empty" in p for p in plan.problems)
