"""The running agent tells the API server what it does: the real loop (agent.loop.Agent) with its
real parts, its pod metadata and its status service (StatusWriter, NodeWatch, ClientTransport
over HTTPS) against the API stand-in.

What is scripted: the policy (a move of one container in chosen cycles, so a move happens when
the test says) and the discovery of that container and the cpuset write (a Parts subclass: this
machine has no kubelet, so no kubepods cgroup; the container's pod UID is what cgroup discovery
would give, and the real pod metadata names it from the stand-in's pod list).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_api import NODE, Fault, KubeServer
from test_status_rbac import COMPONENT, granted

from agent.config import Config, load_config
from agent.export.kubestatus import CONFIG_VALID, READY
from agent.loop import Agent
from agent.wiring import Parts
from perfbalance.cpuset import CpuSet
from perfbalance.model import Action, Container, KubeletState, Plan
from rebalancer.planner import POLICY as COSTMODEL

CID = "c0ffee" * 10 + "beef"
POD_UID = "6f0e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"
CONFIGMAP_NS = "perfbalance-system"  # from POD_NAMESPACE, as the DaemonSet sets it
ALL_ON = {"events": True, "node_conditions": True, "node_labels": True, "extended_resources": True,
          "config_events": True, "resync_seconds": 5}
INTERVAL = 0.3


@pytest.fixture(autouse=True)
def root_logging(restore_root_logging: None) -> None:
    """The agent's logging set-up is undone after each test (tests/conftest.py)."""


@pytest.fixture
def cluster(kube: KubeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[KubeServer]:
    """The agent's pod environment: the API endpoint, the downward-API namespace, one pod."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(kube.port))
    monkeypatch.setenv("POD_NAMESPACE", CONFIGMAP_NS)
    (tmp_path / "token").write_text("t0ken")
    (tmp_path / "run").mkdir()
    kube.store.pods.append({"metadata": {"uid": POD_UID, "name": "web-1", "namespace": "shop"},
                            "status": {"qosClass": "Burstable",
                                       "containerStatuses": [{"name": "web", "containerID": f"containerd://{CID}"}]}})
    yield kube
    for _ in range(4):  # end the stand-in's watch handlers the stopped agent left waiting
        kube.store.watch.put("END")


@pytest.fixture
def moves(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The cycles in which the policy moves the container (the test fills it in)."""
    cycles: set[int] = set()

    def scripted(snapshot: Any, config: Any, state: Any, now: float) -> Plan:
        actions = tuple(Action(kind="cpuset", container=s.id, frm=str(s.container.cpuset), to="0",
                               reason="test: scripted", benefit=0.25, cost=0.01)
                        for s in snapshot.containers if snapshot.cycle in cycles)
        return Plan(time=now, actions=actions, state=state)

    monkeypatch.setattr("rebalancer.planner.POLICY", dataclasses.replace(COSTMODEL, plan=scripted))
    return cycles


def write(path: Path, tmp_path: Path, kube: KubeServer, status: dict[str, Any], **over: Any) -> Path:
    cfg: dict[str, Any] = {
        "agent": {"run_dir": str(tmp_path / "run"), "log_format": "text"},
        "discovery": {"kubernetes": False, "globs": ["pbtest-kube-status-none/*"]},
        "kubernetes": {"api": "on", "token_file": str(tmp_path / "token"), "ca_file": str(kube.ca_file),
                       "refresh_seconds": 1, "backoff_max_seconds": 2, "status": status},
        "resctrl": {"rdt": "off"},
        "collectors": {"avx512": {"enabled": False}, "perf": {"mode": "off"}, "runqlat": {"enabled": False},
                       "resctrl_monitoring": False},
        "metrics": {"enabled": False},
        "vm": {"enabled": False},
        "rebalancer": {"margin": 0.5},
    }
    for k, v in over.items():
        cfg[k].update(v)
    path.write_text(yaml.safe_dump(cfg))
    return path


class PodParts(Parts):
    """The real parts, plus one container of the pod web-1 (named by the real pod metadata) whose
    cpuset writes are recorded instead of made."""

    applied: list[Action]

    def discover(self, errors: list[str]) -> tuple[list[Container], KubeletState]:
        containers, kubelet = super().discover(errors)
        found = [Container(id=CID, pod_uid=POD_UID, cgroup=f"kubepods/burstable/pod{POD_UID}/{CID}",
                           cpuset=CpuSet.parse("0"))]
        if self.podmeta is not None:
            found = self.podmeta.enrich(found)
        return [*containers, *found], kubelet

    def apply(self, action: Action, container: Container) -> None:
        self.applied.append(action)


def agent_for(cfg: Path, *, cycles: int | None = None) -> Agent:
    def interval(c: Config) -> Config:
        return dataclasses.replace(c, agent=dataclasses.replace(c.agent, interval_seconds=INTERVAL))

    def parts(config: Config, node: str, source: str) -> Parts:
        p = PodParts(config, node, config_source=source)
        p.applied = []
        return p

    return Agent(load_config(str(cfg), node=NODE), node=NODE, config_path=str(cfg), cycles=cycles,
                 overrides=interval, parts_factory=parts)


def conds(kube: KubeServer) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in kube.store.nodes[NODE]["status"].get("conditions") or []}


