"""The real agent (agent.loop.Agent, what `perfbalance run` drives) in NRI mode against a real
containerd 1.7 with NRI, pods and containers run through CRI as the kubelet runs them.

Everything is the agent's own: discovery of the pods' cgroups, the NRI session started by Parts,
placement at creation from the agent's snapshot, the cpuset actuator and its runtime route, drift
re-assertion, the report and the Prometheus exporter. Only the planner is scripted (as in
tests/node/test_moves.py): its moves would come from AVX-512 or LLC signals this machine does not
give, so the test says which move to make and checks how the agent makes it. Each behaviour is
shown next to its control with `runtime.nri: off`, where the same moves are cgroupfs writes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from agent.config import load_config
from agent.export.prometheus import make_registry
from agent.loop import Agent
from perfbalance.model import Action, Plan
from rebalancer.planner import POLICY as COSTMODEL
from test_containerd_plugin import allowed
from tests.node.agentproc import PERFBALANCE, LiveAgent, free_port, write_config
from tests.node.containerd import remove_cgroups

pytestmark = [pytest.mark.root, pytest.mark.slow]

ANNOTATION = "perfbalance.io/team"  # copied onto containers (kubernetes.annotation_prefixes)
MAX_CYCLES = 60  # a script that has not finished by then fails


class Script:
    """The agent's `json_out` and its planner: runs the test's step after each cycle (in the
    agent's event loop, between two cycles) and plans the moves the steps asked for."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.step: Callable[[dict[str, Any]], Callable[..., Any] | None] | None = None
        self.moves: dict[int, list[tuple[str, str]]] = {}  # cycle -> [(container id, cpus)]
        self.agent: Agent | None = None
        self.failure: BaseException | None = None
        self.done = False

    def write(self, line: str) -> None:
        report = json.loads(line)
        self.reports.append(report)
        if self.step is None or self.failure is not None:
            return
        try:
            self.step = self.step(report)
        except BaseException as e:  # re-raised by the test once the agent has stopped
            self.failure = e
            self.step = None
        if self.step is None:
            assert self.agent is not None
            self.agent.request_stop()

    def flush(self) -> None:
        pass

    def move(self, after: dict[str, Any], cid: str, cpus: str) -> None:
        self.moves[after["cycle"] + 1] = [(cid, cpus)]

    def plan(self, snapshot, config, state, now) -> Plan:  # type: ignore[no-untyped-def]
        by_id = {s.id: s.container for s in snapshot.containers}
        actions = tuple(Action(kind="cpuset", container=c, frm=str(by_id[c].cpuset) if c in by_id else "", to=to,
                               reason=f"nri test: scripted move of {c[:12]}")
                        for c, to in self.moves.get(snapshot.cycle, []))
        return Plan(time=now, actions=actions, state=state)


@pytest.fixture
def top() -> Iterator[str]:
    name = f"pbnri-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    yield name
    # only under this session's own cgroup of each hierarchy, where runc put them (a walk of the
    # whole tree races other sessions' cgroups coming and going)
    left = remove_cgroups(name)
    assert not left, f"cgroups left behind: {left}"


@pytest.fixture
def kube(containerd, top: str) -> Iterator[Any]:  # type: ignore[no-untyped-def]
    """Pods under <top>/kubepods/burstable/pod<uid>, where the agent's discovery finds them."""
    from cri import Kubelet
    k = Kubelet(containerd.cri_address, f"{top}/kubepods/burstable")
    try:
        yield k
    finally:
        k.teardown()


def agent_for(tmp_path: Path, containerd: Any, *, nri: str, reserved: str, script: Script,
              monkeypatch: pytest.MonkeyPatch) -> Agent:
    (tmp_path / "kubelet").mkdir()  # no cpu_manager_state: the CPU manager's "none" policy
    (tmp_path / "run").mkdir()  # `perfbalance run` makes it (with its lock); Agent alone does not
    cfg = write_config(tmp_path / "config.yaml", run_dir=tmp_path / "run", port=free_port(), extra={
        "agent": {"interval_seconds": 0.5},
        "host": {"kubelet_root": str(tmp_path / "kubelet")},
        "cpuset": {"reserved_cpus": reserved},
        "runtime": {"nri": nri, "nri_socket": containerd.nri_socket, "nri_plugin_index": "20",
                    "nri_backoff_max_seconds": 1.0},
    })
    monkeypatch.setattr("rebalancer.planner.POLICY", dataclasses.replace(COSTMODEL, plan=script.plan))
    agent = Agent(load_config(str(cfg), node="node-test"), node="node-test", config_path=str(cfg),
                  cycles=MAX_CYCLES, json_out=script)  # type: ignore[arg-type]
    script.agent = agent
    return agent


def run(agent: Agent, script: Script) -> None:
    asyncio.run(agent.run())
    if script.failure is not None:
        raise script.failure
    assert script.done, f"the agent stopped before the end of the script (cycle {len(script.reports)})"


def container(report: dict[str, Any], cid: str) -> dict[str, Any]:
    (c,) = [c for c in report["containers"] if c["id"] == cid]
    return c


def event(report: dict[str, Any], cid: str) -> dict[str, Any]:
    (ev,) = [e for e in report["applied"] if e["container"] == cid]
    return ev


def exposition(agent: Agent) -> str:
    return generate_latest(make_registry(agent.state)).decode()


def doctor(agent: Agent) -> dict[str, Any]:
    """`perfbalance doctor --json`'s runtime section, with the running agent's config."""
    res = subprocess.run([PERFBALANCE, "doctor", "--json", "--config", str(agent.config_path)],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "NODE_NAME": "node-test"})
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["runtime"]  # type: ignore[no-any-return]


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def pre_pod(kube: Any) -> tuple[str, int]:
    """A pod that runs before the agent starts (the runtime's Synchronize hands it over)."""
    cfg = kube.pod_config("pre", namespace="shop", annotations={ANNOTATION: "checkout"},
                          labels={"app": "web"})
    pod_id = kube.run_pod(cfg)
    cid = kube.create(pod_id, cfg, "app")
    kube.start(cid)
    return cid, kube.pid(cid)


