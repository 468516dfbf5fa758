"""Candidate decisions: the moves worth scoring for the current (hypothetical) layout.

The cost model decides whether a candidate pays; this module only proposes a small, bounded set
of sensible ones, each a complete change (e.g. an AVX-512 island *and* the evictions that make
its cores clean), so the greedy loop in planner.py never needs half-finished intermediate states:

* avx512_island: AVX-512-heavy containers that share cores with scalar work move, as a cohort,
  to whole cores (the existing island if it has room, a grown island, or fresh cores from the
  allocator); scalar containers leave those cores.
* avx512_shield: an exclusive (immovable) AVX-512-heavy container's SMT siblings are cleared of
  scalar work.
* island_return: whole shareable cores that no container's cpuset holds any more (an AVX-512
  island whose last occupant left) are given back to the containers confined next to them (those
  holding the rest of their L3 domains' shareable CPUs, but for occupied islands).
* llc_separate: a cache aggressor or a cache-sensitive victim moves to another L3 domain.
* llc_rdt: a cache aggressor moves to the configured restricted RDT class.
* bandwidth: a bandwidth-heavy container moves to a NUMA node with bandwidth to spare.
* latency_isolate: a measured victim (rebalancer/latency.py: latency-sensitive, or getting too
  little of the CPU time it wants) moves to the CPUs where its co-runners put the least load.
* anti_affinity / affinity: one container of an annotated pair moves off (onto) the other's
  cores, L3 domain or NUMA node (rebalancer.affinity).

VM sandboxes (docs/vm-sandboxes.md, "The planner"): every candidate that moves a container of a
VM pod moves all the pod's movable containers to the same CPUs (they share the VM's floating
vCPUs); evicted VM pods get CPUs with the same count per NUMA node when the node has them.
"""

from __future__ import annotations

import heapq
from itertools import islice
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from perfbalance.cpuset import CpuSet
from rebalancer.affinity import domain_cpus, overlap
from rebalancer.allocator import allocate
from rebalancer.context import Context
from rebalancer.costmodel import Layout

MAX_PER_KIND = 8


@dataclass(frozen=True, kw_only=True)
class Decision:
    kind: str
    primary: str
    reason: str
    cpus: Mapping[str, frozenset[int]] = field(default_factory=dict)
    classes: Mapping[str, str] = field(default_factory=dict)
    allocated: frozenset[str] = frozenset()  # containers whose target came from the allocator
    island: frozenset[str] = frozenset()  # containers moved onto an AVX-512 island
    followers: frozenset[str] = frozenset()  # moved only because their VM pod moves
    cohort: frozenset[str] = frozenset()  # moved with the primary for the same reason (a return)


def candidates(ctx: Context, layout: Layout) -> list[Decision]:
    scalar = _scalar_cpus(ctx, layout)
    island = _island(ctx, layout, scalar)
    out = _avx_islands(ctx, layout, scalar, island) + _avx_shields(ctx, layout) + _returns(ctx, layout, island)
    if ctx.model.llc_on:
        out += _llc(ctx, layout, island)
    if ctx.model.bw_on and len(ctx.idx.nodes) > 1:
        out += _bandwidth(ctx, layout, island)
    out += _latency(ctx, layout, island)
    if ctx.model.pairs:
        out += _affinity(ctx, layout, island)
    return [_whole_pods(ctx, d) for d in out] if ctx.sandboxes else out


def _whole_pods(ctx: Context, d: Decision) -> Decision:
    """Add the movable pod-mates of every VM-sandboxed container the decision moves, to the same
    target (a decision that moves two of them to different CPUs is left for the planner to
    refuse). VM targets are not held to "one NUMA node when it fits": they keep their shape."""
    cpus = dict(d.cpus)
    followers: set[str] = set()
    for cid in sorted(d.cpus):
        sb = ctx.sandbox_of.get(cid)
        for m in sb.movable if sb is not None else ():
            if m not in cpus:
                cpus[m] = d.cpus[cid]
                followers.add(m)
    allocated = frozenset(c for c in d.allocated if c not in ctx.sandbox_of)
    if not followers and allocated == d.allocated:
        return d
    return replace(d, cpus=cpus, followers=frozenset(followers), allocated=allocated)


