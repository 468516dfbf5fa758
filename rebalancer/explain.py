"""Why the planner proposed nothing, and what it made of the placement annotations.

`Plan.considered` names the candidates the planner scored and rejected; a container that never
became a candidate is not in it. `perfbalance plan` asks this module for those containers: for
each candidate kind of rebalancer/decisions.py, the container's (smoothed) numbers against the
threshold that would have made it one. It also asks `hints()` for every affinity and
anti-affinity pair (who, scope, weight, hard, how much they share and the cost-model term's value
now and once the plan's cpusets are applied, satisfied or not) and the AVX-512 pre-classification
state of every annotated container. Pure, like the planner; the plan itself is untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perfbalance.cpuset import CpuSet
from perfbalance.hints import problems as annotation_problems
from perfbalance.model import Plan, Snapshot
from rebalancer.affinity import Pair, overlap
from rebalancer.config import RebalancerConfig
from rebalancer.context import Context
from rebalancer.decisions import MAX_PER_KIND, candidates
from rebalancer.hintnotes import avx512_notes
from rebalancer.inputs import View, smooth
from rebalancer.latency import co_load
from rebalancer.state import PlannerState


def explain(snapshot: Snapshot, config: RebalancerConfig, state: PlannerState | None,
            now: float, result: Plan) -> tuple[str, list[dict[str, Any]]]:
    """(why there is no candidate at all, "" when there are some; one `considered` entry of
    kind "skipped" for every container neither acted on nor named by `result.considered`)."""
    ctx, smoothed = _context(snapshot, config, state, now)
    found = candidates(ctx, ctx.base) if config.enabled else []
    named = {a.container for a in result.actions} | {str(c.get("container", "")) for c in result.considered}
    named |= {d.primary for d in found}
    skipped = [{"kind": "skipped", "container": cid, "rejected": "no candidate: " + _container(ctx, smoothed, cid)}
               for cid in sorted(ctx.views) if cid not in named]
    return (_node(ctx, smoothed) if not found else ""), skipped


def _context(snapshot: Snapshot, config: RebalancerConfig, state: PlannerState | None,
             now: float) -> tuple[Context, Mapping[str, Mapping[str, float]]]:
    """The planner's view of the snapshot, as plan() builds it (smoothed inputs, then Context)."""
    state = state or PlannerState()
    smoothed = smooth(snapshot, state.smoothed, config.smoothing_alpha, avx512_key=config.avx512_annotation)
    return Context.build(snapshot, config, state, smoothed, now), smoothed


def hints(snapshot: Snapshot, config: RebalancerConfig, state: PlannerState | None, now: float,
          result: Plan) -> dict[str, list[dict[str, Any]]]:
    """{"pairs": one entry per affinity / anti-affinity pair, now and after `result`;
    "avx512": one entry per container annotated AVX-512-heavy (unmeasured, preclassified,
    confirmed or overruled); "problems": one line per hint annotation that does not parse, which
    the planner ignores}."""
    ctx, smoothed = _context(snapshot, config, state, now)
    after = dict(ctx.base.placement)
    for a in result.actions:
        if a.container in after and (a.kind == "cpuset" or (a.kind == "rollback" and a.undoes == "cpuset")):
            after[a.container] = CpuSet.parse(a.to).ids
    names = {s.id: _who(s.container.namespace, s.container.pod, s.container.name, s.id)
             for s in snapshot.containers}
    keys = config.hint_keys()
    return {"pairs": [_pair(ctx, p, after, names) for p in ctx.model.pairs],
            "avx512": [{**n, "who": names.get(n["container"], n["container"])}
                       for n in avx512_notes(ctx, smoothed)],
            "problems": [line for s in snapshot.containers for line in annotation_problems(s.container, keys)]}


def _who(namespace: str, pod: str, name: str, cid: str) -> str:
    return f"{namespace + '/' if namespace else ''}{pod}/{name or cid[:12]}" if pod else cid


def _pair(ctx: Context, p: Pair, after: Mapping[str, frozenset[int]], names: Mapping[str, str]) -> dict[str, Any]:
    now, later = overlap(ctx.idx, p, ctx.base.placement), overlap(ctx.idx, p, after)
    return {"kind": p.kind, "container": p.a, "other": p.b, "who": names.get(p.a, p.a),
            "other_who": names.get(p.b, p.b), "term": p.term, "scope": p.scope, "weight": p.weight,
            "hard": p.hard, "overlap_now": round(now, 4), "satisfied_now": _satisfied(p, now),
            "term_now": round(p.signed_weight * now, 6) + 0.0, "overlap_after": round(later, 4),
            "satisfied_after": _satisfied(p, later), "term_after": round(p.signed_weight * later, 6) + 0.0}  # + 0.0: no -0


