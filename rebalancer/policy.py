"""The policy contract: what a planner must look like for the agent to run it.

A policy is a pure function `plan(snapshot, config, state, now) -> Plan` plus two types: the
frozen dataclass of its settings (declared with `perfbalance.settings.setting`, so the agent
can validate `rebalancer.policies.<name>` and render its reference) and the type of the state it
returns in `Plan.state` and gets back on the next call: a dataclass extending
`perfbalance.model.PolicyState`, whose named fields (dwell times, cooldowns) the agent reads and
checkpoints, and every field defaulted so that the agent can resume it after a restart.
`check_policy()` enforces this when a policy is loaded, before it ever sees a snapshot: a policy
that does not fit is refused with one line saying what is wrong, never discovered half-way
through a cycle.

Pure data and inspection only; finding installed policies is `rebalancer.registry`, running one
with a time budget is the agent's job.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from perfbalance.errors import ConfigError, PerfbalanceError
from perfbalance.model import Plan, PolicyState, Snapshot
from perfbalance.settings import build, reference, to_dict
from rebalancer.config import RebalancerConfig

PLAN_PARAMETERS = ("snapshot", "config", "state", "now")


class PolicyError(PerfbalanceError):
    """A policy that breaks the contract (at load) or fails at run time (raised, too slow,
    returned the wrong thing)."""

    def __init__(self, policy: str, reason: str) -> None:
        self.policy, self.reason = policy, reason
        super().__init__(f"policy {policy!r}: {reason}")


@dataclass(frozen=True, kw_only=True)
class Policy:
    """A planner the agent can select with `rebalancer.policy: <name>`.

    `plan(snapshot, config, state, now)`: `config` is an instance of `config_type`, `state` is
    None on the first call and afterwards the `Plan.state` the previous call returned, which
    must be an instance of `state_type`. `config_type` is RebalancerConfig for a policy that
    reads the whole `rebalancer:` section (the cost model); any other policy gets its own section
    `rebalancer.policies.<name>`.
    """

    name: str
    plan: Callable[[Snapshot, Any, Any, float], Plan]
    config_type: type
    state_type: type[PolicyState]
    summary: str = ""


def check_policy(obj: Any, *, name: str) -> Policy:
    """`obj` as a Policy, or PolicyError naming the first broken rule of the contract."""
    if not isinstance(obj, Policy):
        raise PolicyError(name, f"entry point gives a {type(obj).__name__}, not a rebalancer.policy.Policy")
    if obj.name != name:
        raise PolicyError(name, f"registered as {name!r} but calls itself {obj.name!r}")
    problem = _signature_problem(obj.plan) or _config_problem(obj.config_type) or _state_problem(obj.state_type)
    if problem:
        raise PolicyError(name, problem)
    return obj


def section(policy: Policy, rebalancer: RebalancerConfig, *, source: str = "config") -> Any:
    """The settings `policy` is called with: the `rebalancer:` section itself for the cost model,
    else `rebalancer.policies.<name>` built into `policy.config_type` (ConfigError names the key)."""
    if policy.config_type is RebalancerConfig:
        return rebalancer
    return build(policy.config_type, rebalancer.policies.get(policy.name, {}), source=source,
                 path=f"rebalancer.policies.{policy.name}")


def _signature_problem(fn: Any) -> str:
    if not callable(fn):
        return "plan is not callable"
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return "plan has no inspectable signature"
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(positional) < 4 or len(required) > 4 or any(p not in positional[:4] for p in required):
        names = ", ".join(p.name for p in params)
        return f"plan({names}) must take exactly ({', '.join(PLAN_PARAMETERS)}) positionally"
    return ""


def _config_problem(tp: Any) -> str:
    if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
        return f"config_type {tp!r} is not a dataclass"
    if not tp.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        return f"config_type {tp.__name__} must be a frozen dataclass"
    for f in dataclasses.fields(tp):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            return f"config_type {tp.__name__}.{f.name} has no default (an empty section must be valid)"
        if not f.metadata.get("doc"):
            return f"config_type {tp.__name__}.{f.name} is not documented (declare it with setting(default, doc))"
    try:
        typing.get_type_hints(tp)
        reference(tp)
        build(tp, to_dict(tp()), source="defaults", path="")  # every default within its bounds
    except (ConfigError, NameError, TypeError, ValueError) as e:
        return f"config_type {tp.__name__}: defaults do not validate ({e})"
    return ""


def _state_problem(tp: Any) -> str:
    if not isinstance(tp, type):
        return f"state_type {tp!r} is not a type"
    if not (issubclass(tp, PolicyState) and dataclasses.is_dataclass(tp)):
        return f"state_type {tp.__name__} must be a dataclass extending perfbalance.model.PolicyState"
    try:
        tp(moved_at={}, cooldown_until={})  # what the agent builds after a restart
    except TypeError as e:
        return f"state_type {tp.__name__} cannot be built from dwell times and cooldowns alone ({e})"
    return ""


def check_plan(policy: Policy, plan: Any) -> Plan:
    """A policy's answer as a Plan, or PolicyError (wrong type, wrong state type)."""
    if not isinstance(plan, Plan):
        raise PolicyError(policy.name, f"plan() returned a {type(plan).__name__}, not a Plan")
    if plan.state is not None and not isinstance(plan.state, policy.state_type):
        raise PolicyError(policy.name, f"plan() returned a state of type {type(plan.state).__name__},"
                                       f" not {policy.state_type.__name__}")
    return plan


def sections_of(policies: Mapping[str, Policy]) -> dict[str, type]:
    """Policy name -> its settings type (for `perfbalance config --reference`)."""
    return {n: p.config_type for n, p in sorted(policies.items()) if p.config_type is not RebalancerConfig}
