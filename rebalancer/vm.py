"""VM sandboxes (Kata, KubeVirt), the pure part: vCPU sizing, vCPU pinning plans, guest NUMA.

A container in a VM sandbox runs on the VMM's vCPU threads, not on the processes in its own
cgroup. The kubelet's cpusets therefore mean nothing to the VM unless someone translates them:

* the sandbox mask (the mandatory part of the Kata cpu-manager proposal): vCPU threads may run on
  the OR of the sandbox's workload containers' cpusets (not the pod sandbox container's, which
  holds the VMM in Kata's per-container layout) and nowhere else; helper threads (main loop, I/O
  threads, vhost workers) go to the shared pool, never onto CPUs dedicated to containers
  (bergwolf's design); every thread within the VMM cgroup's cpuset, which the kernel enforces;
* 1:1 pinning (the proposal's second part): each CPU dedicated to a container gets its own vCPU,
  the host CPU <-> vCPU mapping is kept stable across moves and translates a container's host
  cpuset into the guest vCPU ids the in-guest agent must apply (so `nproc` inside matches);
* sizing (Kata PR #7623): the vCPUs a sandbox needs are the VMM overhead plus the containers'
  limits, summed in milli-CPU and rounded up once;
* guest NUMA (KubeVirt PR "numa topology passthrough"): guest nodes whose vCPUs are pinned to one
  host node each, hugepages split as evenly as possible, and moves that keep vCPUs per host node.

Everything here is a pure function of values: `agent/discover/vmm.py` finds the threads (into
`Snapshot.vmms`), `plan_vcpus` turns them into `Plan.vcpu_pinning`, and `agent/act/vcpu.py` applies it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from perfbalance import mcpu
from perfbalance.cpuset import CpuSet, union
from perfbalance.errors import PerfbalanceError
from perfbalance.model import Action, Container, KubeletState, Snapshot
from perfbalance.sandbox import GuestNode, PodHugepages, VcpuPinning, VmmProcess
from perfbalance.topology import Topology

HUGEPAGE_2M = 2 << 20


class VmLayoutError(PerfbalanceError, ValueError):
    """A VM layout (pinning, guest NUMA, hugepages, vCPU translation) cannot be built as asked."""

    def __init__(self, what: str, value: object, reason: str) -> None:
        self.what, self.value, self.reason = what, value, reason
        super().__init__(f"{what}: {reason}: {value!r}")


# -- sizing ---------------------------------------------------------------------------------------

def vcpus_needed(*, overhead_mcpu: int, limits_mcpu: Iterable[int | None]) -> int:
    """vCPUs a sandbox needs: VMM overhead + containers' CPU limits, in mCPU, rounded up once.

    A container without a limit (None) adds nothing; the VM always has at least one vCPU.
    overhead 0 + no limits -> 1; 750 + 250 -> 1; 750 + 1200 -> 2 (not 1 + ceil(1.2) = 3).
    """
    if overhead_mcpu < 0:
        raise VmLayoutError("VMM overhead", overhead_mcpu, "must be >= 0 mCPU")
    limits = [lim for lim in limits_mcpu if lim is not None]
    if any(lim < 0 for lim in limits):
        raise VmLayoutError("container limits", limits, "must be >= 0 mCPU")
    return max(1, mcpu.to_cpus(overhead_mcpu + mcpu.total(limits)))


def sandbox_vcpus(containers: Iterable[Container], *, overhead_mcpu: int) -> int:
    """`vcpus_needed` for a sandbox's containers (their `limit_mcpu`): the planner's capacity."""
    return vcpus_needed(overhead_mcpu=overhead_mcpu, limits_mcpu=(c.limit_mcpu for c in containers))


# -- the planner's view of a sandbox ---------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Sandbox:
    """A VM-sandboxed pod as the planner sees it: one unit of CPU demand and of movement.

    Its `movable` containers (those without kubelet-dedicated CPUs) move together, to one
    target, or not at all. Its `workloads` are the members whose work runs on the vCPUs: all but
    the pod sandbox container that holds the VMM in Kata's per-container layout
    (`vm_workloads`, the rule the applied pinning uses). The vCPUs' mask is the OR of the
    workloads' cpusets, and its CPU demand on that mask is `vcpus` whole CPUs (`sandbox_vcpus`
    of the workloads), not the containers' requests."""

    pod: str
    kind: str  # "kata" | "kubevirt" | whatever pod metadata said
    members: tuple[str, ...]  # container ids, sorted
    movable: tuple[str, ...]  # members without dedicated CPUs, sorted
    vcpus: int
    workloads: tuple[str, ...]  # members whose cpusets make the vCPUs' mask, sorted
    vmm_holder: str = ""  # the member left out of `workloads` (Kata's pod sandbox container), or ""

    @property
    def movable_workloads(self) -> tuple[str, ...]:
        """Movable members that run on the floating vCPUs (their cpuset is the mask's shape)."""
        return tuple(m for m in self.movable if m in self.workloads)

    @property
    def mcpu(self) -> int:
        return self.vcpus * mcpu.MILLI