def _vm_shaped(ctx: Context, here: frozenset[int], avail: frozenset[int]) -> frozenset[int] | None:
    """CPUs from `avail` with as many CPUs on each NUMA node as `here` has (None if impossible):
    where an evicted VM pod can go without changing its guest's NUMA layout."""
    out: set[int] = set()
    for node, cpus in ctx.idx.nodes.items():
        count = len(here & cpus)
        if count:
            got = (allocate(ctx.idx, here & avail & cpus, count, prefer_nodes=[node])
                   or allocate(ctx.idx, avail & cpus, count, prefer_nodes=[node]))
            if got is None:
                return None
            out |= got
    return frozenset(out)


# -- AVX-512 ------------------------------------------------------------------------------------

def _scalar_cpus(ctx: Context, layout: Layout) -> frozenset[int]:
    out: set[int] = set()
    for cpus, g in layout.groups.items():
        if g.u - g.au > 1e-9:
            out |= cpus
    return frozenset(out)


def _heavy(ctx: Context) -> tuple[str, ...]:
    return ctx.heavy


def _island(ctx: Context, layout: Layout, scalar: frozenset[int]) -> frozenset[int]:
    """Whole free cores that only AVX-512-heavy containers use."""
    heavy_cpus: set[int] = set()
    for cpus in {id(p): p for p in map(layout.placement.__getitem__, _heavy(ctx))}.values():
        heavy_cpus |= cpus  # each distinct cpuset object once (most heavy containers share one)
    clean = ctx.idx.full_cores_within(ctx.free - scalar)
    return clean & ctx.idx.whole_cores(frozenset(heavy_cpus))


def _avx_islands(ctx: Context, layout: Layout, scalar: frozenset[int],
                 island: frozenset[int]) -> list[Decision]:
    cohorts: dict[frozenset[int], list[str]] = {}
    shares_cores: dict[int, bool] = {}  # by cpuset object: most heavy containers share one
    for cid in _heavy(ctx):
        cpus = layout.placement[cid]
        if ctx.views[cid].exclusive:
            continue
        near = shares_cores.get(id(cpus))
        if near is None:
            near = shares_cores[id(cpus)] = bool(ctx.idx.whole_cores(cpus) & scalar)
        if near:
            cohorts.setdefault(cpus, []).append(cid)
    out: list[Decision] = []
    evictions: dict[frozenset[int], Evictions | None] = {}  # by target: cohorts share targets
    for _, cohort in sorted(cohorts.items(), key=lambda kv: kv[1][0])[:MAX_PER_KIND]:
        for target, members in _island_targets(ctx, layout, cohort, island):
            d = _with_evictions(ctx, layout, members, target, cohort[0], evictions)
            if d is not None:
                out.append(d)
    return out


def _island_targets(ctx: Context, layout: Layout, cohort: list[str],
                    island: frozenset[int]) -> list[tuple[frozenset[int], list[str]]]:
    """(target CPUs, heavy containers to put there): existing island, grown island, fresh cores."""
    residents = [c for c in _heavy(ctx) if island and layout.placement[c] <= island]
    prefer = _prefer_nodes(ctx, island or layout.placement[cohort[0]])
    out: list[tuple[frozenset[int], list[str]]] = []
    need_all = ctx.need_cpus(residents + cohort)
    if island and need_all <= len(island):
        out.append((island, cohort))
    fresh = allocate(ctx.idx, ctx.free - island, ctx.need_cpus(cohort), whole_cores=True,
                     prefer_nodes=prefer)
    if fresh is not None:
        out.append((fresh, cohort))
    spread = _spread_island(ctx, island, ctx.need_cpus(cohort), prefer, fresh)
    if spread is not None:
        out.append((spread, cohort))
    if island and need_all > len(island):
        extra = allocate(ctx.idx, ctx.free - island, need_all - len(island), whole_cores=True,
                         prefer_nodes=prefer)
        if extra is not None:
            out.append((island | extra, residents + cohort))
    return out


def _spread_island(ctx: Context, island: frozenset[int], need: int, prefer: list[int],
                   packed: frozenset[int] | None) -> frozenset[int] | None:
    """Fresh whole cores, one per CPU of need (its threads on separate physical cores), when
    SMT sharing is modelled and that differs from the packed island: the cost model weighs the
    sibling sharing it saves against the room it takes from scalar work (docs/cost-model.md)."""
    threads = ctx.idx.threads_per_core()
    if not ctx.model.smt_on or need < 2 or threads < 2:
        return None
    got = allocate(ctx.idx, ctx.free - island, need * threads, whole_cores=True, prefer_nodes=prefer)
    return got if got != packed else None


