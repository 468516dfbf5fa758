"""The real loop ties the planner's judgement of a decision to the events of that decision: by the
decision id on its actions (`Action.decision`), whatever actions of the same plan were skipped."""

from __future__ import annotations

import dataclasses
import errno
import io

import pytest

from agent.config import load_config
from agent.loop import Agent
from agent.wiring import Parts
from perfbalance.errors import CpusetError
from perfbalance.model import Action, Container, Judgement, Plan
from rebalancer.planner import POLICY as COSTMODEL

pytestmark = [pytest.mark.root, pytest.mark.slow]


async def test_a_judgement_reaches_the_event_of_its_decision_when_an_earlier_action_was_skipped(
        demo_workloads, write_config, base, monkeypatch):
    refused, moved = f"{base}:{demo_workloads[0].name}", f"{base}:{demo_workloads[1].name}"
    kept = Judgement(decision="d3", outcome="kept: the move helped", predicted=0.4, realized=0.5, method="model")

    def scripted(snapshot, config, state, now):
        """Cycle 1: a move of `refused` (refused: it backs off). Cycle 2: `refused` again (skipped,
        backing off) then `moved` (decision d3, applied). Cycle 3: d3 is judged."""
        cpus = {s.id: str(s.container.cpuset) for s in snapshot.containers}
        move = {1: [(refused, "d1")], 2: [(refused, "d2"), (moved, "d3")]}.get(snapshot.cycle, [])
        actions = tuple(Action(kind="cpuset", container=c, frm=cpus[c], to=cpus[c], reason="test: scripted",
                               decision=d, detail={"decision": float(d[1:])}) for c, d in move)
        judged = (kept,) if snapshot.cycle == 3 else ()
        return Plan(time=now, actions=actions, judgements=judged,
                    considered=tuple(j.to_json() for j in judged), state=state)

    monkeypatch.setattr("rebalancer.planner.POLICY", dataclasses.replace(COSTMODEL, plan=scripted))
    monkeypatch.setattr("rebalancer.plan", scripted)

    class RefusingOne(Parts):
        def apply(self, action: Action, container: Container) -> None:
            if container.id == refused:
                raise CpusetError(errno.EINVAL, container.id, "cpuset.cpus", action.to)
            super().apply(action, container)

    config = load_config(str(write_config({"agent": {"interval_seconds": 0.3}})), node="e2e-node")
    agent = Agent(config, node="e2e-node", cycles=3, json_out=io.StringIO(),
                  parts_factory=lambda c, n, s: RefusingOne(c, n, config_source=s))
    assert await agent.run() == 0
    (applied,) = [e for e in agent.state.recent_applied if e.ok]
    assert applied.container == moved
    (realized,) = agent.state.latest.realized
    assert (realized.event_id, realized.container, realized.realized) == (applied.event_id, moved, 0.5)
