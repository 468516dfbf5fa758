"""Read the node's CPU topology from sysfs (root passed in) into a perfbalance Topology.

The planner needs packages, NUMA nodes, physical cores, L3 domains, isolated CPUs and SST-BF
high-priority CPUs; sysfs has all of them but each in its own small file, some of which are
missing on VMs, old kernels or half-offlined CPUs. This module reads those files one by one
(`_read_*`), parses them purely (`parse_*`), and fills the gaps with explicit defaults:

- no `die_id` (kernel < 5.2): die 0;
- no NUMA node directory: node 0;
- no L3 cache entry: l3 = -1; an L3 without `id` (kernel < 5.0, some VMs): domains numbered
  by their `shared_cpu_list`, lowest CPU first;
- `core_id`s that contradict `thread_siblings_list` (some hypervisors report core_id 0 for
  every vCPU): the core is named by its lowest sibling instead, so SMT grouping stays right;
- a CPU listed online whose directory vanished (hot-unplug during the read) is skipped.

An unparsable file is a ParseError naming the file and the value.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from perfbalance.cpus import online_cpus
from perfbalance.cpuset import CpuSet
from perfbalance.errors import FeatureUnavailable, ParseError
from perfbalance.safefs import read_text
from perfbalance.topology import Cpu, Topology

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 1 << 16
CPUINFO_MAX_BYTES = 16 << 20  # about 1.5 KiB per CPU: room for 10,000 CPUs
CPU_DIR = "devices/system/cpu"
NODE_DIR = "devices/system/node"


# ---------------------------------------------------------------------------------------------
# pure parsers
# ---------------------------------------------------------------------------------------------

def parse_int(text: str, *, source: str = "") -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ParseError("sysfs integer", text.strip()[:80], "not an integer", source=source) from None


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_cache_size(text: str, *, source: str = "") -> int:
    """cache/index*/size: "32768K" -> bytes."""
    t = text.strip().upper()
    unit = t[-1] if t and t[-1] in "KMG" else ""
    try:
        return int(t[: len(t) - len(unit)]) * _SIZE_UNITS[unit]
    except ValueError:
        raise ParseError("cache size", text.strip()[:40], "expected e.g. '32768K'", source=source) from None


def parse_node_meminfo(text: str, *, source: str = "") -> int:
    """node*/meminfo: the "Node N MemTotal: X kB" line -> bytes."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "MemTotal:":
            value = parse_int(parts[3], source=source)
            return value * 1024 if len(parts) > 4 and parts[4] == "kB" else value
    raise ParseError("node meminfo", text[:80], "no MemTotal line", source=source)


def parse_cpu_model(cpuinfo: str) -> str:
    """/proc/cpuinfo: the first "model name" (x86) or "Model"/"cpu model" value."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("model name", "cpu model", "model") and not value.strip().isdigit():
            return value.strip()
    return ""


@dataclass(frozen=True, kw_only=True)
class CacheInfo:
    level: int
    id: int | None  # None when sysfs has no `id` file
    size_bytes: int
    shared: CpuSet


@dataclass(frozen=True, kw_only=True)
class CpuInfo:
    """What sysfs says about one CPU, before defaults and cross-checks."""

    id: int
    package: int
    die: int
    core_id: int
    siblings: CpuSet
    l3: CacheInfo | None
    base_khz: int


# ---------------------------------------------------------------------------------------------
# readers
# ---------------------------------------------------------------------------------------------

def _read(path: str) -> str | None:
    """The text of a small sysfs file, or None when it does not exist (ParseError beyond
    MAX_FILE_BYTES)."""
    try:
        return read_text(path, MAX_FILE_BYTES, "sysfs file")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as e:
        # Some attributes (e.g. cpufreq on a VM) exist but refuse reads: treat as absent.
        log.debug("cannot read %s: %s", path, e.strerror)
        return None


def _read_cpuinfo(path: str) -> str:
    """/proc/cpuinfo, or "" when it cannot be read: the model name is optional."""
    try:
        return read_text(path, CPUINFO_MAX_BYTES, "cpuinfo")
    except (OSError, ParseError) as e:
        log.debug("cannot read %s: %s", path, e)
        return ""


def _read_int(path: str, default: int) -> int:
    text = _read(path)
    return default if text is None or not text.strip() else parse_int(text, source=path)


def _read_cpuset(path: str) -> CpuSet | None:
    text = _read(path)
    return None if text is None else CpuSet.parse(text, source=path)


def read_online(sysfs_root: str) -> CpuSet:
    """cpu/online; without it, every cpuN directory whose `online` is not 0 (perfbalance.cpus)."""
    return online_cpus(sysfs_root)


def _read_l3(cpu_dir: str) -> CacheInfo | None:
    cache = os.path.join(cpu_dir, "cache")
    try:
        indexes = sorted(n for n in os.listdir(cache) if n.startswith("index"))
    except OSError:
        return None
    for name in indexes:
        d = os.path.join(cache, name)
        if _read_int(os.path.join(d, "level"), 0) != 3:
            continue
        shared = _read_cpuset(os.path.join(d, "shared_cpu_list")) or CpuSet()
        size_text = _read(os.path.join(d, "size"))
        cid = _read(os.path.join(d, "id"))
        return CacheInfo(
            level=3, id=None if cid is None or not cid.strip() else parse_int(cid, source=os.path.join(d, "id")),
            size_bytes=0 if size_text is None else parse_cache_size(size_text, source=os.path.join(d, "size")),
            shared=shared)
    return None


def read_cpu(sysfs_root: str, cpu: int) -> CpuInfo | None:
    """One CPU's topology files; None when its directory is gone (offlined meanwhile)."""
    d = os.path.join(sysfs_root, CPU_DIR, f"cpu{cpu}")
    if not os.path.isdir(d):
        return None
    t = os.path.join(d, "topology")
    package = _read_int(os.path.join(t, "physical_package_id"), 0)
    siblings = _read_cpuset(os.path.join(t, "thread_siblings_list")) or CpuSet([cpu])
    return CpuInfo(
        id=cpu, package=max(package, 0), die=max(_read_int(os.path.join(t, "die_id"), 0), 0),
        core_id=_read_int(os.path.join(t, "core_id"), cpu), siblings=siblings, l3=_read_l3(d),
        base_khz=_read_int(os.path.join(d, "cpufreq", "base_frequency"), 0))


