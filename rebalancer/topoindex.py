"""A precomputed index of a Topology for the planner's hot loops.

`Topology` answers questions by scanning its CPU tuple; the planner asks the same questions
thousands of times per cycle, so it builds this index (plain dicts of frozensets) and keeps it
with its memo from one planning call to the next while the topology stays the same (`index_of`):
a node's topology does not change between cycles and its containers' cpusets mostly do not, so
the next cycle asks the allocator, the interned sets and the kernel list forms the same questions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from perfbalance.cpuset import CpuSet

from perfbalance.topology import Topology

CoreKey = tuple[int, int, int]


@dataclass(frozen=True, kw_only=True)
class TopoIndex:
    online: frozenset[int]
    core_of: dict[int, CoreKey]
    cores: dict[CoreKey, frozenset[int]]
    node_of: dict[int, int]
    nodes: dict[int, frozenset[int]]
    l3_of: dict[int, int]
    l3s: dict[int, frozenset[int]]
    dies: dict[tuple[int, int], frozenset[int]]
    high_priority: frozenset[int]
    l3_size: int
    cpu_model: str
    # memo of derived values of cpusets: each a function of the topology and its key alone, so
    # it may outlive a planning call (index_of); never visible outside
    memo: dict[tuple[object, ...], object] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, topology: Topology) -> TopoIndex:
        def group(pairs: dict[int, object]) -> dict:  # type: ignore[type-arg]
            out: dict[object, set[int]] = {}
            for cpu, key in pairs.items():
                out.setdefault(key, set()).add(cpu)
            return {k: frozenset(v) for k, v in sorted(out.items())}  # type: ignore[type-var]

        core_of = {c.id: c.core_key for c in topology.cpus}
        node_of = {c.id: c.node for c in topology.cpus}
        l3_of = {c.id: c.l3 for c in topology.cpus}
        die_of = {c.id: (c.package, c.die) for c in topology.cpus}
        return cls(
            online=frozenset(core_of), core_of=core_of, cores=group(core_of),  # type: ignore[arg-type]
            node_of=node_of, nodes=group(node_of), l3_of=l3_of, l3s=group(l3_of),  # type: ignore[arg-type]
            dies=group(die_of), high_priority=frozenset(topology.high_priority().ids),  # type: ignore[arg-type]
            l3_size=topology.l3_size_bytes, cpu_model=topology.cpu_model,
        )

    def intern(self, cpus: frozenset[int]) -> frozenset[int]:
        """The one object for this set of CPUs: memo keys holding it then compare by identity
        instead of element by element (hundreds of CPUs, thousands of lookups per call)."""
        return self.memo.setdefault(("set", cpus), cpus)  # type: ignore[return-value]

    def whole_cores(self, cpus: frozenset[int]) -> frozenset[int]:
        """Cores touched by `cpus`, with all their SMT siblings."""
        key = ("whole", cpus)
        hit = self.memo.get(key)
        if hit is None:
            core_of, cores = self.core_of, self.cores
            hit = self.memo[key] = frozenset().union(*(cores[k] for k in {core_of[c] for c in cpus}))
        return hit  # type: ignore[return-value]

    def full_cores_within(self, cpus: frozenset[int]) -> frozenset[int]:
        """The CPUs of cores that lie entirely inside `cpus`."""
        memo_key = ("full", cpus)
        hit = self.memo.get(memo_key)
        if hit is None:
            out: set[int] = set()
            for key in {self.core_of[c] for c in cpus if c in self.core_of}:
                if self.cores[key] <= cpus:
                    out |= self.cores[key]
            hit = self.memo[memo_key] = frozenset(out)
        return hit  # type: ignore[return-value]

    def nodes_of(self, cpus: frozenset[int]) -> frozenset[int]:
        key = ("nodes", cpus)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = frozenset(self.node_of[c] for c in cpus if c in self.node_of)
        return hit  # type: ignore[return-value]

    def l3s_of(self, cpus: frozenset[int]) -> frozenset[int]:
        key = ("l3s", cpus)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = frozenset(self.l3_of[c] for c in cpus if c in self.l3_of)
        return hit  # type: ignore[return-value]

    def fmt(self, cpus: frozenset[int]) -> str:
        """The kernel list form of `cpus` ("0-3,8")."""
        key = ("fmt", cpus)
        hit = self.memo.get(key)
        if hit is None:
            hit = self.memo[key] = str(CpuSet(cpus))
        return hit  # type: ignore[return-value]

    def sibling_of(self) -> dict[int, int] | None:
        """Each CPU's SMT sibling when every core has exactly two threads (else None)."""
        key = ("sibling",)
        if key not in self.memo:
            pairs = [tuple(sorted(cpus)) for cpus in self.cores.values()]
            self.memo[key] = ({a: b for a, b in pairs} | {b: a for a, b in pairs}
                              if pairs and all(len(p) == 2 for p in pairs) else None)
        return self.memo[key]  # type: ignore[return-value]

    def threads_per_core(self) -> int:
        return max((len(s) for s in self.cores.values()), default=1)


KEPT_INDEXES = 4  # topologies whose index index_of keeps (a node has one; tests and tools a few)
MAX_MEMO = 8192  # memo entries an index may carry into a call (one 1000-container plan adds ~300)
_kept: list[tuple[Topology, TopoIndex]] = []  # newest last


def index_of(topology: Topology) -> TopoIndex:
    """The index of `topology`, the same object (memo included) as for an earlier call with an
    equal topology among the last `KEPT_INDEXES`, unless its memo has outgrown `MAX_MEMO` (then
    a fresh one). An index depends on the CPUs, the L3 size and the CPU model only, and every
    memo entry on the index and its key, so a kept one answers exactly as a fresh one would."""
    for i, (t, idx) in enumerate(_kept):
        if t is topology or (t.cpus == topology.cpus and t.l3_size_bytes == topology.l3_size_bytes
                             and t.cpu_model == topology.cpu_model):
            del _kept[i]
            if _memo_size(idx) > MAX_MEMO:
                idx = TopoIndex.build(topology)
            _kept.append((topology, idx))
            return idx
    idx = TopoIndex.build(topology)
    _kept.append((topology, idx))
    del _kept[:-KEPT_INDEXES]
    return idx


def _memo_size(idx: TopoIndex) -> int:
    """Entries of the memo, those of its tables (a dict value holds one kind of entry) included."""
    return len(idx.memo) + sum(len(v) for v in idx.memo.values() if isinstance(v, dict))
