"""Constraints no plan may violate, as pure checks shared by the planner and the tests.

* CPUs the kubelet dedicated (static policy) go to nobody else; `snapshot.reserved` CPUs (the
  agent puts reserved and, unless allowed, isolated CPUs there) go to nobody.
* Containers with `exclusive=True` never move.
* For every cpuset the planner hands out, the CPU requests of all containers whose cpuset lies
  within it, summed in milli-CPU and rounded up once (perfbalance.mcpu), fit in it.
* AVX-512 islands are whole cores; `cpuset.mems` is the NUMA nodes of the new CPUs.
* VM sandboxes (Kata, KubeVirt; `rebalancer.vm.Sandbox`): a sandboxed pod's demand is its vCPU
  need (`sandbox_vcpus`: VMM overhead + limits, rounded up once) placed on its mask (the OR of its
  workload containers' cpusets: Kata's pod sandbox container holding the VMM is no workload,
  `rebalancer.vm.vm_workloads`, the rule the applied pinning uses), not its containers'
  requests; its movable containers move together to one target; a workload's move keeps its
  number of CPUs on every host NUMA node (`check_numa_move`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from perfbalance import mcpu
from perfbalance.cpuset import CpuSet
from perfbalance.model import Action, Plan, Snapshot
from rebalancer.topoindex import TopoIndex
from rebalancer.vm import Sandbox, check_numa_move, sandboxes


def shareable(snapshot: Snapshot) -> frozenset[int]:
    """CPUs the planner may give to non-exclusive containers."""
    taken = set(snapshot.reserved.ids) | set(snapshot.kubelet.dedicated().ids)
    for s in snapshot.containers:
        if s.container.exclusive:
            taken |= s.container.cpuset.ids
    return frozenset(snapshot.topology.online.ids - taken)


def demand_mcpu(placement: Mapping[str, frozenset[int]], requests: Mapping[str, int],
                cpus: frozenset[int], vms: Sequence[Sandbox] = ()) -> int:
    """CPU demand placed within `cpus`, milli-CPU: the requests of containers outside VM
    sandboxes whose cpuset lies within it, plus the vCPUs of every sandbox whose mask does."""
    inside = {m for sb in vms for m in sb.members}
    need = mcpu.total(requests.get(cid, 0) for cid, s in placement.items()
                      if s and s <= cpus and cid not in inside)
    for sb in vms:
        mask = sandbox_mask(placement, sb)
        if mask and mask <= cpus:
            need += sb.mcpu
    return need


def sandbox_mask(placement: Mapping[str, frozenset[int]], sb: Sandbox) -> frozenset[int]:
    """Where the sandbox's vCPU threads may run: the OR of its workload containers' cpusets (the
    mask `rebalancer.vm.plan_vcpus` applies)."""
    return frozenset().union(*(placement.get(m, frozenset()) for m in sb.workloads))


def requests_fit(placement: Mapping[str, frozenset[int]], requests: Mapping[str, int],
                 cpus: frozenset[int], vms: Sequence[Sandbox] = ()) -> bool:
    """Demand placed within `cpus` (`demand_mcpu`), rounded up once, fits in `cpus`."""
    return mcpu.to_cpus(demand_mcpu(placement, requests, cpus, vms)) <= len(cpus)


def requests_needed(placement: Mapping[str, frozenset[int]], requests: Mapping[str, int],
                    cpus: frozenset[int], vms: Sequence[Sandbox] = ()) -> int:
    return mcpu.to_cpus(demand_mcpu(placement, requests, cpus, vms))


def numa_move_problem(idx: TopoIndex, snapshot: Snapshot, before: frozenset[int],
                      after: frozenset[int]) -> str | None:
    """`check_numa_move` for a VM-sandboxed container, with a cheap pre-check on the index."""
    if _per_node(idx, before) == _per_node(idx, after):
        return None
    return check_numa_move(topology=snapshot.topology, before=CpuSet(before), after=CpuSet(after))


def holder_move_problem(sb: Sandbox, placement: Mapping[str, frozenset[int]]) -> str | None:
    """Kata's pod sandbox container bounds the VMM's threads (its cgroup cpuset): moved, it must
    still hold the dedicated CPUs of the pod's pinned vCPUs, or they would lose their pinning."""
    if not sb.vmm_holder:
        return None
    held = placement.get(sb.vmm_holder, frozenset())
    pinned = frozenset().union(*(placement.get(m, frozenset()) for m in sb.workloads if m not in sb.movable))
    lost = pinned - held
    if not lost:
        return None
    return (f"its sandbox container {sb.vmm_holder} would hold {_fmt(held)}, without the dedicated "
            f"CPUs {_fmt(lost)} its pinned vCPUs need")


