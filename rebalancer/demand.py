"""Memory bandwidth as offered load: what a container would draw at idle memory latency.

A container's measured bandwidth is what it got, not what it asks for: on a NUMA node past the
knee of the loaded-latency curve every miss waits longer, the container retires fewer
instructions per CPU-second and so misses (and streams) less. Taken as a fixed demand, a stream
measured on a saturated node looks small, and the planner predicts an idle node where two such
streams end up saturating it (bench plan, `bandwidth_hog` observing the independent node). The
loaded-latency curve is a function of offered load, so the cost model is given the offered load:
with the PMU, per instruction

    T_now = 1 / ips_per_core,   stall_now = MPKI/1000 x L_idle x φ(ρ_now) / MLP

and at idle latency T_idle = T_now − stall_now (φ − 1)/φ; the container would draw
b × T_now / T_idle. ρ_now is the measured layout's utilization of the nodes the container runs
on (by the fraction of its CPUs there). Without the PMU (no instructions, no MPKI) the measured
bandwidth stays. Pure; docs/cost-model.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from rebalancer.config import RebalancerConfig
from rebalancer.inputs import View, with_bandwidth
from rebalancer.topoindex import TopoIndex


def offered(views: Mapping[str, View], placement: Mapping[str, frozenset[int]], idx: TopoIndex,
            config: RebalancerConfig, factor: object) -> dict[str, View]:
    """`views` with each measured bandwidth replaced by its offered load (see the module doc);
    `factor(ρ)` is the loaded-latency curve φ."""
    used: dict[int, float] = {}
    fracs: dict[frozenset[int], dict[int, float]] = {}
    for cid, v in views.items():
        if v.bandwidth > 0:
            f = fracs.get(placement[cid])
            if f is None:
                f = fracs[placement[cid]] = _node_fractions(idx, placement[cid])
            for n, x in f.items():
                used[n] = used.get(n, 0.0) + v.bandwidth * x
    if not used:
        return dict(views)
    phi = {n: factor(b / config.bandwidth_of(n)) for n, b in used.items()}  # type: ignore[operator]
    if all(p <= 1.0 for p in phi.values()):
        return dict(views)
    out = dict(views)
    per_mpki = config.memory_latency_seconds / config.memory_parallelism / 1000.0
    excess: dict[frozenset[int], float] = {}  # φ_now − 1 of each distinct cpuset
    for cid, v in views.items():
        if v.bandwidth <= 0 or not v.ips_per_core or v.mpki <= 0:
            continue
        cpus = placement[cid]
        e = excess.get(cpus)
        if e is None:
            e = excess[cpus] = sum(x * phi.get(n, 1.0) for n, x in fracs[cpus].items()) - 1.0
        if e <= 0.0:
            continue
        t_now = 1.0 / v.ips_per_core
        extra = v.mpki * per_mpki * e  # seconds per instruction the load adds
        out[cid] = with_bandwidth(v, v.bandwidth * t_now / max(t_now - extra, 0.1 * t_now))
    return out


def _node_fractions(idx: TopoIndex, cpus: frozenset[int]) -> dict[int, float]:
    out: dict[int, float] = {}
    for c in cpus:
        n = idx.node_of.get(c)
        if n is not None:
            out[n] = out.get(n, 0.0) + 1.0 / len(cpus)
    return out