async def until(what: Callable[[], bool], agent: Agent, timeout: float = 30.0) -> None:
    """Wait while the agent runs; fail naming the last cycle if `what` never becomes true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not what():
        assert loop.time() < deadline, f"not within {timeout} s (agent at cycle {agent._inputs.cycle})"
        await asyncio.sleep(0.05)


def pod_events(kube: KubeServer) -> list[dict[str, Any]]:
    return kube.store.events_for("Pod", "web-1")


async def test_an_applied_move_is_an_event_on_its_pod_and_the_node_shows_the_agent(
        cluster: KubeServer, tmp_path: Path, moves: set[int]) -> None:
    moves.add(2)  # cycles 1 and 3 move nothing: the control
    agent = agent_for(write(tmp_path / "c.yaml", tmp_path, cluster, ALL_ON), cycles=3)
    assert await asyncio.wait_for(agent.run(), 60) == 0
    assert len(agent.parts.applied) == 1  # type: ignore[union-attr]
    (ev,) = pod_events(cluster)
    assert (ev["reason"], ev["action"], ev["type"]) == ("MovedCPUs", "Rebalance", "Normal")
    assert ev["regarding"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "shop", "name": "web-1",
                               "uid": POD_UID, "fieldPath": "spec.containers{web}"}
    assert ev["metadata"]["namespace"] == "shop" and "predicted benefit 0.2500" in ev["note"]
    patches = [r for r in cluster.store.seen if r.method == "PATCH" and r.path == f"/api/v1/nodes/{NODE}/status"]
    assert patches and {r.content_type for r in patches} == {"application/merge-patch+json"}
    c = conds(cluster)
    assert c["Ready"]["reason"] == "KubeletReady"  # the kubelet's conditions survive the merge patches
    assert (c[CONFIG_VALID]["status"], c[CONFIG_VALID]["reason"]) == ("True", "ConfigLoaded")
    assert (c[READY]["status"], c[READY]["reason"]) == ("False", "AgentStopped")  # the last pass, at stop
    node = cluster.store.nodes[NODE]
    assert node["metadata"]["labels"]["perfbalance.io/mode"] == "cgroupfs"
    assert "perfbalance.io/avx512-island-cpus" in node["status"]["capacity"]
    assert cluster.store.events_for("ConfigMap", "perfbalance-config") == []  # the config was good
    assert used_grants(cluster) <= granted_by_all_components()  # the running agent needs no more RBAC


def used_grants(kube: KubeServer) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every request the agent sent, pod metadata included."""
    out = set()
    for r in kube.store.seen:
        verb = {"GET": "get", "POST": "create", "PATCH": "patch", "DELETE": "delete"}[r.method]
        if r.path in ("/api/v1/pods", "/api/v1/nodes"):
            out.add(("", r.path.rsplit("/", 1)[-1], "list" if r.path.endswith("pods") else "watch"))
        elif r.path.startswith("/apis/events.k8s.io/"):
            out.add(("events.k8s.io", "events", verb))
        else:
            out.add(("", "nodes/status" if r.path.endswith("/status") else "nodes", verb))
    return out


def granted_by_all_components() -> set[tuple[str, str, str]]:
    out = {("", "pods", v) for v in ("get", "list", "watch")}  # the base role
    for component in set(COMPONENT.values()):
        out |= granted(component)[0]
    return out


async def test_with_status_off_the_same_move_sends_nothing(cluster: KubeServer, tmp_path: Path, moves: set[int]) -> None:
    moves.add(2)
    agent = agent_for(write(tmp_path / "c.yaml", tmp_path, cluster, {}), cycles=3)
    assert await asyncio.wait_for(agent.run(), 60) == 0
    assert len(agent.parts.applied) == 1  # type: ignore[union-attr]
    assert {r.path for r in cluster.store.seen} == {"/api/v1/pods"}  # pod metadata only
    assert cluster.store.events == {} and READY not in conds(cluster)


