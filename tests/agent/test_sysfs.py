"""Topology from captured sysfs trees: this VM and the hand-made 2-socket, 4-node SMT-2 host."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agent.discover import sysfs
from perfbalance.cpuset import CpuSet
from perfbalance.errors import FeatureUnavailable, ParseError

DATA = Path(__file__).resolve().parent.parent / "data" / "sysfs"
BIG = DATA / "2s4n-smt2"
CPU = "devices/system/cpu"


@pytest.fixture
def big_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "sys"
    shutil.copytree(BIG, dst)
    return dst


def test_thismachine_has_two_cpus_one_node_one_l3() -> None:
    t = sysfs.read_topology(str(DATA / "thismachine"))
    assert t.online == CpuSet.parse("0-1")
    assert list(t.nodes()) == [0]
    assert len(t.l3_domains()) == 1
    assert t.l3_size_bytes == 32 << 20


def test_thismachine_fixture_matches_live_sysfs() -> None:
    fixture_online = (DATA / "thismachine" / CPU / "online").read_text()
    if not os.path.exists(f"/sys/{CPU}/online") or Path(f"/sys/{CPU}/online").read_text() != fixture_online:
        pytest.skip("not the machine the fixture was captured on")
    live = sysfs.read_topology("/sys")
    captured = sysfs.read_topology(str(DATA / "thismachine"))
    assert live.cpus == captured.cpus


def test_2s4n_packages_nodes_and_smt_siblings() -> None:
    t = sysfs.read_topology(str(BIG))
    assert t.packages() == {0: CpuSet.parse("0-7,16-23"), 1: CpuSet.parse("8-15,24-31")}
    assert t.nodes()[3] == CpuSet.parse("12-15,28-31")
    assert t.siblings(5) == CpuSet.parse("5,21")
    assert len(t.cores()) == 16


def test_2s4n_two_l3_domains_per_socket() -> None:
    t = sysfs.read_topology(str(BIG))
    doms = t.l3_domains()
    assert len(doms) == 4
    for pkg_cpus in t.packages().values():
        assert sum(1 for d in doms.values() if d <= pkg_cpus) == 2
    assert t.l3_size_bytes == 16 << 20


def test_2s4n_sst_bf_high_priority_and_isolated() -> None:
    t = sysfs.read_topology(str(BIG))
    assert t.high_priority() == CpuSet.parse("1,9,17,25")
    assert t.cpu(1).base_mhz == 2700 and t.cpu(0).base_mhz == 2100
    assert t.isolated == CpuSet([31])


def test_2s4n_node_memory() -> None:
    t = sysfs.read_topology(str(BIG))
    assert t.node_mem_bytes == {n: 64 << 30 for n in range(4)}


def test_missing_l3_id_derives_domains_from_shared_cpu_list(big_copy: Path) -> None:
    for p in big_copy.glob(f"{CPU}/cpu*/cache/index3/id"):
        p.unlink()
    t = sysfs.read_topology(str(big_copy))
    assert sorted(t.l3_domains().values(), key=lambda s: min(s)) == \
        sorted(sysfs.read_topology(str(BIG)).l3_domains().values(), key=lambda s: min(s))


def test_offline_cpu_is_not_in_topology(big_copy: Path) -> None:
    (big_copy / CPU / "online").write_text("0-30\n")
    shutil.rmtree(big_copy / CPU / "cpu31" / "topology")
    t = sysfs.read_topology(str(big_copy))
    assert 31 not in t.online and t.siblings(15) == CpuSet([15])
    assert t.isolated == CpuSet()  # isolated CPUs are reported only when online


def test_cpu_dir_vanished_mid_read_is_skipped(big_copy: Path) -> None:
    shutil.rmtree(big_copy / CPU / "cpu30")
    t = sysfs.read_topology(str(big_copy))
    assert 30 not in t.online and len(t.online) == 31


def test_no_online_file_falls_back_to_cpu_dirs(big_copy: Path) -> None:
    (big_copy / CPU / "online").unlink()
    (big_copy / CPU / "cpu3" / "online").write_text("0\n")
    assert sysfs.read_topology(str(big_copy)).online == CpuSet.parse("0-2,4-31")


def test_missing_die_node_and_cache_files_use_defaults(tmp_path: Path) -> None:
    base = tmp_path / CPU
    for cpu in (0, 1):
        (base / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (base / f"cpu{cpu}" / "topology" / "core_id").write_text(f"{cpu}\n")
    (base / "online").write_text("0-1\n")
    t = sysfs.read_topology(str(tmp_path))
    assert [(c.package, c.die, c.node, c.l3) for c in t.cpus] == [(0, 0, 0, -1)] * 2
    assert len(t.cores()) == 2


def test_core_id_contradicting_siblings_uses_lowest_sibling(big_copy: Path) -> None:
    for p in big_copy.glob(f"{CPU}/cpu*/topology/core_id"):
        p.write_text("0\n")  # a hypervisor that says every vCPU is core 0
    t = sysfs.read_topology(str(big_copy))
    assert len(t.cores()) == 16 and t.siblings(5) == CpuSet.parse("5,21")


def test_garbage_cpu_online_file_names_the_file(big_copy: Path) -> None:
    (big_copy / CPU / "online").unlink()
    (big_copy / CPU / "cpu3" / "online").write_text("yes\n")
    with pytest.raises(ParseError, match="cpu online file.*cpu3/online"):
        sysfs.read_topology(str(big_copy))


def test_oversized_sysfs_file_is_an_error_naming_it(big_copy: Path) -> None:
    (big_copy / CPU / "cpu2" / "topology" / "core_id").write_text("2" * (sysfs.MAX_FILE_BYTES + 1))
    with pytest.raises(ParseError, match=r"sysfs file.*larger than.*cpu2/topology/core_id"):
        sysfs.read_topology(str(big_copy))


def test_cpu_model_is_read_from_a_cpuinfo_of_many_cpus(big_copy: Path, tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    block = "processor\t: {}\nmodel name\t: Xeon Y\nflags\t\t: " + "avx512f " * 150 + "\n\n"
    (proc / "cpuinfo").write_text("".join(block.format(i) for i in range(448)))
    assert sysfs.read_topology(str(big_copy), procfs_root=str(proc)).cpu_model == "Xeon Y"


def test_garbage_core_id_names_the_file(big_copy: Path) -> None:
    (big_copy / CPU / "cpu2" / "topology" / "core_id").write_text("two\n")
    with pytest.raises(ParseError, match="cpu2/topology/core_id"):
        sysfs.read_topology(str(big_copy))


def test_no_sysfs_is_feature_unavailable(tmp_path: Path) -> None:
    with pytest.raises(FeatureUnavailable):
        sysfs.read_topology(str(tmp_path))


@pytest.mark.parametrize("text,size", [("32768K", 32 << 20), ("2M", 2 << 20), ("512", 512)])
def test_parse_cache_size(text: str, size: int) -> None:
    assert sysfs.parse_cache_size(text) == size


def test_parse_node_meminfo_kb() -> None:
    assert sysfs.parse_node_meminfo("Node 1 MemTotal:   1024 kB\nNode 1 MemFree: 1 kB\n") == 1 << 20


def test_parse_node_meminfo_without_total_is_error() -> None:
    with pytest.raises(ParseError, match="MemTotal"):
        sysfs.parse_node_meminfo("Node 0 MemFree: 1 kB\n")


def test_cpu_model_from_cpuinfo() -> None:
    assert sysfs.parse_cpu_model("processor\t: 0\nmodel\t\t: 85\nmodel name\t: Xeon X\n") == "Xeon X"


def test_generator_reproduces_committed_tree(tmp_path: Path) -> None:
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_2s4n", DATA / "make_2s4n.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.make(str(tmp_path / "gen"))
    gen = sorted(os.path.relpath(p, tmp_path / "gen") for p in (tmp_path / "gen").rglob("*") if p.is_file())
    committed = sorted(os.path.relpath(p, BIG) for p in BIG.rglob("*") if p.is_file())
    assert gen == committed