def _per_node(idx: TopoIndex, cpus: frozenset[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for c in cpus:
        n = idx.node_of.get(c, -1)
        out[n] = out.get(n, 0) + 1
    return out


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


def violations(snapshot: Snapshot, plan: Plan, *, vm_overhead_mcpu: int = 0) -> list[str]:
    """Every broken constraint of `plan` against `snapshot` (empty when the plan is sound).

    `vm_overhead_mcpu` must be the `RebalancerConfig.vm_overhead_mcpu` the plan was made with."""
    out: list[str] = []
    by_id = snapshot.by_id()
    idx = TopoIndex.build(snapshot.topology)
    placement = apply_actions(snapshot, plan.actions)
    requests = {s.id: s.container.request_mcpu for s in snapshot.containers}
    vms = sandboxes((s.container for s in snapshot.containers), overhead_mcpu=vm_overhead_mcpu,
                    vmms=snapshot.vmms)
    for a in plan.actions:
        if a.kind not in ("cpuset", "rollback") or (a.kind == "rollback" and a.undoes != "cpuset"):
            continue
        c = by_id[a.container].container
        cpus = frozenset(_ids(a.to))
        out += _placement_problems(snapshot, idx, a, c.exclusive, c.pod_uid, c.name, cpus)
        if a.kind == "cpuset" and not requests_fit(placement, requests, cpus, vms):
            out.append(f"{a.container}: requests within {a.to} need "
                       f"{requests_needed(placement, requests, cpus, vms)} CPUs")
    return out + _sandbox_violations(snapshot, idx, plan, placement, requests, vms)


def _sandbox_violations(snapshot: Snapshot, idx: TopoIndex, plan: Plan,
                        placement: Mapping[str, frozenset[int]], requests: Mapping[str, int],
                        vms: Sequence[Sandbox]) -> list[str]:
    moves = {a.container: frozenset(_ids(a.to)) for a in plan.actions if a.kind == "cpuset"}
    undo = {a.container: frozenset(_ids(a.to)) for a in plan.actions
            if a.kind == "rollback" and a.undoes == "cpuset"}
    before = {s.id: (s.container.cpuset.ids & idx.online) or idx.online for s in snapshot.containers}
    out: list[str] = []
    for sb in vms:
        moved = [m for m in sb.members if m in moves]
        if not moved:
            continue
        targets = {moves.get(m) for m in sb.movable}
        if len(targets) != 1 or None in targets:
            out.append(f"{sb.kind} pod {sb.pod}: only {moved} of {list(sb.movable)} move, or to "
                       "different CPUs")
        why = holder_move_problem(sb, placement) if sb.vmm_holder in moves else None
        if why:
            out.append(f"{sb.kind} pod {sb.pod}: {why}")
        mask = sandbox_mask(placement, sb)
        if not requests_fit(placement, requests, mask, vms):
            out.append(f"{sb.kind} pod {sb.pod}: demand within its mask {_fmt(mask)} needs "
                       f"{requests_needed(placement, requests, mask, vms)} CPUs")
    for sb in vms:
        for m in sb.workloads:  # the VMM's holder runs no vCPU: its CPUs per node are not the guest's
            to = moves.get(m, undo.get(m))
            why = None if to is None else numa_move_problem(idx, snapshot, before[m], to)
            if why:
                out.append(f"{m} ({sb.kind} pod {sb.pod}): {why}")
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