def _prefer_nodes(ctx: Context, cpus: frozenset[int]) -> list[int]:
    key = ("prefer", cpus)
    hit = ctx.idx.memo.get(key)
    if hit is None:
        counts: dict[int, int] = {}
        for c in cpus:
            counts[ctx.idx.node_of[c]] = counts.get(ctx.idx.node_of[c], 0) + 1
        hit = ctx.idx.memo[key] = tuple(sorted(counts, key=lambda n: (-counts[n], n)))
    return list(hit)  # type: ignore[call-overload]


# the scalar containers that leave an island's target, with their new CPUs, and which of them
# got theirs from the allocator
Evictions = tuple[dict[str, frozenset[int]], frozenset[str]]


def _with_evictions(ctx: Context, layout: Layout, members: list[str], target: frozenset[int],
                    primary: str, memo: dict[frozenset[int], Evictions | None]) -> Decision | None:
    # targets are interned (TopoIndex.intern): later memo lookups then compare by identity
    target = ctx.idx.intern(target)
    if target not in memo:
        memo[target] = _evictions(ctx, layout, target)
    ev = memo[target]
    if ev is None:
        return None
    cpus = {cid: target for cid in members if layout.placement[cid] != target}
    cpus.update(ev[0])  # evictions are scalar, members heavy: no key in both
    if not cpus:
        return None
    n = len(members)
    reason = (f"AVX-512 island: {primary}" + (f" and {n - 1} more AVX-512-heavy" if n > 1 else "")
              + f" to whole cores {_fmt(target)}, away from scalar work")
    return Decision(kind="avx512_island", primary=primary, reason=reason, cpus=cpus,
                    allocated=ev[1], island=frozenset(members))


def _evictions(ctx: Context, layout: Layout, target: frozenset[int]) -> Evictions | None:
    """Where each scalar container on `target` goes (None: one of them fits nowhere)."""
    cpus: dict[str, frozenset[int]] = {}
    allocated: set[str] = set()
    for here in sorted((k for k in layout.groups if k & target), key=sorted):
        rest = ctx.idx.intern((here & ctx.free) - target)
        for cid in layout.groups[here].members:
            if ctx.views[cid].heavy:
                continue
            shaped = _vm_shaped(ctx, here, ctx.free - target) if cid in ctx.sandbox_of else None
            if shaped is not None:
                cpus[cid] = ctx.idx.intern(shaped)
            elif not rest:
                got = allocate(ctx.idx, ctx.free - target, ctx.need_cpus([cid]),
                               prefer_nodes=_prefer_nodes(ctx, here))
                if got is None:
                    return None
                cpus[cid] = ctx.idx.intern(got)
                allocated.add(cid)
            else:
                cpus[cid] = rest
    return cpus, frozenset(allocated)


def _avx_shields(ctx: Context, layout: Layout) -> list[Decision]:
    out: list[Decision] = []
    for cid in _heavy(ctx):
        v = ctx.views[cid]
        if not v.exclusive:
            continue
        siblings = ctx.idx.whole_cores(layout.placement[cid]) - layout.placement[cid]
        cpus = {}
        for other in sorted(layout.placement):
            here = layout.placement[other]
            if other != cid and not ctx.views[other].heavy and here & siblings:
                rest = (here & ctx.free) - siblings
                if other in ctx.sandbox_of:
                    rest = _vm_shaped(ctx, here, ctx.free - siblings) or rest
                if not rest:
                    break
                cpus[other] = ctx.idx.intern(rest)
        else:
            if cpus:
                out.append(Decision(kind="avx512_shield", primary=cid, cpus=cpus,
                                    reason=f"AVX-512 shield: clear scalar work off the SMT siblings "
                                           f"{_fmt(siblings)} of exclusive AVX-512-heavy {cid}"))
    return out[:MAX_PER_KIND]


