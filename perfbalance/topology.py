"""The node's CPU topology as a value: packages, dies, NUMA nodes, cores, SMT siblings, L3 domains.

Built by the sysfs reader in the agent (root passed in) or from a snapshot's JSON; used by the
planner and the allocator, which must not read sysfs themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perfbalance import jsonfields as jf
from perfbalance.cpuset import MAX_CPU_ID, CpuSet, union
from perfbalance.errors import ParseError

_MAX_ID = (1 << 31) - 1  # package, die, core, L3 ids and base MHz: any int sysfs can print


@dataclass(frozen=True, kw_only=True)
class Cpu:
    """One logical CPU and where it sits."""

    id: int
    package: int
    die: int
    node: int
    core: int  # core_id within the package; (package, die, core) identifies a physical core
    l3: int  # L3 cache id (the LLC domain); -1 when sysfs does not say
    base_mhz: int = 0  # cpufreq base_frequency in MHz, 0 when not exposed

    @property
    def core_key(self) -> tuple[int, int, int]:
        return (self.package, self.die, self.core)


@dataclass(frozen=True, kw_only=True)
class Topology:
    """All online CPUs of the node plus the sets the kernel marks specially."""

    cpus: tuple[Cpu, ...]
    isolated: CpuSet = field(default_factory=CpuSet)
    l3_size_bytes: int = 0  # size of one L3 domain; 0 when unknown
    cpu_model: str = ""
    node_mem_bytes: Mapping[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for c in self.cpus:
            if c.id in seen:
                raise ParseError("topology", c.id, "duplicate cpu id")
            seen.add(c.id)

    # -- lookups -------------------------------------------------------------------------
    @property
    def online(self) -> CpuSet:
        return CpuSet(c.id for c in self.cpus)

    def cpu(self, cpu_id: int) -> Cpu:
        for c in self.cpus:
            if c.id == cpu_id:
                return c
        raise KeyError(cpu_id)

    def _group(self, key: str) -> dict[Any, CpuSet]:
        groups: dict[Any, set[int]] = {}
        for c in self.cpus:
            k = c.core_key if key == "core" else getattr(c, key)
            groups.setdefault(k, set()).add(c.id)
        return {k: CpuSet(v) for k, v in sorted(groups.items())}

    def cores(self) -> dict[tuple[int, int, int], CpuSet]:
        """Physical cores: SMT siblings grouped together."""
        return self._group("core")

    def nodes(self) -> dict[int, CpuSet]:
        return self._group("node")

    def packages(self) -> dict[int, CpuSet]:
        return self._group("package")

    def dies(self) -> dict[tuple[int, int], CpuSet]:
        groups: dict[tuple[int, int], set[int]] = {}
        for c in self.cpus:
            groups.setdefault((c.package, c.die), set()).add(c.id)
        return {k: CpuSet(v) for k, v in sorted(groups.items())}

    def l3_domains(self) -> dict[int, CpuSet]:
        return self._group("l3")

    def siblings(self, cpu_id: int) -> CpuSet:
        key = self.cpu(cpu_id).core_key
        return CpuSet(c.id for c in self.cpus if c.core_key == key)

    def whole_cores(self, cpus: CpuSet) -> CpuSet:
        """The cores touched by `cpus`, with all their SMT siblings."""
        return union(s for s in self.cores().values() if not s.isdisjoint(cpus))

    def nodes_of(self, cpus: CpuSet) -> CpuSet:
        """NUMA node ids of the given CPUs (what cpuset.mems should follow)."""
        return CpuSet(c.node for c in self.cpus if c.id in cpus)

    def high_priority(self) -> CpuSet:
        """SST-BF high-priority CPUs: those whose base frequency is above the node's lowest."""
        freqs = {c.base_mhz for c in self.cpus if c.base_mhz}
        if len(freqs) < 2:
            return CpuSet()
        low = min(freqs)
        return CpuSet(c.id for c in self.cpus if c.base_mhz > low)

    # -- JSON ----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "cpus": [
                {"id": c.id, "package": c.package, "die": c.die, "node": c.node, "core": c.core,
                 "l3": c.l3, "base_mhz": c.base_mhz}
                for c in self.cpus
            ],
            "isolated": str(self.isolated),
            "l3_size_bytes": self.l3_size_bytes,
            "cpu_model": self.cpu_model,
            "node_mem_bytes": {str(k): v for k, v in self.node_mem_bytes.items()},
        }

    @classmethod
    def from_json(cls, data: Any, *, at: jf.At = jf.At(path="topology")) -> Topology:
        """Every id checked here: CPU and NUMA node ids are members of CpuSets (0..MAX_CPU_ID-1),
        package, die, core and L3 ids may be -1 (sysfs does not say)."""
        data = jf.obj(data, at)
        if "cpus" not in data:
            raise at.error(sorted(map(str, data))[:20], "missing key 'cpus'")
        cpus = tuple(_cpu(c, at.key("cpus").index(i))
                     for i, c in enumerate(jf.arr(data["cpus"], at.key("cpus"))))
        seen: set[int] = set()
        for i, c in enumerate(cpus):
            if c.id in seen:
                raise at.key("cpus").index(i).key("id").error(c.id, "duplicate cpu id")
            seen.add(c.id)
        mem_at = at.key("node_mem_bytes")
        return cls(
            cpus=cpus, isolated=jf.cpus(data.get("isolated", ""), at.key("isolated")),
            l3_size_bytes=jf.integer(data.get("l3_size_bytes", 0), at.key("l3_size_bytes"), lo=0),
            cpu_model=jf.text(data.get("cpu_model", ""), at.key("cpu_model")),
            node_mem_bytes={jf.integer(k, mem_at, lo=0, hi=MAX_CPU_ID - 1):
                            jf.integer(v, mem_at.key(str(k)), lo=0)
                            for k, v in jf.obj(data.get("node_mem_bytes", {}), mem_at).items()},
        )