def sandboxes(containers: Iterable[Container], *, overhead_mcpu: int,
              vmms: Iterable[VmmProcess] = ()) -> tuple[Sandbox, ...]:
    """The VM sandboxes among `containers`: pods (by `Container.pod_key`) with a container whose `sandbox`
    is set. A negative limit (never valid) counts as no limit rather than stopping the planner.

    `vmms` (`Snapshot.vmms`) say which container holds each pod's VMM; `vm_workloads` then
    leaves Kata's pod sandbox container out of the workloads, as the applied pinning does.
    A pod whose VMM was not found counts every container."""
    containers = list(containers)
    if not any(c.sandbox for c in containers):  # most nodes: no VM pod, no pod keys to build
        return ()
    pods: dict[str, list[Container]] = {}
    for c in containers:
        pods.setdefault(c.pod_key, []).append(c)
    vmm_of = {v.pod: v for v in vmms}
    out = []
    for key, cs in sorted(pods.items()):
        kinds = sorted({c.sandbox for c in cs if c.sandbox})
        if not kinds:
            continue
        work = vm_workloads(cs, vmm_of[key]) if key in vmm_of else list(cs)
        sane = [c for c in work if c.limit_mcpu is None or c.limit_mcpu >= 0]
        holder = sorted({c.id for c in cs} - {c.id for c in work})
        out.append(Sandbox(pod=key, kind=kinds[0], members=tuple(sorted(c.id for c in cs)),
                           movable=tuple(sorted(c.id for c in cs if not c.exclusive)),
                           vcpus=sandbox_vcpus(sane, overhead_mcpu=max(0, overhead_mcpu)),
                           workloads=tuple(sorted(c.id for c in work)),
                           vmm_holder=holder[0] if holder else ""))
    return tuple(out)


# -- where helper threads may run -----------------------------------------------------------------

def shared_pool(*, online: CpuSet, kubelet: KubeletState, reserved: CpuSet,
                containers: Iterable[Container] = ()) -> CpuSet:
    """The kubelet's shared pool: defaultCpuSet (all online CPUs without a static policy), minus
    reserved CPUs and minus every CPU dedicated to a container (kubelet state or `exclusive`)."""
    base = kubelet.default_cpuset if kubelet.default_cpuset else online
    dedicated = kubelet.dedicated() | union(c.cpuset for c in containers if c.exclusive)
    return (base & online if online else base) - reserved - dedicated


# -- 1:1 pinning and the host <-> vCPU mapping -----------------------------------------------------

VcpuMap = Mapping[str, Mapping[int, int]]  # container id -> host cpu -> vCPU index


@dataclass(frozen=True, kw_only=True)
class Pinning:
    """Which vCPU each dedicated host CPU got, per container, and what could not be done."""

    mapping: Mapping[str, Mapping[int, int]]
    problems: tuple[str, ...] = ()

    @property
    def pinned(self) -> dict[int, int]:
        """vCPU index -> host CPU over all containers."""
        return {v: h for m in self.mapping.values() for h, v in m.items()}