def _returns(ctx: Context, layout: Layout, island: frozenset[int]) -> list[Decision]:
    """Each cpuset's containers confined beside whole cores that no container uses any more,
    widened over them: the confinement's reason has gone. Heavy, exclusive and VM-sandboxed
    containers keep their CPUs (a VM keeps its shape). Scored like any candidate: confined
    beside idle cores, the balancer doubles threads up on siblings (smt.balanced_loads)."""
    unused = _unused_cores(ctx, layout)
    out: list[Decision] = []
    for here in sorted(layout.groups, key=sorted) if unused else ():
        near = _freed_beside(ctx, here, unused, island)
        movers = [c for c in layout.groups[here].members
                  if not (ctx.views[c].heavy or ctx.views[c].exclusive or c in ctx.sandbox_of)]
        if near and movers:
            target, n = ctx.idx.intern(here | near), len(movers)
            out.append(Decision(kind="island_return", primary=movers[0], cpus=dict.fromkeys(movers, target),
                                cohort=frozenset(movers),
                                reason=f"return: {movers[0]}" + (f" and {n - 1} more" if n > 1 else "")
                                       + f" widened over whole cores {_fmt(near)} that no container uses "
                                       f"(to {_fmt(target)})"))
    return out[:MAX_PER_KIND]


def _freed_beside(ctx: Context, here: frozenset[int], unused: frozenset[int],
                  island: frozenset[int]) -> frozenset[int]:
    """The unused cores in the L3 domains of `here` when `here` holds every other shareable
    CPU there but for AVX-512 islands (the shape an island's evictions leave), else none."""
    domains = frozenset().union(*(ctx.idx.l3s[d] for d in ctx.idx.l3s_of(here))) & ctx.free
    near = domains & unused
    return near if near and here | near | (island & domains) == domains else frozenset()


def _unused_cores(ctx: Context, layout: Layout) -> frozenset[int]:
    """Whole shareable cores in no container's cpuset (none while one cpuset is the whole pool)."""
    free = ctx.free
    if any(len(k) >= len(free) and free <= k for k in layout.groups):
        return frozenset()
    return ctx.idx.full_cores_within(free.difference(*layout.groups))


# -- LLC and bandwidth ----------------------------------------------------------------------------

def _top(ctx: Context, ids: frozenset[str], key: str) -> list[str]:
    # nsmallest(n, ...) == sorted(...)[:n]; the key is a total order (ties broken by id)
    def rank(c: str) -> tuple[float, str]:
        return (-getattr(ctx.views[c], key), c)
    if len(ids) <= 4 * MAX_PER_KIND:
        return heapq.nsmallest(MAX_PER_KIND, (c for c in ids if not ctx.views[c].exclusive), key=rank)
    # many (every container of a hot node): the first of all movable containers in rank order,
    # sorted once per call and key
    order = ctx.memo.get(("rank", key))
    if order is None:
        order = ctx.memo[("rank", key)] = sorted((c for c, v in ctx.views.items() if not v.exclusive), key=rank)
    return list(islice((c for c in order if c in ids), MAX_PER_KIND))  # type: ignore[attr-defined]


def _llc(ctx: Context, layout: Layout, island: frozenset[int]) -> list[Decision]:
    out: list[Decision] = []
    model = ctx.model
    for role, ids in (("aggressor", model.aggressors), ("victim", model.llc_victims)):
        for cid in _top(ctx, ids, "misses"):
            out += _relocations(ctx, layout, cid, ctx.idx.l3s, island, "llc_separate",
                                f"LLC: cache {role} {cid} to L3 domain", role == "victim")
    if ctx.rdt_class:
        for cid in _top(ctx, model.aggressors, "misses"):
            if layout.classes.get(cid) != ctx.rdt_class:
                out.append(Decision(kind="llc_rdt", primary=cid, classes={cid: ctx.rdt_class},
                                    reason=f"LLC: cache aggressor {cid} to RDT class {ctx.rdt_class}"))
    return out


def _hot_nodes(ctx: Context, layout: Layout) -> set[int]:
    """NUMA nodes whose bandwidth use is past the low knee of the loaded-latency curve."""
    used: dict[int, float] = {}
    for k, g in layout.groups.items():
        if g.b > 0:
            for n, f in ctx.model.frac("node", k).items():
                used[n] = used.get(n, 0.0) + g.b * f
    return {n for n, b in used.items() if b / ctx.config.bandwidth_of(n) > ctx.config.bandwidth_knee_low}


def _bandwidth(ctx: Context, layout: Layout, island: frozenset[int]) -> list[Decision]:
    hot = _hot_nodes(ctx, layout)
    if not hot:
        return []
    hogs = frozenset(c for k, g in layout.groups.items() if g.b > 0 and ctx.idx.nodes_of(k) & hot
                     for c in g.members if ctx.views[c].bandwidth > 0)
    out: list[Decision] = []
    for cid in _top(ctx, hogs, "bandwidth"):
        out += _relocations(ctx, layout, cid, ctx.idx.nodes, island, "bandwidth",
                            f"memory bandwidth: {cid} to NUMA node", False)
    return out


