"""Which policies are installed: the Python entry-point group `perfbalance.policies`.

A package ships a policy by declaring, in its pyproject.toml,

    [project.entry-points."perfbalance.policies"]
    mypolicy = "mypackage.module:POLICY"

where POLICY is a `rebalancer.policy.Policy`. The two built-in policies are registered the same
way by perfbalance itself, and are also known without package metadata (a source checkout run
with PYTHONPATH), so `costmodel` is always there. Loading checks the contract
(`check_policy`); a broken third-party package is one clear error naming it, and only when that
policy is selected or asked for.

This module reads package metadata (importlib.metadata), so it is not part of the pure planner:
the import-linter contract "in-tree policies are pure" lists the policy modules, not this one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from perfbalance.errors import ConfigError
from rebalancer.config import RebalancerConfig
from rebalancer.policy import Policy, PolicyError, check_policy, section

GROUP = "perfbalance.policies"
BUILTIN: Mapping[str, str] = {"costmodel": "rebalancer.planner:POLICY", "spread": "rebalancer.spread:POLICY"}
DEFAULT = "costmodel"


def available() -> dict[str, str]:
    """Policy name -> "module:attribute", built-ins first, then installed entry points."""
    out = dict(BUILTIN)
    for ep in entry_points(group=GROUP):
        out.setdefault(ep.name, ep.value)
    return dict(sorted(out.items()))


def load(name: str, *, importer: Callable[[str], Any] = import_module) -> Policy:
    """The policy registered as `name`, checked against the contract; PolicyError otherwise."""
    names = available()
    target = names.get(name)
    if target is None:
        raise PolicyError(name, f"not installed (entry-point group {GROUP}; installed: {', '.join(names)})")
    module, _, attr = target.partition(":")
    try:
        obj: Any = importer(module)
        for part in filter(None, attr.split(".")):
            obj = getattr(obj, part)
    except Exception as e:  # a third-party module may raise anything while importing
        raise PolicyError(name, f"cannot load {target} ({type(e).__name__}: {e})") from None
    return check_policy(obj, name=name)


def check_config(rebalancer: RebalancerConfig, *, source: str) -> None:
    """ConfigError unless `rebalancer.policy` names a loadable policy and every section under
    `rebalancer.policies` belongs to an installed policy and validates against its settings."""
    try:
        load(rebalancer.policy)
    except PolicyError as e:
        raise ConfigError(source, "rebalancer.policy", rebalancer.policy, e.reason) from None
    for name in sorted(rebalancer.policies):
        try:
            policy = load(name)
        except PolicyError as e:
            raise ConfigError(source, f"rebalancer.policies.{name}", dict(rebalancer.policies[name]), e.reason) from None
        if policy.config_type is RebalancerConfig:
            raise ConfigError(source, f"rebalancer.policies.{name}", dict(rebalancer.policies[name]),
                              f"{name} reads the rebalancer section itself; set its keys there")
        section(policy, rebalancer, source=source)
