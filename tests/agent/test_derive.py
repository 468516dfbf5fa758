"""Derived metrics are computed once, when the Snapshot is built (agent/snapshot/derive.py), and
every reader downstream reads them: the exporter, the report and the planner compute none."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.cli import main
from agent.config import Config
from agent.export.report import is_heavy
from agent.snapshot.derive import CACHE_LINE_BYTES, derive, with_derived
from agent.wiring import Parts
from collectors import perf
from collectors import events as ev
from perfbalance.cpuset import CpuSet
from perfbalance.model import CollectorStatus, Container, ContainerSample, Snapshot
from perfbalance.topology import synthetic
from rebalancer import RebalancerConfig
from rebalancer.inputs import view

RATES = {"instructions_per_second": 2.0e9, "cycles_per_second": 2.5e9, "llc_misses_per_second": 4.0e6}

# each derived value and the inputs it needs
NEEDS = {
    "ipc": ("instructions_per_second", "cycles_per_second"),
    "llc_mpki": ("llc_misses_per_second", "instructions_per_second"),
    "memory_bandwidth_bytes_per_second": ("llc_misses_per_second",),
    "memory_bandwidth_estimated": ("llc_misses_per_second",),
    "bytes_per_instruction": ("llc_misses_per_second", "instructions_per_second"),
}


def test_each_value_is_derived_from_its_inputs() -> None:
    m = derive(RATES)
    assert m["ipc"] == RATES["instructions_per_second"] / RATES["cycles_per_second"]
    assert m["llc_mpki"] == pytest.approx(RATES["llc_misses_per_second"] * 1000.0 / RATES["instructions_per_second"])
    assert m["memory_bandwidth_bytes_per_second"] == RATES["llc_misses_per_second"] * CACHE_LINE_BYTES
    assert m["memory_bandwidth_estimated"] == 1.0
    assert m["bytes_per_instruction"] == m["memory_bandwidth_bytes_per_second"] / RATES["instructions_per_second"]


@pytest.mark.parametrize("key,needs", NEEDS.items(), ids=list(NEEDS))
def test_a_value_is_derived_only_when_its_inputs_exist(key: str, needs: tuple[str, ...]) -> None:
    for missing in needs:
        assert key not in derive({k: v for k, v in RATES.items() if k != missing}), missing


@pytest.mark.parametrize("den,ratios", [("instructions_per_second", ("llc_mpki", "bytes_per_instruction")),
                                        ("cycles_per_second", ("ipc",))])
def test_no_ratio_over_a_zero_denominator(den: str, ratios: tuple[str, ...]) -> None:
    m = derive({**RATES, den: 0.0})
    assert [k for k in ratios if k in m] == []


def test_measured_bandwidth_is_kept_and_not_marked_estimated() -> None:
    measured = {**RATES, "memory_bandwidth_bytes_per_second": 5.0e9, "memory_bandwidth_estimated": 0.0}
    m = derive(measured)
    assert m["memory_bandwidth_bytes_per_second"] == 5.0e9 and m["memory_bandwidth_estimated"] == 0.0
    assert m["bytes_per_instruction"] == 5.0e9 / RATES["instructions_per_second"]


def test_values_a_snapshot_holds_are_kept_and_derive_is_idempotent() -> None:
    saved = {**RATES, "ipc": 1.25, "llc_mpki": 7.0}
    once = derive(saved)
    assert once["ipc"] == 1.25 and once["llc_mpki"] == 7.0
    assert derive(once) == once


def test_nothing_is_derived_from_nothing() -> None:
    assert derive({}) == {} and derive({"cpu_usage_cores": 1.0}) == {"cpu_usage_cores": 1.0}


def test_the_pmu_collector_reports_rates_not_ratios() -> None:
    events = ev.parse_events(["instructions", "cycles", "llc_misses"])
    counts = {"instructions": 2e9, "cycles": 1e9, "llc_misses": 4e6}
    m = perf.derive(events, counts, counts, 2.0)
    assert m["instructions_per_second"] == 1e9 and "ipc" not in m and "llc_mpki" not in m


# -- applied once when the snapshot is built -----------------------------------------------------


class Fixed:
    """A collector that reports the same metrics for every container."""

    def __init__(self, name: str, metrics: Mapping[str, float]) -> None:
        self.name, self.metrics = name, dict(metrics)

    def start(self) -> CollectorStatus:
        return CollectorStatus(up=True)

    def collect(self, containers: Sequence[Container], now: float) -> dict[str, dict[str, float]]:
        return {c.id: dict(self.metrics) for c in containers}

    def status(self) -> CollectorStatus:
        return CollectorStatus(up=True)

    def close(self) -> None:
        pass


@pytest.fixture
def parts() -> Iterator[Parts]:
    p = Parts(Config(), "node-a")
    try:
        yield p
    finally:
        p.close()


def test_collect_merges_every_collector_then_derives(parts: Parts) -> None:
    parts.collectors = [Fixed("perf", RATES), Fixed("resctrl", {"memory_bandwidth_bytes_per_second": 3.0e9,
                                                                 "memory_bandwidth_estimated": 0.0})]
    got = parts.collect([Container(id="c1", name="c1", cgroup="x/c1")], 1.0)["c1"]
    assert got["ipc"] == RATES["instructions_per_second"] / RATES["cycles_per_second"]
    assert got["memory_bandwidth_estimated"] == 0.0  # MBM measured it: no estimate over it
    assert got["bytes_per_instruction"] == 3.0e9 / RATES["instructions_per_second"]


# -- readers only read ---------------------------------------------------------------------------


def sample(**metrics: float) -> ContainerSample:
    return ContainerSample(container=Container(id="c1", name="c1", cgroup="x/c1", cpuset=CpuSet.parse("0-1")),
                           metrics=metrics)


@pytest.mark.parametrize("metrics,heavy", [
    ({"avx512_heavy": 1.0, "avx512_active_ratio": 0.6}, True),
    ({"avx512_heavy": 0.0, "avx512_active_ratio": 0.6}, False),  # hysteresis has not let it in yet
    ({"avx512_active_ratio": 0.6}, False),  # no flag: no classification, for the planner too
    ({}, False),
])
def test_report_and_planner_share_one_avx512_heavy_rule(metrics: dict[str, float], heavy: bool) -> None:
    s = sample(**metrics)
    assert is_heavy(s) is heavy
    assert view(s, s.metrics, RebalancerConfig()).heavy is heavy


# -- saved snapshots --------------------------------------------------------------------------


def hog_snapshot(*, estimated_bandwidth: bool) -> Snapshot:
    """Two memory-bound containers on NUMA node 0 of a two-node machine; node 1 idle."""
    def metrics(misses: float) -> dict[str, float]:
        m = {"cpu_usage_cores": 1.0, "llc_misses_per_second": misses, "llc_mpki": 30.0}
        if estimated_bandwidth:
            m |= {"memory_bandwidth_bytes_per_second": misses * CACHE_LINE_BYTES, "memory_bandwidth_estimated": 1.0}
        return m
    t = synthetic(packages=2, cores_per_node=4, threads_per_core=1)
    samples = tuple(ContainerSample(container=Container(id=cid, name=cid, pod_uid=f"pod-{cid}", cgroup=f"x/{cid}",
                                                        cpuset=CpuSet.parse("0-3"), mems=CpuSet.parse("0")),
                                    metrics=metrics(misses)) for cid, misses in (("hog", 6e8), ("db", 1e8)))
    return Snapshot(time=1000.0, window=10.0, node="n", topology=t, containers=samples)


def planned(tmp_path: Path, capsys: pytest.CaptureFixture[str], snap: Snapshot, name: str) -> dict[str, Any]:
    path = tmp_path / name
    path.write_text(json.dumps(snap.to_json()))
    assert main(["plan", "--json", str(path)]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    out.pop("plan_seconds")
    return out


def test_a_saved_snapshot_without_derived_values_plans_as_if_the_agent_had_derived_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bare = planned(tmp_path, capsys, hog_snapshot(estimated_bandwidth=False), "bare.json")
    derived = planned(tmp_path, capsys, hog_snapshot(estimated_bandwidth=True), "derived.json")
    assert bare == derived
    assert any("memory bandwidth" in a["reason"] for a in bare["actions"])  # the estimate mattered


def test_with_derived_derives_every_container_and_keeps_the_rest() -> None:
    snap = hog_snapshot(estimated_bandwidth=False)
    out = with_derived(snap)
    assert [s.metrics for s in out.containers] == [derive(s.metrics) for s in snap.containers]
    assert (out.time, out.topology, [s.container for s in out.containers]) == \
        (snap.time, snap.topology, [s.container for s in snap.containers])
