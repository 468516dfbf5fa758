"""Cgroupfs: layout detection, path mapping, bounded reads, gone cgroups, create/attach/remove."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fakecg
from perfbalance import cgroupfs as cg
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.errors import ContainerGone, FeatureUnavailable, ParseError

SAMPLES = Path(__file__).resolve().parent.parent / "data" / "cgroup" / "samples"


def test_v2_layout_detected_and_every_controller_maps_to_root(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    c = Cgroupfs(root=str(root))
    assert c.layout == "v2"
    assert c.dir("a/b", "cpuset") == str(root / "a/b")
    assert c.dir("a/b") == str(root / "a/b")
    assert "cpuset" in c.controllers()


def test_v1_comounted_cpu_cpuacct_share_one_directory(tmp_path: Path) -> None:
    root = fakecg.v1(tmp_path)
    c = Cgroupfs(root=str(root))
    assert c.layout == "v1"
    assert c.dir("x", "cpu") == c.dir("x", "cpuacct") == str(root / "cpu,cpuacct" / "x")
    assert c.dir("x", "cpuset") == str(root / "cpuset" / "x")
    assert {"cpu", "cpuacct", "cpuset", "memory", "systemd"} <= set(c.controllers())


def test_v1_has_no_cgroup_id_and_no_v2_dir(tmp_path: Path) -> None:
    c = Cgroupfs(root=str(fakecg.v1(tmp_path)))
    assert c.cgroup_id("") is None
    with pytest.raises(FeatureUnavailable):
        c.dir("x", None)


def test_hybrid_maps_none_to_unified_and_controllers_to_v1(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    c = Cgroupfs(root=str(root))
    assert c.layout == "hybrid"
    assert c.dir("k/p", None) == str(root / "unified/k/p")
    assert c.dir("k/p", "cpuset") == str(root / "cpuset/k/p")


def test_unmounted_controller_is_feature_unavailable(tmp_path: Path) -> None:
    c = Cgroupfs(root=str(fakecg.hybrid(tmp_path)))
    with pytest.raises(FeatureUnavailable, match="blkio"):
        c.dir("x", "blkio")


def test_empty_root_is_feature_unavailable(tmp_path: Path) -> None:
    with pytest.raises(FeatureUnavailable, match="no cgroup hierarchy"):
        Cgroupfs(root=str(tmp_path))


@pytest.mark.parametrize("rel", ["../etc", "a/../../b", "a/./b", "a\x00b"])
def test_escaping_paths_are_rejected(tmp_path: Path, rel: str) -> None:
    c = Cgroupfs(root=str(fakecg.v2(tmp_path)))
    with pytest.raises(ParseError):
        c.dir(rel, "cpuset")


def test_file_name_with_slash_is_rejected(tmp_path: Path) -> None:
    c = Cgroupfs(root=str(fakecg.v2(tmp_path)))
    with pytest.raises(ParseError):
        c.read("", None, "../cgroup.procs")


def test_read_of_missing_cgroup_is_container_gone(tmp_path: Path) -> None:
    c = Cgroupfs(root=str(fakecg.v2(tmp_path)))
    with pytest.raises(ContainerGone, match="gone/x"):
        c.read("gone/x", "cpu", "cpu.stat")


def test_read_is_bounded(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    (root / "big").write_text("x" * 100)
    c = Cgroupfs(root=str(root))
    with pytest.raises(ParseError, match="larger than 10 bytes"):
        c.read("", None, "big", limit=10)


def test_pids_prefers_v2_directory_on_hybrid(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    fakecg.mkcg(root, "c1", {"unified": {"cgroup.procs": "10\n11\n"}, "cpuset": {"cgroup.procs": "99\n"}})
    assert Cgroupfs(root=str(root)).pids("c1") == [10, 11]


def test_pids_fall_back_to_cpuset_when_absent_from_v2(tmp_path: Path) -> None:
    root = fakecg.hybrid(tmp_path)
    fakecg.mkcg(root, "c1", {"cpuset": {"cgroup.procs": "7\n", "tasks": "7\n8\n"}})
    c = Cgroupfs(root=str(root))
    assert c.pids("c1") == [7]
    assert c.tids("c1") == [7, 8]


def test_walk_lists_parents_before_children(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    fakecg.mkcg(root, "a/b/c", {"": {}})
    fakecg.mkcg(root, "a/d", {"": {}})
    assert list(Cgroupfs(root=str(root)).walk("a")) == ["a", "a/b", "a/b/c", "a/d"]


def test_parse_v1_cpu_stat_converts_throttled_ns() -> None:
    s = cg.parse_cpu_stat("nr_periods 10\nnr_throttled 4\nthrottled_time 5000000\n")
    assert (s.nr_periods, s.nr_throttled, s.throttled_usec, s.usage_usec) == (10, 4, 5000, None)


def test_parse_captured_v2_cpu_stat_has_usage() -> None:
    s = cg.parse_cpu_stat((SAMPLES / "v2-cpu.stat").read_text())
    assert s.usage_usec is not None and s.usage_usec > 0
    assert s.usage_usec >= (s.user_usec or 0)


def test_parse_captured_psi_is_fraction() -> None:
    p = cg.parse_psi((SAMPLES / "v2-cpu.pressure").read_text())
    assert 0.0 <= p.some_avg60 <= 1.0 and p.some_total_usec > 0


def test_parse_psi_percent_to_fraction() -> None:
    p = cg.parse_psi("some avg10=12.50 avg60=1.00 avg300=0.00 total=42\n")
    assert p.some_avg10 == pytest.approx(0.125) and p.some_total_usec == 42


def test_parse_psi_garbage_is_parse_error() -> None:
    with pytest.raises(ParseError):
        cg.parse_psi("some avg10=abc\n")


def test_v1_unlimited_memory_is_none() -> None:
    assert cg.parse_memory_limit((SAMPLES / "v1-memory.limit_in_bytes").read_text()) is None
    assert cg.parse_memory_limit("max\n") is None
    assert cg.parse_memory_limit("268435456\n") == 268435456


@pytest.mark.parametrize("text,quota,period", [("max 100000", None, 100000),
                                               ("50000 100000", 50000, 100000), ("max", None, 100000)])
def test_parse_cpu_max(text: str, quota: int | None, period: int) -> None:
    m = cg.parse_cpu_max(text)
    assert (m.quota_usec, m.period_usec) == (quota, period)


def test_cpuacct_usage_ns_to_usec() -> None:
    assert cg.parse_cpuacct_usage("1500000\n") == 1500


@pytest.mark.parametrize("shares", [2, 102, 1024, 2048, 262144])
def test_weight_shares_roundtrip_is_close(shares: int) -> None:
    back = cg.shares_from_weight(cg.weight_from_shares(shares))
    assert abs(back - shares) <= 27  # one weight step is ~26 shares


# --- real cgroups on this machine ------------------------------------------------------------

@pytest.mark.root
def test_real_hierarchy_is_detected(cgfs: Cgroupfs) -> None:
    assert cgfs.layout in ("v1", "v2", "hybrid")
    assert cgfs.has("cpuset")


@pytest.mark.root
def test_create_attach_and_read_real_cgroup(real, cgfs: Cgroupfs) -> None:  # type: ignore[no-untyped-def]
    rel = real.create("c1")
    p = real.start(rel)
    assert cgfs.pids(rel) == [p.pid]
    assert p.pid in cgfs.tids(rel)
    if cgfs.version("cpuset") == 1:  # parent's cpus were copied so that tasks could join
        assert cgfs.read(rel, "cpuset", "cpuset.cpus").strip() == \
            cgfs.read("", "cpuset", "cpuset.cpus").strip()


@pytest.mark.root
def test_cgroup_id_is_inode_of_v2_dir(real, cgfs: Cgroupfs) -> None:  # type: ignore[no-untyped-def]
    rel = real.create("c2")
    if cgfs.layout == "v1":
        pytest.skip("v1-only host has no cgroup ids")
    assert cgfs.cgroup_id(rel) == os.stat(cgfs.dir(rel, None)).st_ino


@pytest.mark.root
def test_remove_takes_children_and_all_hierarchies(real, cgfs: Cgroupfs) -> None:  # type: ignore[no-untyped-def]
    rel = real.create("p/child/grandchild")
    cgfs.remove(real.rel("p"))
    assert not any(os.path.exists(os.path.join(h.path, rel)) for h in cgfs.hierarchies)


@pytest.mark.root
def test_attach_exited_pid_is_container_gone(real, cgfs: Cgroupfs) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    rel = real.create("c3")
    p = subprocess.Popen(["true"])
    p.wait()
    with pytest.raises(ContainerGone):
        cgfs.attach(rel, p.pid)


def test_missing_control_file_in_existing_cgroup_is_not_gone(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    fakecg.mkcg(root, "c", {"": {"cgroup.procs": ""}})
    c = Cgroupfs(root=str(root))
    with pytest.raises(cg.CgroupfsError, match="controller not enabled"):
        c.read("c", None, "cpu.pressure")
    with pytest.raises(FileNotFoundError):
        c.write("c", "cpuset", "cpuset.cpus", "0")
    with pytest.raises(ContainerGone):
        c.write("gone", "cpuset", "cpuset.cpus", "0")
