"""Constraints no plan may violate, as pure checks shared by the planner and the tests.

* CPUs the kubelet dedicated (static policy) go to nobody else; `snapshot.reserved` CPUs (the
  agent puts reserved and, unless allowed, isolated CPUs there) go to nobody.
* Containers with `exclusive=True` never move.
* For every cpuset the planner hands out, the CPU requests of all containers whose cpuset lies
  within it, summed in milli-CPU and rounded up once (perfbalance.mcpu), fit in it.
* AVX-512 islands are whole cores; `cpuset.mems` is the NUMA nodes of the new CPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from perfbalance import mcpu
from perfbalance.cpuset import CpuSet
from perfbalance.model import Action, Plan, Snapshot
from rebalancer.topoindex import TopoIndex


def shareable(snapshot: Snapshot) -> frozenset[int]:
    """CPUs the planner may give to non-exclusive containers."""
    taken = set(snapshot.reserved.ids) | set(snapshot.kubelet.dedicated().ids)
    for s in snapshot.containers:
        if s.container.exclusive:
            taken |= s.container.cpuset.ids
    return frozenset(snapshot.topology.online.ids - taken)


def requests_fit(placement: Mapping[str, frozenset[int]], requests: Mapping[str, int],
                 cpus: frozenset[int]) -> bool:
    """Requests of containers placed within `cpus`, rounded up once, fit in `cpus`."""
    need = mcpu.total(requests.get(cid, 0) for cid, s in placement.items() if s and s <= cpus)
    return mcpu.to_cpus(need) <= len(cpus)


def requests_needed(placement: Mapping[str, frozenset[int]], requests: Mapping[str, int],
                    cpus: frozenset[int]) -> int:
    return mcpu.to_cpus(mcpu.total(requests.get(cid, 0) for cid, s in placement.items()
                                   if s and s <= cpus))


def spans_needlessly(idx: TopoIndex, free: frozenset[int], cpus: frozenset[int]) -> bool:
    """`cpus` spans NUMA nodes although one node alone has that many usable CPUs."""
    return len(idx.nodes_of(cpus)) > 1 and any(len(n & free) >= len(cpus) for n in idx.nodes.values())


def apply_actions(snapshot: Snapshot, actions: Iterable[Action]) -> dict[str, frozenset[int]]:
    """Container placement after the cpuset (and rollback) actions."""
    placement = {s.id: s.container.cpuset.ids for s in snapshot.containers}
    for a in actions:
        if a.kind == "cpuset" or (a.kind == "rollback" and a.undoes == "cpuset"):
            placement[a.container] = frozenset(_ids(a.to))
    return placement


def _ids(text: str) -> set[int]:
    return set(CpuSet.parse(text).ids)


def violations(snapshot: Snapshot, plan: Plan) -> list[str]:
    """Every broken constraint of `plan` against `snapshot` (empty when the plan is sound)."""
    out: list[str] = []
    by_id = snapshot.by_id()
    idx = TopoIndex.build(snapshot.topology)
    placement = apply_actions(snapshot, plan.actions)
    requests = {s.id: s.container.request_mcpu for s in snapshot.containers}
    for a in plan.actions:
        if a.kind not in ("cpuset", "rollback") or (a.kind == "rollback" and a.undoes != "cpuset"):
            continue
        c = by_id[a.container].container
        cpus = frozenset(_ids(a.to))
        out += _placement_problems(snapshot, idx, a, c.exclusive, c.pod_uid, c.name, cpus)
        if a.kind == "cpuset" and not requests_fit(placement, requests, cpus):
            out.append(f"{a.container}: requests within {a.to} need "
                       f"{requests_needed(placement, requests, cpus)} CPUs")
    return out


def _placement_problems(snapshot: Snapshot, idx: TopoIndex, a: Action, exclusive: bool,
                        pod_uid: str, name: str, cpus: frozenset[int]) -> list[str]:
    out = []
    if exclusive:
        out.append(f"{a.container}: exclusive container moved")
    if not cpus or not cpus <= idx.online:
        out.append(f"{a.container}: target {a.to} empty or offline")
    if cpus & snapshot.reserved.ids:
        out.append(f"{a.container}: target {a.to} uses reserved CPUs {snapshot.reserved}")
    if cpus & snapshot.kubelet.dedicated_to_others(pod_uid, name).ids:
        out.append(f"{a.container}: target {a.to} uses CPUs the kubelet dedicated to others")
    if a.mems and a.mems != _fmt(idx.nodes_of(cpus)):
        out.append(f"{a.container}: mems {a.mems} do not follow CPUs {a.to}")
    if a.detail.get("avx512_island") and idx.whole_cores(cpus) != cpus:
        out.append(f"{a.container}: AVX-512 island {a.to} is not whole cores")
    if a.detail.get("allocated") and spans_needlessly(idx, shareable(snapshot), cpus):
        out.append(f"{a.container}: {a.to} spans NUMA nodes though it fits in one")
    return out


def _fmt(ids: Iterable[int]) -> str:
    return str(CpuSet(ids))
