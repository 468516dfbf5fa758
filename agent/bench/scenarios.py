"""Benchmark scenarios for the planner and the strategies they are scored with.

Strategies, each ending in a placement the simulator scores:
* none: containers stay where they were created;
* placement_tag: cri-resource-manager's AVX-512 tag, best case (the tag is known at creation):
  each container is placed, once, on the shared CPUs of one NUMA node, AVX-512-tagged ones where
  other tagged ones are, untagged ones where fewest are; nothing ever moves afterwards;
* perfbalance: the planner run in closed loop with the simulator (10 s cycles);
* optimum: exhaustive search over a candidate family of cpusets (unions of whole cores, or of
  L3 domains or NUMA nodes) respecting the constraints (CPU requests, hard anti-affinity); None
  when too large.

Victim slowdown = 1 - mean performance of the containers marked `victim`; throughput = sum of
every container's performance (1.0 = as fast as alone). Where pods carry affinity annotations,
each result also says, per annotated pair, whether the final placement gives it what it asks for
and how often a hard anti-affinity pair came (back) together. Pure functions; `agent/bench/plan.py`
times and prints them.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from perfbalance.cpuset import CpuSet
from perfbalance.hints import AffinityTerm, HintKeys, affinity_terms
from perfbalance.model import Action, Container, KubeletState, Snapshot
from perfbalance.topology import Topology, synthetic
from rebalancer.config import RebalancerConfig
from rebalancer.constraints import requests_fit
from rebalancer.planner import plan
from agent.bench.sim import GIB, MIB, Node, Workload, simulate, snapshot
from rebalancer.topoindex import TopoIndex

Planner = Callable[..., Any]  # plan(snapshot, rebalancer config, state, now) -> Plan
# score(node, workloads, cpus, classes) -> (victim slowdown, throughput); `score` below is this
# module's (agent.bench.sim), agent.bench.judge gives the independent simulator's
Scorer = Callable[[Node, Sequence[Workload], Mapping[str, frozenset[int]], Mapping[str, str] | None],
                  tuple[float, float]]
Observer = Callable[..., Snapshot]  # snapshot(node, workloads, cpus, classes, *, time, pmu, noise, rng)

INTERVAL = 10.0
MAX_OPTIMUM_EVALS = 20_000
SKYLAKE = "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz"


@dataclass(frozen=True, kw_only=True)
class Event:
    cycle: int
    add: Workload | None = None
    remove: str = ""


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    node: Node
    workloads: tuple[Workload, ...]  # present at cycle 0
    initial: Mapping[str, frozenset[int]]  # where the runtime put them
    events: tuple[Event, ...] = ()
    cycles: int = 40
    unit: str = "core"  # optimum family: unions of "core", "l3" (domains) or "node"
    pmu: bool = True
    noise: float = 0.0
    planner: RebalancerConfig = RebalancerConfig()  # what the operator configured for this node


@dataclass(frozen=True, kw_only=True)
class Result:
    victim_slowdown: float
    throughput: float
    moves: int = 0
    pairs: tuple[PairOutcome, ...] = ()  # annotated pairs in the final placement
    hard_rises: int = 0  # cycles in which a hard anti-affinity pair came (back) together
    judged: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # other scorers' (slowdown, throughput)
    final: Mapping[str, frozenset[int]] = field(default_factory=dict)  # the placement at the end
    final_classes: Mapping[str, str] = field(default_factory=dict)
    final_live: tuple[Workload, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"victim_slowdown": round(self.victim_slowdown, 4),
                               "throughput": round(self.throughput, 4), "moves": self.moves}
        if self.pairs:
            out["pairs"] = [{"a": p.a, "b": p.b, "kind": p.kind, "scope": p.scope, "hard": p.hard, "ok": p.ok}
                            for p in self.pairs]
            out["hard_rises"] = self.hard_rises
        return out


def score(node: Node, workloads: Sequence[Workload], cpus: Mapping[str, frozenset[int]],
          classes: Mapping[str, str] | None = None) -> tuple[float, float]:
    perf = simulate(node, workloads, cpus, classes)
    victims = [perf[w.id].perf for w in workloads if w.victim]
    slow = 1.0 - sum(victims) / len(victims) if victims else 0.0
    return slow, sum(p.perf for p in perf.values())


# -- strategies -----------------------------------------------------------------------------------

def pool(node: Node) -> frozenset[int]:
    return frozenset(node.topology.online.ids - node.reserved.ids - node.kubelet.dedicated().ids)


def run_none(sc: Scenario, judges: Mapping[str, Scorer] | None = None) -> Result:
    return _run(sc, lambda w, cpus, live: cpus, None, judges=judges)


def run_placement_tag(sc: Scenario, judges: Mapping[str, Scorer] | None = None) -> Result:
    def place(w: Workload, cpus: frozenset[int], live: Mapping[str, frozenset[int]]) -> frozenset[int]:
        if w.exclusive:
            return cpus
        return _tag_pool(sc, w, live)
    return _run(sc, place, None, judges=judges)


def run_perfbalance(sc: Scenario, config: RebalancerConfig | None = None, *, planner: Planner = plan,
                    judges: Mapping[str, Scorer] | None = None, observe: Observer | None = None) -> Result:
    """The closed loop with the cost model, or with `planner` (a policy: agent.plan.runner.planner).
    The planner sees this module's simulator, or the Snapshots `observe` makes; `judges` score
    the same placements besides."""
    return _run(sc, lambda w, cpus, live: cpus, config or sc.planner, planner, judges=judges,
                observe=observe or snapshot)


def _tag_pool(sc: Scenario, w: Workload, live: Mapping[str, frozenset[int]]) -> frozenset[int]:
    idx = TopoIndex.build(sc.node.topology)
    shared = pool(sc.node)
    by_id = {wl.id: wl for wl in _all_workloads(sc)}

    def key(n: int) -> tuple[int, float, int]:
        cpus = idx.nodes[n] & shared
        here = [by_id[c] for c, s in live.items() if s <= cpus]
        avx = sum(1 for x in here if x.avx512)
        load = sum(x.demand for x in here) / len(cpus)
        return (-avx if w.avx512 else avx, load, n)
    best = min((n for n in idx.nodes if idx.nodes[n] & shared), key=key)
    return idx.nodes[best] & shared


def _all_workloads(sc: Scenario) -> list[Workload]:
    return list(sc.workloads) + [e.add for e in sc.events if e.add is not None]


def _run(sc: Scenario, place: Callable[[Workload, frozenset[int], Mapping[str, frozenset[int]]], frozenset[int]],
         config: RebalancerConfig | None, planner: Planner = plan, *,
         judges: Mapping[str, Scorer] | None = None, observe: Observer | None = None) -> Result:
    live: dict[str, Workload] = {}
    cpus: dict[str, frozenset[int]] = {}
    classes: dict[str, str] = {}
    for w in sc.workloads:
        live[w.id] = w
        cpus[w.id] = place(w, sc.initial[w.id], cpus)
    state: Any = None  # the policy's own state type (PlannerState for the cost model)
    rng = random.Random(sc.name)
    moves, slow_sum, thr_sum, samples = 0, 0.0, 0.0, 0
    judges = judges or {}
    sums = {k: (0.0, 0.0) for k in judges}
    ints = intents(sc)
    broken, rises = hard_broken(sc, cpus, ints), 0
    for cycle in range(sc.cycles):
        for e in sc.events:
            if e.cycle == cycle:
                _event(sc, e, live, cpus, classes, place)
        if config is not None:
            snap = (observe or snapshot)(sc.node, list(live.values()), cpus, classes, time=cycle * INTERVAL,
                                         pmu=sc.pmu, noise=sc.noise, rng=rng)
            p = planner(snap, config, state, cycle * INTERVAL)
            state = p.state
            moves += apply(p.actions, cpus, classes)
        now_broken = hard_broken(sc, cpus, ints)
        rises, broken = rises + (now_broken > broken), now_broken
        if sc.events and cycle >= sc.cycles // 4:
            s, t = score(sc.node, list(live.values()), cpus, classes)
            slow_sum, thr_sum, samples = slow_sum + s, thr_sum + t, samples + 1
            for k, judge in judges.items():
                js, jt = judge(sc.node, list(live.values()), cpus, classes)
                sums[k] = (sums[k][0] + js, sums[k][1] + jt)
    pairs = tuple(pair_outcomes(sc, cpus, ints))
    end = dict(final=dict(cpus), final_classes=dict(classes), final_live=tuple(live.values()))
    if samples:
        return Result(victim_slowdown=slow_sum / samples, throughput=thr_sum / samples, moves=moves,
                      pairs=pairs, hard_rises=rises,
                      judged={k: (a / samples, b / samples) for k, (a, b) in sums.items()}, **end)
    s, t = score(sc.node, list(live.values()), cpus, classes)
    return Result(victim_slowdown=s, throughput=t, moves=moves, pairs=pairs, hard_rises=rises,
                  judged={k: judge(sc.node, list(live.values()), cpus, classes) for k, judge in judges.items()},
                  **end)


def _event(sc: Scenario, e: Event, live: dict[str, Workload], cpus: dict[str, frozenset[int]],
           classes: dict[str, str], place: Callable[..., frozenset[int]]) -> None:
    if e.remove:
        live.pop(e.remove, None)
        cpus.pop(e.remove, None)
        classes.pop(e.remove, None)
    if e.add is not None:
        live[e.add.id] = e.add
        cpus[e.add.id] = place(e.add, pool(sc.node), cpus)


def apply(actions: Sequence[Action], cpus: dict[str, frozenset[int]], classes: dict[str, str]) -> int:
    """Carry out a plan on the simulated node; returns the number of container actions."""
    n = 0
    for a in actions:
        if a.container not in cpus:
            continue
        if a.kind == "cpuset" or (a.kind == "rollback" and a.undoes == "cpuset"):
            cpus[a.container] = CpuSet.parse(a.to).ids
        elif a.kind == "rdt_class" or (a.kind == "rollback" and a.undoes == "rdt_class"):
            classes[a.container] = a.to
        n += 1
    return n


# -- optimum --------------------------------------------------------------------------------------

def family(sc: Scenario) -> list[frozenset[int]]:
    """Candidate cpusets: non-empty unions of whole cores (or NUMA nodes) of the shared pool."""
    idx = TopoIndex.build(sc.node.topology)
    shared = pool(sc.node)
    units = {"node": idx.nodes, "l3": idx.l3s}.get(sc.unit, idx.cores).values()
    usable = [u & shared for u in units if u & shared]
    if sc.unit == "core":
        usable = [u for u in usable if u == idx.whole_cores(u) & shared]
    out = []
    for r in range(1, len(usable) + 1):
        for combo in itertools.combinations(usable, r):
            out.append(frozenset().union(*combo))
    return out


def run_optimum(sc: Scenario, scorer: Scorer | None = None, *, max_evals: int = MAX_OPTIMUM_EVALS) -> Result | None:
    """The best placement of the candidate family by `scorer` (this module's simulator by default);
    None with events or above `max_evals` placements."""
    scorer = scorer or score
    if sc.events:
        return None
    movable = [w for w in sc.workloads if not w.exclusive]
    fam = family(sc)
    if len(fam) ** len(movable) > max_evals:
        return None
    requests = {w.id: w.request_mcpu for w in sc.workloads}
    hard = [i for i in intents(sc) if i[2].hard]
    best: tuple[float, float, dict[str, frozenset[int]]] | None = None
    for combo in itertools.product(fam, repeat=len(movable)):
        cpus = dict(sc.initial)
        cpus.update({w.id: s for w, s in zip(movable, combo)})
        if not all(requests_fit(cpus, requests, s) for s in set(combo)) or hard_broken(sc, cpus, hard):
            continue
        slow, thr = scorer(sc.node, sc.workloads, cpus, None)
        if best is None or thr > best[1] + 1e-12:
            best = (slow, thr, cpus)
    if best is None:
        return None
    return Result(victim_slowdown=best[0], throughput=best[1], pairs=tuple(pair_outcomes(sc, best[2])),
                  final=best[2], final_live=sc.workloads)


def ideal_without_avx_penalty(sc: Scenario, judges: Mapping[str, Scorer] | None = None) -> Result:
    """Victim slowdown if AVX-512 cost nothing: the floor no placement can beat."""
    return run_none(replace(sc, node=replace(sc.node, license_loss=0.0)), judges)


# -- scenarios ------------------------------------------------------------------------------------

def _scalar(i: int, demand: float = 1.0, **kw: object) -> Workload:
    return Workload(id=f"web-{i}", demand=demand, request_mcpu=int(demand * 500), victim=True,
                    mpki_ref=0.5, **kw)  # type: ignore[arg-type]


def _avx(i: int, demand: float = 1.5, **kw: object) -> Workload:
    return Workload(id=f"avx-{i}", demand=demand, request_mcpu=int(demand * 500), avx512=True, **kw)  # type: ignore[arg-type]


def _node(topo: Topology, **kw: object) -> Node:
    return Node(topology=topo, **kw)  # type: ignore[arg-type]


def avx512_small() -> Scenario:
    topo = synthetic(packages=1, cores_per_node=4, threads_per_core=2, cpu_model=SKYLAKE)
    ws = (_avx(0, 1.5), _scalar(0, 1.5), _scalar(1, 1.5))
    return Scenario(name="avx512_vs_scalar_small", node=_node(topo), workloads=ws,
                    initial={w.id: topo.online.ids for w in ws})


def avx512_large() -> Scenario:
    topo = synthetic(packages=1, cores_per_node=8, threads_per_core=2, cpu_model=SKYLAKE)
    ws = (_avx(0, 2.0), _avx(1, 1.5)) + tuple(_scalar(i, 1.2) for i in range(6))
    return Scenario(name="avx512_vs_scalar", node=_node(topo), workloads=ws,
                    initial={w.id: topo.online.ids for w in ws})


def cache_thrasher() -> Scenario:
    topo = synthetic(packages=1, cores_per_node=4, l3_per_package=2, l3_size_bytes=8 * MIB,
                     cpu_model=SKYLAKE)
    ws = (Workload(id="thrasher", demand=1.0, request_mcpu=500, mpki_ref=40.0, ref_cache=4 * MIB,
                   working_set=512 * MIB, cpi_core=0.8),
          Workload(id="kv-store", demand=1.0, request_mcpu=500, mpki_ref=6.0, ref_cache=4 * MIB,
                   working_set=6 * MIB, victim=True),
          Workload(id="batch", demand=1.0, request_mcpu=500, mpki_ref=0.2, victim=False))
    return Scenario(name="cache_thrasher", node=_node(topo), workloads=ws,
                    initial={w.id: topo.online.ids for w in ws})


def bandwidth_hog() -> Scenario:
    topo = synthetic(packages=2, cores_per_node=4, l3_size_bytes=16 * MIB, cpu_model=SKYLAKE)
    node0 = topo.nodes()[0].ids
    hog = dict(mpki_ref=60.0, ref_cache=4 * MIB, working_set=4 * GIB, cpi_core=0.7, memory_bytes=2 * GIB)
    ws = (Workload(id="stream-0", demand=1.0, request_mcpu=1000, **hog),  # type: ignore[arg-type]
          Workload(id="stream-1", demand=1.0, request_mcpu=1000, **hog),  # type: ignore[arg-type]
          Workload(id="db", demand=1.0, request_mcpu=1000, mpki_ref=8.0, working_set=1 * GIB, victim=True),
          Workload(id="api", demand=1.0, request_mcpu=1000, mpki_ref=3.0, working_set=256 * MIB, victim=True))
    return Scenario(name="bandwidth_hog", node=_node(topo, bandwidth_per_node=4e9), workloads=ws,
                    initial={w.id: node0 for w in ws}, unit="node",
                    planner=RebalancerConfig(memory_bandwidth_per_node=4e9))


def churn() -> Scenario:
    topo = synthetic(packages=2, cores_per_node=4, threads_per_core=2, cpu_model=SKYLAKE)
    ws = tuple(_scalar(i, 1.0) for i in range(6))
    events = []
    for k in range(6):
        events.append(Event(cycle=10 + 30 * k, add=_avx(k, 1.5)))
        events.append(Event(cycle=10 + 30 * k + 45, remove=f"avx-{k}"))
    events.append(Event(cycle=100, add=_scalar(6, 1.0)))
    events.append(Event(cycle=150, remove="web-0"))
    return Scenario(name="churn", node=_node(topo), workloads=ws,
                    initial={w.id: topo.online.ids for w in ws}, events=tuple(events), cycles=240,
                    noise=0.03)


def fragmented_2socket() -> Scenario:
    topo = synthetic(packages=2, cores_per_node=8, threads_per_core=2, l3_size_bytes=16 * MIB,
                     cpu_model=SKYLAKE)
    frag = [CpuSet.parse(s).ids for s in ("0-1,8-9", "2,10,18,26", "3-5,19-21", "6-7,22-23",
                                           "11-13,27-29", "14-15,30-31", "0-15", "16-31")]
    ws = (_avx(0, 2.0), _scalar(0, 1.0), _scalar(1, 1.0), _avx(1, 2.0), _scalar(2, 1.5),
          Workload(id="thrasher", demand=1.5, request_mcpu=500, mpki_ref=40.0, working_set=512 * MIB),
          _scalar(3, 2.0), _scalar(4, 2.0))
    return Scenario(name="fragmented_2socket", node=_node(topo), workloads=ws,
                    initial={w.id: s for w, s in zip(ws, frag)})


def kubelet_static() -> Scenario:
    topo = synthetic(packages=1, cores_per_node=8, threads_per_core=2, cpu_model=SKYLAKE)
    kubelet = KubeletState(policy="static", default_cpuset=CpuSet.parse("1,4-9,11-15"),
                           exclusive={("pod-g1", "solver"): CpuSet.parse("2"),
                                      ("pod-g2", "pricing"): CpuSet.parse("3")})
    node = _node(topo, reserved=CpuSet.parse("0,8"), kubelet=kubelet)
    ws = (Workload(id="solver", demand=1.0, request_mcpu=1000, avx512=True, exclusive=True,
                   pod_uid="pod-g1", name="solver"),
          Workload(id="pricing", demand=1.0, request_mcpu=1000, exclusive=True, victim=True,
                   pod_uid="pod-g2", name="pricing"),
          _avx(0, 1.5)) + tuple(_scalar(i, 1.2) for i in range(5))
    shared = pool(node)
    initial = {w.id: (CpuSet.parse("2").ids if w.id == "solver" else CpuSet.parse("3").ids
                      if w.id == "pricing" else shared) for w in ws}
    return Scenario(name="kubelet_static", node=node, workloads=ws, initial=initial)


SCENARIOS: tuple[Callable[[], Scenario], ...] = (
    avx512_small, avx512_large, cache_thrasher, bandwidth_hog, churn, fragmented_2socket,
    kubelet_static)


# -- affinity and anti-affinity (pod annotations, docs/classes.md) ------------------------------------

ANTI, AFF = "perfbalance.io/anti-affinity", "perfbalance.io/affinity"


def _pod(wid: str, app: str, *, ann: Mapping[str, str] | None = None, **kw: Any) -> Workload:
    """A workload with the metadata discovery gives: pod `wid` in namespace `prod`, label app=`app`,
    its pod's annotations, container name `main`."""
    return Workload(id=wid, pod=wid, pod_uid=f"uid-{wid}", namespace="prod", name="main",
                    labels={"app": app}, annotations=dict(ann or {}), **kw)


def anti_affinity() -> Scenario:
    """Two streaming replicas that should not share a NUMA node (the node's memory bandwidth, which
    the planner is not told, is what they really fight over) and two key-value replicas that should
    not share cores, each with a weight. All start on NUMA node 0."""
    topo = synthetic(packages=2, cores_per_node=4, l3_size_bytes=16 * MIB, cpu_model=SKYLAKE)
    hog = dict(mpki_ref=60.0, ref_cache=4 * MIB, working_set=4 * GIB, cpi_core=0.7, memory_bytes=2 * GIB)
    kv = dict(mpki_ref=2.0, working_set=8 * MIB, victim=True)
    ws = (_pod("stream-0", "stream", ann={ANTI: "app=stream@numa*0.5"}, demand=1.0, request_mcpu=1000, **hog),
          _pod("stream-1", "stream", ann={ANTI: "app=stream@numa*0.5"}, demand=1.0, request_mcpu=1000, **hog),
          _pod("kv-0", "kv", ann={ANTI: "app=kv@core*0.2"}, demand=1.0, request_mcpu=1000, **kv),
          _pod("kv-1", "kv", demand=1.0, request_mcpu=1000, **kv))
    node0 = topo.nodes()[0].ids
    return Scenario(name="anti_affinity", node=_node(topo, bandwidth_per_node=4e9), workloads=ws,
                    initial={w.id: node0 for w in ws}, unit="node")


def affinity() -> Scenario:
    """A producer and its consumer that exchange cache lines (same L3 wanted), an API server and
    the database it talks to (same NUMA node wanted; the database has kubelet-dedicated CPU 7),
    started apart as a spreading scheduler would leave them."""
    topo = synthetic(packages=2, cores_per_node=4, l3_per_package=2, l3_size_bytes=16 * MIB,
                     cpu_model=SKYLAKE)  # L3 domains {0,1} {2,3} {4,5} {6,7}; nodes 0-3, 4-7
    kubelet = KubeletState(policy="static", default_cpuset=CpuSet.parse("0-6"),
                           exclusive={("uid-db", "main"): CpuSet.parse("7")})
    ws = (_pod("producer", "ingest", demand=1.0, request_mcpu=500, mpki_ref=1.0,
               talks_to=(("consumer", 2.0),)),
          _pod("consumer", "index", ann={AFF: "app=ingest@l3*0.3"}, demand=1.0, request_mcpu=500,
               mpki_ref=1.0, talks_to=(("producer", 2.0),), victim=True),
          _pod("api", "api", ann={AFF: "app=db@numa*0.2"}, demand=1.0, request_mcpu=500, mpki_ref=1.0,
               talks_to=(("db", 1.0),), victim=True),
          _pod("db", "db", demand=1.0, request_mcpu=1000, exclusive=True, mpki_ref=1.0,
               talks_to=(("api", 1.0),)))
    initial = {"producer": CpuSet.parse("0-1").ids, "consumer": CpuSet.parse("4-5").ids,
               "api": CpuSet.parse("2-3").ids, "db": CpuSet.parse("7").ids}
    return Scenario(name="affinity", node=_node(topo, kubelet=kubelet), workloads=ws, initial=initial,
                    unit="l3")


def hard_anti_affinity() -> Scenario:
    """A cache (kv-1) that wants the NUMA node of its client (web, dedicated CPU 5) and whose
    replica (kv-0, dedicated CPU 4 on that node) is marked hard: never on the same NUMA node.
    Node 1 has a free shareable CPU (3), so only the hard term keeps kv-1 where it is."""
    topo = synthetic(packages=2, cores_per_node=3, l3_size_bytes=16 * MIB, cpu_model=SKYLAKE)
    kubelet = KubeletState(policy="static", default_cpuset=CpuSet.parse("0-3"),
                           exclusive={("uid-kv-0", "main"): CpuSet.parse("4"),
                                      ("uid-web", "main"): CpuSet.parse("5")})
    kv = dict(mpki_ref=2.0, working_set=8 * MIB)
    ws = (_pod("web", "web", demand=1.0, request_mcpu=1000, exclusive=True, mpki_ref=1.0,
               talks_to=(("kv-1", 1.0),)),
          _pod("kv-0", "kv", ann={ANTI: "app=kv@numa!"}, demand=1.0, request_mcpu=1000, exclusive=True, **kv),
          _pod("kv-1", "kv", ann={AFF: "app=web@numa*0.5"}, demand=1.0, request_mcpu=500, victim=True,
               talks_to=(("web", 1.0),), **kv),
          _pod("batch", "batch", demand=1.0, request_mcpu=500, mpki_ref=0.5))
    initial = {"web": CpuSet.parse("5").ids, "kv-0": CpuSet.parse("4").ids,
               "kv-1": CpuSet.parse("0-1").ids, "batch": CpuSet.parse("0-3").ids}
    return Scenario(name="hard_anti_affinity", node=_node(topo, kubelet=kubelet), workloads=ws,
                    initial=initial)


# Beside SCENARIOS, not in it: the golden plans (tests/data/plan_golden.json.gz) cover SCENARIOS
# as planned before these terms existed.
AFFINITY_SCENARIOS: tuple[Callable[[], Scenario], ...] = (anti_affinity, hard_anti_affinity, affinity)


@dataclass(frozen=True, kw_only=True)
class PairOutcome:
    """One annotated pair (unordered) and whether a placement gives the pair what it asks for."""

    a: str
    b: str
    kind: str
    scope: str
    hard: bool
    ok: bool  # anti-affinity: no domain of `scope` in common; affinity: the same single domain(s)


Intent = tuple[str, str, AffinityTerm]  # (annotated container, matched container, term)


def intents(sc: Scenario) -> list[Intent]:
    """(a, b, term) for every annotated pair, from the annotations and labels, each pair once
    (the grammar of perfbalance.hints, not the planner's cost model)."""
    keys = HintKeys()
    ws = _all_workloads(sc)
    cs = {w.id: snapshot_container(w) for w in ws}
    seen: dict[tuple[str, str, str, str], Intent] = {}
    for w in sorted(ws, key=lambda w: w.id):
        for t in affinity_terms(cs[w.id], keys):
            for o in sorted(ws, key=lambda w: w.id):
                if o.id != w.id and t.matches(cs[o.id]):
                    key = (*sorted((w.id, o.id)), t.kind, t.scope)
                    if key not in seen or t.hard:
                        seen[key] = (w.id, o.id, t)
    return [seen[k] for k in sorted(seen)]


def snapshot_container(w: Workload) -> Container:
    return Container(id=w.id, name=w.name or w.id, pod=w.pod, namespace=w.namespace, cgroup=f"sim/{w.id}",
                     labels=dict(w.labels), annotations=dict(w.annotations))


def pair_outcomes(sc: Scenario, cpus: Mapping[str, frozenset[int]],
                  pairs: list[Intent] | None = None) -> list[PairOutcome]:
    pairs = intents(sc) if pairs is None else pairs
    if not pairs:
        return []
    idx = TopoIndex.build(sc.node.topology)
    of = {"core": idx.core_of, "l3": idx.l3_of, "numa": idx.node_of}
    out = []
    for a, b, t in pairs:
        if a not in cpus or b not in cpus:
            continue
        da, db = ({of[t.scope][c] for c in cpus[x]} for x in (a, b))
        ok = da.isdisjoint(db) if t.kind == "anti-affinity" else da == db and len(da) == 1
        out.append(PairOutcome(a=a, b=b, kind=t.kind, scope=t.scope, hard=t.hard, ok=ok))
    return out


def hard_broken(sc: Scenario, cpus: Mapping[str, frozenset[int]],
                pairs: list[Intent] | None = None) -> int:
    """How many hard anti-affinity pairs share a domain of their scope in `cpus`."""
    return sum(1 for p in pair_outcomes(sc, cpus, pairs) if p.hard and not p.ok)


# -- planning-time instances -------------------------------------------------------------------------

def timing_snapshot(containers: int, cpus: int) -> Snapshot:
    """A realistic large snapshot: a shared pool, pinned containers, 10 % AVX-512, LLC metrics."""
    packages = 1 if cpus <= 16 else 2
    topo = synthetic(packages=packages, cores_per_node=cpus // (2 * packages), threads_per_core=2,
                     cpu_model=SKYLAKE)
    node = _node(topo)
    rng = random.Random(f"{containers}x{cpus}")
    ws, placement = [], {}
    online = topo.online.ids
    for i in range(containers):
        kind = rng.random()
        w = Workload(id=f"c{i:04d}", demand=0.2 * cpus / containers * rng.uniform(0.5, 1.5) * 3,
                     request_mcpu=max(1, int(500 * cpus / containers)), avx512=kind < 0.1,
                     mpki_ref=30.0 if kind > 0.97 else rng.uniform(0.1, 4.0),
                     working_set=(512 if kind > 0.97 else 8) * MIB, victim=kind >= 0.1)
        ws.append(w)
        if rng.random() < 0.05:
            start = rng.randrange(cpus // 2)
            placement[w.id] = frozenset(range(start, start + 2)) | {start + cpus // 2}
        else:
            placement[w.id] = online
    return snapshot(node, ws, placement, time=0.0)


def timing_sizes() -> tuple[tuple[str, int, int], ...]:
    return (("10x8", 10, 8), ("100x64", 100, 64), ("1000x256", 1000, 256))



def steady_moves(sc: Scenario, *, cycles: int, settle_cycles: int, noise: float = 0.05,
                 config: RebalancerConfig | None = None, planner: Planner = plan,
                 observe: Observer = snapshot) -> tuple[int, int]:
    """(actions in the first `settle_cycles`, actions after) of a noisy closed loop: ping-pong check.
    `observe` makes the Snapshots the planner sees (this module's simulator by default)."""
    config = config or RebalancerConfig()
    cpus = dict(sc.initial)
    classes: dict[str, str] = {}
    state: Any = None
    rng = random.Random(f"steady-{sc.name}")
    early = late = 0
    for cycle in range(cycles):
        snap = observe(sc.node, sc.workloads, cpus, classes, time=cycle * INTERVAL, pmu=sc.pmu,
                       noise=noise, rng=rng)
        p = planner(snap, config, state, cycle * INTERVAL)
        state = p.state
        n = apply(p.actions, cpus, classes)
        if cycle < settle_cycles:
            early += n
        else:
            late += n
    return early, late
