"""The planner: a pure function from a Snapshot (plus config, its own state and `now`) to a Plan.

One call:
1. smooths the inputs (EWMA kept in the state);
2. judges earlier moves whose settle time has passed and rolls back those that did not help;
3. greedily picks, up to `max_moves_per_cycle` times, the candidate decision with the largest
   net benefit (benefit - amortized move cost, core-seconds per second) above `margin`, skipping
   containers in dwell or cooldown and any decision that would break a constraint;
4. returns the actions, the rejected candidates with the reason, and the next state.

Same input, same plan: every iteration is in sorted order and nothing reads a clock or a file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from perfbalance import mcpu
from perfbalance.cpuset import CpuSet
from perfbalance.model import Action, Plan, Snapshot
from rebalancer.config import RebalancerConfig
from rebalancer.constraints import holder_move_problem, numa_move_problem, sandbox_mask, spans_needlessly
from rebalancer.affinity import hard_worsened
from rebalancer.context import Context
from rebalancer.costmodel import Evaluation, Layout, move_cost_total, move_costs
from rebalancer.decisions import Decision, candidates
from rebalancer.evaluate import judge_pending
from rebalancer.health import measure, noise, push
from rebalancer.hintnotes import hint_notes
from rebalancer.inputs import smooth
from rebalancer.policy import Policy
from rebalancer.state import Moved, Pending, PlannerState, built, frozen_map
from rebalancer.vm import layout_move_problem

MAX_CONSIDERED = 64


@dataclass(frozen=True, kw_only=True)
class Scored:
    decision: Decision
    layout: Layout
    evaluation: Evaluation
    benefit: float
    # container -> (refill, migration, disruption); only once picked (_greedy), `cost` always
    costs: Mapping[str, tuple[float, float, float]]
    cost: float  # amortized, core-s/s
    latency: float = 0.0  # L_lat of `layout` (rebalancer/latency.py)
    saved_latency: float = 0.0  # the part of `benefit` from L_lat

    @property
    def net(self) -> float:
        return self.benefit - self.cost


def plan(snapshot: Snapshot, config: RebalancerConfig, state: PlannerState | None,
         now: float) -> Plan:
    """Plan moves for `snapshot`. Pure and deterministic; pass `Plan.state` to the next call."""
    state = state or PlannerState()
    smoothed = smooth(snapshot, state.smoothed, config.smoothing_alpha, avx512_key=config.avx512_annotation)
    ctx = Context.build(snapshot, config, state, smoothed, now)
    considered: list[dict[str, Any]] = [{"kind": "input", "rejected": p} for p in ctx.problems]
    considered += hint_notes(ctx, smoothed)
    rollbacks, pending, touched, judgements = judge_pending(ctx)
    considered += [j.to_json() for j in judgements]
    actions: list[Action] = list(rollbacks)
    seq = state.seq
    moved_now = {a.container for a in rollbacks}
    if config.enabled:
        for scored in _greedy(ctx, moved_now, considered):
            seq += 1
            before, after = _victims(ctx, scored)
            actions += _actions(ctx, scored, seq, tuple(sorted(before)))
            pending.append(_pending(ctx, scored, seq, before, after))
            moved_now |= set(scored.decision.cpus) | set(scored.decision.classes)
    return Plan(time=now, actions=tuple(actions), considered=tuple(considered[:MAX_CONSIDERED]),
                judgements=tuple(judgements), state=_next_state(ctx, smoothed, seq, pending, moved_now, touched))


def _greedy(ctx: Context, moved_now: set[str], considered: list[dict[str, Any]]) -> list[Scored]:
    layout = ctx.base
    ev = ctx.base_eval
    lat = ctx.latency_loss(layout)
    chosen: list[Scored] = []
    budget = ctx.config.max_actions_per_cycle - len(moved_now)
    while True:
        best: Scored | None = None
        above: list[Scored] = []
        masks = {sb.pod: sandbox_mask(layout.placement, sb) for sb in ctx.sandboxes}
        for d in candidates(ctx, layout):
            why = _blocked(ctx, d, moved_now, budget)
            after = None if why else layout.moved(ctx.model, d.cpus, d.classes)
            why = why or _constraint(ctx, layout, after, d, masks)  # type: ignore[arg-type]
            if why or after is None:
                _note(considered, d, why)
                continue
            s = _score(ctx, layout, after, ev, lat, d)
            if s.net <= ctx.config.margin:
                _note(considered, d, f"net {s.net:.4f} below margin {ctx.config.margin}", s)
                continue
            above.append(s)
            if best is None or s.net > best.net:
                best = s
        if best is None:
            return chosen
        if len(chosen) >= ctx.config.max_moves_per_cycle:
            for s in above:
                _note(considered, s.decision, f"cap: max_moves_per_cycle={ctx.config.max_moves_per_cycle}", s)
            return chosen
        if not best.costs:
            best = replace(best, costs=_costs(ctx, layout, best.decision))
        chosen.append(best)
        layout, ev, lat = best.layout, best.evaluation, best.latency
        moved_now |= set(best.decision.cpus) | set(best.decision.classes)
        budget -= len(best.decision.cpus) + len(best.decision.classes)


def _blocked(ctx: Context, d: Decision, moved_now: set[str], budget: int) -> str:
    for ids in (d.cpus, d.classes):
        if not moved_now.isdisjoint(ids):
            return f"{min(moved_now.intersection(ids))} already acted on this cycle"
        if not ctx.unmovable.keys().isdisjoint(ids):
            cid = min(ctx.unmovable.keys() & ids.keys())
            return f"{cid}: {ctx.unmovable[cid]}"
    if len(d.cpus) + len(d.classes) > budget:
        return f"cap: needs {len(d.cpus) + len(d.classes)} actions, {budget} left (max_actions_per_cycle)"
    return ""


def _constraint(ctx: Context, layout: Layout, after: Layout, d: Decision,
                masks: Mapping[str, frozenset[int]]) -> str:
    """Targets inside the shareable CPUs, one NUMA node when they fit, VM pods whole and on their
    NUMA nodes, demand fits. `masks`: every VM pod's mask in `layout` (before `d`)."""
    targets = set(d.cpus.values())  # a few distinct targets for hundreds of containers (C-level)
    why = _target_constraint(ctx, d, targets)
    if why:
        return why
    why = _sandbox_constraint(ctx, layout, d)
    if why:
        return why
    hard = hard_worsened(ctx.idx, ctx.model.pairs, layout.placement, after.placement) if ctx.model.pairs else None
    if hard is not None:
        return f"constraint: hard anti-affinity {hard.a} / {hard.b} ({hard.term}) would share more"
    if ctx.sandbox_of:  # VM pods: their masks after the move are targets too
        vms = {ctx.sandbox_of[cid].pod: ctx.sandbox_of[cid] for cid in d.cpus if cid in ctx.sandbox_of}
        masks = {**masks, **{pod: sandbox_mask(after.placement, sb) for pod, sb in vms.items()}}
        targets |= {masks[pod] for pod in vms}
    for cpus in sorted(targets, key=sorted):
        need = mcpu.total(g.req for k, g in after.groups.items() if k <= cpus)
        need += mcpu.total(sb.mcpu for sb in ctx.sandboxes if masks[sb.pod] and masks[sb.pod] <= cpus)
        if mcpu.to_cpus(need) > len(cpus):
            return f"constraint: CPU requests placed within {_fmt(cpus)} need {mcpu.to_cpus(need)} CPUs"
    return ""


