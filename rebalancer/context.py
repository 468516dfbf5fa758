"""Everything one planning call derives from its inputs, computed once and shared read-only."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from perfbalance import mcpu
from perfbalance.model import Snapshot
from rebalancer.affinity import pairs
from rebalancer.config import RebalancerConfig
from rebalancer.constraints import shareable
from rebalancer.costmodel import CostModel, Evaluation, Layout, loaded_latency_factor
from rebalancer.demand import offered
from rebalancer.health import Health, measure, target_of
from rebalancer.inputs import View, view
from rebalancer.latency import Victim, co_load, is_victim, loss, measured_loss, victim_loss
from rebalancer.state import PlannerState
from rebalancer.topoindex import TopoIndex, index_of
from rebalancer.vm import Sandbox, sandboxes


@dataclass(frozen=True, kw_only=True)
class Context:
    snapshot: Snapshot
    config: RebalancerConfig
    now: float
    idx: TopoIndex
    views: Mapping[str, View]
    free: frozenset[int]  # CPUs that may be handed out (see constraints.shareable)
    requests: Mapping[str, int]
    model: CostModel
    base: Layout  # the measured placement
    base_eval: Evaluation
    state: PlannerState
    rdt_class: str  # the aggressor class, "" when RDT actions are off
    unmovable: Mapping[str, str]  # container -> why it may not move now
    sandboxes: tuple[Sandbox, ...] = ()  # VM-sandboxed pods (Kata, KubeVirt)
    sandbox_of: Mapping[str, Sandbox] = field(default_factory=dict)  # container -> its sandbox
    heavy: tuple[str, ...] = ()  # AVX-512-heavy containers, sorted
    health: Mapping[str, Health] = field(default_factory=dict)  # measured (smoothed inputs)
    victims: Mapping[str, Victim] = field(default_factory=dict)  # rebalancer/latency.py
    problems: tuple[str, ...] = ()  # bad latency annotations, one line each
    targets: Mapping[str, float] = field(default_factory=dict)  # container -> run-queue p99 target, s
    base_load: float = 0.05  # b of the run-queue wait model (see unseen_load)
    # values derived from this context alone, remembered for the call (e.g. need_cpus per ids)
    memo: dict[object, object] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, snapshot: Snapshot, config: RebalancerConfig, state: PlannerState,
              smoothed: Mapping[str, Mapping[str, float]], now: float) -> Context:
        idx = index_of(snapshot.topology)
        vms = sandboxes((s.container for s in snapshot.containers), overhead_mcpu=config.vm_overhead_mcpu,
                        vmms=snapshot.vmms)
        sandbox_of = {m: sb for sb in vms for m in sb.members}
        views = {s.id: view(s, smoothed.get(s.id, {}), config,
                            sandbox_of[s.id].pod if s.id in sandbox_of else "")
                 for s in snapshot.containers}
        placement = _placement(views, idx)
        views = offered(views, placement, idx, config, lambda u: loaded_latency_factor(
            u, config.bandwidth_knee_low, config.bandwidth_knee_high))
        resctrl = snapshot.collectors.get("resctrl")
        rdt = config.rdt_aggressor_class if resctrl is not None and resctrl.up else ""
        free = shareable(snapshot)
        model = CostModel(idx=idx, views=views, config=config, aggressor_class=rdt,
                          pairs=pairs((s.container for s in snapshot.containers), config.hint_keys()),
                          shareable=free)
        base = model.layout(placement, {cid: v.rdt_class for cid, v in views.items()})
        model.set_baseline(base)
        unmovable = _unmovable(views, state, config, now)
        health, victims, problems, targets = _victims(snapshot, config, smoothed, base, views)
        return cls(heavy=tuple(sorted(cid for cid, v in views.items() if v.heavy)), unmovable=unmovable,
                   sandboxes=vms, sandbox_of=sandbox_of, snapshot=snapshot,
                   health=health, victims=victims, problems=problems, targets=targets,
                   config=config, now=now, idx=idx, views=views,
                   free=free, requests={cid: v.request_mcpu for cid, v in views.items()},
                   model=model, base=base, base_eval=model.evaluate(base), state=state, rdt_class=rdt,
                   base_load=config.latency_base_load + unseen_load(snapshot, views, len(idx.online)))

    @property
    def usage(self) -> Mapping[str, float]:
        return {cid: v.usage for cid, v in self.views.items()}

    def latency_loss(self, layout: Layout) -> float:
        """L_lat of `layout` (rebalancer/latency.py); 0 without victims."""
        if not self.victims:
            return 0.0
        c = self.config
        return loss(self.victims, layout, self.usage, base=self.base_load,
                    cost=c.latency_breach_cost, cap=c.latency_breach_cap)

    def measured_loss(self, cid: str, h: Health | None = None) -> float | None:
        """Measured health loss of a container: its run-queue wait plus its breached target
        (the term it has in L_lat as a victim); None without a measurement. `h`: raw health
        instead of the smoothed one."""
        h = h if h is not None else self.health.get(cid)
        if h is None:
            return None
        c = self.config
        return measured_loss(h, self.targets.get(cid), cost=c.latency_breach_cost, cap=c.latency_breach_cap)

    def predicted_loss(self, v: Victim, layout: Layout) -> float:
        c = self.config
        return victim_loss(v, layout, self.usage, base=self.base_load,
                           cost=c.latency_breach_cost, cap=c.latency_breach_cap)

    def need_cpus(self, ids: list[str]) -> int:
        """Whole CPUs for containers: their requests, or their usage plus headroom if larger.

        Milli-CPU amounts are summed and rounded up once; usage within `size_tolerance_cores`
        above a whole CPU does not round up (measurement jitter of a busy loop). A VM sandbox
        counts with all its movable containers and its vCPUs instead of their requests; one
        sandbox moved alone keeps the size of its floating vCPUs' mask (its guest was built for
        that many CPUs; Kata's pod sandbox container holding the VMM does not widen it).
        """
        key = ("need", *ids)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = self._need_cpus(ids)
        return hit  # type: ignore[return-value]

    def _need_cpus(self, ids: list[str]) -> int:
        cfg = self.config
        vms = {self.sandbox_of[c].pod: self.sandbox_of[c] for c in ids if c in self.sandbox_of}
        plain = [c for c in ids if c not in self.sandbox_of]
        if len(vms) == 1 and not plain:
            (sb,) = vms.values()
            return max(1, max((len(self.base.placement[m]) for m in sb.movable_workloads), default=1))
        users = plain + [m for sb in vms.values() for m in sb.movable]
        requests = mcpu.total(self.views[c].request_mcpu for c in plain)
        requests += mcpu.total(sb.mcpu for sb in vms.values())
        used = mcpu.total(mcpu.from_cores(self.views[c].usage * (1.0 + cfg.island_headroom)) for c in users)
        used = max(0, used - mcpu.from_cores(cfg.size_tolerance_cores))
        return max(1, mcpu.to_cpus(requests), mcpu.to_cpus(used))

def _placement(views: Mapping[str, View], idx: TopoIndex) -> dict[str, frozenset[int]]:
    """Each container's online CPUs, one frozenset object per distinct cpuset: the cost model
    keys groups and memos by cpuset, and equal-but-distinct 256-CPU sets compare element by
    element on every lookup while identical ones compare by identity."""
    canon: dict[frozenset[int], frozenset[int]] = {}
    out = {}
    for cid, v in views.items():
        cpus = canon.get(v.cpuset)
        if cpus is None:
            cpus = canon[v.cpuset] = idx.intern((v.cpuset & idx.online) or idx.online)
        out[cid] = cpus
    return out


def _victims(snapshot: Snapshot, config: RebalancerConfig, smoothed: Mapping[str, Mapping[str, float]],
             base: Layout, views: Mapping[str, View],
             ) -> tuple[dict[str, Health], dict[str, Victim], tuple[str, ...], dict[str, float]]:
    """Measured health of every container, the victims among them, bad annotations, targets."""
    health: dict[str, Health] = {}
    victims: dict[str, Victim] = {}
    problems: list[str] = []
    targets: dict[str, float] = {}
    usage = {cid: v.usage for cid, v in views.items()}
    selectors = config.latency_targets
    for s in snapshot.containers:
        # a target comes from an annotation or a selector: without either there is none
        target, problem = (target_of(s.container, selectors, default=config.latency_sensitive_target)
                           if selectors or s.container.annotations else (None, ""))
        if problem:
            problems.append(problem)
        if target is not None:
            targets[s.id] = target
        h = measure(smoothed.get(s.id, {}), min_waits=config.health_min_waits)
        if h is None:
            continue
        health[s.id] = h
        load0 = co_load(base, usage, s.id)
        if is_victim(h, target, config.victim_health_threshold, load0=load0, cpus=len(base.placement[s.id])):
            victims[s.id] = Victim(id=s.id, health=h, target=target, load0=load0)
    return health, victims, tuple(problems), targets


def _unmovable(views: Mapping[str, View], state: PlannerState, config: RebalancerConfig,
               now: float) -> dict[str, str]:
    """Container -> why it may not move now, in id order; without dwell times or cooldowns in
    the state (a first plan, a quiet node) only the exclusive containers are looked at."""
    if state.cooldown_until or state.moved_at:
        ids: list[str] = sorted(views)
    else:
        ids = sorted(cid for cid, v in views.items() if v.exclusive)
    return {cid: why for cid in ids if (why := _blocked(views[cid], state, config, now))}


def _blocked(v: View, state: PlannerState, config: RebalancerConfig, now: float) -> str:
    """Why a container may not move now ("" when it may)."""
    if v.exclusive:
        return "exclusive (kubelet-dedicated CPUs)"
    until = state.cooldown_until.get(v.id)
    if until is not None and now < until:
        return f"cooldown for {math.ceil(until - now)} s after a rollback"
    moved = state.moved_at.get(v.id)
    if moved is not None and now - moved < config.dwell_seconds:
        return f"dwell: moved {now - moved:.0f} s ago (< {config.dwell_seconds:.0f} s)"
    return ""


def unseen_load(snapshot: Snapshot, views: Mapping[str, View], cpus: int) -> float:
    """CPUs of demand per CPU that no container of the snapshot accounts for: the node's busy
    cores (`node_metrics["cpu_busy_cores"]`, agent/snapshot/nodecpu.py) less the containers'
    usage, spread over the online CPUs; 0 when the node's figure is missing."""
    busy = snapshot.node_metrics.get("cpu_busy_cores")
    if busy is None or cpus <= 0:
        return 0.0
    return max(0.0, busy - sum(v.usage for v in views.values())) / cpus
