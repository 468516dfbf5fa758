"""The cost model: how many core-seconds per second a placement loses to interference.

A placement (container -> CPUs, plus RDT classes) is scored by the CPU time the containers lose:

* AVX-512 contamination: CPU time of non-AVX containers on cores that hold an AVX-512 license,
  times the frequency loss of this CPU model;
* LLC contention: extra stall time of cache-sensitive victims whose share of an L3 domain shrinks,
  through the miss-rate curve M(C) = M0 (C/C0)^-a;
* memory bandwidth: extra stall time of every miss once a NUMA node's bandwidth use passes the
  knee of the loaded-latency curve;
* CPU: demand the water-filling scheduler model cannot serve (so the planner never crams);
* SMT: work slowed by a busy sibling thread of the same physical core (rebalancer/smt.py).

Containers with the same cpuset are aggregated into groups, so scoring a placement costs about
one pass over the CPUs, whatever the number of containers. Formulas: docs/cost-model.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import groupby, repeat
from typing import Any
from operator import itemgetter, mul

from rebalancer.config import RebalancerConfig
from rebalancer.inputs import View
from rebalancer.sharing import fill_order, water_fill, water_fill_from
from rebalancer.smt import balanced_loads, lost as smt_lost
from rebalancer.affinity import Pair
from rebalancer.affinity import cost as affinity_cost
from rebalancer.topoindex import TopoIndex

Placement = Mapping[str, frozenset[int]]


def loaded_latency_factor(u: float, low: float, high: float) -> float:
    """L(u)/L_idle: flat to `low`, linear to 1.5x at `high`, then +5x per unit of utilization."""
    if u <= low:
        return 1.0
    if u <= high:
        return 1.0 + 0.5 * (u - low) / max(high - low, 1e-9)
    return 1.5 + 5.0 * (u - high)


@dataclass(slots=True)
class Group:
    """Containers that share one cpuset, with summed inputs."""

    members: list[str]
    u: float = 0.0  # usage
    au: float = 0.0  # usage of AVX-512-heavy members
    m: float = 0.0  # LLC misses/s of members in the default RDT class
    mr: float = 0.0  # ... in the aggressor class
    b: float = 0.0  # memory bandwidth
    req: int = 0  # CPU requests of members outside VM sandboxes, milli-CPU


@dataclass(slots=True)
class Layout:
    """A placement with its groups; `moved` derives a new layout cheaply."""

    placement: dict[str, frozenset[int]]
    classes: dict[str, str]
    groups: dict[frozenset[int], Group]

    def moved(self, model: CostModel, cpus: Mapping[str, frozenset[int]],
              classes: Mapping[str, str] | None = None) -> Layout:
        """A new layout with some containers moved (layouts are never mutated: unchanged dicts
        are shared between them)."""
        placement = self.placement
        if cpus:
            placement = dict(placement)
            placement.update(cpus)
        new_classes = self.classes
        if classes:
            new_classes = dict(new_classes)
            new_classes.update(classes)
        groups = dict(self.groups)
        touched = set(cpus)
        if classes:
            touched.update(classes)
        leaving = dict.fromkeys(map(self.placement.__getitem__, touched))
        # joiners in the decision's order (sorted runs, mostly: the sort in build_group merges
        # them instead of sorting a thousand ids from the set's order)
        joining: dict[frozenset[int], list[str]] = {}
        for to, run in groupby(cpus.items(), key=_target):  # runs of one target, in C
            joining.setdefault(to, []).extend(map(_moved_id, run))
        for cid in classes or ():
            if cid not in cpus:
                joining.setdefault(placement[cid], []).append(cid)
        for k in leaving.keys() | joining.keys():
            g = groups.get(k)
            old = g.members if g is not None else []
            # a member of k that is touched leaves k (and joins again if its target is k)
            ids = _without(old, touched) if k in leaving else list(old)
            joined = joining.get(k)
            if joined:
                ids += joined
            if ids:
                # old members are sorted (build_group sorts): without joiners they still are
                groups[k] = model.build_group(ids, new_classes, is_sorted=not joined)
            else:
                groups.pop(k, None)
        return Layout(placement=placement, classes=new_classes, groups=groups)


def _table(idx: TopoIndex, name: str) -> dict[Any, Any]:
    got = idx.memo.get((name,))
    if got is None:
        got = idx.memo[(name,)] = {}
    return got  # type: ignore[return-value]


_moved_id, _target = itemgetter(0), itemgetter(1)


def _first(pair: tuple[int, frozenset[int]]) -> int:
    return pair[0]


def _without(members: list[str], gone: set[str]) -> list[str]:
    """Sorted `members` less `gone`: a few found by bisection (a pool of a thousand loses one
    container per candidate), many by one pass."""
    if len(gone) > 8:
        return [m for m in members if m not in gone]
    out = members
    for cid in gone:
        i = bisect_left(out, cid)
        if i < len(out) and out[i] == cid:
            out = out[:i] + out[i + 1:]
    return out if out is not members else list(members)


@dataclass(slots=True)
class Evaluation:
    total: float
    parts: dict[str, float]
    rates: dict[frozenset[int], tuple[float, float, float]]  # group -> (avx/scalar core, bw/miss, unserved/core)
    stalls: dict[str, float] = field(default_factory=dict)  # LLC victim -> stall core-s/s
    # group -> (its demand, its CPU time per CPU): what the water filling gave it, for layouts
    # derived from this one (CostModel.evaluate's `before`)
    fills: dict[frozenset[int], tuple[float, dict[int, float]]] = field(default_factory=dict)


class CostModel:
    """Scores layouts of one snapshot. Pure: holds only the snapshot's derived values."""

    def __init__(self, *, idx: TopoIndex, views: Mapping[str, View], config: RebalancerConfig,
                 aggressor_class: str = "", pairs: tuple[Pair, ...] = (),
                 shareable: frozenset[int] | None = None) -> None:
        self.idx, self.views, self.cfg = idx, views, config
        # CPUs containers may be given: whole cores of it in no cpuset skew the balancer (smt.balanced_loads)
        self.shareable = shareable if shareable and len(idx.l3s) > 1 else None
        self.pairs = pairs  # affinity / anti-affinity (rebalancer.affinity)
        self.loss = config.license_loss(idx.cpu_model)
        self.aggressor_class = aggressor_class
        least = config.llc_aggressor_misses_per_second  # the first test of _is_aggressor, inline
        self.aggressors = frozenset(v.id for v in views.values() if v.misses >= least and self._is_aggressor(v))
        self.llc_victims = frozenset(
            v.id for v in views.values()
            if v.id not in self.aggressors and v.misses > 0 and v.mpki >= config.llc_victim_mpki)
        self.llc_on = bool(self.aggressors and self.llc_victims and
                           (len(idx.l3s) > 1 or aggressor_class))
        self.bw_on = any(v.bandwidth > 0 for v in views.values())
        self.smt_on = config.smt_speed < 1.0 and idx.threads_per_core() > 1
        self._frac_cache = _table(idx, "frac")
        self._node_items_of = _table(idx, "node-items")
        self._node_items_seen = _table(idx, "node-items-seen")
        self._k0: dict[str, float] = {}
        self._order = _table(idx, "fill-order")
        self._groups: dict[tuple[tuple[str, ...], tuple[str, ...]], Group] = {}
        # per container: (usage, AVX-512 usage, misses, bandwidth, requests outside VM sandboxes;
        # a VM pod's demand is its vCPUs)
        self._inputs = {cid: (v.usage, v.usage if v.heavy else 0.0, v.misses, v.bandwidth,
                              0 if v.sandbox_pod else v.request_mcpu) for cid, v in views.items()}

    # -- roles -------------------------------------------------------------------------------
    def _is_aggressor(self, v: View) -> bool:
        if v.misses < self.cfg.llc_aggressor_misses_per_second or v.mpki < self.cfg.llc_aggressor_mpki:
            return False
        if v.occupancy is None or self.idx.l3_size <= 0:
            return True
        return v.occupancy >= self.cfg.llc_aggressor_occupancy_fraction * self.idx.l3_size

    # -- layouts -----------------------------------------------------------------------------
    def layout(self, placement: Mapping[str, frozenset[int]], classes: Mapping[str, str]) -> Layout:
        members: dict[frozenset[int], list[str]] = {}
        for cid, cpus in placement.items():
            members.setdefault(cpus, []).append(cid)
        groups = {k: self.build_group(ids, classes) for k, ids in members.items()}
        return Layout(placement=dict(placement), classes=dict(classes), groups=groups)

    def build_group(self, ids: Iterable[str], classes: Mapping[str, str], *, is_sorted: bool = False) -> Group:
        """Sum the members' inputs in sorted order (so equal layouts score bit-identically).
        `is_sorted`: `ids` already are."""
        members = tuple(ids) if is_sorted else tuple(sorted(ids))
        restricted = tuple(c for c in members if classes.get(c) == self.aggressor_class) \
            if self.aggressor_class else ()
        key = (members, restricted)
        hit = self._groups.get(key)
        if hit is None:
            hit = self._groups[key] = self._sum_group(members, classes)
        return hit

    def _sum_group(self, members: tuple[str, ...], classes: Mapping[str, str]) -> Group:
        agg = self.aggressor_class
        if agg and any(classes.get(cid) == agg for cid in members):
            return sum_each(self._inputs, members, frozenset(c for c in members if classes.get(c) == agg))
        return sum_plain(self._inputs, members)

    def set_baseline(self, layout: Layout) -> None:
        """Record each LLC victim's modelled cache share in the measured placement (C0)."""
        if self.llc_on:
            self._k0 = {}
            shares = self._cache_shares(layout, self.ordered(layout))
            for cpus, g in layout.groups.items():
                for cid in g.members:
                    if cid in self.llc_victims:
                        self._k0[cid] = shares.get(cpus, 0.0)

    def ordered(self, layout: Layout) -> list[frozenset[int]]:
        """Groups in water-filling order (also fixes the order of every float sum)."""
        order = self._order
        for k in layout.groups:
            if k not in order:
                order[k] = fill_order(k)
        return sorted(layout.groups, key=order.__getitem__)

    def frac(self, kind: str, cpus: frozenset[int]) -> dict[int, float]:
        """Fraction of a cpuset in each L3 domain ("l3") or NUMA node ("node")."""
        key = (kind, cpus)
        hit = self._frac_cache.get(key)
        if hit is None:
            of = self.idx.l3_of if kind == "l3" else self.idx.node_of
            hit = {}
            for c in cpus:
                d = of.get(c)
                if d is not None:
                    hit[d] = hit.get(d, 0.0) + 1.0 / len(cpus)
            self._frac_cache[key] = hit
        return hit

    # -- scoring -----------------------------------------------------------------------------
    def evaluate(self, layout: Layout, before: tuple[Layout, Evaluation] | None = None) -> Evaluation:
        """Score `layout`. `before`: a layout it was derived from and its evaluation, whose
        water filling is taken over for the groups the change cannot reach (the same result)."""
        keys = self.ordered(layout)
        demands = [(k, layout.groups[k].u) for k in keys]
        if before is None:
            contribs, loads = water_fill(demands)
        else:
            contribs, loads = water_fill_from(demands, before[1].fills, self._gone(keys, layout, before[0]))
        avx_core, unserved = self._avx_and_cpu(layout, keys, contribs)
        bw_rate = self._bandwidth_rates(layout, keys) if self.bw_on else {}
        stalls = self._llc_stalls(layout, keys) if self.llc_on else {}
        rates: dict[frozenset[int], tuple[float, float, float]] = {}
        avx_sum = bw_sum = cpu_sum = 0.0  # each part summed from 0.0 in fill order
        groups, avx_of, bw_of, un_of = layout.groups, avx_core.get, bw_rate.get, unserved.get
        for k in keys:
            g = groups[k]
            u = g.u
            scalar = u - g.au
            lost = avx_of(k, 0.0)
            bw = bw_of(k, 0.0)
            un = un_of(k, 0.0)
            rates[k] = (lost / scalar if scalar > 1e-12 else 0.0, bw, un / u if u > 1e-12 else 0.0)
            avx_sum += lost
            bw_sum += bw * (g.m + g.mr)
            cpu_sum += un
        parts = {"avx512": avx_sum, "llc": sum(stalls.values()), "bandwidth": bw_sum, "cpu": cpu_sum}
        if self.smt_on:
            if self.shareable is not None:
                loads = balanced_loads(keys, contribs, loads, self.idx, self.shareable)
            parts["smt"] = smt_lost(loads, self.idx, self.cfg.smt_speed)
        if self.pairs:
            parts["affinity"] = affinity_cost(self.idx, self.pairs, layout.placement)
        return Evaluation(total=sum(parts.values()), parts=parts, rates=rates, stalls=stalls,
                          fills=dict(zip(keys, zip([u for _, u in demands], contribs))))

    def _gone(self, keys: list[frozenset[int]], layout: Layout,
              before: Layout) -> list[tuple[int, frozenset[int]]]:
        """The groups of `before` absent from `layout`, each with the index in `keys` (the fill
        order of `layout`) of the first group that would be filled after it."""
        order, groups = self._order, layout.groups
        gone = [k for k in before.groups if k not in groups]
        if not gone:
            return []
        ranks = [order[k] for k in keys]
        return sorted(((bisect_left(ranks, order[k]), k) for k in gone), key=_first)

    def _avx_and_cpu(self, layout: Layout, keys: list[frozenset[int]],
                     contribs: list[dict[int, float]]) -> tuple[dict[frozenset[int], float], dict[frozenset[int], float]]:
        avx_t: dict[int, float] = {}
        unserved: dict[frozenset[int], float] = {}
        groups = layout.groups
        for k, contrib in zip(keys, contribs):
            g = groups[k]
            unserved[k] = max(0.0, g.u - sum(contrib.values()))
            if g.au > 0 and g.u > 0:
                _add_scaled(avx_t, contrib, g.au / g.u)
        if not avx_t or self.loss <= 0:
            return {}, unserved
        p_get = self._license_probability(avx_t).get
        out: dict[frozenset[int], float] = {}
        for k, contrib in zip(keys, contribs):
            g = groups[k]
            if g.u <= g.au:
                continue
            scalar_share = (g.u - g.au) / g.u
            # sum of x * P(license on the CPU's core), in contrib order (map: no Python loop)
            lost = sum(map(mul, contrib.values(), map(p_get, contrib, repeat(0.0))))
            if lost > 0:
                out[k] = lost * scalar_share * self.loss
        return out, unserved

    def _license_probability(self, avx_t: Mapping[int, float]) -> dict[int, float]:
        """Per CPU, P(its core holds a license) = 1 - prod over the core's threads of (1 - AVX
        busy fraction); CPUs of cores without AVX-512 time are absent (0)."""
        sibling = self.idx.sibling_of()
        if sibling is not None:
            return licence_by_busy_pairs(sibling, avx_t)
        free_of = {cpu: 1.0 - (a if a < 1.0 else 1.0) for cpu, a in avx_t.items()}  # 1 - min(1, a)
        return licence_by_core(self.idx.core_of, self.idx.cores, free_of)

    def _bandwidth_rates(self, layout: Layout, keys: list[frozenset[int]]) -> dict[frozenset[int], float]:
        used: dict[int, float] = {}
        groups = layout.groups
        node_items = self._node_items
        for k in keys:
            b = groups[k].b
            if b > 0:
                for n, f in node_items(k):
                    used[n] = used.get(n, 0.0) + b * f
        cfg = self.cfg
        per_miss = {n: cfg.memory_latency_seconds / cfg.memory_parallelism *
                    (loaded_latency_factor(b / cfg.bandwidth_of(n), cfg.bandwidth_knee_low,
                                           cfg.bandwidth_knee_high) - 1.0)
                    for n, b in used.items()}
        # the rate depends only on the group's NUMA fractions (interned: few distinct ones)
        rate_of: dict[tuple[tuple[int, float], ...], float] = {}
        out: dict[frozenset[int], float] = {}
        for k in keys:
            items = node_items(k)
            r = rate_of.get(items)
            if r is None:
                r = 0  # as sum() over the fractions: 0 + x == x, then one by one
                for n, f in items:
                    r += f * per_miss.get(n, 0.0)
                rate_of[items] = r
            out[k] = r
        return out

    def _node_items(self, cpus: frozenset[int]) -> tuple[tuple[int, float], ...]:
        """frac("node", cpus) as (node, fraction) pairs, one shared tuple per distinct value."""
        hit = self._node_items_of.get(cpus)
        if hit is None:
            items = tuple(self.frac("node", cpus).items())
            hit = self._node_items_of[cpus] = self._node_items_seen.setdefault(items, items)
        return hit

    def _cache_shares(self, layout: Layout, keys: list[frozenset[int]]) -> dict[frozenset[int], float]:
        """Q(group) = sum_d f_d (x_d)^-a: the miss multiplier of a member, up to a constant.

        x_d is the share of L3 domain d a member holds there: LRU shares a domain in proportion
        to insertion (miss) rates, and a member's threads in d see only what it holds in d (its
        data is replicated per domain), so misses add up per domain, weighted by where it runs.
        """
        tu: dict[int, float] = {}
        tr: dict[int, float] = {}
        for k in keys:
            g = layout.groups[k]
            if g.m <= 0 and g.mr <= 0:
                continue
            for d, f in self.frac("l3", k).items():
                tu[d] = tu.get(d, 0.0) + g.m * f
                tr[d] = tr.get(d, 0.0) + g.mr * f
        phi = self.cfg.rdt_aggressor_fraction
        avail = {d: 1.0 - min(phi, tr[d] / (tu[d] + tr[d])) if tu[d] + tr[d] > 0 else 1.0 for d in tu}
        a = self.cfg.llc_alpha
        out: dict[frozenset[int], float] = {}
        for k in keys:
            g = layout.groups[k]
            if g.m > 0:
                out[k] = sum(f * (avail[d] * f / tu[d]) ** -a
                             for d, f in self.frac("l3", k).items() if tu.get(d, 0) > 0)
        return out

    def _llc_stalls(self, layout: Layout, keys: list[frozenset[int]]) -> dict[str, float]:
        shares = self._cache_shares(layout, keys)
        cfg = self.cfg
        per_miss = cfg.memory_latency_seconds / cfg.memory_parallelism
        hi = cfg.llc_max_gain ** cfg.llc_alpha
        out: dict[str, float] = {}
        for k in keys:
            for cid in layout.groups[k].members:
                if cid not in self.llc_victims:
                    continue
                v = self.views[cid]
                q0 = self._k0.get(cid, 0.0)
                ratio = shares.get(k, 0.0) / q0 if q0 > 0 else 1.0
                ratio = min(hi, max(1.0 / hi, ratio))
                out[cid] = min(v.usage, v.misses * ratio * per_miss)
        return out

    # -- per container -------------------------------------------------------------------------
    def container_loss(self, ev: Evaluation, layout: Layout, cid: str) -> float:
        return self.container_losses(ev, layout, (cid,))[0]

    def container_losses(self, ev: Evaluation, layout: Layout, ids: Iterable[str]) -> list[float]:
        """container_loss of each of `ids`, in one loop (the same arithmetic)."""
        views, rates, placement, stalls = self.views, ev.rates.get, layout.placement, ev.stalls.get
        zero = (0.0, 0.0, 0.0)
        out = []
        for cid in ids:
            v = views[cid]
            avx_rate, bw_rate, un_rate = rates(placement[cid], zero)
            loss = 0.0 if v.heavy else avx_rate * v.usage
            out.append(loss + bw_rate * v.misses + un_rate * v.usage + stalls(cid, 0.0))
        return out


