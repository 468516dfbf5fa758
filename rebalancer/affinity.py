"""Affinity and anti-affinity between containers as cost-model terms (docs/cost-model.md).

Each annotated container contributes pairs (it, a container its selector matches). How much two
containers share a scope is the Jaccard overlap of the domains their cpusets touch (cores, L3
domains or NUMA nodes): 1 when both are confined to the same one domain, 0 when they touch none
in common. Anti-affinity costs `weight x overlap` core-seconds per second; affinity is a benefit
of `weight x overlap` (a negative cost). A hard anti-affinity pair costs HARD_WEIGHT x overlap, so
the planner separates it whenever it can, and no decision may raise its overlap (planner.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from perfbalance.hints import AffinityTerm, HintKeys, affinity_terms
from perfbalance.model import Container
from rebalancer.topoindex import TopoIndex

HARD_WEIGHT = 10.0  # core-s/s: more than any measured gain the cost model predicts on one node
MAX_PAIRS = 4096  # bound on pairs per planning call (selectors matching everything on big nodes)


@dataclass(frozen=True, slots=True)
class Pair:
    a: str  # the annotated container
    b: str  # the container its selector matched
    kind: str  # "affinity" | "anti-affinity"
    scope: str  # "core" | "l3" | "numa"
    weight: float
    hard: bool
    term: str  # the term as written, for explanations

    @property
    def signed_weight(self) -> float:
        w = HARD_WEIGHT if self.hard else self.weight
        return w if self.kind == "anti-affinity" else -w


def pairs(containers: Iterable[Container], keys: HintKeys) -> tuple[Pair, ...]:
    """Every (annotated container, matched container) pair, in a stable order, bounded."""
    cs = sorted(containers, key=lambda c: c.id)
    out: list[Pair] = []
    for c in cs:
        for t in affinity_terms(c, keys) if c.annotations else ():  # terms are annotations
            out += [_pair(c.id, o.id, t) for o in cs if o.id != c.id and t.matches(o)]
            if len(out) >= MAX_PAIRS:
                return tuple(out[:MAX_PAIRS])
    return tuple(out)


def _pair(a: str, b: str, t: AffinityTerm) -> Pair:
    return Pair(a=a, b=b, kind=t.kind, scope=t.scope, weight=t.weight, hard=t.hard, term=t.describe())


def domains(idx: TopoIndex, scope: str, cpus: frozenset[int]) -> frozenset[object]:
    if scope == "core":
        return frozenset(idx.core_of[c] for c in cpus if c in idx.core_of)
    if scope == "l3":
        return idx.l3s_of(cpus)  # type: ignore[return-value]
    return idx.nodes_of(cpus)  # type: ignore[return-value]


def domain_cpus(idx: TopoIndex, scope: str, cpus: frozenset[int]) -> frozenset[int]:
    """All CPUs of the domains `cpus` touch at `scope`."""
    if scope == "core":
        return idx.whole_cores(cpus)
    table = idx.l3s if scope == "l3" else idx.nodes
    return frozenset().union(*(table[d] for d in domains(idx, scope, cpus)))  # type: ignore[index]


def overlap(idx: TopoIndex, p: Pair, placement: Mapping[str, frozenset[int]]) -> float:
    a, b = placement.get(p.a), placement.get(p.b)
    if not a or not b:
        return 0.0
    da, db = domains(idx, p.scope, a), domains(idx, p.scope, b)
    union = da | db
    return len(da & db) / len(union) if union else 0.0


def cost(idx: TopoIndex, ps: Iterable[Pair], placement: Mapping[str, frozenset[int]]) -> float:
    """Core-s/s: anti-affinity overlap costs, affinity overlap earns (negative)."""
    return sum(p.signed_weight * overlap(idx, p, placement) for p in ps)


def hard_worsened(idx: TopoIndex, ps: Iterable[Pair], before: Mapping[str, frozenset[int]],
                  after: Mapping[str, frozenset[int]]) -> Pair | None:
    """A hard anti-affinity pair whose overlap a change would raise (the constraint)."""
    for p in ps:
        if p.hard and overlap(idx, p, after) > overlap(idx, p, before) + 1e-9:
            return p
    return None
