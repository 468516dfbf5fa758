"""Generate the hand-made sysfs tree `2s4n-smt2/`: a 2-socket, 4-NUMA-node, SMT-2 host.

    python tests/data/sysfs/make_2s4n.py tests/data/sysfs/2s4n-smt2

Shape (numbered the way Linux numbers Intel hosts: all first threads, then all siblings):
- 2 packages x 2 NUMA nodes (sub-NUMA clustering) x 4 cores x 2 threads = 32 CPUs;
  package 0 = CPUs 0-7,16-23; package 1 = CPUs 8-15,24-31; node n = cores 4n..4n+3.
- one L3 domain per node (two per socket), cache id = node id, 16 MiB each;
- SST-BF: cores 1 and 9 (CPUs 1,17,9,25) have base_frequency 2.7 GHz, the rest 2.1 GHz;
- CPU 31 is isolated (isolcpus=31); 64 GiB per node.
"""

from __future__ import annotations

import os
import shutil
import sys

from perfbalance.cpuset import CpuSet

PACKAGES, NODES_PER_PACKAGE, CORES_PER_NODE, THREADS = 2, 2, 4, 2
CORES = PACKAGES * NODES_PER_PACKAGE * CORES_PER_NODE
NCPUS = CORES * THREADS
HIGH_PRIORITY_CORES = (1, 9)
ISOLATED = "31"
NODE_KB = 64 << 20


def cpulist(ids: list[int]) -> str:
    return str(CpuSet(ids))


def put(root: str, rel: str, text: str) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text + "\n")


def core_of(cpu: int) -> int:
    return cpu % CORES  # global core index


def node_of_core(core: int) -> int:
    return core // CORES_PER_NODE


def cpus_of_core(core: int) -> list[int]:
    return [core + t * CORES for t in range(THREADS)]


def cpus_of_node(node: int) -> list[int]:
    return [c for core in range(node * CORES_PER_NODE, (node + 1) * CORES_PER_NODE)
            for c in cpus_of_core(core)]


def cpus_of_package(pkg: int) -> list[int]:
    return [c for n in range(pkg * NODES_PER_PACKAGE, (pkg + 1) * NODES_PER_PACKAGE)
            for c in cpus_of_node(n)]


def write_cpu(root: str, cpu: int) -> None:
    core = core_of(cpu)
    node = node_of_core(core)
    pkg = node // NODES_PER_PACKAGE
    base = f"devices/system/cpu/cpu{cpu}"
    if cpu:
        put(root, f"{base}/online", "1")
    put(root, f"{base}/topology/physical_package_id", str(pkg))
    put(root, f"{base}/topology/die_id", "0")
    put(root, f"{base}/topology/core_id", str(core % (NODES_PER_PACKAGE * CORES_PER_NODE)))
    put(root, f"{base}/topology/thread_siblings_list", cpulist(cpus_of_core(core)))
    put(root, f"{base}/topology/core_siblings_list", cpulist(cpus_of_package(pkg)))
    caches = [(1, "Data", "48K", cpus_of_core(core), core), (1, "Instruction", "32K", cpus_of_core(core), core),
              (2, "Unified", "2048K", cpus_of_core(core), core), (3, "Unified", "16384K", cpus_of_node(node), node)]
    for i, (level, kind, size, shared, cid) in enumerate(caches):
        d = f"{base}/cache/index{i}"
        put(root, f"{d}/level", str(level))
        put(root, f"{d}/type", kind)
        put(root, f"{d}/size", size)
        put(root, f"{d}/id", str(cid))
        put(root, f"{d}/shared_cpu_list", cpulist(shared))
    khz = 2700000 if core in HIGH_PRIORITY_CORES else 2100000
    put(root, f"{base}/cpufreq/base_frequency", str(khz))


def make(root: str) -> None:
    if os.path.exists(root):
        shutil.rmtree(root)
    allcpus = cpulist(list(range(NCPUS)))
    for name, text in (("online", allcpus), ("possible", allcpus), ("present", allcpus),
                       ("offline", ""), ("isolated", ISOLATED)):
        put(root, f"devices/system/cpu/{name}", text)
    for cpu in range(NCPUS):
        write_cpu(root, cpu)
    nodes = PACKAGES * NODES_PER_PACKAGE
    for name in ("online", "possible", "has_cpu", "has_memory"):
        put(root, f"devices/system/node/{name}", f"0-{nodes - 1}")
    for n in range(nodes):
        put(root, f"devices/system/node/node{n}/cpulist", cpulist(cpus_of_node(n)))
        put(root, f"devices/system/node/node{n}/meminfo",
            f"Node {n} MemTotal:       {NODE_KB} kB\nNode {n} MemFree:        {NODE_KB // 2} kB")


if __name__ == "__main__":
    make(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "2s4n-smt2"))
