"""VM sandboxes as values: the VMM threads discovery found, and the vCPU pinning the planner chose.

A Kata or KubeVirt pod's work runs on its VMM's vCPU threads. Discovery (agent/discover/vmm.py)
finds the VMM and its threads and the hugepages the pod holds on each host NUMA node
(`VmmProcess`, carried in `Snapshot.vmms`); the planner (rebalancer/vm.py) turns them into a
`VcpuPinning` per sandbox (in `Plan.vcpu_pinning`): the CPUs every thread must run on, the host
CPU <-> vCPU mapping and the guest NUMA layout; the vCPU actuator (agent/act/vcpu.py) applies it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perfbalance.cpuset import CpuSet
from perfbalance.errors import ParseError


@dataclass(frozen=True, kw_only=True)
class PodHugepages:
    """Hugepages of one size a pod holds, per host NUMA node (hugetlb cgroup `numa_stat`).

    `per_node` is empty when the kernel gives only the pod's total (no `numa_stat` file)."""

    page_size_bytes: int
    total: int  # pages
    per_node: Mapping[int, int] = field(default_factory=dict)  # host node -> pages

    def to_json(self) -> dict[str, Any]:
        return {"page_size_bytes": self.page_size_bytes, "total": self.total,
                "per_node": {str(n): p for n, p in sorted(self.per_node.items())}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PodHugepages:
        return cls(page_size_bytes=int(d["page_size_bytes"]), total=int(d["total"]),
                   per_node={int(n): int(p) for n, p in dict(d.get("per_node", {})).items()})


@dataclass(frozen=True, kw_only=True)
class VmmProcess:
    """One pod's VMM as discovery found it: who runs where, nothing decided yet."""

    pod: str  # pod key: pod UID, else the pod's cgroup (Container.pod_key)
    cgroup: str  # the pod's cgroup, relative to the cgroup root
    pid: int
    comm: str
    vcpus: Mapping[int, int]  # vCPU index -> TID
    helpers: tuple[int, ...]  # TIDs: main loop, I/O threads, vhost workers
    hugepages: tuple[PodHugepages, ...] = ()
    # The pod's container whose cgroup the VMM process is in ("" when it is in no container's
    # cgroup, as in Kata's `kata_<sandbox id>` cgroup): Kata's pod sandbox container, or
    # KubeVirt's compute container.
    container: str = ""
    # The effective cpuset of the VMM's own cgroup: sched_setaffinity cannot leave it (empty:
    # not known, no bound assumed).
    allowed: CpuSet = field(default_factory=CpuSet)
    # The pod's containers whose cgroups hold host processes (the VMM's included); the others'
    # work runs inside the VM.
    busy: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"pod": self.pod, "cgroup": self.cgroup, "pid": self.pid, "comm": self.comm,
                "vcpus": {str(v): t for v, t in sorted(self.vcpus.items())},
                "helpers": list(self.helpers), "hugepages": [h.to_json() for h in self.hugepages],
                "container": self.container, "allowed": str(self.allowed), "busy": list(self.busy)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, source: str = "vmm") -> VmmProcess:
        try:
            return cls(pod=str(d["pod"]), cgroup=str(d.get("cgroup", "")), pid=int(d["pid"]),
                       comm=str(d.get("comm", "")),
                       vcpus={int(v): int(t) for v, t in dict(d.get("vcpus", {})).items()},
                       helpers=tuple(int(t) for t in d.get("helpers", ())),
                       hugepages=tuple(PodHugepages.from_json(h) for h in d.get("hugepages", ())),
                       container=str(d.get("container", "")),
                       allowed=CpuSet.parse(str(d.get("allowed", "")), source=source),
                       busy=tuple(str(c) for c in d.get("busy", ())))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ParseError("vmm", str(d)[:120], f"{type(e).__name__}: {e}", source=source) from None


@dataclass(frozen=True, kw_only=True)
class GuestNode:
    """One guest NUMA node: its vCPUs, the host node and CPUs they are pinned to, its memory."""

    id: int
    vcpus: CpuSet
    host_node: int
    host_cpus: CpuSet
    hugepages: int
    memory_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "vcpus": str(self.vcpus), "host_node": self.host_node,
                "host_cpus": str(self.host_cpus), "hugepages": self.hugepages,
                "memory_bytes": self.memory_bytes}


@dataclass(frozen=True, kw_only=True)
class VcpuPinning:
    """The planner's answer for one VM sandbox: where each of its VMM's threads must run.

    `affinity` is per TID (vCPU and helper threads alike); `mapping` is container -> host CPU ->
    vCPU for containers pinned 1:1 (kept stable across moves: the next cycle's plan starts from
    it); `guest_cpusets` is what the in-guest agent must apply; `guest_numa` the guest NUMA
    nodes of the pinned vCPUs with the pod's hugepages split over them (empty when no vCPU is
    pinned); `problems` what could not be done, one line each (errors of every cycle); `notes`
    how the layout bounds the pinning (the VMM's cgroup cpuset leaves out the shared pool):
    state, not errors, logged once when they change."""

    pod: str
    vmm_pid: int
    affinity: Mapping[int, CpuSet]  # TID -> host CPUs
    vcpu_threads: Mapping[int, int]  # vCPU index -> TID
    helpers: tuple[int, ...]
    mapping: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    guest_cpusets: Mapping[str, CpuSet] = field(default_factory=dict)
    guest_numa: tuple[GuestNode, ...] = ()
    hugepages: tuple[PodHugepages, ...] = ()
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"pod": self.pod, "vmm_pid": self.vmm_pid,
                "guest_numa": [n.to_json() for n in self.guest_numa],
                "hugepages": [h.to_json() for h in self.hugepages],
                **({"problems": list(self.problems)} if self.problems else {}),
                **({"notes": list(self.notes)} if self.notes else {})}
