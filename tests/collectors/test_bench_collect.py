"""`perfbalance bench collect` measures real costs (a small run: few cgroups, short rounds)."""

from __future__ import annotations

import os

import pytest

from agent.bench import collect as bench_collect
from perfbalance.host import HostPaths


@pytest.mark.root
@pytest.mark.bpf
def test_bench_reports_bpf_cost_cycle_cpu_fds_and_rss(host: HostPaths) -> None:
    out = bench_collect.measure(host, (2, 8), rounds=1, seconds=0.3, scrape_containers=30, start_runs=1)
    # runqlat's sched_info method is one BTF raw tracepoint on sched_switch where the kernel has BTF
    stamps = not os.path.exists("/sys/kernel/btf/vmlinux")
    programs = {"avx512", "pmu", "runqlat_sched_switch"} | (
        {"runqlat_sched_wakeup", "runqlat_sched_wakeup_new"} if stamps else set())
    assert set(out["bpf_ns_per_event"]) == programs, out["collectors"]
    assert all(ns > 0 for ns in out["bpf_ns_per_event"].values())
    assert set(out["bpf_ns_floor"]) == programs
    assert all(ns > 0 for ns in out["bpf_ns_floor"].values())
    assert set(out["bpf_ns_per_event_two_cgroups"]) == programs
    methods = out["runqlat_methods"]  # both methods, each alone: the stamps pay per wakeup too
    assert set(methods["wakeup_stamps"]) == {"sched_switch", "sched_wakeup", "sched_wakeup_new", "per_switch"}
    assert methods["wakeup_stamps"]["per_switch"] > methods["wakeup_stamps"]["sched_switch"]
    if not stamps:
        assert set(methods["sched_info"]) == {"sched_switch", "per_switch"}
        assert methods["sched_info"]["per_switch"] == methods["sched_info"]["sched_switch"]
    assert set(out["bpf_ns_key_floor"]) == set(out["bpf_ns_clock_floor"]) == programs
    split = out["pmu_ns_split"]  # the program without its counter reads is the cheaper one
    assert split["without_reads"] < split["with_reads"] and split["reads"] > 0, split
    assert set(out["cycle_cpu_seconds"]) == {"2", "8"} and out["cycle_cpu_seconds"]["8"] > 0
    assert out["perf_fds_by_containers"]["2"] == out["perf_fds_by_containers"]["8"] == out["perf_fds"] > 0
    assert out["rss_bytes"] > 0
    assert out["memory"]["pss_bytes"] > 0 and 0 < out["memory"]["anonymous_bytes"] <= out["memory"]["rss_bytes"]
    assert out["start"]["runs"] == 1 and out["start"]["first_seconds"] > 0
    assert out["scrape"]["containers"] == 30 and out["scrape"]["series"] > 30 * 20
    assert not [d for d in os.listdir("/sys/fs/cgroup/unified") if d.startswith(f"{bench_collect.PREFIX}-{os.getpid()}-")]


@pytest.mark.root
def test_start_measurement_names_an_agent_that_never_gets_ready(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.bench import start

    monkeypatch.setattr(start.sys, "executable", "/bin/false")  # control: exits at once, never ready
    with pytest.raises(RuntimeError, match="exited with 1 before ready"):
        start.one_start(timeout=10)


@pytest.mark.root
@pytest.mark.bpf
def test_programs_on_one_tracepoint_are_told_apart_by_their_collector(host: HostPaths) -> None:
    from perfbalance.cgroupfs import Cgroupfs

    collectors = bench_collect.start_collectors(host, Cgroupfs(root=host.cgroup))
    try:
        progs = bench_collect.loaded_programs(collectors)
    finally:
        for c in collectors:
            c.close()
    assert progs["pmu"][1] == ("sched", "sched_switch")
    assert progs["runqlat_sched_switch"][1] in (("sched", "sched_switch"), ("tp_btf", "sched_switch"))
    assert progs["pmu"][0] != progs["runqlat_sched_switch"][0]  # two programs, two fds
