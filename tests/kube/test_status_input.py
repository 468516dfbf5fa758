"""What a cycle shows the control plane: events per applied move, facts about the node."""

from __future__ import annotations

import dataclasses

from agent.config import Config
from agent.export.kubestatus import PREFIX, status_input
from agent.export.report import Applied, CycleReport, Realized
from perfbalance.cpuset import CpuSet
from perfbalance.model import CollectorStatus, Container, ContainerSample, Plan, Snapshot
from perfbalance.topology import synthetic
from resctrl.metrics import ResctrlMetrics

SKYLAKE = "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz"


def container(cid: str, **kw: object) -> ContainerSample:
    fields: dict[str, object] = dict(id=cid, name=f"{cid}-ctr", namespace="shop", pod=f"{cid}-pod",
                                     pod_uid=f"uid-{cid}", cgroup=f"k/{cid}", cpuset=CpuSet.parse("0-3"))
    c = Container(**{**fields, **kw})  # type: ignore[arg-type]
    return ContainerSample(container=c, metrics={"cpu_usage_cores": 1.0})


def report(**kw: object) -> CycleReport:
    topo = synthetic(packages=1, cores_per_node=4, threads_per_core=1, cpu_model=SKYLAKE)
    snap = Snapshot(time=10.0, window=10.0, node="n", topology=topo, cycle=3,
                    containers=(container("a"), container("x", exclusive=True, cpuset=CpuSet.parse("3")),
                                ContainerSample(container=Container(id="bare", cgroup="demo/bare"))),
                    collectors={"avx512": CollectorStatus(up=True), "resctrl": CollectorStatus(up=False, reason="not mounted")})
    return CycleReport(cycle=3, time=10.0, snapshot=snap, plan=Plan(time=10.0), **kw)  # type: ignore[arg-type]


def applied(cid: str, kind: str = "cpuset", ok: bool = True) -> Applied:
    return Applied(event_id="e1", kind=kind, container=cid, frm="0-3", to="1-2", reason="avx512: island", ok=ok,
                   predicted_benefit=0.12, predicted_cost=0.01, time=10.0)


def test_applied_moves_and_rollbacks_are_events_on_their_pods_failed_and_podless_ones_are_not() -> None:
    r = report(applied=(applied("a"), applied("a", kind="rollback"), applied("a", ok=False), applied("bare")),
               realized=(Realized(event_id="e1", container="a", predicted=0.1, realized=0.08, rolled_back=False),))
    s = status_input(r, config=Config(), config_valid=True, config_error="", extra={})
    assert [(e.reason, e.type, e.regarding["name"]) for e in s.events] == [
        ("MovedCPUs", "Normal", "a-pod"), ("RolledBack", "Warning", "a-pod"), ("MoveJudged", "Normal", "a-pod")]
    first = s.events[0]
    assert first.regarding["fieldPath"] == "spec.containers{a-ctr}" and "predicted benefit 0.1200" in first.note
    assert "realized 0.0800 of predicted 0.1000" in s.events[2].note


def test_facts_say_what_the_node_offers() -> None:
    s = status_input(report(), config=Config(), config_valid=True, config_error="", extra={"resctrl_closids_free": 7})
    f = s.facts
    assert f.labels[f"{PREFIX}avx512-license-loss"] == "0.20" and f.labels[f"{PREFIX}rdt"] == "false"
    assert f.labels[f"{PREFIX}mode"] == "cgroupfs"
    assert f.resources[f"{PREFIX}avx512-island-cpus"] == 3  # 4 CPUs, one dedicated to x
    assert f"{PREFIX}rdt-free-closids" not in f.resources  # resctrl is down: no claim about CLOSIDs
    amd = dataclasses.replace(report().snapshot, topology=synthetic(packages=1, cores_per_node=4, cpu_model="AMD EPYC 9654"))
    s2 = status_input(dataclasses.replace(report(), snapshot=amd), config=Config(), config_valid=True, config_error="", extra={})
    assert s2.facts.resources[f"{PREFIX}avx512-island-cpus"] == 0  # control: no licence, no islands
    assert s2.facts.labels[f"{PREFIX}avx512-license-loss"] == "0.00"


def test_free_closids_come_from_the_snapshot_when_the_agent_state_has_none() -> None:
    snap = report().snapshot
    up = dataclasses.replace(snap, collectors={**snap.collectors, "resctrl": CollectorStatus(up=True)},
                             node_metrics=ResctrlMetrics(num_closids=16, free_closids=5).node_metrics())
    s = status_input(dataclasses.replace(report(), snapshot=up), config=Config(), config_valid=True,
                     config_error="", extra={})
    assert s.facts.resources[f"{PREFIX}rdt-free-closids"] == 5
