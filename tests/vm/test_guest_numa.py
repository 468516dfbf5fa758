"""Guest NUMA nodes from the pinned host CPUs, hugepages split, moves that keep it."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfbalance.cpuset import CpuSet
from perfbalance.topology import synthetic
from rebalancer.vm import (VmLayoutError, check_numa_move, check_pinning_move, guest_numa,
                           split_hugepages)

S = CpuSet.parse
TWO_SOCKETS = synthetic(packages=2, nodes_per_package=1, cores_per_node=4, threads_per_core=2)
# node 0: CPUs 0-3,8-11; node 1: CPUs 4-7,12-15
CAPTURED = Path(__file__).resolve().parents[1] / "data" / "sysfs" / "2s4n-smt2"


def test_vcpus_on_two_host_nodes_make_two_guest_nodes():
    nodes = guest_numa(pins={0: 2, 1: 3, 2: 5, 3: 13}, topology=TWO_SOCKETS, hugepages=4)
    assert [(n.id, n.vcpus, n.host_node, n.host_cpus) for n in nodes] == [
        (0, S("0-1"), 0, S("2-3")), (1, S("2-3"), 1, S("5,13"))]


def test_guest_nodes_are_numbered_from_the_boot_vcpu():
    nodes = guest_numa(pins={0: 4, 1: 0}, topology=TWO_SOCKETS, hugepages=2)
    assert [(n.id, n.host_node) for n in nodes] == [(0, 1), (1, 0)]


def test_each_guest_node_fits_its_host_node():
    pins = {v: h for v, h in enumerate([0, 1, 2, 3, 8, 9, 10, 11, 4])}  # all of node 0 + one of node 1
    nodes = guest_numa(pins=pins, topology=TWO_SOCKETS, hugepages=9)
    host = TWO_SOCKETS.nodes()
    for n in nodes:
        assert n.host_cpus <= host[n.host_node]
        assert len(n.vcpus) <= len(host[n.host_node])
    assert [len(n.vcpus) for n in nodes] == [8, 1]


def test_uneven_hugepages_give_the_remainder_to_the_first_nodes():
    nodes = guest_numa(pins={0: 0, 1: 4}, topology=TWO_SOCKETS, hugepages=5, page_size_bytes=1 << 30)
    assert [n.hugepages for n in nodes] == [3, 2]
    assert [n.memory_bytes for n in nodes] == [3 << 30, 2 << 30]


@pytest.mark.parametrize("total,nodes,split", [(4, 2, (2, 2)), (7, 3, (3, 2, 2)), (5, 4, (2, 1, 1, 1)), (1, 1, (1,))])
def test_split_hugepages(total, nodes, split):
    assert split_hugepages(total, nodes) == split
    assert sum(split) == total


def test_fewer_hugepages_than_guest_nodes_is_rejected():
    with pytest.raises(VmLayoutError) as e:
        guest_numa(pins={0: 0, 1: 4}, topology=TWO_SOCKETS, hugepages=1)
    assert "2 guest NUMA nodes" in str(e.value) and "at least 2 hugepages" in str(e.value)


def test_two_vcpus_on_one_host_cpu_are_rejected():
    with pytest.raises(VmLayoutError) as e:
        guest_numa(pins={0: 3, 1: 3}, topology=TWO_SOCKETS, hugepages=2)
    assert "same host CPU" in str(e.value)


def test_pin_to_an_offline_cpu_is_rejected():
    with pytest.raises(VmLayoutError):
        guest_numa(pins={0: 99}, topology=TWO_SOCKETS, hugepages=1)


def test_captured_four_node_host():
    sysfs = pytest.importorskip("agent.discover.sysfs")
    topo = sysfs.read_topology(str(CAPTURED))
    node_of = {n: cpus for n, cpus in topo.nodes().items()}
    pins = {0: min(node_of[0]), 1: min(node_of[2]), 2: max(node_of[2]), 3: min(node_of[3])}
    nodes = guest_numa(pins=pins, topology=topo, hugepages=7)
    assert [(n.host_node, len(n.vcpus), n.hugepages) for n in nodes] == [(0, 1, 3), (2, 2, 2), (3, 1, 2)]


def test_move_within_the_same_nodes_is_allowed():
    assert check_numa_move(topology=TWO_SOCKETS, before=S("0-1,4"), after=S("2,8,12")) is None


def test_move_changing_vcpus_per_host_node_is_refused_with_a_reason():
    reason = check_numa_move(topology=TWO_SOCKETS, before=S("0-1,4"), after=S("0,4-5"))
    assert reason is not None
    assert "node 0: 2 -> 1" in reason and "node 1: 1 -> 2" in reason


def test_move_to_offline_cpus_is_refused():
    assert "not online" in check_numa_move(topology=TWO_SOCKETS, before=S("0"), after=S("40"))


def test_pinning_move_must_keep_each_vcpu_on_its_node():
    before = {0: 0, 1: 4}
    assert check_pinning_move(topology=TWO_SOCKETS, before=before, after={0: 1, 1: 5}) is None
    swapped = check_pinning_move(topology=TWO_SOCKETS, before=before, after={0: 4, 1: 0})
    assert swapped is not None and "vCPU 0: node 0 -> 1" in swapped