def _latency(ctx: Context, layout: Layout, island: frozenset[int]) -> list[Decision]:
    """Each victim, worst health first, to the least co-loaded CPUs it fits on (away from the
    AVX-512 island and, when there is room, from CPUs other containers are pinned to)."""
    out: list[Decision] = []
    worst = sorted(ctx.victims.values(), key=lambda v: (v.health.score, v.id))[:MAX_PER_KIND]
    for v in worst:
        here = layout.placement[v.id]
        usable = ctx.free - island
        need = ctx.need_cpus([v.id])
        claimed = _claimed(layout, v.id, usable)
        got = allocate(ctx.idx, usable - claimed, need) or allocate(ctx.idx, usable - here, need)
        if got is not None and got != here:
            why = (f"target p99 {v.target * 1e3:g} ms" if v.target is not None else
                   f"health {v.health.score:.2f}")
            out.append(Decision(kind="latency_isolate", primary=v.id, cpus={v.id: got},
                                allocated=frozenset({v.id}),
                                reason=f"latency: victim {v.id} ({why}) to {_fmt(got)}"))
    return out


def _affinity(ctx: Context, layout: Layout, island: frozenset[int]) -> list[Decision]:
    """For the heaviest pairs not as they want to be: each side moved away from (anti) or into
    (affinity) the other's domains at the pair's scope."""
    out: list[Decision] = []
    placement, idx = layout.placement, ctx.idx
    unhappy = [p for p in ctx.model.pairs
               if (ov := overlap(idx, p, placement)) > 1e-9 and p.kind == "anti-affinity"
               or ov < 1 - 1e-9 and p.kind == "affinity"]
    for p in sorted(unhappy, key=lambda p: -abs(p.signed_weight))[:MAX_PER_KIND]:
        for mover, other in ((p.a, p.b), (p.b, p.a)):
            if mover in ctx.unmovable or other not in placement:
                continue
            theirs = domain_cpus(idx, p.scope, placement[other])
            usable = (ctx.free - theirs if p.kind == "anti-affinity" else ctx.free & theirs) - island
            verb = "away from" if p.kind == "anti-affinity" else "next to"
            d = _place(ctx, layout, mover, usable, p.kind.replace("-", "_"),
                       f"{p.kind}: {mover} {verb} {other} ({p.scope}, {p.term} from {p.a})")
            out += [d] if d is not None else []
    return out


def _place(ctx: Context, layout: Layout, cid: str, usable: frozenset[int], kind: str,
           reason: str) -> Decision | None:
    need = ctx.need_cpus([cid])
    claimed = _claimed(layout, cid, usable)
    got = allocate(ctx.idx, usable - claimed, need) or allocate(ctx.idx, usable, need)
    if got is None or got == layout.placement[cid]:
        return None
    return Decision(kind=kind, primary=cid, cpus={cid: ctx.idx.intern(got)}, allocated=frozenset({cid}),
                    reason=f"{reason} to {_fmt(got)}")


def _relocations(ctx: Context, layout: Layout, cid: str, domains: Mapping[int, frozenset[int]],
                 avx_island: frozenset[int], kind: str, reason: str, sensitive: bool) -> list[Decision]:
    here = layout.placement[cid]
    out = []
    for d, cpus in domains.items():
        if here <= cpus:
            continue
        usable = (cpus & ctx.free) - avx_island
        claimed = _claimed(layout, cid, usable)
        need = ctx.need_cpus([cid])
        kw = {"prefer_nodes": _prefer_nodes(ctx, cpus), "high_priority": sensitive}
        got = allocate(ctx.idx, usable - claimed, need, **kw) or allocate(ctx.idx, usable, need, **kw)
        if got is not None and got != here:
            out.append(Decision(kind=kind, primary=cid, cpus={cid: ctx.idx.intern(got)}, allocated=frozenset({cid}),
                                reason=f"{reason} {d} ({_fmt(got)})"))
    return out


def _claimed(layout: Layout, cid: str, usable: frozenset[int]) -> frozenset[int]:
    """CPUs other containers are pinned to inside `usable` (avoided when there is a choice)."""
    out: set[int] = set()
    for k, g in layout.groups.items():
        if k & usable and not usable <= k and g.members != [cid]:
            out |= k
    return frozenset(out)


def _fmt(cpus: frozenset[int]) -> str:
    return str(CpuSet(cpus))
