"""Running the selected policy: its own state, a time budget, and isolation from its failures.

The planner is a plug-in (`rebalancer.policy: <name>`, rebalancer.registry), so the agent cannot
trust it the way it trusts its own code: a policy may raise, return something that is not a
Plan, or loop. Each call runs in a worker thread that the cycle waits on for at most
`rebalancer.policy_budget_seconds`. On any failure the cycle reports it (`PlanOutcome.error`),
plans no moves, and the policy's state stays what its last good call returned. Python cannot
stop a thread, so a call that overran keeps running in the background; no new call is started
until it has returned (each cycle says so), so a runaway policy costs at most one thread.

Every policy keeps its own typed state; switching policy on a config reload starts the new one
from None and forgets nothing of the old one's state until the switch back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from perfbalance.errors import ConfigError
from perfbalance.model import Plan, PolicyState, Snapshot
from rebalancer import registry
from rebalancer.config import RebalancerConfig
from rebalancer.policy import Policy, PolicyError, check_plan, section

log = logging.getLogger("perfbalance.planning")


@dataclass(frozen=True, kw_only=True)
class PlanOutcome:
    """One planning call: the plan to act on and, when the policy failed, why (then the plan
    has no actions and carries the last good state)."""

    policy: str
    plan: Plan
    error: str = ""


class _Call:
    """One policy call in a daemon thread; `result` or `error` once it has returned."""

    def __init__(self, fn: Callable[[], Plan], name: str) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), name=f"policy-{name}", daemon=True)

    def _run(self, fn: Callable[[], Plan]) -> None:
        try:
            self.result = fn()
        except BaseException as e:  # noqa: BLE001 - whatever a plug-in raises is reported, not re-raised
            self.error = e


class PolicyRunner:
    """The agent's handle on the selected policy (one per agent; called from the cycle thread)."""

    def __init__(self, *, loader: Callable[[str], Policy] = registry.load) -> None:
        self._loader = loader
        self._policies: dict[str, Policy] = {}
        self._states: dict[str, PolicyState | None] = {}
        self._running: _Call | None = None
        self.last_good: dict[str, Plan] = {}

    def state(self, name: str) -> PolicyState | None:
        return self._states.get(name)

    def seed(self, name: str, state: PolicyState | None) -> None:
        """Start `name` from `state` (e.g. recovered from a checkpoint)."""
        self._states[name] = state

    def resume(self, name: str, carried: PolicyState) -> None:
        """Start `name` from what a previous run left (dwell times, cooldowns), in the policy's
        own state type; PolicyError when the policy cannot be loaded."""
        state_type = self.policy(name).state_type
        self.seed(name, state_type(moved_at=carried.moved_at, cooldown_until=carried.cooldown_until))

    def policy(self, name: str) -> Policy:
        if name not in self._policies:
            self._policies[name] = self._loader(name)
        return self._policies[name]

    def run(self, snapshot: Snapshot, config: RebalancerConfig, now: float) -> PlanOutcome:
        name = config.policy
        try:
            policy = self.policy(name)
            cfg = section(policy, config)
        except (PolicyError, ConfigError) as e:
            return self._failed(name, now, str(e))
        if self._running is not None and self._running.thread.is_alive():
            return self._failed(name, now, f"policy {name!r}: an earlier call is still running past its budget")
        state = self._states.get(name)
        call = self._running = _Call(lambda: policy.plan(snapshot, cfg, state, now), name)
        call.thread.start()
        call.thread.join(config.policy_budget_seconds)
        if call.thread.is_alive():
            return self._failed(name, now, f"policy {name!r}: no plan within its budget of "
                                           f"{config.policy_budget_seconds:g} s (rebalancer.policy_budget_seconds)")
        self._running = None
        if call.error is not None:
            e = call.error
            return self._failed(name, now, f"policy {name!r} raised {type(e).__name__}: {str(e)[:300]}")
        try:
            plan = check_plan(policy, call.result)
        except PolicyError as e:
            return self._failed(name, now, str(e))
        self._states[name] = plan.state
        self.last_good[name] = plan
        return PlanOutcome(policy=name, plan=plan)

    def _failed(self, name: str, now: float, error: str) -> PlanOutcome:
        log.error("%s; no moves this cycle, the policy's last good state is kept", error)
        return PlanOutcome(policy=name, plan=Plan(time=now, state=self._states.get(name)), error=error)


def planner(name: str, *, loader: Callable[[str], Policy] = registry.load) -> Callable[..., Plan]:
    """The policy registered as `name`, called like the cost model's `plan(snapshot, rebalancer,
    state, now)`: its settings picked from the `rebalancer:` section and its answer checked. For
    the tools that plan outside the agent (`perfbalance plan --policy`, `bench plan --policy`),
    which want the policy's own errors, not the agent's isolation. PolicyError when it cannot be
    loaded, ConfigError when its section is invalid."""
    policy = loader(name)

    def run(snapshot: Snapshot, rebalancer: RebalancerConfig, state: Any, now: float) -> Plan:
        return check_plan(policy, policy.plan(snapshot, section(policy, rebalancer), state, now))

    return run