def map_vcpus(*, exclusive: Mapping[str, CpuSet], vcpus: Iterable[int],
              previous: VcpuMap | None = None, system_vcpus: int = 1,
              topology: Topology | None = None) -> Pinning:
    """Give every CPU dedicated to a container its own vCPU, keeping earlier pairs where possible.

    Pairs of `previous` whose host CPU is still the container's and whose vCPU still exists are
    kept. A container's new host CPUs take the vCPUs its dropped CPUs released (on the same host
    NUMA node first, when `topology` is given), then free vCPUs, the lowest `system_vcpus`
    indices last (they stay unpinned for the guest's own work when there are enough). A container
    that cannot get one vCPU per dedicated CPU gets no pinning at all, and a problem says why.
    """
    previous = previous or {}
    free = set(vcpus)
    kept: dict[str, dict[int, int]] = {}
    for cid in sorted(exclusive):
        kept[cid] = {}
        for host, v in sorted(previous.get(cid, {}).items()):
            if host in exclusive[cid] and v in free:
                kept[cid][host] = v
                free.discard(v)
    mapping: dict[str, dict[int, int]] = {}
    problems: list[str] = []
    for cid in sorted(exclusive):
        others = {v for o, m in previous.items() if o != cid for v in m.values()}
        pairs = _complete(exclusive[cid], kept[cid], free, previous.get(cid, {}),
                          _Prefs(system_vcpus=system_vcpus, others=others, topology=topology))
        if pairs is None:
            free.update(kept[cid].values())
            problems.append(f"container {cid}: {len(exclusive[cid])} dedicated CPUs "
                            f"({exclusive[cid]}) but only {len(free)} unpinned vCPUs left; "
                            "its vCPUs float over the sandbox mask")
            continue
        mapping[cid] = pairs
    return Pinning(mapping=mapping, problems=tuple(problems))


@dataclass(frozen=True, kw_only=True)
class _Prefs:
    system_vcpus: int
    others: set[int]  # vCPUs other containers held before: taken last, so they can get them back
    topology: Topology | None


def _complete(cpus: CpuSet, kept: dict[int, int], free: set[int], before: Mapping[int, int],
              prefs: _Prefs) -> dict[int, int] | None:
    todo = [h for h in cpus if h not in kept]
    if len(todo) > len(free):
        return None
    pairs = dict(kept)
    released = {v: h for h, v in before.items() if v in free}
    for host in todo:
        v = _pick(host, released, free, prefs)
        pairs[host] = v
        free.discard(v)
        released.pop(v, None)
    return dict(sorted(pairs.items()))


def _pick(host: int, released: Mapping[int, int], free: set[int], prefs: _Prefs) -> int:
    if released:
        if prefs.topology is not None:
            node = _node(prefs.topology, host)
            same = [v for v, h in sorted(released.items()) if _node(prefs.topology, h) == node]
            if same:
                return same[0]
        return min(released)
    return min(free, key=lambda v: (v in prefs.others, v < prefs.system_vcpus, v))


def _node(topology: Topology, cpu: int) -> int:
    try:
        return topology.cpu(cpu).node
    except KeyError:
        return -1


def to_guest(mapping: Mapping[int, int], host: CpuSet, *, container: str = "") -> CpuSet:
    """The guest vCPU ids a host cpuset corresponds to under `mapping` (host cpu -> vCPU).

    This is what the in-guest agent must apply as the container's cpuset (host CPUs
    4-6 pinned to vCPUs 1-3 are vCPUs 1-3 inside). Every host CPU must be mapped."""
    missing = host - CpuSet(mapping)
    if missing:
        raise VmLayoutError(f"host cpuset of {container or 'container'}", str(host),
                            f"host CPUs {missing} have no vCPU pinned to them")
    return CpuSet(mapping[h] for h in host)


def to_host(mapping: Mapping[int, int], guest: CpuSet, *, container: str = "") -> CpuSet:
    """The inverse of `to_guest`: host CPUs under the given vCPU ids."""
    back = {v: h for h, v in mapping.items()}
    missing = guest - CpuSet(back)
    if missing:
        raise VmLayoutError(f"guest cpuset of {container or 'container'}", str(guest),
                            f"vCPUs {missing} are not pinned to a host CPU")
    return CpuSet(back[v] for v in guest)


# -- the affinity plan of one sandbox --------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class SandboxPlan:
    """Where every thread of one VM sandbox should run, and what the guest should be told."""

    mask: CpuSet  # OR of the sandbox's containers' cpusets
    pool: CpuSet  # the node's shared pool
    vcpu_affinity: Mapping[int, CpuSet]  # vCPU index -> host CPUs
    helper_affinity: CpuSet
    mapping: Mapping[str, Mapping[int, int]]  # container id -> host cpu -> vCPU
    guest_cpusets: Mapping[str, CpuSet]  # container id -> vCPU ids to apply inside the guest
    problems: tuple[str, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())  # how the VMM's cgroup bounds the plan (not errors)