def _satisfied(p: Pair, ov: float) -> bool:
    """Anti-affinity: no domain of the scope in common; affinity: the same domains (overlap 1)."""
    return ov <= 1e-9 if p.kind == "anti-affinity" else ov >= 1 - 1e-9


def _node(ctx: Context, smoothed: Mapping[str, Mapping[str, float]]) -> str:
    cfg, views = ctx.config, ctx.views
    if not cfg.enabled:
        return "planning is off (rebalancer.enabled: false)"
    if not views:
        return "no containers in the snapshot"
    out = [f"{len(ctx.free)} of {len(ctx.idx.online)} CPUs shareable"
           + (" (none: all reserved, kubelet-dedicated or exclusive)" if not ctx.free else "")]
    heavy = max(smoothed.get(c, {}).get("avx512_heavy", 0.0) for c in views)
    out.append(f"AVX-512-heavy: {len(ctx.heavy)} (highest avx512_heavy {heavy:.2f}, "
               f"threshold {cfg.avx512_heavy_threshold})")
    out.append(_llc_node(ctx))
    out.append(f"victims: {len(ctx.victims)} (lowest health {_lowest_health(ctx)}, "
               f"threshold {cfg.victim_health_threshold}; latency targets: {len(ctx.targets)})")
    if ctx.model.pairs:
        out.append(f"affinity pairs: {len(ctx.model.pairs)}, all as they want to be")
    return "no candidate move: " + "; ".join(out)


def _llc_node(ctx: Context) -> str:
    m, cfg = ctx.model, ctx.config
    misses = max((v.misses for v in ctx.views.values()), default=0.0)
    why = ("" if m.llc_on or not m.aggressors else
           ", but LLC moves need a cache-sensitive victim too and two L3 domains or an RDT class")
    return (f"cache aggressors: {len(m.aggressors)}, cache-sensitive: {len(m.llc_victims)} "
            f"(highest {misses:.3g} LLC misses/s, aggressor threshold "
            f"{cfg.llc_aggressor_misses_per_second:.3g}/s and {cfg.llc_aggressor_mpki:g} MPKI){why}")


def _lowest_health(ctx: Context) -> str:
    scores = [h.score for h in ctx.health.values()]
    return f"{min(scores):.2f}" if scores else "not measured"


def _container(ctx: Context, smoothed: Mapping[str, Mapping[str, float]], cid: str) -> str:
    v = ctx.views[cid]
    if cid in ctx.unmovable:
        return f"may not move ({ctx.unmovable[cid]})"
    parts = [_avx(ctx, smoothed.get(cid, {}), v), _llc(ctx, v), _latency(ctx, cid)]
    if ctx.model.bw_on and len(ctx.idx.nodes) > 1:
        parts.append(f"memory bandwidth {v.bandwidth:.3g} B/s")
    return "; ".join(parts)


def _avx(ctx: Context, m: Mapping[str, float], v: View) -> str:
    cfg = ctx.config
    if "avx512_heavy" not in m:
        return "AVX-512 use not measured"
    if not v.heavy:
        return f"avx512_heavy {m['avx512_heavy']:.2f} <= {cfg.avx512_heavy_threshold} (not AVX-512-heavy)"
    return (f"AVX-512-heavy (avx512_heavy {m['avx512_heavy']:.2f}), but its cores hold no scalar work "
            "or there are no whole free cores to move it to")


def _llc(ctx: Context, v: View) -> str:
    m, cfg = ctx.model, ctx.config
    role = ("a cache aggressor" if v.id in m.aggressors else
            "cache-sensitive" if v.id in m.llc_victims else "")
    nums = f"{v.misses:.3g} LLC misses/s, {v.mpki:.3g} MPKI"
    if not role and not v.misses:
        return "LLC misses not measured (no cache role)"
    if not role:
        return (f"{nums} (aggressor above {cfg.llc_aggressor_misses_per_second:.3g}/s and "
                f"{cfg.llc_aggressor_mpki:g} MPKI, cache-sensitive from {cfg.llc_victim_mpki:g} MPKI)")
    if not m.llc_on:
        return f"{role} ({nums}), but LLC moves are off on this node"
    return f"{role} ({nums}), but not among the {MAX_PER_KIND} heaviest or no other L3 domain has room"


def _latency(ctx: Context, cid: str) -> str:
    h = ctx.health.get(cid)
    if cid in ctx.victims:
        return "a victim, but no less loaded CPUs it fits on"
    if h is None:
        return "run-queue wait not measured (not a victim)"
    load0 = co_load(ctx.base, ctx.usage, cid)
    own = h.usage / max(1, len(ctx.base.placement[cid]))
    return (f"health {h.score:.2f} (victim below {ctx.config.victim_health_threshold}), "
            f"co-runner load {load0:.2f} vs its own {own:.2f} per CPU")