def _cpu(c: Any, at: jf.At) -> Cpu:
    c = jf.obj(c, at)
    if "id" not in c:
        raise at.error(sorted(map(str, c))[:20], "missing key 'id'")

    def get(key: str, default: Any, lo: int, hi: int = _MAX_ID) -> int:
        return jf.integer(c.get(key, default), at.key(key), lo=lo, hi=hi)

    cpu_id = get("id", None, 0, MAX_CPU_ID - 1)
    return Cpu(id=cpu_id, package=get("package", 0, -1), die=get("die", 0, -1),
               node=get("node", 0, 0, MAX_CPU_ID - 1), core=get("core", cpu_id, -1),
               l3=get("l3", 0, -1), base_mhz=get("base_mhz", 0, 0))


def synthetic(*, packages: int, dies_per_package: int = 1, nodes_per_package: int = 1,
              cores_per_node: int, threads_per_core: int = 1, l3_per_package: int = 1,
              l3_size_bytes: int = 32 << 20, cpu_model: str = "synthetic") -> Topology:
    """A regular topology, numbered like Linux does (siblings offset by the CPU count).

    Used by the simulator and tests; the agent always reads the real one from sysfs.
    """
    cores_total = packages * nodes_per_package * cores_per_node
    cpus: list[Cpu] = []
    l3_per_node = max(1, l3_per_package // nodes_per_package)
    for t in range(threads_per_core):
        for g in range(cores_total):
            pkg, rest = divmod(g, nodes_per_package * cores_per_node)
            node_in_pkg, core_in_node = divmod(rest, cores_per_node)
            node = pkg * nodes_per_package + node_in_pkg
            dies_per_node = max(1, dies_per_package // nodes_per_package)
            die = (node_in_pkg * dies_per_package) // nodes_per_package
            die += (core_in_node * dies_per_node) // cores_per_node if dies_per_node > 1 else 0
            l3_local = (node_in_pkg * l3_per_package) // nodes_per_package
            l3_local += (core_in_node * l3_per_node) // cores_per_node if l3_per_node > 1 else 0
            cpus.append(Cpu(id=t * cores_total + g, package=pkg, die=die, node=node, core=rest,
                            l3=pkg * l3_per_package + l3_local))
    return Topology(cpus=tuple(sorted(cpus, key=lambda c: c.id)), l3_size_bytes=l3_size_bytes,
                    cpu_model=cpu_model)