def plan_sandbox(*, containers: Sequence[Container], vcpus: Iterable[int], pool: CpuSet,
                 previous: VcpuMap | None = None, system_vcpus: int = 1,
                 pin_exclusive: bool = True, topology: Topology | None = None,
                 allowed: CpuSet = CpuSet()) -> SandboxPlan:
    """Plan the affinity of a sandbox's vCPU and helper threads.

    Dedicated CPUs of `exclusive` containers each get one vCPU pinned 1:1 (when `pin_exclusive`);
    the other vCPUs float over the sandbox mask minus those CPUs (or the pool when nothing is
    left: the guest's own work then shares the pool, as bergwolf proposed); helpers get the pool.
    Every thread stays within `allowed`, the VMM cgroup's cpuset (the kernel refuses an affinity
    outside it): KubeVirt's compute container holds only its dedicated CPUs, so there the
    helpers and unpinned vCPUs share those CPUs, and a note says so. Empty sets fall back to the
    sandbox mask so that no thread is ever left without a CPU.
    """
    vcpu_ids = sorted(set(vcpus))
    mask = union(c.cpuset for c in containers)
    exclusive, notes = _pinnable(containers, allowed)
    pinning = (map_vcpus(exclusive=exclusive, vcpus=vcpu_ids, previous=previous,
                         system_vcpus=system_vcpus, topology=topology)
               if pin_exclusive else Pinning(mapping={}))
    problems = list(pinning.problems)
    pinned = pinning.pinned
    clip = _within(allowed)
    floating_cpus = _first_nonempty(clip(mask - CpuSet(pinned.values())), clip(pool), clip(mask),
                                    allowed, mask)
    helpers = _first_nonempty(clip(pool), floating_cpus, mask)
    if mask and not clip(mask):
        notes.append(f"the sandbox mask {mask} lies outside the VMM's cgroup cpuset {allowed}; "
                     f"its vCPUs run on {floating_cpus} instead")
    if not pool:
        problems.append(f"shared pool is empty; helper threads run on {helpers} instead")
    elif not clip(pool):
        notes.append(f"the shared pool {pool} lies outside the VMM's cgroup cpuset {allowed}; "
                     f"helper threads run on {helpers} instead")
    affinity = {v: CpuSet([pinned[v]]) if v in pinned else floating_cpus for v in vcpu_ids}
    floating = CpuSet(v for v in vcpu_ids if v not in pinned)
    if not floating and len(pinning.mapping) < len(containers):
        problems.append("every vCPU is pinned; shared containers run on all vCPUs in the guest")
    guest = {c.id: CpuSet(pinning.mapping[c.id].values()) if c.id in pinning.mapping
             else (floating or CpuSet(vcpu_ids)) for c in containers}
    return SandboxPlan(mask=mask, pool=pool, vcpu_affinity=affinity, helper_affinity=helpers,
                       mapping=pinning.mapping, guest_cpusets=guest, problems=tuple(problems),
                       notes=tuple(notes))


def _pinnable(containers: Sequence[Container], allowed: CpuSet) -> tuple[dict[str, CpuSet], list[str]]:
    """Dedicated cpusets to pin 1:1: those within `allowed` (a vCPU cannot be pinned to a CPU its
    cgroup leaves out), and a note for each that is not."""
    exclusive = {c.id: c.cpuset for c in containers if c.exclusive and c.cpuset}
    outside = {cid: cpus for cid, cpus in exclusive.items() if allowed and not cpus <= allowed}
    notes = [f"container {cid}: dedicated CPUs {cpus} lie outside the VMM's cgroup cpuset "
             f"{allowed}; its vCPUs are not pinned" for cid, cpus in sorted(outside.items())]
    return {cid: cpus for cid, cpus in exclusive.items() if cid not in outside}, notes


def _within(allowed: CpuSet) -> Callable[[CpuSet], CpuSet]:
    return (lambda s: s & allowed) if allowed else (lambda s: s)


def _first_nonempty(*sets: CpuSet) -> CpuSet:
    for s in sets:
        if s:
            return s
    return CpuSet()


# -- guest NUMA ---------------------------------------------------------------------------------------

