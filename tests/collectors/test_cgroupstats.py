"""cgroup statistics: CPU usage, throttling, PSI and memory from real cgroups (hybrid here)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from collector_helpers import SH_BUSY, Cgroups, bounded
from perfbalance import cgroupfs as cg
from perfbalance.cgroupfs import CgroupPathRefused, Cgroupfs
from collectors.cgroupstats import CgroupStatsCollector, FileCache, Reading, metrics
from perfbalance.errors import ContainerGone
from perfbalance.model import Container


def test_usage_rate_is_the_delta_over_the_window() -> None:
    m = metrics(Reading(usage_usec=3_000_000), Reading(usage_usec=1_000_000), 4.0)
    assert m["cpu_usage_cores"] == 0.5 and m["cpu_seconds_total"] == 3.0


def test_throttled_ratio_is_throttled_periods_over_periods() -> None:
    prev = Reading(usage_usec=0, nr_periods=100, nr_throttled=10, throttled_usec=0)
    cur = Reading(usage_usec=0, nr_periods=200, nr_throttled=60, throttled_usec=2_500_000)
    m = metrics(cur, prev, 1.0)
    assert m["cpu_throttled_ratio"] == 0.5 and m["cpu_throttled_seconds_total"] == 2.5


def test_counter_that_went_backwards_gives_no_rate() -> None:
    m = metrics(Reading(usage_usec=10), Reading(usage_usec=5_000_000), 1.0)
    assert "cpu_usage_cores" not in m


def test_first_window_has_totals_but_no_rates() -> None:
    m = metrics(Reading(usage_usec=1_000_000, memory_bytes=4096, psi_cpu_some=0.25), None, 0.0)
    assert m == {"cpu_seconds_total": 1.0, "cpu_throttled_seconds_total": 0.0, "memory_bytes": 4096.0,
                 "psi_cpu_some": 0.25}


@pytest.mark.root
def test_busy_cgroup_usage_matches_what_the_kernel_accounted(cgroups: Cgroups) -> None:
    col = CgroupStatsCollector(cgroupfs=cgroups.fs)
    assert col.start().up
    c = cgroups.new("busy")
    t0 = time.time()
    col.collect([c], t0)
    cgroups.run(c, bounded(SH_BUSY, 1)).wait(timeout=30)
    t1 = time.time()
    m = col.collect([c], t1)["busy"]
    kernel = cgroups.cpuacct_seconds(c)
    assert m["cpu_seconds_total"] == pytest.approx(kernel, abs=1e-3)
    assert m["cpu_usage_cores"] == pytest.approx(kernel / (t1 - t0), rel=0.01)
    assert m["memory_bytes"] >= 0


@pytest.mark.root
def test_cfs_quota_shows_up_as_throttling(cgroups: Cgroups) -> None:
    col = CgroupStatsCollector(cgroupfs=cgroups.fs)
    assert col.start().up
    c = cgroups.new("capped")
    cgroups.fs.write(c.cgroup, "cpu", "cpu.cfs_quota_us", "10000")  # 10% of a CPU
    col.collect([c], time.time())
    cgroups.run(c, bounded(SH_BUSY, 1)).wait(timeout=30)
    m = col.collect([c], time.time())["capped"]
    assert m["cpu_throttled_ratio"] > 0.5 and m["cpu_throttled_seconds_total"] > 0


@pytest.mark.root
def test_pressure_comes_from_the_unified_hierarchy_on_hybrid_hosts(cgroups: Cgroups) -> None:
    col = CgroupStatsCollector(cgroupfs=cgroups.fs)
    st = col.start()
    if not st.detail.get("psi"):
        pytest.skip(f"no PSI here: {st.reason}")
    c = cgroups.new("psi")
    m = col.collect([c], time.time())["psi"]
    assert 0.0 <= m["psi_cpu_some"] <= 1.0 and 0.0 <= m["psi_memory_some"] <= 1.0


@pytest.mark.root
def test_vanished_cgroup_is_skipped_without_error(cgroups: Cgroups) -> None:
    col = CgroupStatsCollector(cgroupfs=cgroups.fs)
    col.start()
    c = cgroups.new("gone")
    cgroups.fs.remove(c.cgroup)
    assert col.collect([c], time.time()) == {} and col.status().up


def planted_symlink(tmp_path: Path, target: str) -> Cgroupfs:
    """A cgroup v2 tree (plain directories) where cgroup `evil` is a symlink to `target`."""
    (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (tmp_path / "evil").symlink_to(target)
    return Cgroupfs(root=str(tmp_path))


@pytest.mark.root
def test_cached_cgroup_files_are_opened_without_following_symlinks(cgroups: Cgroups, tmp_path: Path) -> None:
    real = cgroups.fs.dir(cgroups.new("real").cgroup, None)  # a live cgroup whose cpu.stat exists
    files = FileCache(planted_symlink(tmp_path, real), capacity=10)
    with pytest.raises(CgroupPathRefused, match="symlink"):
        files.read("evil", None, "cpu.stat")
    assert len(files) == 0


@pytest.mark.root
def test_collector_reports_nothing_through_a_planted_symlink(cgroups: Cgroups, tmp_path: Path) -> None:
    real = cgroups.fs.dir(cgroups.new("real").cgroup, None)
    col = CgroupStatsCollector(cgroupfs=planted_symlink(tmp_path, real))
    assert col.start().up
    assert col.collect([Container(id="evil", name="evil", cgroup="evil")], time.time()) == {}


def test_disabled_collector_is_down_and_says_so() -> None:
    st = CgroupStatsCollector(cgroupfs=None, enabled=False).start()
    assert not st.up and "disabled" in st.reason


def test_psi_some_avg10_is_a_fraction_and_agrees_with_the_full_parser() -> None:
    from perfbalance.cgroupfs import parse_psi
    from collectors.cgroupstats import parse_psi_some_avg10

    text = "some avg10=12.50 avg60=3.00 avg300=1.00 total=12345\nfull avg10=1.00 avg60=0.00 avg300=0.00 total=5\n"
    assert parse_psi_some_avg10(text) == parse_psi(text).some_avg10 == 0.125


def test_malformed_pressure_names_the_file() -> None:
    from collectors.cgroupstats import parse_psi_some_avg10
    from perfbalance.errors import ParseError

    with pytest.raises(ParseError, match="kubepods/x/cpu.pressure"):
        parse_psi_some_avg10("garbage", source="kubepods/x/cpu.pressure")


def test_memory_signals_are_read_every_other_cycle_and_reported_every_cycle() -> None:
    from collectors.cgroupstats import SLOW_EVERY

    col = CgroupStatsCollector(cgroupfs=None)
    col._status = col._set(True, "")  # no files: read() is replaced below
    reads: list[bool] = []
    usage = iter(range(0, 10_000_000, 100_000))

    def fake_read(rel: str, *, slow: bool = True) -> Reading:
        reads.append(slow)
        return Reading(usage_usec=next(usage), memory_bytes=4096 * len(reads) if slow else None,
                       psi_memory_some=0.25 if slow else None)

    col.read = fake_read  # type: ignore[method-assign]
    c = Container(id="a", cgroup="pod/a")
    out = [col.collect([c], now=float(t))["a"] for t in range(1, 7)]
    assert reads[0] is True  # a new container reads everything at once
    assert reads.count(True) == 1 + (len(reads) - 1) // SLOW_EVERY  # then every SLOW_EVERY cycles
    assert all("memory_bytes" in m and m["psi_memory_some"] == 0.25 for m in out)  # kept between reads
    assert all("cpu_usage_cores" in m for m in out[1:])  # CPU is read every cycle


def fresh_reading(col: CgroupStatsCollector, rel: str) -> Reading:
    """The per-file path: each file opened, read and parsed afresh through Cgroupfs (no kept
    fds, no bytes compared, nothing reused)."""
    fs = col.cgroupfs
    stat = cg.parse_cpu_stat(fs.read(rel, "cpu" if col._cpu_v1 else None, "cpu.stat"))
    usage = cg.parse_cpuacct_usage(fs.read(rel, "cpuacct", "cpuacct.usage")) if col._usage_v1 else stat.usage_usec
    psi = cg.parse_psi(fs.read(rel, None, "cpu.pressure")).some_avg10 if col._psi else None
    return Reading(usage_usec=usage, nr_periods=stat.nr_periods, nr_throttled=stat.nr_throttled,
                   throttled_usec=stat.throttled_usec, psi_cpu_some=psi)


CPU_KEYS = ("cpu_seconds_total", "cpu_usage_cores", "cpu_throttled_seconds_total", "cpu_throttled_ratio",
            "cpu_throttled_seconds_per_second", "psi_cpu_some")


def cpu_part(m: Mapping[str, float]) -> dict[str, float]:
    return {k: m[k] for k in CPU_KEYS if k in m}


@pytest.mark.root
def test_idle_metrics_equal_the_per_file_path_and_move_when_the_container_burns_cpu(cgroups: Cgroups) -> None:
    col = CgroupStatsCollector(cgroupfs=cgroups.fs)
    assert col.start().up
    idle, busy = cgroups.new("idle"), cgroups.new("busy")
    for c in (idle, busy):
        cgroups.run(c, ["sleep", "60"])
    time.sleep(0.3)  # both sleeping in their cgroups
    outs = [col.collect([idle, busy], now=100.0 + i) for i in range(5)]
    ref = {c.id: fresh_reading(col, c.cgroup) for c in (idle, busy)}
    for c in (idle, busy):
        assert cpu_part(outs[-1][c.id]) == cpu_part(metrics(ref[c.id], ref[c.id], 1.0))
    # nothing moved: reused, not re-parsed (memory usage may move while idle, as the kernel
    # drains per-CPU charge caches, so not every pair of cycles need be identical)
    assert any(outs[i + 1]["idle"] is outs[i]["idle"] for i in range(len(outs) - 1))
    cgroups.run(busy, bounded(SH_BUSY, 0.3)).wait(timeout=30)
    after = col.collect([idle, busy], now=106.0)
    burnt = fresh_reading(col, busy.cgroup)
    assert cpu_part(after["busy"]) == cpu_part(metrics(burnt, ref["busy"], 2.0))
    assert after["busy"]["cpu_usage_cores"] > 0.05 and after["busy"] != outs[-1]["busy"]  # control: it moved


@pytest.mark.root
def test_a_group_of_kept_files_reads_what_each_file_reads_and_nothing_once_the_cgroup_is_gone(cgroups: Cgroups) -> None:
    c = cgroups.new("grouped")
    files = FileCache(cgroups.fs, capacity=10)
    names = [("cpuacct", "cpuacct.usage"), ("cpu", "cpu.stat")]
    try:
        assert files.read_group(c.cgroup, 0, names) is None  # not open yet: read them one by one
        each = [files.read_bytes(c.cgroup, ctl, name) for ctl, name in names]
        assert files.read_group(c.cgroup, 0, names) == each
        cgroups.fs.remove(c.cgroup)
        assert files.read_group(c.cgroup, 0, names) is None  # control: gone, and said so one by one
        with pytest.raises(ContainerGone):
            files.read_bytes(c.cgroup, *names[0])
        assert files.read_group(c.cgroup, 0, names) is None
    finally:
        files.close()