Inputs = Mapping[str, tuple[float, float, float, float, int]]  # usage, AVX usage, misses, bandwidth, requests


def sum_plain(inputs: Inputs, members: tuple[str, ...]) -> Group:
    """A group none of whose members is RDT-restricted: each field summed in member order.
    sum() adds floats one by one from 0, as sum_each does, only in C. Column by column with
    itemgetter: zip(*rows) would make an iterator per member (a thousand in a pool), each one
    an object for the garbage collector to count and visit."""
    if not members:
        return Group(members=[])
    rows = list(map(inputs.__getitem__, members))
    u, au, m, b, req = (sum(map(col, rows)) for col in _COLUMNS)
    return Group(members=list(members), u=u, au=au, m=m, mr=0.0, b=b, req=req)


_COLUMNS = tuple(itemgetter(i) for i in range(5))


def sum_each(inputs: Inputs, members: tuple[str, ...], restricted: frozenset[str]) -> Group:
    """A group's sums member by member, the misses of `restricted` ones apart (mr)."""
    u = au = m = mr = b = 0.0
    req = 0
    for cid in members:
        vu, vau, vm, vb, vreq = inputs[cid]
        r = cid in restricted
        u += vu
        au += vau
        mr += vm if r else 0.0
        m += 0.0 if r else vm
        b += vb
        req += vreq
    return Group(members=list(members), u=u, au=au, m=m, mr=mr, b=b, req=req)


