"""A NUMA- and die-aware CPU allocator (cri-resource-manager's "improve allocation heuristics").

Given the CPUs that are free to hand out, pick `count` of them so that the container loses as
little as possible to topology: in order of preference

1. a whole die, when the request is exactly a die;
2. a whole NUMA node, when the request is exactly a node;
3. whole cores inside one die, then inside one NUMA node (best fit: the tightest domain that
   still has room, so large free domains stay intact for large requests);
4. single threads inside one NUMA node, siblings of already-busy cores first (keeps whole
   cores free for AVX-512 islands and for requests that need them);
5. only when nothing fits in one node: the fewest nodes, the emptiest first.

SST-BF high-priority CPUs (`Topology.high_priority()`) go to the most sensitive containers and
are avoided for everyone else. Pure and deterministic: ties are broken by CPU id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rebalancer.topoindex import CoreKey, TopoIndex


def allocate(idx: TopoIndex, free: Iterable[int], count: int, *, whole_cores: bool = False,
             prefer_nodes: Sequence[int] = (), high_priority: bool = False) -> frozenset[int] | None:
    """`count` CPUs from `free` (rounded up to whole cores if `whole_cores`), or None.

    Remembered in `idx.memo`: the candidates of one cycle ask the same question many times
    (every container of a pool relocated to the same node, each greedy round again), the next
    cycle mostly asks it again (topoindex.index_of keeps the index), and the answer depends on
    nothing else."""
    avail = frozenset(free) & idx.online
    if count <= 0 or len(avail) < count:
        return None
    key = ("allocate", avail, count, whole_cores, tuple(prefer_nodes), high_priority)
    if key in idx.memo:
        return idx.memo[key]  # type: ignore[return-value]
    got = idx.memo[key] = _allocate(idx, avail, count, whole_cores, prefer_nodes, high_priority)
    return got


def _allocate(idx: TopoIndex, avail: frozenset[int], count: int, whole_cores: bool,
              prefer_nodes: Sequence[int], high_priority: bool) -> frozenset[int] | None:
    exact = _exact_domain(idx, avail, count, prefer_nodes)
    if exact is not None:
        return exact
    for domains in (_dies_by_node(idx), idx.nodes):
        got = _cores_in_one(idx, avail, count, domains, prefer_nodes, high_priority, whole_cores)
        if got is not None:
            return got
    if not whole_cores:
        got = _threads_in_one_node(idx, avail, count, prefer_nodes, high_priority)
        if got is not None:
            return got
    return _spanning(idx, avail, count, prefer_nodes, high_priority, whole_cores)


def _node_rank(prefer_nodes: Sequence[int], node: int) -> int:
    return prefer_nodes.index(node) if node in prefer_nodes else len(prefer_nodes)


def _exact_domain(idx: TopoIndex, avail: frozenset[int], count: int,
                  prefer_nodes: Sequence[int]) -> frozenset[int] | None:
    for domains in (idx.dies, idx.nodes):
        fits = [cpus for cpus in domains.values() if len(cpus) == count and cpus <= avail]
        if fits:
            return min(fits, key=lambda s: (_node_rank(prefer_nodes, idx.node_of[min(s)]), min(s)))
    return None


def _dies_by_node(idx: TopoIndex) -> dict[tuple[int, int], frozenset[int]]:
    """Dies split at NUMA boundaries (a die never spans nodes in practice; be safe)."""
    out: dict[tuple[int, int], frozenset[int]] = {}
    for (pkg, die), cpus in idx.dies.items():
        for node in sorted(idx.nodes_of(cpus)):
            out[(node, pkg * 4096 + die)] = cpus & idx.nodes[node]
    return out


def _core_order(idx: TopoIndex, cores: list[CoreKey], high_priority: bool) -> list[CoreKey]:
    statics = _core_statics(idx)

    def key(k: CoreKey) -> tuple[int, int, int]:
        is_hp, l3, first = statics[k]
        return (0 if is_hp == high_priority else 1, l3, first)
    return sorted(cores, key=key)


def _core_statics(idx: TopoIndex) -> dict[CoreKey, tuple[bool, int, int]]:
    """Per core: (has an SST-BF high-priority CPU, L3 domain, lowest CPU id), once per index."""
    hit = idx.memo.get(("core-statics",))
    if hit is None:
        hit = idx.memo[("core-statics",)] = {
            k: (bool(cpus & idx.high_priority), idx.l3_of[min(cpus)], min(cpus))
            for k, cpus in idx.cores.items()}
    return hit  # type: ignore[return-value]


def _free_cores(idx: TopoIndex, avail: frozenset[int], domain: frozenset[int]) -> list[CoreKey]:
    keys = {idx.core_of[c] for c in domain & avail}
    return [k for k in keys if idx.cores[k] <= avail]


def _cores_in_one(idx: TopoIndex, avail: frozenset[int], count: int, domains: dict,  # type: ignore[type-arg]
                  prefer_nodes: Sequence[int], high_priority: bool,
                  whole_cores: bool) -> frozenset[int] | None:
    options = []
    for dkey, cpus in domains.items():
        cores = _free_cores(idx, avail, cpus)
        size = sum(len(idx.cores[k]) for k in cores)
        lone = 0 if whole_cores else len(cpus & avail) - size
        if size >= count or (size and size + lone >= count):
            node = idx.node_of[min(cpus)]
            options.append(((_node_rank(prefer_nodes, node), size + lone, min(cpus)), cores, cpus))
    if not options:
        return None
    _, cores, domain = min(options, key=lambda o: o[0])
    return _take_cores(idx, avail & domain, _core_order(idx, cores, high_priority), count, whole_cores)


def _take_cores(idx: TopoIndex, avail: frozenset[int], cores: list[CoreKey], count: int,
                whole_cores: bool) -> frozenset[int]:
    """Whole cores in order; a remainder smaller than a core comes from lone free threads of
    busy cores in the same domain first, so that no whole core is split needlessly."""
    out: set[int] = set()
    for k in cores:
        if len(out) >= count or (not whole_cores and len(out) + len(idx.cores[k]) > count):
            break
        out |= idx.cores[k]
    if len(out) < count and not whole_cores:
        lone = sorted(c for c in avail if c not in out and not idx.cores[idx.core_of[c]] <= avail)
        out |= set(lone[:count - len(out)])
        for k in cores:
            if len(out) >= count:
                break
            spare = sorted(idx.cores[k] - out)
            out |= set(spare[:count - len(out)])
    return frozenset(out)


def _threads_in_one_node(idx: TopoIndex, avail: frozenset[int], count: int,
                         prefer_nodes: Sequence[int], high_priority: bool) -> frozenset[int] | None:
    options = []
    for node, cpus in idx.nodes.items():
        free = cpus & avail
        if len(free) >= count:
            options.append(((_node_rank(prefer_nodes, node), len(free), node), free))
    if not options:
        return None
    _, free = min(options, key=lambda o: o[0])
    return frozenset(sorted(free, key=lambda c: _thread_key(idx, avail, c, high_priority))[:count])


def _thread_key(idx: TopoIndex, avail: frozenset[int], cpu: int,
                high_priority: bool) -> tuple[int, int, int]:
    partial = 0 if not idx.cores[idx.core_of[cpu]] <= avail else 1
    hp = 0 if (cpu in idx.high_priority) == high_priority else 1
    return (hp, partial, cpu)


def _spanning(idx: TopoIndex, avail: frozenset[int], count: int, prefer_nodes: Sequence[int],
              high_priority: bool, whole_cores: bool) -> frozenset[int] | None:
    nodes = sorted(idx.nodes, key=lambda n: (_node_rank(prefer_nodes, n), -len(idx.nodes[n] & avail), n))
    out: set[int] = set()
    for n in nodes:
        if len(out) >= count:
            break
        cores = _core_order(idx, _free_cores(idx, avail, idx.nodes[n]), high_priority)
        out |= _take_cores(idx, avail & idx.nodes[n], cores, count - len(out), whole_cores)
        if not whole_cores and len(out) < count:
            rest = sorted(idx.nodes[n] & avail - out, key=lambda c: _thread_key(idx, avail, c, high_priority))
            out |= set(rest[:count - len(out)])
    if len(out) < count:
        return None
    return frozenset(out)
