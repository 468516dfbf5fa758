"""The allocator: die, then node, then whole cores in one node/die, then threads; SST-BF."""

from __future__ import annotations

import pytest

from perfbalance.topology import Cpu, Topology, synthetic
from rebalancer.allocator import allocate
from rebalancer.topoindex import TopoIndex

# 2 packages x 2 dies x 2 cores x 2 threads = 16 CPUs; node = package; siblings offset by 8.
TWO_SOCKET = TopoIndex.build(synthetic(packages=2, dies_per_package=2, cores_per_node=4, threads_per_core=2))


def ids(text: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        out |= set(range(int(a), int(b or a) + 1))
    return frozenset(out)


@pytest.mark.parametrize("free, count, kw, expected", [
    ("0-15", 4, {}, "0-1,8-9"),                    # exactly one die
    ("0-15", 8, {}, "0-3,8-11"),                   # exactly one NUMA node
    ("0-15", 8, {"prefer_nodes": [1]}, "4-7,12-15"),  # ... the preferred one
    ("0-15", 2, {}, "0,8"),                        # one whole core
    ("1-15", 2, {}, "1,9"),                        # core 0 is busy: next whole core
    ("0-15", 6, {}, "0-2,8-10"),                   # whole cores inside one node
    ("0-15", 3, {"whole_cores": True}, "0-1,8-9"),  # rounded up to whole cores
    ("1-15", 1, {}, "8"),                          # a lone thread of a busy core first
    ("1-15", 3, {}, "1,8-9"),                      # whole core + the lone thread
    ("0-3,8-11,4", 9, {}, "0-4,8-11"),             # nothing fits in one node: span
])
def test_allocation_preference(free: str, count: int, kw: dict, expected: str) -> None:
    assert allocate(TWO_SOCKET, ids(free), count, **kw) == ids(expected)


@pytest.mark.parametrize("free, count, kw", [
    ("0-3", 5, {}),
    ("0-3", 3, {"whole_cores": True}),  # no whole core inside 0-3 (siblings are 8-11)
    ("0-15", 0, {}),
])
def test_allocation_impossible(free: str, count: int, kw: dict) -> None:
    assert allocate(TWO_SOCKET, ids(free), count, **kw) is None


def sst_bf() -> TopoIndex:
    cpus = tuple(Cpu(id=i, package=0, die=0, node=0, core=i, l3=0, base_mhz=2700 if i in (2, 3) else 2100)
                 for i in range(6))
    return TopoIndex.build(Topology(cpus=cpus))


def test_sensitive_containers_get_high_priority_cpus() -> None:
    assert allocate(sst_bf(), frozenset(range(6)), 2, high_priority=True) == {2, 3}


def test_other_containers_avoid_high_priority_cpus() -> None:
    assert allocate(sst_bf(), frozenset(range(6)), 2) == {0, 1}
