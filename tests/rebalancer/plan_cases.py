"""Planner inputs for the equivalence test: every benchmark scenario and seeded random nodes, each
run in closed loop with the simulator, and a canonical record of every plan made.

The record keeps every number at full precision, so that a faster planner can be checked against
the plans of the code it replaced (tests/data/plan_golden.json.gz, written by
scripts/plan_golden.py from the older tree). Pure: seeded `random.Random`, no clock.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

from perfbalance.model import Plan
from perfbalance.topology import synthetic
from rebalancer import RebalancerConfig, plan
from rebalancer.state import PlannerState

from agent.bench import scenarios as sc
from agent.bench.sim import MIB, Node, Workload, snapshot

SKYLAKE = "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz"
RANDOM_SEEDS = tuple(range(12))


def plan_record(p: Plan) -> dict[str, Any]:
    """Everything a plan says, floats unrounded."""
    acts = [{"kind": a.kind, "container": a.container, "frm": a.frm, "to": a.to, "reason": a.reason,
             "benefit": a.benefit, "cost": a.cost, "victims": list(a.victims), "mems": a.mems,
             "undoes": a.undoes, "detail": dict(sorted(a.detail.items()))} for a in p.actions]
    st = p.state
    pending = [{"decision": q.decision, "victims": list(q.victims), "predicted": q.predicted,
                "moves": [[m.container, m.frm, m.to, m.mems_frm, m.mems_to, m.kind] for m in q.moves],
                "baseline_loss": dict(q.baseline_loss)} for q in st.pending]
    return {"actions": acts, "considered": [dict(c) for c in p.considered], "seq": st.seq,
            "pending": pending, "moved_at": dict(st.moved_at), "cooldown": dict(st.cooldown_until)}


def closed_loop(node: Node, workloads: list[Workload], cpus: dict[str, frozenset[int]], *,
                cycles: int, config: RebalancerConfig, noise: float, seed: str,
                events: dict[int, Callable[[list[Workload], dict[str, frozenset[int]]], None]] | None = None,
                ) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    classes: dict[str, str] = {}
    state: PlannerState | None = None
    out = []
    for cycle in range(cycles):
        if events and cycle in events:
            events[cycle](workloads, cpus)
        snap = snapshot(node, workloads, cpus, classes, time=cycle * 10.0, noise=noise, rng=rng)
        p = plan(snap, config, state, cycle * 10.0)
        state = p.state
        out.append(plan_record(p))
        sc.apply(p.actions, cpus, classes)
    return out


def scenario_cases() -> Iterator[tuple[str, Callable[[], list[dict[str, Any]]]]]:
    for make in sc.SCENARIOS:
        s = make()
        if s.events:
            continue

        def run(s: sc.Scenario = s) -> list[dict[str, Any]]:
            return closed_loop(s.node, list(s.workloads), dict(s.initial), cycles=12, config=s.planner,
                               noise=0.03, seed=s.name)
        yield s.name, run


def timing_cases() -> Iterator[tuple[str, Callable[[], list[dict[str, Any]]]]]:
    for name, containers, cpus in sc.timing_sizes():
        yield f"timing_{name}", lambda c=containers, n=cpus: [plan_record(plan(sc.timing_snapshot(c, n), RebalancerConfig(), None, 0.0))]


def random_node(seed: int) -> tuple[Node, list[Workload], dict[str, frozenset[int]], RebalancerConfig]:
    """A seeded random node: topology, a mix of AVX-512, cache, bandwidth and plain workloads,
    cpusets from the whole node to odd subsets, an RDT class on some nodes."""
    rng = random.Random(f"plan-case-{seed}")
    packages = rng.choice((1, 2))
    topo = synthetic(packages=packages, cores_per_node=rng.choice((2, 4, 6, 8)),
                     threads_per_core=rng.choice((1, 2)), l3_per_package=rng.choice((1, 2)),
                     l3_size_bytes=rng.choice((8, 16, 32)) * MIB, cpu_model=SKYLAKE)
    rdt = "batch" if rng.random() < 0.4 else ""
    bw = rng.choice((4e9, 20e9, 60e9))
    node = Node(topology=topo, bandwidth_per_node=bw, rdt_class=rdt)
    online = sorted(topo.online.ids)
    ws: list[Workload] = []
    cpus: dict[str, frozenset[int]] = {}
    for i in range(rng.randint(3, 3 * len(online))):
        kind = rng.random()
        demand = round(rng.uniform(0.1, 2.0), 3)
        w = Workload(id=f"w{i:03d}", demand=demand, request_mcpu=rng.choice((0, 100, 250, 500)),
                     avx512=kind < 0.2, victim=kind >= 0.2,
                     mpki_ref=40.0 if 0.2 <= kind < 0.3 else rng.uniform(0.0, 8.0),
                     working_set=(512 if kind < 0.3 else rng.choice((2, 6, 64))) * MIB,
                     memory_bytes=rng.choice((1, 4)) << 30)
        ws.append(w)
        r = rng.random()
        if r < 0.6:
            cpus[w.id] = frozenset(online)
        else:
            k = rng.randint(1, max(1, len(online) // 2))
            cpus[w.id] = frozenset(rng.sample(online, k))
    config = RebalancerConfig(memory_bandwidth_per_node=bw, rdt_aggressor_class=rdt,
                              max_moves_per_cycle=rng.choice((1, 2, 3)))
    return node, ws, cpus, config


def random_cases() -> Iterator[tuple[str, Callable[[], list[dict[str, Any]]]]]:
    for seed in RANDOM_SEEDS:
        def run(seed: int = seed) -> list[dict[str, Any]]:
            node, ws, cpus, config = random_node(seed)
            return closed_loop(node, ws, cpus, cycles=10, config=config, noise=0.05, seed=f"loop-{seed}")
        yield f"random_{seed}", run


def all_cases() -> list[tuple[str, Callable[[], list[dict[str, Any]]]]]:
    return [*scenario_cases(), *timing_cases(), *random_cases()]
