"""SMT sibling sharing: what two busy hyperthreads of one physical core cost each other.

The water-filling model (rebalancer/sharing.py) gives every logical CPU a capacity of 1. Two
SMT threads of one core are not two cores: while both run, each gets `smt_speed` of the core's
throughput (~0.6, a yield of ~1.2 for the pair), so work placed on busy siblings is slower than
the same work on separate cores. The kernel knows this: `select_idle_sibling` looks for an idle
whole core before an idle thread, and the load balancer spreads tasks over cores before
doubling up. So the model assumes the busy time of a core's threads is packed: its threads run
together only for as long as the core's load exceeds one thread's worth,

    ℓ_k = Σ_{t∈k} load_t,  shared_k = ℓ_k − min(1, (n − ℓ_k)/(n − 1))   (ℓ_k > 1; n threads)

thread-seconds per second run beside a busy sibling (2 ℓ_k − 2 for n = 2), each losing
(1 − smt_speed) of its work. Exact when one sibling is always busy (a pinned busy loop), an
underestimate for two partly busy threads pinned to the two siblings (their overlap is then
by chance, not packed). Where whole cores sit in no container's cpuset (an emptied AVX-512
island), the loads are first those the load balancer leaves across L3 domains
(`balanced_loads`). Pure; formulas and sources in docs/cost-model.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rebalancer.topoindex import TopoIndex


def lost(loads: Mapping[int, float], idx: TopoIndex, speed: float) -> float:
    """Core-seconds per second lost to SMT sharing with `loads` (CPU -> its busy time).

    A whole-node term: sharing moves loss between co-runners (the one that leaves a core gains
    what its sibling's new neighbour loses), so it enters a decision's benefit, not the
    victims' predicted gain that the move is judged by afterwards (docs/cost-model.md)."""
    pairs, wider = _cores(idx)
    get = loads.get
    out = 0.0
    for a, b in pairs:  # two threads: they run side by side 2 l - 2 of the time
        load = get(a, 0.0) + get(b, 0.0)
        if load > 1.0 + 1e-12:
            out += 2.0 * load - 2.0
    for threads in wider:
        load = sum(get(c, 0.0) for c in threads)
        n = len(threads)
        if load > 1.0 + 1e-12:
            out += load - min(1.0, (n - load) / (n - 1))
    return (1.0 - speed) * out


def _cores(idx: TopoIndex) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, ...], ...]]:
    """The index's 2-thread cores as CPU pairs and its wider cores as tuples, once per index."""
    hit = idx.memo.get(("smt-cores",))
    if hit is None:
        cores = [tuple(sorted(t)) for t in idx.cores.values() if len(t) > 1]
        hit = idx.memo[("smt-cores",)] = (tuple(c for c in cores if len(c) == 2),  # type: ignore[misc]
                                          tuple(c for c in cores if len(c) > 2))
    return hit  # type: ignore[return-value]


def balanced_loads(keys: Sequence[frozenset[int]], contribs: Sequence[Mapping[int, float]],
                   loads: Mapping[int, float], idx: TopoIndex, shareable: frozenset[int]) -> Mapping[int, float]:
    """The per-CPU loads as the kernel's load balancer leaves them when shareable whole cores
    are in no container's cpuset (an emptied AVX-512 island): `loads` itself otherwise.

    The balancer compares L3 domains by the load and capacity of all their CPUs, not of the
    CPUs a task may use (kernel/sched/fair.c `update_sg_lb_stats` sums over the sched group's
    span), so a domain whose idle cores nobody may use looks as roomy as a whole one and keeps
    as many of a cpuset's threads: a group G spanning domains d takes, in each, its granted
    time in proportion to |G ∩ d| + the idle cores' CPUs in d, spread evenly over G ∩ d (each
    CPU held to [0, 1]). The kernel's `sg_imbalanced` retry after a pinned task blocked a pull
    can undo part of it; the model does not count on that. `keys`: the groups' cpusets in
    water-filling order (smallest first), `contribs`: each one's granted time per CPU."""
    unused = _unused(keys, shareable, idx)
    if not unused:
        return loads
    out: dict[int, float] | None = None
    for cpus, contrib in zip(keys, contribs):
        doms = sorted(idx.l3s_of(cpus))
        idle = [len(unused & idx.l3s[d]) for d in doms]
        if len(doms) < 2 or not any(idle):
            continue
        allowed = [sorted(cpus & idx.l3s[d]) for d in doms]
        weights = [len(a) + n for a, n in zip(allowed, idle)]
        granted = sum(contrib.values())
        out = dict(loads) if out is None else out
        for here, w in zip(allowed, weights):
            delta = (granted * w / sum(weights) - sum(contrib.get(c, 0.0) for c in here)) / len(here)
            for c in here:
                out[c] = min(1.0, max(0.0, out.get(c, 0.0) + delta))
    return loads if out is None else out


def _unused(keys: Sequence[frozenset[int]], shareable: frozenset[int], idx: TopoIndex) -> frozenset[int]:
    """Shareable CPUs of whole cores that no group's cpuset holds (none when a group holds the
    whole shareable pool, the common case: the largest cpusets come last, so one subset test)."""
    if any(len(k) >= len(shareable) and shareable <= k for k in reversed(keys)):
        return frozenset()
    return idx.full_cores_within(shareable.difference(*keys))