async def test_a_rejected_config_is_a_warning_on_the_configmap_until_a_good_one_loads(
        cluster: KubeServer, tmp_path: Path, moves: set[int]) -> None:
    cfg = write(tmp_path / "c.yaml", tmp_path, cluster, ALL_ON)
    agent = agent_for(cfg)

    def warnings() -> list[dict[str, Any]]:
        return cluster.store.events_for("ConfigMap", "perfbalance-config")

    async def break_then_fix() -> None:
        await until(lambda: conds(cluster).get(CONFIG_VALID, {}).get("status") == "True", agent)
        assert warnings() == []  # control: a good config raises nothing
        cfg.write_text(cfg.read_text().replace("margin: 0.5", "margin: lots"))
        await until(lambda: len(warnings()) == 1 and conds(cluster)[CONFIG_VALID]["status"] == "False", agent)
        (ev,) = warnings()
        assert ev["type"] == "Warning" and ev["reason"] == "InvalidConfig"
        assert ev["metadata"]["namespace"] == CONFIGMAP_NS and ev["regarding"]["namespace"] == CONFIGMAP_NS
        assert "rebalancer.margin" in ev["note"] and "lots" in ev["note"] and NODE in ev["note"]
        assert "rebalancer.margin" in conds(cluster)[CONFIG_VALID]["message"]
        cfg.write_text(cfg.read_text().replace("margin: lots", "margin: 0.25"))
        await until(lambda: warnings() == [] and conds(cluster)[CONFIG_VALID]["status"] == "True", agent)
        agent.request_stop()

    driver = asyncio.create_task(break_then_fix())
    assert await asyncio.wait_for(agent.run(), 90) == 0
    await driver
    assert agent.config.rebalancer.margin == 0.25


async def test_api_conflicts_rejections_throttling_and_a_broken_watch_neither_stop_the_agent_nor_lose_the_status(
        cluster: KubeServer, tmp_path: Path, moves: set[int]) -> None:
    moves.update({2, 3})
    heartbeats: list[int] = []

    def kubelet_once(store: Any) -> None:  # the kubelet writes between our GET and PATCH: a 409
        if not heartbeats:
            heartbeats.append(1)
            store.kubelet_heartbeat()

    cluster.store.after_node_get = kubelet_once
    cluster.store.faults += [  # answered in this order, each once
        Fault(method="PATCH", path_contains=f"/nodes/{NODE}/status", status=422, message="status.conditions: Invalid"),
        Fault(method="PATCH", path_contains=f"/nodes/{NODE}/status", status=409, message="the object has been modified"),
        Fault(method="POST", path_contains="/events", status=429, headers={"Retry-After": "1"}),
    ]
    cluster.store.watch.put("BREAK")
    agent = agent_for(write(tmp_path / "c.yaml", tmp_path, cluster, {**ALL_ON, "series_flush_seconds": 1}))

    def series() -> int:
        evs = pod_events(cluster)
        return (evs[0].get("series") or {}).get("count", 1) if len(evs) == 1 else -len(evs)

    async def check() -> None:
        # While the agent runs: one Event counting both moves (the first create was throttled, then sent) ...
        await until(lambda: series() == 2, agent)
        # ... our conditions, written after the 422 (by the resync or the watch) beside the kubelet's ...
        await until(lambda: conds(cluster).get(READY, {}).get("status") == "True", agent)
        assert conds(cluster)["Ready"]["lastHeartbeatTime"] == "2026-12-01T10:05:00Z"  # the kubelet's write kept
        # ... and a watch that resumed after breaking, from the resourceVersion it had seen.
        await until(lambda: len(cluster.store.watch_queries) >= 2, agent)
        assert cluster.store.watch_queries[1]["resourceVersion"] != [""]
        seen = agent._inputs.cycle
        await until(lambda: agent._inputs.cycle >= seen + 2, agent)  # still cycling
        agent.request_stop()

    driver = asyncio.create_task(check())
    assert await asyncio.wait_for(agent.run(), 90) == 0
    await driver
    posts = [r for r in cluster.store.seen if r.method == "POST" and "/events" in r.path]
    assert len(posts) >= 2  # the throttled create was sent again
    status_patches = [r for r in cluster.store.seen if r.method == "PATCH" and r.path.endswith("/status")]
    assert len(status_patches) >= 3  # the rejected one, the conflicting one, then written


async def test_an_api_server_that_does_not_answer_never_holds_up_a_cycle(
        cluster: KubeServer, tmp_path: Path, moves: set[int]) -> None:
    cluster.store.stalled.set()  # node and event requests hang (the client gives up after 2 s)
    cfg = write(tmp_path / "c.yaml", tmp_path, cluster, ALL_ON, kubernetes={"timeout_seconds": 2})
    agent = agent_for(cfg)

    async def check() -> None:
        await until(lambda: agent._inputs.cycle >= 1, agent)
        start, asked = agent._inputs.cycle, cluster.store.arrived
        await until(lambda: agent._inputs.cycle >= start + 10, agent)
        # Ten cycles, each handing its report over, while the status threads sent a few requests
        # and got no answer: a cycle that waited for the writer would be one request each.
        assert cluster.store.arrived - asked < 10
        assert READY not in conds(cluster) and cluster.store.events == {}
        cluster.store.stalled.clear()  # control: once it answers, the status arrives
        await until(lambda: conds(cluster).get(READY, {}).get("status") == "True", agent)
        agent.request_stop()

    driver = asyncio.create_task(check())
    assert await asyncio.wait_for(agent.run(), 90) == 0
    await driver
