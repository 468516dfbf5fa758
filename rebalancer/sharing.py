"""How CPU time is shared when cpusets overlap: a water-filling model of CFS load balancing.

A group of containers with the same cpuset asks for `demand` CPUs of time; the scheduler spreads
it over the least loaded CPUs of its set. Groups with the smallest sets are served first (they
have nowhere else to go), ties broken by the sorted CPU list so the result is deterministic.
Used by both the planner's cost model and the node simulator, so both agree on who gets the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence


def fill_order(cpus: frozenset[int]) -> tuple[int, tuple[int, ...]]:
    return (len(cpus), tuple(sorted(cpus)))


def water_fill(groups: Sequence[tuple[frozenset[int], float]],
               ) -> tuple[list[dict[int, float]], dict[int, float]]:
    """Per group, the CPU time it gets on each of its CPUs; and the total load per CPU (<= 1).

    `groups` must already be in `fill_order`. A group's granted time is the sum of its dict.
    """
    loads: dict[int, float] = {}
    out: list[dict[int, float]] = []
    for cpus, demand in groups:
        contrib = _fill_one(loads, cpus, demand)
        for cpu, x in contrib.items():
            loads[cpu] = loads.get(cpu, 0.0) + x
        out.append(contrib)
    return out, loads


def _fill_one(loads: dict[int, float], cpus: frozenset[int], demand: float) -> dict[int, float]:
    if demand <= 0.0 or not cpus:
        return {}
    get = loads.get
    cur = [(get(c, 0.0), c) for c in cpus]
    lo, hi = min(cur)[0], max(cur)[0]
    if lo == hi:  # all CPUs equally loaded (often all idle): no sort needed
        level = min(1.0, lo + demand / len(cpus))
        return dict.fromkeys(cpus, level - lo) if level > lo else {}
    cur.sort()
    level = _level(cur, demand)
    return {c: level - load for load, c in cur if load < level}


def _level(cur: list[tuple[float, int]], demand: float) -> float:
    """The water level: filling every CPU below it up to it uses `demand` (capped at 1)."""
    prefix = 0.0
    for k, (load, _) in enumerate(cur, start=1):
        prefix += load
        level = (demand + prefix) / k
        nxt = cur[k][0] if k < len(cur) else 1.0
        if level <= nxt or k == len(cur):
            return min(level, 1.0)
    return 1.0
