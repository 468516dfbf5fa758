"""The hugepages a pod holds per host node, read from a hugetlb cgroup and sysfs (temp trees)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.discover.hugepages import page_sizes, parse_numa_stat, pod_hugepages, size_name
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.errors import ParseError

MB2 = 2 << 20
GB1 = 1 << 30


@pytest.mark.parametrize("size,name", [(MB2, "2MB"), (GB1, "1GB"), (64 << 10, "64KB"), (32 << 20, "32MB")])
def test_size_names_are_the_kernels(size, name):
    assert size_name(size) == name


def test_v1_numa_stat_takes_the_hierarchical_line():
    text = "total=0 N0=0 N1=0\nhierarchical_total=8388608 N0=2097152 N1=6291456\n"
    assert parse_numa_stat(text) == (4 * MB2, {0: MB2, 1: 3 * MB2})


def test_v2_numa_stat_has_one_line():
    assert parse_numa_stat("total=4194304 N0=4194304 N1=0\n") == (2 * MB2, {0: 2 * MB2, 1: 0})


@pytest.mark.parametrize("text", ["", "N0=1\n", "total=x N0=1\n", "total=1 node0=1\n"])
def test_bad_numa_stat_names_the_file(text):
    with pytest.raises(ParseError) as e:
        parse_numa_stat(text, source="pod/hugetlb.2MB.numa_stat")
    assert "hugetlb.2MB.numa_stat" in str(e.value)


def sysfs(tmp: Path, sizes_kb: tuple[int, ...]) -> str:
    for node in (0, 1):
        for kb in sizes_kb:
            d = tmp / "sys" / "devices" / "system" / "node" / f"node{node}" / "hugepages" / f"hugepages-{kb}kB"
            d.mkdir(parents=True)
            (d / "nr_hugepages").write_text("8\n")
    return str(tmp / "sys")


def test_page_sizes_come_from_the_node_directories(tmp_path):
    assert page_sizes(sysfs(tmp_path, (2048, 1048576))) == (MB2, GB1)
    assert page_sizes(str(tmp_path / "absent")) == ()


def cgroup_v2(tmp: Path, files: dict[str, str], controllers: str = "cpuset hugetlb") -> Cgroupfs:
    root = tmp / "cg"
    (root / "pod").mkdir(parents=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    for name, text in files.items():
        (root / "pod" / name).write_text(text)
    return Cgroupfs(root=str(root))


def test_pod_hugepages_per_host_node(tmp_path):
    cg = cgroup_v2(tmp_path, {"hugetlb.2MB.numa_stat": f"total={6 * MB2} N0={2 * MB2} N1={4 * MB2}\n",
                              "hugetlb.2MB.current": f"{6 * MB2}\n", "hugetlb.1GB.current": "0\n"})
    (held,) = pod_hugepages(cg, "pod", (MB2, GB1))
    assert (held.page_size_bytes, held.total, dict(held.per_node)) == (MB2, 6, {0: 2, 1: 4})


def test_without_numa_stat_only_the_total_is_known(tmp_path):
    cg = cgroup_v2(tmp_path, {"hugetlb.2MB.current": f"{3 * MB2}\n"})
    (held,) = pod_hugepages(cg, "pod", (MB2,))
    assert held.total == 3 and held.per_node == {}


def test_without_the_hugetlb_controller_there_are_none(tmp_path):
    cg = cgroup_v2(tmp_path, {}, controllers="cpuset")
    cg_v1 = tmp_path / "v1" / "cpuset"
    cg_v1.mkdir(parents=True)
    assert pod_hugepages(Cgroupfs(root=str(tmp_path / "v1")), "pod", (MB2,)) == ()
    assert pod_hugepages(cg, "pod", (MB2,)) == ()  # v2 without the files: nothing held