def split_hugepages(total: int, nodes: int) -> tuple[int, ...]:
    """Split `total` hugepages over `nodes` guest nodes as evenly as possible, the remainder going
    one page each to the first nodes. Fewer pages than nodes is refused: a node without memory is
    not a NUMA node a guest can boot with (KubeVirt rejects such a VM the same way)."""
    if nodes <= 0:
        raise VmLayoutError("guest NUMA nodes", nodes, "need at least one")
    if total < nodes:
        raise VmLayoutError("hugepages", total,
                            f"a VM with {nodes} guest NUMA nodes needs at least {nodes} hugepages "
                            "(one per node)")
    share, rest = divmod(total, nodes)
    return tuple(share + (1 if i < rest else 0) for i in range(nodes))


def guest_numa(*, pins: Mapping[int, int], topology: Topology, hugepages: int,
               page_size_bytes: int = HUGEPAGE_2M) -> tuple[GuestNode, ...]:
    """Guest NUMA nodes for a VM whose vCPUs are pinned 1:1 (`pins`: vCPU -> host CPU).

    One guest node per host node the vCPUs are pinned to, so each guest node's vCPUs sit on one
    host node and it has no more CPUs than that node. Guest nodes are numbered in the order of
    their lowest vCPU (vCPU 0, the boot CPU, is on guest node 0). `hugepages` 0: a VM without
    hugepages, whose nodes get no memory of their own in the layout."""
    if not pins:
        raise VmLayoutError("vCPU pinning", {}, "guest NUMA needs at least one pinned vCPU")
    _check_pins(pins, topology)
    groups: dict[int, list[int]] = {}
    for v in sorted(pins):
        groups.setdefault(topology.cpu(pins[v]).node, []).append(v)
    host_nodes = topology.nodes()
    order = sorted(groups, key=lambda n: min(groups[n]))
    pages = split_hugepages(hugepages, len(order)) if hugepages else (0,) * len(order)
    out = []
    for gid, node in enumerate(order):
        vs = CpuSet(groups[node])
        if len(vs) > len(host_nodes[node]):
            raise VmLayoutError(f"guest node {gid}", str(vs),
                                f"more vCPUs than host node {node} has CPUs ({host_nodes[node]})")
        out.append(GuestNode(id=gid, vcpus=vs, host_node=node,
                             host_cpus=CpuSet(pins[v] for v in vs), hugepages=pages[gid],
                             memory_bytes=pages[gid] * page_size_bytes))
    return tuple(out)


def _check_pins(pins: Mapping[int, int], topology: Topology) -> None:
    online = topology.online
    seen: dict[int, int] = {}
    for v, h in sorted(pins.items()):
        if h not in online:
            raise VmLayoutError(f"vCPU {v}", h, f"pinned to a host CPU that is not online ({online})")
        if h in seen:
            raise VmLayoutError(f"vCPUs {seen[h]} and {v}", h, "pinned to the same host CPU")
        seen[h] = v


def per_node(topology: Topology, cpus: CpuSet) -> dict[int, int]:
    """Number of CPUs of `cpus` on each host NUMA node (nodes with none left out)."""
    return dict(sorted(Counter(topology.cpu(c).node for c in cpus).items()))


def check_numa_move(*, topology: Topology, before: CpuSet, after: CpuSet) -> str | None:
    """None when moving a VM-sandboxed container's dedicated CPUs from `before` to `after` keeps
    the number of vCPUs on every host NUMA node (its guest NUMA layout and the hugepages bound to
    each host node stay valid); otherwise the reason the move must not be made."""
    online = topology.online
    for name, cpus in (("current", before), ("proposed", after)):
        if not cpus <= online:
            return f"{name} cpuset {cpus} has CPUs that are not online: {cpus - online}"
    old, new = per_node(topology, before), per_node(topology, after)
    if old == new:
        return None
    changes = ", ".join(f"node {n}: {old.get(n, 0)} -> {new.get(n, 0)}"
                        for n in sorted(set(old) | set(new)) if old.get(n, 0) != new.get(n, 0))
    return (f"move {before} -> {after} changes the vCPUs per host NUMA node ({changes}); "
            "a VM's guest NUMA nodes must stay on their host nodes")


def check_pinning_move(*, topology: Topology, before: Mapping[int, int],
                       after: Mapping[int, int]) -> str | None:
    """Like `check_numa_move` for whole pinnings (vCPU -> host CPU): every vCPU must stay on its
    host NUMA node, so each guest node keeps its vCPUs and its memory's host node."""
    for name, pins in (("current", before), ("proposed", after)):
        try:
            _check_pins(pins, topology)
        except VmLayoutError as e:
            return f"{name} pinning is invalid: {e}"
    if set(before) != set(after):
        return f"vCPUs change from {CpuSet(before)} to {CpuSet(after)}"
    moved = [f"vCPU {v}: node {topology.cpu(before[v]).node} -> {topology.cpu(after[v]).node}"
             for v in sorted(before)
             if topology.cpu(before[v]).node != topology.cpu(after[v]).node]
    if moved:
        return "pinning move changes host NUMA nodes (" + ", ".join(moved) + ")"
    return None


