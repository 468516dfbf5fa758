"""The "spread" policy: keep CPU load even across NUMA nodes and L3 domains, with no cost model.

Where the cost model asks "which neighbours cost whom how much, and does a move pay?", spread
asks only "is one part of the machine busier than another?". Load is measured CPU use
(`cpu_usage_cores`) per CPU of a domain's shareable CPUs; a container confined to one domain
counts fully there, one that spans several counts in each in proportion to the CPUs it covers
(the scheduler already balances it, so it is never moved). When the busiest and the idlest
domain differ by more than `tolerance_cores` (measured on the smaller domain), the confined
container whose move best evens the two goes to the idlest domain's shareable CPUs, its memory
nodes with it. NUMA nodes are balanced first; L3 domains only within one node, so this policy
never trades a NUMA hop for cache balance.

It is deliberately simple: a second, genuinely different planner that shows what the policy
contract (rebalancer.policy) asks of one. Pure: no I/O, no clock; same input, same plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfbalance.cpuset import CpuSet
from perfbalance.model import Action, Plan, PolicyState, Snapshot
from perfbalance.settings import setting
from rebalancer.constraints import shareable
from rebalancer.policy import Policy
from rebalancer.state import frozen_map
from rebalancer.topoindex import TopoIndex

MAX_CONSIDERED = 64


@dataclass(frozen=True, kw_only=True)
class SpreadConfig:
    tolerance_cores: float = setting(0.5, "Move only when the busiest and the idlest domain differ by more than this much CPU use, in cores, scaled to the smaller domain.", min=0.0)
    min_usage_cores: float = setting(0.05, "Containers using less CPU than this are never moved (moving them evens nothing).", min=0.0)
    dwell_seconds: float = setting(60.0, "A container moved by spread stays put at least this long.", min=0.0)
    max_moves_per_cycle: int = setting(1, "Cap on moves per cycle.", min=0)


@dataclass(frozen=True, kw_only=True)
class SpreadState(PolicyState):
    """When each container was last moved (`moved_at`, for dwell); spread sets no cooldowns."""


@dataclass(frozen=True, kw_only=True)
class _Domain:
    key: str  # "node 0", "L3 3"
    span: frozenset[int]  # all CPUs of the domain (a container within them is confined to it)
    cpus: frozenset[int]  # its shareable CPUs (capacity and move target)
    load: float  # cores

    @property
    def per_cpu(self) -> float:
        return self.load / len(self.cpus)


def plan(snapshot: Snapshot, config: SpreadConfig, state: SpreadState | None, now: float) -> Plan:
    """Moves that even out CPU load between NUMA nodes, then between L3 domains of a node."""
    state = state or SpreadState()
    idx = TopoIndex.build(snapshot.topology)
    free = shareable(snapshot)
    usage = {s.id: max(0.0, s.metrics.get("cpu_usage_cores", 0.0)) for s in snapshot.containers}
    placement = {s.id: (frozenset(s.container.cpuset.ids) & idx.online) or idx.online
                 for s in snapshot.containers}
    movable, considered = _movable(snapshot, config, state, usage, now)
    actions: list[Action] = []
    for _ in range(config.max_moves_per_cycle):
        move = _next_move(idx, free, usage, placement, movable, config, considered)
        if move is None:
            break
        actions.append(move)
        placement[move.container] = frozenset(CpuSet.parse(move.to).ids)
        movable.discard(move.container)
    present = set(usage)
    moved_at = {c: t for c, t in state.moved_at.items() if c in present and now - t < config.dwell_seconds}
    moved_at.update({a.container: now for a in actions})
    return Plan(time=now, actions=tuple(actions), considered=tuple(considered[:MAX_CONSIDERED]),
                state=SpreadState(moved_at=frozen_map(moved_at)))


def _movable(snapshot: Snapshot, config: SpreadConfig, state: SpreadState, usage: Mapping[str, float],
             now: float) -> tuple[set[str], list[dict[str, Any]]]:
    out: set[str] = set()
    considered: list[dict[str, Any]] = []
    for s in sorted(snapshot.containers, key=lambda s: s.id):
        c = s.container
        why = ("exclusive (kubelet-dedicated CPUs)" if c.exclusive else
               f"VM-sandboxed ({c.sandbox}): spread moves plain containers only" if c.sandbox else
               f"dwell: moved {now - state.moved_at[c.id]:.0f} s ago" if now - state.moved_at.get(c.id, -1e18) < config.dwell_seconds else
               "")
        if why and usage[c.id] >= config.min_usage_cores:
            considered.append({"kind": "cpuset", "container": c.id, "reason": "spread", "rejected": why})
        elif usage[c.id] >= config.min_usage_cores:
            out.add(c.id)
    return out, considered


def _next_move(idx: TopoIndex, free: frozenset[int], usage: Mapping[str, float],
               placement: Mapping[str, frozenset[int]], movable: set[str], config: SpreadConfig,
               considered: list[dict[str, Any]]) -> Action | None:
    nodes = {f"node {n}": cpus for n, cpus in idx.nodes.items()}
    levels = [nodes] + [{f"L3 {l3}": cpus for l3, cpus in idx.l3s.items() if cpus <= node_cpus}
                        for node_cpus in idx.nodes.values()]
    for groups in levels:
        domains = _domains(groups, free, usage, placement)
        if len(domains) < 2:
            continue
        hi, lo = max(domains, key=lambda d: (d.per_cpu, d.key)), min(domains, key=lambda d: (d.per_cpu, d.key))
        imbalance = (hi.per_cpu - lo.per_cpu) * min(len(hi.cpus), len(lo.cpus))
        if imbalance <= config.tolerance_cores:
            continue
        target = _target(idx, free, lo, usage, placement)
        action = _best(hi, lo, target, usage, placement, movable, imbalance, idx)
        if action is not None:
            return action
        considered.append({"kind": "cpuset", "container": "", "reason": f"spread: {hi.key} -> {lo.key}",
                           "rejected": f"imbalance {imbalance:.2f} cores but no confined container evens it"})
    return None


def _domains(groups: Mapping[str, frozenset[int]], free: frozenset[int], usage: Mapping[str, float],
             placement: Mapping[str, frozenset[int]]) -> list[_Domain]:
    """Domains with shareable CPUs and their load: each container's use shared out over the
    domains in proportion to the CPUs of its cpuset in each."""
    span = frozenset().union(*groups.values()) if groups else frozenset()
    out = []
    for key, cpus in sorted(groups.items()):
        if not cpus & free:
            continue
        load = 0.0
        for cid, where in placement.items():
            inside = where & span
            if inside:
                load += usage[cid] * len(where & cpus) / len(inside)
        out.append(_Domain(key=key, span=cpus, cpus=cpus & free, load=load))
    return out


def _target(idx: TopoIndex, free: frozenset[int], lo: _Domain, usage: Mapping[str, float],
            placement: Mapping[str, frozenset[int]]) -> frozenset[int]:
    """The idlest L3 domain inside `lo` (a node's target is one of its L3 domains)."""
    l3s = {f"L3 {k}": cpus for k, cpus in idx.l3s.items() if cpus <= lo.span}
    inner = _domains(l3s, free, usage, placement)
    if len(inner) <= 1:
        return lo.cpus
    return min(inner, key=lambda d: (d.per_cpu, d.key)).cpus


def _best(hi: _Domain, lo: _Domain, target: frozenset[int], usage: Mapping[str, float],
          placement: Mapping[str, frozenset[int]], movable: set[str], imbalance: float,
          idx: TopoIndex) -> Action | None:
    best: tuple[float, str] | None = None
    for cid in sorted(movable):
        if not placement[cid] <= hi.span or usage[cid] > len(target):
            continue
        after = abs((hi.load - usage[cid]) / len(hi.cpus) - (lo.load + usage[cid]) / len(lo.cpus))
        after *= min(len(hi.cpus), len(lo.cpus))
        if after < imbalance and (best is None or (after, cid) < best):
            best = (after, cid)
    if best is None:
        return None
    after, cid = best
    return Action(kind="cpuset", container=cid, frm=idx.fmt(placement[cid]), to=idx.fmt(target),
                  mems=idx.fmt(idx.nodes_of(target)),
                  reason=f"spread: {hi.key} at {hi.per_cpu:.2f} cores/CPU, {lo.key} at {lo.per_cpu:.2f}",
                  detail={"imbalance_cores": imbalance, "imbalance_after_cores": after,
                          "usage_cores": usage[cid]})


POLICY = Policy(name="spread", plan=plan, config_type=SpreadConfig, state_type=SpreadState,
                summary="even CPU load across NUMA nodes, then L3 domains; no cost model")
