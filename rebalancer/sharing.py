"""How CPU time is shared when cpusets overlap: a water-filling model of CFS load balancing.

A group of containers with the same cpuset asks for `demand` CPUs of time; the scheduler spreads
it over the least loaded CPUs of its set. Groups with the smallest sets are served first (they
have nowhere else to go), ties broken by the sorted CPU list so the result is deterministic.
Used by both the planner's cost model and the node simulator, so both agree on who gets the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


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
        out.append(_fill_one(loads, cpus, demand))
    return out, loads


def water_fill_from(groups: Sequence[tuple[frozenset[int], float]],
                    prior: Mapping[frozenset[int], tuple[float, dict[int, float]]],
                    gone: Sequence[tuple[int, frozenset[int]]],
                    ) -> tuple[list[dict[int, float]], dict[int, float]]:
    """water_fill(groups), exactly, for a layout that differs from an earlier one in a few groups.

    `prior`: the earlier layout's groups, cpuset -> (demand, grants); `gone`: its groups that
    are absent now, as (index in `groups` of the first group filled after it, cpuset), by index.
    A group's grants depend only on its demand and on the loads its CPUs carry when its turn
    comes, which are the grants of the groups filled before it on those CPUs: a group with the
    demand it had, none of whose CPUs a changed, new or vanished group filled before it touched
    ("dirty" CPUs), gets the grants it got (the same dict), and adds them to the loads as
    `_fill_one` would. Any other group is filled afresh and dirties its CPUs.
    """
    loads: dict[int, float] = {}
    out: list[dict[int, float]] = []
    dirty: set[int] = set()
    g, get = 0, loads.get
    for i, (cpus, demand) in enumerate(groups):
        while g < len(gone) and gone[g][0] <= i:
            dirty |= gone[g][1]
            g += 1
        was = prior.get(cpus)
        if was is not None and was[0] == demand and cpus.isdisjoint(dirty):
            contrib = was[1]
            for c, x in contrib.items():  # as _fill_one: an idle CPU's load is x (0.0 + x)
                loads[c] = get(c, 0.0) + x
        else:
            contrib = _fill_one(loads, cpus, demand)
            dirty |= cpus
        out.append(contrib)
    return out, loads


def _fill_one(loads: dict[int, float], cpus: frozenset[int], demand: float) -> dict[int, float]:
    """The group's time per CPU, added to `loads` (each CPU's new load is its old load plus the
    time granted there, in that order; an idle CPU's is the time itself, as 0.0 + x == x)."""
    if demand <= 0.0 or not cpus:
        return {}
    busy = cpus & loads.keys()  # loads hold only CPUs given time (> 0); the rest are idle
    if not busy:  # all CPUs idle: no sort needed
        level = min(1.0, demand / len(cpus))
        if level <= 0.0:
            return {}
        out = dict.fromkeys(cpus, level)
        loads.update(out)
        return out
    cur = sorted([(loads[c], c) for c in busy])
    idle = len(cpus) - len(cur)
    if not idle and cur[0][0] == cur[-1][0]:  # all CPUs equally loaded
        lo = cur[0][0]
        level = min(1.0, lo + demand / len(cpus))
        if level <= lo:
            return {}
        out = dict.fromkeys(cpus, level - lo)
        loads.update(dict.fromkeys(cpus, lo + (level - lo)))
        return out
    level = _level(cur, demand, idle)
    out = dict.fromkeys(sorted(cpus - busy), level) if idle else {}
    loads.update(out)
    for load, c in cur:
        if load >= level:
            break
        x = out[c] = level - load
        loads[c] = load + x
    return out


def _level(cur: list[tuple[float, int]], demand: float, idle: int) -> float:
    """The water level: filling every CPU below it up to it uses `demand` (capped at 1).

    `cur`: the busy CPUs' (load, cpu), sorted; `idle` CPUs with no load come before them (no
    level below the first busy load can stop among them: it would need demand <= 0)."""
    prefix = 0.0
    if idle:
        level = demand / idle
        if level <= (cur[0][0] if cur else 1.0):
            return min(level, 1.0)
    for k, (load, _) in enumerate(cur, start=idle + 1):
        prefix += load
        level = (demand + prefix) / k
        i = k - idle
        nxt = cur[i][0] if i < len(cur) else 1.0
        if level <= nxt or i == len(cur):
            return min(level, 1.0)
    return 1.0