def read_nodes(sysfs_root: str) -> dict[int, CpuSet]:
    """NUMA node id -> its CPUs (node*/cpulist); {} when the node directory is absent."""
    base = os.path.join(sysfs_root, NODE_DIR)
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    out: dict[int, CpuSet] = {}
    for n in sorted(names):
        if n.startswith("node") and n[4:].isdigit():
            cpus = _read_cpuset(os.path.join(base, n, "cpulist"))
            if cpus is not None:
                out[int(n[4:])] = cpus
    return out


def read_node_memory(sysfs_root: str, nodes: Mapping[int, CpuSet]) -> dict[int, int]:
    out: dict[int, int] = {}
    for n in nodes:
        path = os.path.join(sysfs_root, NODE_DIR, f"node{n}", "meminfo")
        text = _read(path)
        if text is not None:
            out[n] = parse_node_meminfo(text, source=path)
    return out


# ---------------------------------------------------------------------------------------------
# assembly (pure)
# ---------------------------------------------------------------------------------------------

def core_ids(infos: list[CpuInfo]) -> dict[int, int]:
    """cpu -> core number; core_id if it agrees with thread_siblings_list, else lowest sibling."""
    groups: dict[tuple[int, int, int], set[int]] = {}
    for i in infos:
        groups.setdefault((i.package, i.die, i.core_id), set()).add(i.id)
    online = {i.id for i in infos}
    consistent = all(set(groups[(i.package, i.die, i.core_id)]) == (i.siblings.ids & online)
                     for i in infos)
    if consistent:
        return {i.id: i.core_id for i in infos}
    log.warning("sysfs core_id contradicts thread_siblings_list; naming cores by their lowest sibling")
    return {i.id: min(i.siblings.ids & online or {i.id}) for i in infos}


def l3_ids(infos: list[CpuInfo]) -> dict[int, int]:
    """cpu -> L3 domain; the cache `id` when every L3 has one, else numbered by shared CPUs."""
    l3s = [i.l3 for i in infos if i.l3 is not None]
    if l3s and all(c.id is not None for c in l3s):
        return {i.id: (i.l3.id if i.l3 is not None and i.l3.id is not None else -1) for i in infos}
    domains = sorted({c.shared for c in l3s}, key=lambda s: min(s.ids, default=-1))
    number = {s: n for n, s in enumerate(domains)}
    return {i.id: (number[i.l3.shared] if i.l3 is not None else -1) for i in infos}


def assemble(infos: list[CpuInfo], *, nodes: Mapping[int, CpuSet], isolated: CpuSet,
             node_mem: Mapping[int, int], cpu_model: str = "") -> Topology:
    """Build the Topology value from what was read."""
    if not infos:
        raise ParseError("sysfs topology", "", "no online CPU could be read")
    node_of = {cpu: n for n, cpus in nodes.items() for cpu in cpus}
    cores, l3 = core_ids(infos), l3_ids(infos)
    cpus = tuple(Cpu(id=i.id, package=i.package, die=i.die, node=node_of.get(i.id, 0),
                     core=cores[i.id], l3=l3[i.id], base_mhz=i.base_khz // 1000)
                 for i in sorted(infos, key=lambda i: i.id))
    sizes = [i.l3.size_bytes for i in infos if i.l3 is not None]
    return Topology(cpus=cpus, isolated=isolated & CpuSet(c.id for c in cpus),
                    l3_size_bytes=max(sizes, default=0), cpu_model=cpu_model,
                    node_mem_bytes=dict(node_mem))


def read_topology(sysfs_root: str, *, procfs_root: str | None = None) -> Topology:
    """The node's topology from `<sysfs_root>/devices/system/{cpu,node}` (and cpuinfo's model)."""
    online = read_online(sysfs_root)
    if not online:
        raise FeatureUnavailable("sysfs topology", f"no online CPUs under {sysfs_root}/{CPU_DIR}")
    infos = []
    for cpu in online:
        info = read_cpu(sysfs_root, cpu)
        if info is None:
            log.warning("cpu%d is listed online but %s has no directory for it; skipped", cpu, sysfs_root)
            continue
        infos.append(info)
    nodes = read_nodes(sysfs_root)
    isolated = _read_cpuset(os.path.join(sysfs_root, CPU_DIR, "isolated")) or CpuSet()
    model = ""
    if procfs_root is not None:
        model = parse_cpu_model(_read_cpuinfo(os.path.join(procfs_root, "cpuinfo")))
    return assemble(infos, nodes=nodes, isolated=isolated,
                    node_mem=read_node_memory(sysfs_root, nodes), cpu_model=model)