def guest_hugepage_problems(nodes: Sequence[GuestNode], held: PodHugepages | None) -> tuple[str, ...]:
    """Guest nodes whose share of hugepages the pod does not hold on their host node (only when
    the kernel says where the pod's hugepages are: hugetlb `numa_stat`)."""
    if held is None or not held.per_node:
        return ()
    return tuple(f"guest node {n.id} (vCPUs {n.vcpus} on host node {n.host_node}) needs {n.hugepages} "
                 f"hugepages there, the pod holds {held.per_node.get(n.host_node, 0)} on that node "
                 f"(per node: {dict(sorted(held.per_node.items()))})"
                 for n in nodes if held.per_node.get(n.host_node, 0) < n.hugepages)


def main_hugepages(held: Sequence[PodHugepages]) -> PodHugepages | None:
    """The hugepage size that backs the guest's memory: the one with the most bytes held."""
    used = [h for h in held if h.total > 0]
    return max(used, key=lambda h: (h.total * h.page_size_bytes, h.page_size_bytes)) if used else None


# -- the vCPU pinning of every VM sandbox in a snapshot ---------------------------------------------

def placed(snapshot: Snapshot, actions: Iterable[Action] = ()) -> list[Container]:
    """The snapshot's containers with the cpusets its cpuset (and cpuset rollback) actions give."""
    to = {a.container: CpuSet.parse(a.to, source=f"action on {a.container}") for a in actions
          if a.kind == "cpuset" or (a.kind == "rollback" and a.undoes == "cpuset")}
    return [replace(s.container, cpuset=to[s.id]) if s.id in to else s.container
            for s in snapshot.containers]


def plan_vcpus(snapshot: Snapshot, *, actions: Iterable[Action] = (),
               previous: Sequence[VcpuPinning] = (), system_vcpus: int = 1,
               pin_exclusive: bool = True) -> tuple[VcpuPinning, ...]:
    """Where every VM sandbox's VMM threads must run once `actions` are applied.

    One `VcpuPinning` per VMM of `snapshot.vmms` whose pod has containers: `plan_sandbox` over
    the pod's containers (cpusets after the actions) and the node's shared pool, starting from
    the host CPU <-> vCPU mapping of `previous` (the last cycle's pinnings: that is what keeps
    it stable across moves), with the guest NUMA layout of the pinned vCPUs. The sandbox mask is
    the OR of the pod's workload containers (`vm_workloads`), every thread within the VMM
    cgroup's cpuset (`VmmProcess.allowed`)."""
    if not snapshot.vmms:  # most nodes, every cycle
        return ()
    containers = placed(snapshot, actions)
    pool = shared_pool(online=snapshot.topology.online, kubelet=snapshot.kubelet,
                       reserved=snapshot.reserved, containers=containers)
    containers = list(containers)
    if not any(c.sandbox for c in containers):  # most nodes: no VM pod, no pod keys to build
        return ()
    pods: dict[str, list[Container]] = {}
    for c in containers:
        pods.setdefault(c.pod_key, []).append(c)
    before = {p.pod: p.mapping for p in previous}
    seen = {s.id: s.container.cpuset for s in snapshot.containers}
    out = []
    for vmm in sorted(snapshot.vmms, key=lambda v: v.pod):
        if vmm.pod not in pods:
            continue
        plan = plan_sandbox(containers=vm_workloads(pods[vmm.pod], vmm), vcpus=vmm.vcpus, pool=pool,
                            previous=before.get(vmm.pod, {}), system_vcpus=system_vcpus,
                            pin_exclusive=pin_exclusive, topology=snapshot.topology,
                            allowed=vmm_bound(vmm, pods[vmm.pod], seen))
        out.append(pinning_of(vmm, plan, snapshot.topology))
    return tuple(out)