def test_agent_places_moves_and_names_containers_through_nri(containerd, kube, tmp_path, monkeypatch):
    pre, pre_pid = pre_pod(kube)
    script = Script()
    agent = agent_for(tmp_path, containerd, nri="on", reserved="0", script=script, monkeypatch=monkeypatch)
    seen: dict[str, Any] = {}

    def connected(r: dict[str, Any]) -> Callable[..., Any]:
        # the session may come up mid-cycle, after that cycle's discovery: names from the next
        return named if r["actuation"]["connected"] else connected

    def named(r: dict[str, Any]) -> Callable[..., Any]:
        a = r["actuation"]
        assert a["path"] == "nri" and a["sessions"] == 1 and a["runtime"].startswith("containerd 1.7"), a
        c = container(r, pre)  # names from the runtime: kubernetes.api is off, no API server here
        assert (c["name"], c["pod"], c["namespace"]) == ("app", "pre", "shop"), c
        assert c["annotations"].get(ANNOTATION) == "checkout"
        assert 'perfbalance_actuation_path{path="nri"} 1.0' in exposition(agent)
        assert 'perfbalance_nri_connected 1.0' in exposition(agent)
        # a container created now is placed by the agent from its snapshot: CPU 0 is reserved
        _, _, seen["fresh_pid"] = kube.run("fresh", "app")
        assert allowed(seen["fresh_pid"]) == "1"
        assert allowed(pre_pid) == "0-1"  # the planner has not moved it yet
        script.move(r, pre, "1")
        return moved

    def moved(r: dict[str, Any]) -> Callable[..., Any]:
        ev = event(r, pre)
        assert ev["ok"] and ev["path"] == "nri" and ev["to"] == "1", ev
        assert allowed(pre_pid) == "1"
        assert agent.parts is not None and agent.parts.nri.view is not None
        assert agent.parts.nri.view.containers[pre].cpus == "1"  # the runtime's record has it
        assert agent.parts.cpusets.counters["runtime_applied_total"] == 1
        kube.update_cpuset(pre, "0-1")  # the CPU manager's reconcile of a shared container
        return kept

    def kept(r: dict[str, Any]) -> None:
        assert allowed(pre_pid) == "1"  # the runtime kept the move: no drift, nothing re-asserted
        assert agent.state.drift_reasserted_total == 0 and not r["errors"], r["errors"]
        rt = doctor(agent)
        assert rt["available"] and rt["path"] == "nri" and rt["running_agent"]["pid"] == os.getpid(), rt
        script.done = True

    script.step = connected
    run(agent, script)