def _target_constraint(ctx: Context, d: Decision, targets: set[frozenset[int]]) -> str:
    """The first container (by id) whose target is outside the shareable CPUs, or allocated
    across NUMA nodes needlessly. A decision moves hundreds of containers to a few targets:
    when every target is inside, only the allocated containers need a look."""
    if all(cpus and cpus <= ctx.free for cpus in targets):
        ids = sorted(d.allocated & d.cpus.keys())
    else:
        ids = sorted(d.cpus)
    for cid in ids:
        cpus = d.cpus[cid]
        if not (cpus and cpus <= ctx.free):
            return f"constraint: {cid} target {_fmt(cpus)} outside the shareable CPUs"
        if cid in d.allocated and spans_needlessly(ctx.idx, ctx.free, cpus):
            return f"constraint: {cid} target {_fmt(cpus)} spans NUMA nodes needlessly"
    return ""


def _sandbox_constraint(ctx: Context, layout: Layout, d: Decision) -> str:
    """A VM pod's movable containers move together to one target, each workload keeping its
    number of CPUs on every host NUMA node (the guest NUMA layout the VM booted with; Kata's pod
    sandbox container holding the VMM runs no vCPU and is not held to it)."""
    if not ctx.sandbox_of:  # no VM pod on the node: nothing to hold together
        return ""
    for cid in sorted(d.cpus):
        sb = ctx.sandbox_of.get(cid)
        if sb is None:
            continue
        split = sorted({_fmt(d.cpus[m]) if m in d.cpus else "(stays)" for m in sb.movable})
        if len(split) > 1:
            return (f"constraint: {sb.kind} pod {sb.pod} would be split ({', '.join(split)}); "
                    "a VM pod's containers move together")
        why = (numa_move_problem(ctx.idx, ctx.snapshot, layout.placement[cid], d.cpus[cid])
               if cid in sb.workloads else None)  # the VMM's holder runs no vCPU
        if why:
            return f"constraint: {cid} ({sb.kind} pod {sb.pod}): {why}"
        why = (holder_move_problem(sb, {**layout.placement, **d.cpus})
               if cid == sb.vmm_holder else None)
        if why:
            return f"constraint: {sb.kind} pod {sb.pod}: {why}"
    return _guest_layout_constraint(ctx, layout, d)