def vmm_bound(vmm: VmmProcess, placed: Sequence[Container], seen: Mapping[str, CpuSet]) -> CpuSet:
    """The VMM cgroup's cpuset once the cycle's actions are applied: discovery's, unless the
    container holding the VMM is moved this cycle (Kata's sandbox container moves with its pod),
    then its new cpuset (the actuator writes it before the threads are pinned)."""
    host = next((c for c in placed if c.id == vmm.container), None)
    if host is not None and host.cpuset and host.cpuset != seen.get(host.id):
        return host.cpuset
    return vmm.allowed


def vm_workloads(containers: Sequence[Container], vmm: VmmProcess) -> list[Container]:
    """The pod's containers whose work runs on the VMM's vCPUs: all but the pod sandbox container.

    In Kata's per-container layout the VMM runs in the cgroup of the pod sandbox (pause)
    container, which holds the pod's CPUs and no workload: it must not widen the mask. In
    KubeVirt's the VMM runs in the `compute` container, which is the workload. The VMM's
    container is taken for the sandbox when pod metadata says Kata, or, without it, when other
    containers exist and none of them has a host process (their work runs in the VM, as in
    Kata; KubeVirt's sidecars are host processes); metadata saying KubeVirt keeps it."""
    host = next((c for c in containers if c.id == vmm.container), None)
    others = [c for c in containers if c is not host]
    if host is None or not others or host.sandbox == "kubevirt":
        return list(containers)
    if host.sandbox == "kata" or not {c.id for c in others} & set(vmm.busy):
        return others
    return list(containers)


def pinning_of(vmm: VmmProcess, plan: SandboxPlan, topology: Topology) -> VcpuPinning:
    """A sandbox plan as per-thread affinities, with its guest NUMA layout (problems named)."""
    affinity = {tid: plan.vcpu_affinity[v] for v, tid in vmm.vcpus.items()}
    affinity.update({tid: plan.helper_affinity for tid in vmm.helpers})
    nodes, problems = sandbox_numa(plan.mapping, topology, vmm.hugepages)
    return VcpuPinning(pod=vmm.pod, vmm_pid=vmm.pid, affinity=dict(sorted(affinity.items())),
                       vcpu_threads=dict(vmm.vcpus), helpers=vmm.helpers, mapping=plan.mapping,
                       guest_cpusets=plan.guest_cpusets, guest_numa=nodes,
                       hugepages=vmm.hugepages, problems=plan.problems + problems, notes=plan.notes)


def sandbox_numa(mapping: VcpuMap, topology: Topology,
                 held: Sequence[PodHugepages]) -> tuple[tuple[GuestNode, ...], tuple[str, ...]]:
    """The guest NUMA layout of a sandbox's pinned vCPUs and the pod's main hugepage size, and
    what is wrong with it (a layout that cannot be built is no layout and one problem)."""
    pins = {v: h for m in mapping.values() for h, v in m.items()}
    if not pins:
        return (), ()
    hp = main_hugepages(held)
    try:
        nodes = guest_numa(pins=pins, topology=topology, hugepages=hp.total if hp else 0,
                           page_size_bytes=hp.page_size_bytes if hp else HUGEPAGE_2M)
    except VmLayoutError as e:
        return (), (f"guest NUMA: {e}",)
    return nodes, guest_hugepage_problems(nodes, hp)


def layout_move_problem(*, topology: Topology, vmm: VmmProcess, before: Sequence[Container],
                        after: Sequence[Container], system_vcpus: int = 1) -> str | None:
    """None when moving a sandbox's containers from `before` to `after` keeps its guest NUMA
    layout: every pinned vCPU stays on its host NUMA node (`check_pinning_move`) and every guest
    node stays on a host node where the pod holds its share of hugepages; else the reason."""
    def pinned(cs: Sequence[Container], previous: VcpuMap | None) -> Pinning:
        return map_vcpus(exclusive={c.id: c.cpuset for c in cs if c.exclusive and c.cpuset},
                         vcpus=vmm.vcpus, previous=previous, system_vcpus=system_vcpus,
                         topology=topology)

    old = pinned(before, None)
    new = pinned(after, old.mapping)
    if not old.pinned:
        return None
    why = check_pinning_move(topology=topology, before=old.pinned, after=new.pinned)
    if why:
        return f"guest NUMA layout would break: {why}"
    nodes, problems = sandbox_numa(new.mapping, topology, vmm.hugepages)
    _, had = sandbox_numa(old.mapping, topology, vmm.hugepages)
    fresh = [p for p in problems if p not in had]
    return f"guest NUMA layout would break: {fresh[0]}" if fresh else None