def test_with_nri_off_the_same_moves_are_cgroupfs_writes(containerd, kube, tmp_path, monkeypatch):
    """The control of the test above: the same node, pods and script with runtime.nri off."""
    pre, pre_pid = pre_pod(kube)
    script = Script()
    agent = agent_for(tmp_path, containerd, nri="off", reserved="0", script=script, monkeypatch=monkeypatch)

    def first(r: dict[str, Any]) -> Callable[..., Any]:
        a = r["actuation"]
        assert (a["path"], a["connected"], a["reason"]) == ("cgroupfs", False, "runtime.nri is off"), a
        c = container(r, pre)  # no NRI and no API server: what the cgroup path tells, nothing more
        assert (c["name"], c["pod"], c["namespace"]) == ("", "", ""), c
        assert ANNOTATION not in c["annotations"]
        assert 'perfbalance_actuation_path{path="cgroupfs"} 1.0' in exposition(agent)
        assert 'perfbalance_actuation_path{path="nri"} 0.0' in exposition(agent)
        _, _, fresh_pid = kube.run("fresh", "app")
        assert allowed(fresh_pid) == "0-1"  # the runtime's default: nobody placed it
        script.move(r, pre, "1")
        return moved

    def moved(r: dict[str, Any]) -> Callable[..., Any]:
        ev = event(r, pre)
        assert ev["ok"] and ev["path"] == "cgroupfs", ev
        assert allowed(pre_pid) == "1"
        kube.update_cpuset(pre, "0-1")  # the runtime does not know our move: this undoes it
        assert allowed(pre_pid) == "0-1"
        return reasserted

    def reasserted(r: dict[str, Any]) -> None:
        assert agent.state.drift_reasserted_total == 1 and allowed(pre_pid) == "1"
        rt = doctor(agent)
        assert not rt["available"] and rt["path"] == "cgroupfs" and "runtime.nri is off" in rt["reason"], rt
        script.done = True

    script.step = first
    run(agent, script)


def test_a_move_the_runtime_refuses_is_an_error_and_backs_off(containerd, kube, tmp_path, monkeypatch):
    pre, pre_pid = pre_pod(kube)
    other, other_pid = pre_pod(kube)
    script = Script()
    agent = agent_for(tmp_path, containerd, nri="on", reserved="", script=script, monkeypatch=monkeypatch)

    def connected(r: dict[str, Any]) -> Callable[..., Any]:
        if not r["actuation"]["connected"]:
            return connected
        # narrow the pod's cgroup to CPU 0: runc cannot give its container CPU 1 (cpuset v1:
        # a child's CPUs must be within its parent's), so the runtime's update fails
        kube.update_cpuset(pre, "0")
        pod_cgroup = Path("/sys/fs/cgroup/cpuset") / container(r, pre)["cgroup"].rsplit("/", 1)[0]
        for child in pod_cgroup.iterdir():  # the pause container's cgroup too (EBUSY otherwise)
            if child.is_dir():
                (child / "cpuset.cpus").write_text("0")
        (pod_cgroup / "cpuset.cpus").write_text("0")
        assert agent.parts is not None
        script.moves[r["cycle"] + 1] = [(pre, "1"), (other, "1")]
        return refused

    def refused(r: dict[str, Any]) -> Callable[..., Any]:
        ev = event(r, pre)
        assert not ev["ok"] and "runtime did not move" in ev["error"] and pre in ev["error"], ev
        assert allowed(pre_pid) == "0"
        assert event(r, other)["ok"] and allowed(other_pid) == "1"  # control: same cycle, same path
        assert agent.state.action_errors_total["RuntimeRefused"] == 1
        script.moves[r["cycle"] + 1] = [(pre, "1")]  # the planner asks again at once
        return backing_off

    def backing_off(r: dict[str, Any]) -> None:
        assert not [e for e in r["applied"] if e["container"] == pre]  # not retried in a hot loop
        assert any(pre in e and "backing off" in e for e in r["errors"]), r["errors"]
        assert agent.state.action_errors_total["RuntimeRefused"] == 1
        script.done = True

    script.step = connected
    run(agent, script)


