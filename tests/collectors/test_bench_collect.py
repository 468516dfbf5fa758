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
    assert set(out["bpf_ns_per_event"]) == {"avx512", "pmu"}
    assert all(ns > 0 for ns in out["bpf_ns_per_event"].values())
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