def _guest_layout_constraint(ctx: Context, layout: Layout, d: Decision) -> str:
    """A VM pod with pinned vCPUs keeps its guest NUMA layout: each vCPU on its host node, each
    guest node where the pod holds its hugepages (rebalancer.vm.layout_move_problem)."""
    vmms = {v.pod: v for v in ctx.snapshot.vmms}
    pods = sorted({ctx.sandbox_of[cid].pod for cid in d.cpus if cid in ctx.sandbox_of} & vmms.keys())
    if not pods:  # the common case, on every candidate: no VM pod with a found VMM moves
        return ""
    by_id = ctx.snapshot.by_id()
    for pod in pods:
        sb, vmm = next(s for s in ctx.sandboxes if s.pod == pod), vmms[pod]
        before = [replace(by_id[m].container, cpuset=CpuSet(layout.placement[m])) for m in sb.workloads]
        after = [replace(c, cpuset=CpuSet(d.cpus[c.id])) if c.id in d.cpus else c for c in before]
        why = layout_move_problem(topology=ctx.snapshot.topology, vmm=vmm, before=before, after=after)
        if why:
            return f"constraint: {sb.kind} pod {pod}: {why}"
    return ""


def _score(ctx: Context, layout: Layout, after: Layout, ev: Evaluation, lat: float, d: Decision) -> Scored:
    ev2 = ctx.model.evaluate(after, (layout, ev))
    lat2 = ctx.latency_loss(after)
    benefit = ev.total - ev2.total + lat - lat2
    if benefit <= ctx.config.margin:  # costs are >= 0: no need to add them up
        return Scored(decision=d, layout=after, evaluation=ev2, benefit=benefit, costs={}, cost=0.0,
                      latency=lat2, saved_latency=lat - lat2)
    if d.classes:
        costs = _costs(ctx, layout, d)
        one_time = sum(sum(c) for c in costs.values())
    else:  # the parts only if it is picked (_greedy): the same total
        costs = {}
        one_time = move_cost_total(ctx.views, layout.placement, d.cpus, ctx.idx, ctx.config)
    return Scored(decision=d, layout=after, evaluation=ev2, benefit=benefit, costs=costs,
                  cost=one_time / ctx.config.amortize_seconds, latency=lat2, saved_latency=lat - lat2)


def _costs(ctx: Context, layout: Layout, d: Decision) -> dict[str, tuple[float, float, float]]:
    """Each container's one-time (refill, migration, disruption) core-seconds of `d` from `layout`."""
    costs = move_costs(ctx.views, layout.placement, d.cpus, ctx.idx, ctx.config)
    for cid in d.classes:
        occ = ctx.views[cid].occupancy or 0.0
        costs[cid] = (occ / ctx.config.refill_bandwidth, 0.0, ctx.config.disruption_core_seconds)
    return costs


