"""The agent moving real containers (containerd + runc) and holding them against the runtime.

The agent runs in-process (agent.loop.Agent, the same object `perfbalance run` drives) with its
real parts: discovery, collectors, the cpuset actuator, drift re-assertion, checkpoint. Only the
planner is scripted: its moves here would come from AVX-512 or LLC signals this machine's CPU
and hypervisor do not give (no avx512f, no resctrl), so the test says which move to make and
checks everything the agent does with it and after it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.config import load_config
from agent.loop import Agent
from perfbalance.model import Action, Plan
from rebalancer.planner import POLICY as COSTMODEL
from tests.node.agentproc import cpus_allowed, free_port, write_config
from tests.node.containerd import CGROUP_ROOT, Containerd, Pod

pytestmark = [pytest.mark.root, pytest.mark.slow]

# A container that keeps forking: a new `sleep` every 0.2 s, each a new process of the container.
FORKING = ("/bin/sh", "-c", "while :; do sleep 0.2; done")
IDLE = ("/bin/sleep", "100000")


def cid() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


class Script:
    """The agent's `json_out`: keeps each cycle's report and runs the test's step for that cycle
    between two cycles (in the agent's event loop, while no cycle runs)."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.steps: dict[int, Callable[[dict[str, Any]], None]] = {}
        self.moves: dict[int, list[tuple[str, str]]] = {}  # cycle -> [(container, cpus)]
        self.agent: Agent | None = None
        self.failure: BaseException | None = None

    def write(self, line: str) -> None:
        report = json.loads(line)
        self.reports.append(report)
        step = self.steps.get(report["cycle"])
        if step is not None and self.failure is None:
            try:
                step(report)
            except BaseException as e:  # re-raised by the test after the agent stopped
                self.failure = e
                assert self.agent is not None
                self.agent.request_stop()

    def flush(self) -> None:
        pass

    def plan(self, snapshot, config, state, now) -> Plan:
        """Stands in for the cost model's plan: this cycle's scripted moves, as cpuset actions."""
        by_id = {s.id: s.container for s in snapshot.containers}
        actions = tuple(
            Action(kind="cpuset", container=c, frm=str(by_id[c].cpuset) if c in by_id else "", to=to,
                   reason=f"node test: scripted move of {c[:12]}")
            for c, to in self.moves.get(snapshot.cycle, []))
        return Plan(time=now, actions=actions, state=state)


def all_allowed(ctd: Containerd, c: str) -> set[str]:
    """The CPU lists of the container's processes; one that exits between the listing and the
    read (the container's shell forks short-lived children) is left out, not an error."""
    out = set()
    for p in ctd.pids(c):
        try:
            out.add(cpus_allowed(p))
        except FileNotFoundError:
            continue
    return out


def test_moved_container_stays_moved_against_the_runtime(containerd, tmp_path: Path, top: str, monkeypatch):
    a, b = cid(), cid()
    pod_a = Pod(uid=str(uuid.uuid4()), qos="burstable")
    containerd.run(a, pod_a, FORKING, cpu_shares=102)
    containerd.run(b, Pod(uid=str(uuid.uuid4()), qos="burstable"), IDLE, cpu_shares=102)
    pod_cpuset = CGROUP_ROOT / "cpuset" / pod_a.cgroup(top) / "cpuset.cpus"
    cfg = write_config(tmp_path / "config.yaml", run_dir=tmp_path / "run", port=free_port(),
                       extra={"agent": {"interval_seconds": 0.5}})
    script = Script()
    monkeypatch.setattr("rebalancer.planner.POLICY", dataclasses.replace(COSTMODEL, plan=script.plan))
    agent = Agent(load_config(str(cfg), node="node-test"), node="node-test", config_path=str(cfg),
                  cycles=40, json_out=script)  # type: ignore[arg-type]
    script.agent = agent
    seen: dict[str, Any] = {}
    script.moves[1] = [(a, "1")]

    def after_move(r: dict[str, Any]) -> None:
        (ev,) = [e for e in r["applied"] if e["container"] == a]
        assert ev["ok"] and ev["to"] == "1", ev
        assert all_allowed(containerd, a) == {"1"}  # every process of the container
        assert all_allowed(containerd, b) == {"0-1"}  # control: the other container untouched
        containerd.exec(a, "late", ("/bin/sleep", "100000"))  # a process started after the move
        seen["late"] = set(containerd.pids(a))
        assert all_allowed(containerd, a) == {"1"}
        containerd.update_cpuset(a, "0-1")  # the runtime rewrites it (kubelet UpdateContainerResources)
        assert all_allowed(containerd, a) == {"0-1"}

    def after_reassert(r: dict[str, Any]) -> None:
        assert agent.state.drift_reasserted_total == 1 and not r["errors"], r["errors"]
        assert all_allowed(containerd, a) == {"1"}
        assert all_allowed(containerd, b) == {"0-1"}
        # Now the rewrite cannot be undone: the runtime sets "0" and the pod's cgroup is narrowed
        # to "0", so writing "1" into the container's cgroup is EACCES (cpuset v1: a child's CPUs
        # must be a subset of its parent's).
        assert agent.parts is not None
        agent.parts.cpusets.backoff_base = 3.0
        containerd.update_cpuset(a, "0")
        pod_cpuset.write_text("0")

    def after_refused(r: dict[str, Any]) -> None:
        errs = [e for e in r["errors"] if a in e]
        assert errs and "EACCES" in errs[0] and "drift" in errs[0], r["errors"]
        assert agent.parts.cpusets.counters["drift_reassert_failed_total"] == 1

    def backing_off(r: dict[str, Any]) -> None:
        counters = agent.parts.cpusets.counters
        if counters["drift_backoff_skipped_total"] and "widened" not in seen:
            assert not [e for e in r["errors"] if a in e]  # skipped, not retried and not reported
            pod_cpuset.write_text("0-1")
            seen["widened"] = r["cycle"]
        if counters["drift_reasserted_total"] == 2:
            seen["done"] = r["cycle"]
            assert all_allowed(containerd, a) == {"1"}
            containerd.remove(a)  # the container ends; its cgroup is removed by runc
            script.moves[r["cycle"] + 1] = [(a, "0")]  # a stale decision about it
            script.steps[r["cycle"] + 1] = after_gone
            return
        script.steps[r["cycle"] + 1] = backing_off

    def after_gone(r: dict[str, Any]) -> None:
        (ev,) = [e for e in r["applied"] if e["container"] == a]
        assert not ev["ok"] and a in ev["error"], ev
        assert a not in agent.parts.cpusets.applied()
        assert not any((h / pod_a.cgroup(top) / a).exists() for h in CGROUP_ROOT.iterdir())
        seen["gone"] = True
        agent.request_stop()

    script.steps = {1: after_move, 2: after_reassert, 3: after_refused, 4: backing_off}
    try:
        asyncio.run(agent.run())
    finally:
        containerd.remove(b)
        if a in containerd.containers:
            containerd.remove(a)
    if script.failure is not None:
        raise script.failure
    assert seen.get("gone"), f"the agent stopped before the end of the script: {seen}"
    assert seen["late"] and seen["widened"] < seen["done"]
    counters = agent.parts.cpusets.counters
    assert counters["drift_backoff_skipped_total"] >= 1 and counters["drift_reassert_failed_total"] == 1

