"""The run-queue latency term of the planner: victims' predicted waits and breached targets.

Who is a victim is measured, not modelled (rebalancer/health.py): a latency-sensitive container
(named by annotation or config selector, with a run-queue p99 target) or any container whose
health score (CPU time got / wanted) is below `victim_health_threshold`. For each, the model
scales its measured wait W0 and p99 with the load its co-runners put on its CPUs:

    load(v) = Σ_G (u_G − u_v [v ∈ G]) · |G ∩ P_v| / |G| / |P_v|     (CPUs of demand per CPU of v)
    W(v)    = W0(v) · (b + load) / (b + load0),    p99(v) = p99_0(v) · (same factor)

with `load0` the load in the measured placement and b what the planner cannot place: the busy
cores of the node no container of the snapshot accounts for, spread over the online CPUs
(`Context.base_load`, from `node_metrics["cpu_busy_cores"]`), plus `latency_base_load` (kernel
threads, interrupts). Where most of a victim's wait comes from such unseen work, moving its
seen co-runners away is predicted to help little, as it does. A breached target costs like
Heracles' negative latency slack:

    breach(v) = latency_breach_cost · min(latency_breach_cap, max(0, p99(v)/target − 1))

L_lat = Σ_v W(v) + breach(v), in seconds per second (threads waiting), added to the cost
model's loss; its drop is part of a decision's benefit. The model is naive on purpose (it does
not know why a victim waits): the measured health after the move judges it (evaluate.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rebalancer.costmodel import Layout
from rebalancer.health import Health


@dataclass(frozen=True, kw_only=True)
class Victim:
    id: str
    health: Health
    target: float | None  # run-queue p99 target, seconds
    load0: float  # co-runner load in the measured placement


def co_load(layout: Layout, usage: Mapping[str, float], cid: str) -> float:
    """CPUs of other containers' demand landing on each of `cid`'s CPUs (see the docstring)."""
    mine = layout.placement.get(cid)
    if not mine:
        return 0.0
    total = 0.0
    for k, g in layout.groups.items():
        common = len(k & mine)
        if not common:
            continue
        u = g.u - (usage.get(cid, 0.0) if cid in g.members else 0.0)
        total += max(0.0, u) * common / len(k)
    return total / len(mine)


def factor(load: float, load0: float, base: float) -> float:
    return (base + load) / (base + load0)


def predicted(v: Victim, layout: Layout, usage: Mapping[str, float], base: float) -> tuple[float, float | None]:
    """(wait in s/s, p99 in s) of victim `v` in `layout`."""
    f = factor(co_load(layout, usage, v.id), v.load0, base)
    return v.health.wait * f, (v.health.p99 * f if v.health.p99 is not None else None)


def breach(p99: float | None, target: float | None, cost: float, cap: float) -> float:
    if p99 is None or target is None:
        return 0.0
    return cost * min(cap, max(0.0, p99 / target - 1.0))


def measured_loss(h: Health, target: float | None, *, cost: float, cap: float) -> float:
    """A victim's measured term of L_lat: its wait plus its breached target."""
    return h.wait + breach(h.p99, target, cost, cap)


def victim_loss(v: Victim, layout: Layout, usage: Mapping[str, float], *,
                base: float, cost: float, cap: float) -> float:
    """A victim's predicted term of L_lat in `layout` (equal to the measured one in the
    measured placement)."""
    wait, p99 = predicted(v, layout, usage, base)
    return wait + breach(p99, v.target, cost, cap)


def loss(victims: Mapping[str, Victim], layout: Layout, usage: Mapping[str, float], *,
         base: float, cost: float, cap: float) -> float:
    """L_lat of `layout`: the victims' predicted waits plus their breached targets."""
    return sum(victim_loss(v, layout, usage, base=base, cost=cost, cap=cap) for v in victims.values())


def is_victim(h: Health, target: float | None, threshold: float, *, load0: float, cpus: int) -> bool:
    """Latency-sensitive (has a target), or measured to get less than `threshold` of the CPU
    time it wants while its co-runners take more of its CPUs than it does itself. A container
    that fills its own CPUs waits behind its own threads: moving others away cannot cure that,
    and a victim without a target must be one a move can help."""
    if target is not None:
        return True
    return h.score < threshold and load0 > h.usage / max(1, cpus)
