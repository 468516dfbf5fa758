"""The hugepages a pod holds, per host NUMA node: what a VM sandbox's guest memory is made of.

A KubeVirt or Kata VM with guest NUMA backs each guest node with hugepages on the host node its
vCPUs are pinned to. The kernel says which page sizes exist in sysfs
(`<sysfs>/devices/system/node/node<N>/hugepages/hugepages-<K>kB/`) and what a cgroup holds in
the hugetlb controller's files, named by size like the kernel's `hugetlb_cgroup_file_init`
("2MB", "1GB", "64KB"): `hugetlb.<size>.numa_stat` (per node, bytes; kernel 5.11+), else only
the total, `hugetlb.<size>.current` (v2) or `hugetlb.<size>.usage_in_bytes` (v1). Both roots are
passed in; nothing here opens a literal host path.
"""

from __future__ import annotations

import os
import re

from perfbalance.cgroupfs import Cgroupfs, CgroupfsError
from perfbalance.errors import ContainerGone, FeatureUnavailable, ParseError
from perfbalance.sandbox import PodHugepages

_SIZE_DIR = re.compile(r"hugepages-(\d+)kB\Z")
_NODE_DIR = re.compile(r"node(\d+)\Z")
_NODE_VALUE = re.compile(r"N(\d+)=(\d+)\Z")


def size_name(page_size_bytes: int) -> str:
    """The kernel's name for a hugepage size in hugetlb cgroup file names."""
    for unit, shift in (("GB", 30), ("MB", 20), ("KB", 10)):
        if page_size_bytes >= 1 << shift:
            return f"{page_size_bytes >> shift}{unit}"
    return f"{page_size_bytes}B"


def page_sizes(sysfs_root: str) -> tuple[int, ...]:
    """Hugepage sizes (bytes) the host's NUMA nodes offer, from sysfs; () when there is none."""
    base = os.path.join(sysfs_root, "devices", "system", "node")
    sizes: set[int] = set()
    try:
        nodes = [n for n in os.listdir(base) if _NODE_DIR.match(n)]
    except OSError:
        return ()
    for node in nodes:
        try:
            names = os.listdir(os.path.join(base, node, "hugepages"))
        except OSError:
            continue
        sizes.update(int(m.group(1)) << 10 for n in names if (m := _SIZE_DIR.match(n)))
    return tuple(sorted(sizes))


def parse_numa_stat(text: str, *, source: str = "hugetlb numa_stat") -> tuple[int, dict[int, int]]:
    """(total bytes, host node -> bytes) of a `hugetlb.<size>.numa_stat` file, hierarchical.

    v1 prints a local line (`total=... N0=...`) and a hierarchical one (`hierarchical_total=`);
    v2 prints one line, hierarchical, as `total=`. The hierarchical one is wanted: a pod's VMM
    runs in a cgroup below the pod's."""
    lines = {ln.split("=", 1)[0]: ln.split() for ln in text.splitlines() if "=" in ln}
    words = lines.get("hierarchical_total") or lines.get("total")
    if not words:
        raise ParseError("hugetlb numa_stat", text[:80], "no total= line", source=source)
    try:
        total = int(words[0].split("=", 1)[1])
    except ValueError:
        raise ParseError("hugetlb numa_stat", words[0], "total is not an integer", source=source) from None
    per_node: dict[int, int] = {}
    for w in words[1:]:
        m = _NODE_VALUE.match(w)
        if m is None:
            raise ParseError("hugetlb numa_stat", w, "expected N<node>=<bytes>", source=source)
        per_node[int(m.group(1))] = int(m.group(2))
    return total, per_node


def pod_hugepages(cgroupfs: Cgroupfs, cgroup: str, sizes: tuple[int, ...]) -> tuple[PodHugepages, ...]:
    """The hugepages of every size in `sizes` that `cgroup` (and its subtree) holds; sizes it
    holds none of are left out, and so is everything when there is no hugetlb controller."""
    if not sizes or not cgroupfs.has("hugetlb"):
        return ()
    out = []
    for size in sizes:
        got = _one_size(cgroupfs, cgroup, size)
        if got is not None and got.total > 0:
            out.append(got)
    return tuple(out)


def _one_size(cgroupfs: Cgroupfs, cgroup: str, size: int) -> PodHugepages | None:
    prefix = f"hugetlb.{size_name(size)}."
    try:
        stat = cgroupfs.try_read(cgroup, "hugetlb", prefix + "numa_stat")
        if stat is not None:
            total, per_node = parse_numa_stat(stat, source=f"{cgroup}/{prefix}numa_stat")
            return PodHugepages(page_size_bytes=size, total=total // size,
                                per_node={n: b // size for n, b in sorted(per_node.items())})
        for name in ("current", "usage_in_bytes"):
            text = cgroupfs.try_read(cgroup, "hugetlb", prefix + name)
            if text is not None:
                return PodHugepages(page_size_bytes=size, total=_bytes(text, prefix + name) // size)
    except (ContainerGone, FeatureUnavailable, CgroupfsError):
        return None
    return None


def _bytes(text: str, name: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ParseError(name, text.strip()[:40], "not an integer") from None