def licence_by_core(core_of: Mapping[int, tuple[int, int, int]], cores: Mapping[tuple[int, int, int], frozenset[int]],
                    free_of: Mapping[int, float]) -> dict[int, float]:
    """Per CPU of a core with AVX-512 time: 1 - the product of its threads' `free_of` (1 - busy)."""
    free: dict[tuple[int, int, int], float] = {}
    for cpu, f in free_of.items():
        key = core_of[cpu]
        free[key] = free.get(key, 1.0) * f
    return {cpu: 1.0 - f for key, f in free.items() for cpu in cores[key]}


def licence_by_pairs(sibling: Mapping[int, int], free_of: Mapping[int, float]) -> dict[int, float]:
    """licence_by_core where every core has two threads: the product of the two factors (1.0
    for a thread without AVX-512 time) is the same in either order, so each thread gives its
    core's value without grouping by core."""
    out: dict[int, float] = {}
    get = free_of.get
    for cpu, f in free_of.items():
        s = sibling[cpu]
        out[s] = out[cpu] = 1.0 - f * get(s, 1.0)
    return out


def licence_by_busy_pairs(sibling: Mapping[int, int], avx_t: Mapping[int, float]) -> dict[int, float]:
    """licence_by_pairs(sibling, {cpu: 1 - min(1, a)}) in one pass over the cores: each core's
    value once, from its threads' factors (a product is the same in either order, and f * 1.0
    is f), without the intermediate map."""
    out: dict[int, float] = {}
    get = avx_t.get
    for cpu, a in avx_t.items():
        if cpu in out:
            continue
        s = sibling[cpu]
        b = get(s)
        f = 1.0 - (a if a < 1.0 else 1.0)
        out[s] = out[cpu] = 1.0 - (f * (1.0 - (b if b < 1.0 else 1.0)) if b is not None else f * 1.0)
    return out