def _victims(ctx: Context, s: Scored) -> tuple[dict[str, float], dict[str, float]]:
    """Containers predicted to gain, with their modelled loss before and after (core-s/s):
    by the cost model, or by the run-queue wait model for measured victims (their measured
    wait is judged after the move, see evaluate.py)."""
    ev0 = ctx.base_eval
    before, after = {}, {}
    ids = sorted(ctx.views)
    losses = zip(ids, ctx.model.container_losses(ev0, ctx.base, ids),
                 ctx.model.container_losses(s.evaluation, s.layout, ids))
    for cid, b, a in losses:
        if b - a > 1e-6:
            before[cid], after[cid] = b, a
    for cid, (b, a) in _health_predictions(ctx, s).items():
        before[cid], after[cid] = before.get(cid, 0.0) + b, after.get(cid, 0.0) + a
    return before, after


def _health_predictions(ctx: Context, s: Scored) -> dict[str, tuple[float, float]]:
    """Victim -> (measured health loss now, predicted after the decision) where it drops:
    run-queue wait plus breached target, s/s (rebalancer/latency.py)."""
    out = {}
    for cid, v in sorted(ctx.victims.items()):
        now = ctx.measured_loss(cid) or 0.0
        after = ctx.predicted_loss(v, s.layout)
        if now - after > 1e-6:
            out[cid] = (now, after)
    return out


def _actions(ctx: Context, s: Scored, seq: int, victims: tuple[str, ...]) -> list[Action]:
    d = s.decision
    parts = ctx.base_eval.parts
    # detail.decision: the decision's number, as the plan JSON has always shown it (Action.decision is the id)
    detail_common = {"decision": float(seq), "decision_benefit": s.benefit,
                     "decision_cost": s.cost, "decision_net": s.net,
                     **{f"saved_{k}": parts[k] - s.evaluation.parts[k] for k in sorted(parts)}}
    if ctx.victims:
        detail_common["saved_latency"] = s.saved_latency
    out: list[Action] = []
    fmt = _Formats(ctx, seq)
    for cid in [d.primary] * (d.primary in d.cpus) + sorted(set(d.cpus) - {d.primary}):
        out.append(_cpuset_action(ctx, s, cid, seq, detail_common, victims, fmt))
    for cid, cls in sorted(d.classes.items()):
        out.append(Action(kind="rdt_class", container=cid, frm=ctx.base.classes[cid], to=cls,
                          decision=decision_id(seq), reason=d.reason, benefit=s.benefit if cid == d.primary else 0.0,
                          cost=sum(s.costs[cid]) / ctx.config.amortize_seconds,
                          victims=victims, detail=detail_common))
    return out


class _Formats:
    """Kernel list forms of one decision's cpusets and their memory nodes, by cpuset object
    (a decision moves hundreds of containers between a few cpusets)."""

    def __init__(self, ctx: Context, seq: int) -> None:
        self.idx = ctx.idx
        self.decision = decision_id(seq)
        self.cpus: dict[frozenset[int], str] = {}
        self.mems: dict[frozenset[int], str] = {}

    def of(self, cpus: frozenset[int]) -> str:
        got = self.cpus.get(cpus)
        if got is None:
            got = self.cpus[cpus] = self.idx.fmt(cpus)
        return got

    def mems_of(self, cpus: frozenset[int]) -> str:
        got = self.mems.get(cpus)
        if got is None:
            got = self.mems[cpus] = self.idx.fmt(self.idx.nodes_of(cpus))
        return got


def _cpuset_action(ctx: Context, s: Scored, cid: str, seq: int, common: Mapping[str, float],
                   victims: tuple[str, ...], fmt: _Formats) -> Action:
    d = s.decision
    refill, migration, disruption = s.costs[cid]
    primary = cid == d.primary
    reason = (d.reason if primary or cid in d.island or cid in d.cohort else
              f"{d.reason} (decision {seq}: {cid} moves with its VM pod)" if cid in d.followers else
              f"{d.reason} (decision {seq}: {cid} makes room)")
    detail = {**common, "refill_seconds": refill, "migration_seconds": migration,
              "disruption_seconds": disruption}
    if cid in d.island:
        detail["avx512_island"] = 1.0
    if cid in d.allocated:
        detail["allocated"] = 1.0
    cpus = d.cpus[cid]
    return built(Action, {  # Action(...) with every field, in field order
        "kind": "cpuset", "container": cid, "frm": fmt.of(ctx.base.placement[cid]), "to": fmt.of(cpus),
        "reason": reason, "benefit": s.benefit if primary else 0.0,
        "cost": (refill + migration + disruption) / ctx.config.amortize_seconds,
        "victims": victims if primary else (), "mems": fmt.mems_of(cpus), "undoes": "",
        "decision": fmt.decision, "detail": detail})


