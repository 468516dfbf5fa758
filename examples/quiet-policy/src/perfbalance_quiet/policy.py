"""The "quiet" policy: gather idle containers onto a few housekeeping CPUs.

An example of a policy shipped outside perfbalance. Containers using less CPU than
`idle_below_cores` for `idle_cycles` consecutive plans are moved onto `housekeeping_cpus`, so
the busy ones have the rest of the machine to themselves. It shows each part of the contract:
a frozen settings dataclass declared with `setting()`, a typed state (extending PolicyState, so the
agent can read and restore its dwell times and cooldowns) passed back every call, and
a pure `plan()` that reads only its arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from perfbalance.cpuset import CpuSet
from perfbalance.errors import ParseError
from perfbalance.model import Action, Plan, PolicyState, Snapshot
from perfbalance.settings import setting
from rebalancer.policy import Policy


def _cpulist(value: str) -> str | None:
    try:
        CpuSet.parse(value)
    except ParseError as e:
        return f"not a CPU list ({e.reason})"
    return None if value.strip() else "must name at least one CPU"


@dataclass(frozen=True, kw_only=True)
class QuietConfig:
    housekeeping_cpus: str = setting("0", "CPUs that idle containers are gathered on.", check=_cpulist)
    idle_below_cores: float = setting(0.05, "A container using less CPU than this is idle.", min=0.0)
    idle_cycles: int = setting(3, "Consecutive idle plans before a container is moved.", min=1)


@dataclass(frozen=True, kw_only=True)
class QuietState(PolicyState):  # dwell times and cooldowns (unused here) come with PolicyState
    idle_for: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


def plan(snapshot: Snapshot, config: QuietConfig, state: QuietState | None, now: float) -> Plan:
    state = state or QuietState()
    target = CpuSet.parse(config.housekeeping_cpus) & snapshot.topology.online
    idle_for: dict[str, int] = {}
    actions = []
    for s in sorted(snapshot.containers, key=lambda s: s.id):
        c = s.container
        if c.exclusive or s.metrics.get("cpu_usage_cores", 0.0) >= config.idle_below_cores:
            continue
        idle_for[c.id] = state.idle_for.get(c.id, 0) + 1
        if idle_for[c.id] >= config.idle_cycles and target and c.cpuset != target:
            actions.append(Action(kind="cpuset", container=c.id, frm=str(c.cpuset), to=str(target),
                                  reason=f"quiet: idle for {idle_for[c.id]} plans"))
    return Plan(time=now, actions=tuple(actions), state=QuietState(idle_for=MappingProxyType(idle_for)))


POLICY = Policy(name="quiet", plan=plan, config_type=QuietConfig, state_type=QuietState,
                summary="gather idle containers onto housekeeping CPUs")