def _add_scaled(into: dict[int, float], contrib: Mapping[int, float], share: float) -> None:
    """into[cpu] += x * share for every (cpu, x) of `contrib` (a plain loop: faster here than
    any set or map construction for a few hundred CPUs)."""
    get = into.get
    for cpu, x in contrib.items():
        into[cpu] = get(cpu, 0.0) + x * share


def move_cost(v: View, frm: frozenset[int], to: frozenset[int], idx: TopoIndex,
              config: RebalancerConfig) -> tuple[float, float, float]:
    """One-time cost of moving `v` from `frm` to `to`: (refill, migration, disruption) core-seconds.

    refill = LLC occupancy x (fraction of `to` in L3 domains `frm` did not use) / refill bandwidth;
    migration = resident memory x (fraction of memory nodes dropped) / migration bandwidth;
    disruption = a fixed cost per move. See docs/cost-model.md.
    """
    if frm == to:
        return (0.0, 0.0, 0.0)
    refill = (v.occupancy or 0.0) * _cold_fraction(idx, frm, to) / config.refill_bandwidth
    moved = _moved_fraction(idx, v.mems or idx.nodes_of(frm), to) if v.memory_bytes else 0.0
    return (refill, v.memory_bytes * moved / config.migration_bandwidth, config.disruption_core_seconds)