def _pending(ctx: Context, s: Scored, seq: int, before: Mapping[str, float],
             after: Mapping[str, float]) -> Pending:
    d = s.decision
    fmt = _Formats(ctx, seq)
    moves = [built(Moved, {"container": cid, "frm": fmt.of(ctx.base.placement[cid]), "to": fmt.of(cpus),
                           "mems_frm": (ctx.idx.fmt(ctx.views[cid].mems) if ctx.views[cid].mems
                                        else fmt.mems_of(ctx.base.placement[cid])),
                           "mems_to": fmt.mems_of(cpus), "kind": "cpuset"})
             for cid, cpus in sorted(d.cpus.items())]
    moves += [Moved(container=cid, frm=ctx.base.classes[cid], to=cls, kind="rdt_class")
              for cid, cls in sorted(d.classes.items())]
    ips = {v: ctx.views[v].ips_per_core for v in before}
    waits = _health_predictions(ctx, s)
    cfg = ctx.config
    sigma = math.sqrt(sum(noise(ctx.state.health_history.get(v, ()), floor=cfg.health_noise_floor) ** 2
                          for v in waits))
    return Pending(decision=decision_id(seq), time=ctx.now, reason=d.reason, moves=tuple(moves),
                   victims=tuple(sorted(before)),
                   predicted=sum(before[v] - after[v] for v in before),
                   baseline_ips=frozen_map({v: x for v, x in ips.items() if x is not None}),
                   baseline_loss=frozen_map(before),
                   health_before=frozen_map({v: b for v, (b, _) in waits.items()}),
                   health_predicted=frozen_map({v: a for v, (_, a) in waits.items()}),
                   health_band=cfg.health_noise_sigmas * sigma, cycle=ctx.snapshot.cycle)


def _next_state(ctx: Context, smoothed: Mapping[str, Mapping[str, float]], seq: int,
                pending: list[Pending], moved_now: set[str], touched: Mapping[str, float]) -> PlannerState:
    cfg, now, present = ctx.config, ctx.now, set(ctx.views)
    moved_at = {c: t for c, t in ctx.state.moved_at.items()
                if c in present and now - t < cfg.dwell_seconds}
    moved_at.update({c: now for c in moved_now})
    cooldown = {c: t for c, t in ctx.state.cooldown_until.items() if c in present and t > now}
    cooldown.update(touched)
    return PlannerState(time=now, seq=seq, smoothed=smoothed, moved_at=frozen_map(moved_at),
                        cooldown_until=frozen_map(cooldown), pending=tuple(pending),
                        health_history=_health_history(ctx))


def _health_history(ctx: Context) -> Mapping[str, tuple[float, ...]]:
    """Each container's raw (unsmoothed) measured health loss of the last `health_windows`
    windows: the window-to-window variation that sets the noise band of an evaluation."""
    old, keep, out = ctx.state.health_history, ctx.config.health_windows, {}
    for s in ctx.snapshot.containers:
        loss = ctx.measured_loss(s.id, measure(s.metrics, min_waits=ctx.config.health_min_waits))
        if loss is not None:
            out[s.id] = push(old.get(s.id, ()), loss, keep)
    return frozen_map(out)


def _note(considered: list[dict[str, Any]], d: Decision, why: str, s: Scored | None = None) -> None:
    if len(considered) >= MAX_CONSIDERED:
        return
    entry: dict[str, Any] = {"kind": d.kind, "container": d.primary, "reason": d.reason,
                             "rejected": why}
    if d.cpus.get(d.primary) is not None:
        entry["to"] = _fmt(d.cpus[d.primary])
    if s is not None:
        entry.update(benefit=round(s.benefit, 6), cost=round(s.cost, 6), net=round(s.net, 6))
    considered.append(entry)


def _fmt(cpus: frozenset[int]) -> str:
    return str(CpuSet(cpus))


def decision_id(seq: int) -> str:
    """The id of the planner's `seq`-th decision, on its actions, its Pending and its Judgement."""
    return f"d{seq}"


POLICY = Policy(name="costmodel", plan=plan, config_type=RebalancerConfig, state_type=PlannerState,
                summary="the cost model of docs/cost-model.md: move only when the predicted benefit beats the move's cost")