def test_perfbalance_run_json_names_pods_from_nri_and_stops_cleanly(containerd, kube, tmp_path):
    """`perfbalance run --json` as the DaemonSet runs it: the same NRI session from the command
    line, the pod's names in its JSON lines, the session closed at exit."""
    pre, _ = pre_pod(kube)
    cfg = write_config(tmp_path / "config.yaml", run_dir=tmp_path / "run", port=free_port(), extra={
        "host": {"kubelet_root": str(tmp_path)},
        "runtime": {"nri": "on", "nri_socket": containerd.nri_socket, "nri_plugin_index": "21"}})
    live = LiveAgent(cfg, cycles=MAX_CYCLES, interval=0.5, dry_run=True)
    try:
        r = live.next()
        while not r["actuation"]["connected"]:
            r = live.next()
        c = container(live.next(), pre)
        assert (c["name"], c["pod"], c["namespace"], c["annotations"].get(ANNOTATION)) == \
            ("app", "pre", "shop", "checkout"), c
        live.proc.send_signal(signal.SIGTERM)
        assert live.wait(30) == 0, live.stderr()
        assert "NRI: connected to" in live.stderr()
    finally:
        live.close()


def test_runtime_crash_falls_back_to_cgroupfs_and_reconnects_losing_nothing(containerd, kube, tmp_path,
                                                                           monkeypatch):
    pre, pre_pid = pre_pod(kube)
    script = Script()
    agent = agent_for(tmp_path, containerd, nri="on", reserved="", script=script, monkeypatch=monkeypatch)

    def connected(r: dict[str, Any]) -> Callable[..., Any]:
        if not r["actuation"]["connected"]:
            return connected
        script.move(r, pre, "1")
        return moved_by_nri

    def moved_by_nri(r: dict[str, Any]) -> Callable[..., Any]:
        assert event(r, pre)["path"] == "nri" and allowed(pre_pid) == "1"
        containerd.kill()  # a crash: shims and containers keep running
        assert agent.parts is not None
        assert wait_for(lambda: not agent.parts.nri.connected, 10), agent.parts.nri.status()
        script.move(r, pre, "0")
        return moved_by_cgroupfs

    def moved_by_cgroupfs(r: dict[str, Any]) -> Callable[..., Any]:
        a = r["actuation"]
        assert a["path"] == "cgroupfs" and not a["connected"] and a["reason"], a
        assert 'perfbalance_actuation_path{path="cgroupfs"} 1.0' in exposition(agent)
        ev = event(r, pre)
        assert ev["ok"] and ev["path"] == "cgroupfs", ev
        assert allowed(pre_pid) == "0"
        containerd.start()
        return reconnected

    def reconnected(r: dict[str, Any]) -> Callable[..., Any]:
        return resynchronized if r["actuation"]["connected"] else reconnected

    def resynchronized(r: dict[str, Any]) -> Callable[..., Any]:
        assert r["actuation"]["sessions"] == 2 and r["actuation"]["path"] == "nri"
        assert agent.parts is not None and agent.parts.nri.view is not None
        # nothing lost: the pod is named again, and the move made while the runtime was down was
        # handed to it at Synchronize, so its record agrees with the cgroup
        assert container(r, pre)["pod"] == "pre"
        assert agent.parts.nri.view.containers[pre].cpus == "0"
        assert allowed(pre_pid) == "0"
        kube.update_cpuset(pre, "0-1")  # the kubelet's reconcile keeps our placement now
        return kept

    def kept(r: dict[str, Any]) -> Callable[..., Any]:
        assert allowed(pre_pid) == "0" and agent.state.drift_reasserted_total == 0, r["errors"]
        script.move(r, pre, "1")
        return moved_again

    def moved_again(r: dict[str, Any]) -> None:
        assert event(r, pre)["path"] == "nri" and allowed(pre_pid) == "1"
        script.done = True

    script.step = connected
    try:
        run(agent, script)
    finally:
        if containerd.proc is None:  # leave the module's containerd running for what follows
            containerd.start()