def move_costs(views: Mapping[str, View], placement: Placement, targets: Mapping[str, frozenset[int]],
               idx: TopoIndex, config: RebalancerConfig) -> dict[str, tuple[float, float, float]]:
    """`move_cost` of every container in `targets` (in its order)."""
    return dict(_move_parts(views, placement, targets, idx, config))


def move_cost_total(views: Mapping[str, View], placement: Placement, targets: Mapping[str, frozenset[int]],
                    idx: TopoIndex, config: RebalancerConfig) -> float:
    """sum(sum(c) for c in move_costs(...).values()): the same float operations in the same
    order, without keeping a tuple per container (the greedy loop needs the total of every
    candidate above the margin, the parts only of the one it picks; a thousand tuples kept per
    candidate are as many objects for the garbage collector, passing ones are not)."""
    total = 0  # as sum(): int 0 plus the first container's
    for _, (refill, migration, disruption) in _move_parts(views, placement, targets, idx, config):
        total += 0 + refill + migration + disruption  # sum() of the three, from int 0, left to right
    return total


_NO_MOVE = (0.0, 0.0, 0.0)


def _move_parts(views: Mapping[str, View], placement: Placement, targets: Mapping[str, frozenset[int]],
                idx: TopoIndex, config: RebalancerConfig) -> Iterator[tuple[str, tuple[float, float, float]]]:
    """(container, its move_cost) for each of `targets` in order; a decision moves hundreds of
    containers from a few cpusets to a few targets, so the fractions are looked up once per pair."""
    # per (from, to) pair: None when from == to, else (cold L3 fraction, moved memory fraction by
    # the container's memory nodes); consecutive containers mostly share the pair's objects
    pairs: dict[tuple[frozenset[int], frozenset[int]], tuple[float, dict[frozenset[int], float]] | None] = {}
    refill_bw, migration_bw = config.refill_bandwidth, config.migration_bandwidth
    disruption = config.disruption_core_seconds
    last_frm = last_to = pair = None
    for cid, to in targets.items():
        frm = placement[cid]
        if frm is to:
            yield cid, _NO_MOVE
            continue
        if frm is not last_frm or to is not last_to:
            last_frm, last_to = frm, to
            key = (frm, to)
            if key not in pairs:
                pairs[key] = None if frm == to else (_cold_fraction(idx, frm, to), {})
            pair = pairs[key]
        if pair is None:
            yield cid, _NO_MOVE
            continue
        v = views[cid]
        cold, moved_of = pair
        moved = moved_of.get(v.mems)
        if moved is None:
            moved = moved_of[v.mems] = _moved_fraction(idx, v.mems or idx.nodes_of(frm), to)
        # a container without resident memory migrates nothing (0 * fraction == 0.0)
        yield cid, ((v.occupancy or 0.0) * cold / refill_bw, v.memory_bytes * moved / migration_bw, disruption)


def _cold_fraction(idx: TopoIndex, frm: frozenset[int], to: frozenset[int]) -> float:
    """Fraction of `to` in L3 domains `frm` does not touch (where the cache starts cold)."""
    key = (frm, to)
    hit = idx.memo.get(key)
    if hit is None:
        old = idx.l3s_of(frm)
        hit = idx.memo[key] = (0.0 if idx.l3s_of(to) <= old else
                               sum(1 for c in to if idx.l3_of.get(c) not in old) / max(1, len(to)))
    return hit  # type: ignore[return-value]


def _moved_fraction(idx: TopoIndex, mems_from: frozenset[int], to: frozenset[int]) -> float:
    """Fraction of a container's memory nodes that cpuset.mems drops (pages to migrate)."""
    if not mems_from:
        return 0.0
    key = ("moved", mems_from, to)
    hit = idx.memo.get(key)
    if hit is None:
        hit = idx.memo[key] = len(mems_from - idx.nodes_of(to)) / len(mems_from)
    return hit  # type: ignore[return-value]
