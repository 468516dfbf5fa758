"""The agent runs the selected policy isolated: a policy that raises, overruns its budget or
answers nonsense costs one cycle's moves, never the agent or the policy's last good state."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest

from agent.plan.runner import PolicyRunner
from perfbalance.model import Action, Plan, PolicyState, Snapshot
from perfbalance.settings import setting
from perfbalance.topology import synthetic
from rebalancer import RebalancerConfig
from rebalancer.policy import Policy, PolicyError, check_policy

SNAP = Snapshot(time=1.0, window=1.0, node="n", topology=synthetic(packages=1, cores_per_node=2), containers=())
MOVE = Action(kind="cpuset", container="c", frm="0", to="1", reason="test")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Knobs:
    mode: str = setting("ok", "What the test policy does.")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Count(PolicyState):
    n: int = 0


class Behaviour:
    """A test policy whose answer the test switches between calls."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[Any] = []

    def plan(self, snapshot: Snapshot, config: Knobs, state: Count | None, now: float) -> Any:
        self.calls.append(state.n if state else None)
        if config.mode == "raise":
            raise ZeroDivisionError("division by zero")
        if config.mode == "hang":
            self.release.wait(30)
        if config.mode == "garbage":
            return {"actions": []}
        if config.mode == "badstate":
            return Plan(time=now, state="not an int")
        return Plan(time=now, actions=(MOVE,), state=Count(n=(state.n if state else 0) + 1))


@pytest.fixture
def behaviour() -> Any:
    b = Behaviour()
    yield b
    b.release.set()  # let a hung call finish so no thread outlives the test


def runner(b: Behaviour) -> PolicyRunner:
    pol = Policy(name="probe", plan=b.plan, config_type=Knobs, state_type=Count)

    def loader(name: str) -> Policy:
        if name != "probe":
            raise PolicyError(name, "not installed")
        return check_policy(pol, name=name)

    return PolicyRunner(loader=loader)


def cfg(mode: str, budget: float = 5.0) -> RebalancerConfig:
    return RebalancerConfig(policy="probe", policies={"probe": {"mode": mode}}, policy_budget_seconds=budget)


def test_a_good_policy_plans_and_gets_its_state_back(behaviour: Behaviour) -> None:
    r = runner(behaviour)
    first = r.run(SNAP, cfg("ok"), 1.0)
    second = r.run(SNAP, cfg("ok"), 2.0)
    assert (first.error, first.plan.actions, second.plan.state) == ("", (MOVE,), Count(n=2))
    assert behaviour.calls == [None, 1]


@pytest.mark.parametrize(("mode", "needle"), [
    ("raise", "policy 'probe' raised ZeroDivisionError: division by zero"),
    ("garbage", "returned a dict, not a Plan"),
    ("badstate", "state of type str, not Count"),
])
def test_a_failing_policy_costs_the_moves_not_the_state(behaviour: Behaviour, mode: str, needle: str) -> None:
    r = runner(behaviour)
    r.run(SNAP, cfg("ok"), 1.0)
    bad = r.run(SNAP, cfg(mode), 2.0)
    assert needle in bad.error
    assert bad.plan.actions == () and bad.plan.state == Count(n=1)
    good = r.run(SNAP, cfg("ok"), 3.0)  # control: it recovers with the last good state
    assert good.error == "" and good.plan.state == Count(n=2)


def test_a_policy_past_its_budget_is_abandoned_and_not_called_again_until_it_returns(behaviour: Behaviour) -> None:
    r = runner(behaviour)
    r.run(SNAP, cfg("ok"), 1.0)
    slow = r.run(SNAP, cfg("hang", budget=0.05), 2.0)
    assert "no plan within its budget of 0.05 s" in slow.error and slow.plan.actions == ()
    again = r.run(SNAP, cfg("ok"), 3.0)
    assert "still running" in again.error and len(behaviour.calls) == 2
    behaviour.release.set()
    r._running.thread.join(5)  # type: ignore[union-attr]
    done = r.run(SNAP, cfg("ok"), 4.0)
    assert done.error == "" and done.plan.state == Count(n=2)  # the overrun call's answer was never used


def test_an_unknown_policy_is_reported_each_cycle(behaviour: Behaviour) -> None:
    out = runner(behaviour).run(SNAP, RebalancerConfig(policy="gone"), 1.0)
    assert "policy 'gone': not installed" in out.error and out.plan.actions == ()


def test_the_builtin_policies_run_through_the_runner() -> None:
    r = PolicyRunner()
    for name in ("costmodel", "spread"):
        out = r.run(SNAP, RebalancerConfig(policy=name), 1.0)
        assert out.error == "" and out.policy == name and out.plan.state is not None


def test_a_policy_resumes_in_its_own_state_type_with_the_carried_dwell_and_cooldowns(behaviour: Behaviour) -> None:
    r = runner(behaviour)
    r.resume("probe", PolicyState(moved_at={"c": 5.0}, cooldown_until={"c": 9.0}))
    assert r.state("probe") == Count(moved_at={"c": 5.0}, cooldown_until={"c": 9.0})
    with pytest.raises(PolicyError, match="not installed"):
        r.resume("gone", PolicyState())
