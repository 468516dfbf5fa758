"""What the independent simulator knows about a node and a job: its own value types.

The planner-side simulator (agent.bench.sim) and the planner share a cost model; this package
is the second opinion, so it describes the hardware and the work in its own terms (threads with
a duty cycle, CFS weights, cache ways, a migration refill bandwidth) instead of reusing
agent.bench.sim's Workload and Node. The bench harness (agent.bench.judge) converts a scenario
into these types. Every number here is a default a caller may override; the sources are in
docs/benchmarks.md ("The independent simulator").
"""

from __future__ import annotations

from dataclasses import dataclass

from perfbalance.topology import Topology

MIB = 1 << 20
LINE = 64


@dataclass(frozen=True, kw_only=True)
class Place:
    """Where one logical CPU sits: its physical core, L3 domain and NUMA node."""

    cpu: int
    core: tuple[int, int, int]
    l3: int
    node: int


@dataclass(frozen=True, kw_only=True)
class Machine:
    """A node as the independent simulator models it (hashable, so results can be cached)."""

    places: tuple[Place, ...]
    l3_bytes: float = 32.0 * MIB  # per L3 domain
    llc_ways: int = 11  # Skylake-SP: 11 ways; a class of k ways holds k/11 of the L3
    restricted_ways: int = 0  # ways of the restricted RDT class (0 = no RDT)
    restricted_class: str = ""
    llc_alpha: float = 0.5  # M(C) = M0 (C/C0)^-a, Hartstein et al. 2006
    l2_bytes: float = 1.0 * MIB  # below this the LLC share does not matter (misses stop rising)
    f0_hz: float = 2.5e9
    licence_loss: float = 0.2  # frequency lost by every thread of a licensed core
    licence_hold_s: float = 1.3e-3  # licence kept after the last 512-bit instruction (0.65-2 ms)
    smt_speed: float = 0.62  # a thread's core throughput while its sibling is busy (yield ~1.24)
    idle_latency_s: float = 90e-9
    remote_extra_s: float = 50e-9  # an access to the other NUMA node's memory
    bandwidth_per_node: float = 60e9  # sustained (not peak) bytes/s of one NUMA node
    migration_hot_s: float = 0.5e-3  # kernel sched_migration_cost: a task is cache-hot this long
    refill_bytes_per_s: float = 10e9  # per-core miss bandwidth refilling a migrated footprint
    transfer_s: tuple[float, float, float, float] = (10e-9, 35e-9, 80e-9, 150e-9)  # shared line: core, L3, node, remote
    dt_s: float = 0.5e-3  # time step
    window_s: float = 0.05  # simulated time per evaluation
    burst_s: float = 3e-3  # mean runnable burst of a thread that sleeps
    seed: str = "truth"

    @classmethod
    def from_topology(cls, topology: Topology, **kw: object) -> Machine:
        places = tuple(Place(cpu=c.id, core=c.core_key, l3=c.l3 if c.l3 >= 0 else c.package, node=c.node)
                       for c in sorted(topology.cpus, key=lambda c: c.id))
        kw.setdefault("l3_bytes", float(topology.l3_size_bytes or 32 * MIB))
        return cls(places=places, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class Job:
    """One container's work: `threads` threads, each runnable `duty` of the time."""

    id: str
    threads: int
    duty: float = 1.0
    weight: float = 1.0  # CFS group weight (cpu.weight follows the CPU request)
    avx512: bool = False
    cpi_core: float = 1.0  # cycles per instruction with a perfect LLC, sibling idle
    mpki_ref: float = 0.0  # LLC misses per 1000 instructions holding `ref_cache` bytes
    ref_cache: float = 4.0 * MIB
    working_set: float = 4.0 * MIB
    mlp: float = 2.0  # memory-level parallelism of its misses
    partners: tuple[tuple[str, float], ...] = ()  # (job id, shared-line transfers per 1000 instructions)
    victim: bool = False
