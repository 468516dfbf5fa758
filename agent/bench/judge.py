"""The bench harness between the scenarios and the independent simulator (agent.bench.truth).

agent.bench.truth may not import the scenarios or agent.bench.sim (an import-linter contract),
so this module converts them: a sim Node becomes a truth Machine, a Workload becomes a Job (its
demand as whole threads with a duty cycle, its CPU request as the CFS weight), an RDT class as
the restricted set. It scores placements with the independent model, makes the Snapshots a
node modelled by it would report (for closed loops the planner runs against it), and says
where the two simulators disagree and which model element drives the difference: each element
is switched off (in both simulators where both have it, in the independent one where only it
has it) and the element whose removal closes most of the gap is named.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from agent.bench import truth
from agent.bench.scenarios import score as sim_score  # the planner-side simulator's score
from agent.bench.sim import LINE, Node, Workload
from agent.snapshot.derive import derive
from perfbalance.cpuset import CpuSet
from perfbalance.model import CollectorStatus, Container, ContainerSample, Snapshot

SHARED = ("licence", "llc", "bandwidth", "transfers")  # elements both simulators model


def machine(node: Node) -> truth.Machine:
    ways = 11
    return truth.Machine.from_topology(
        node.topology, f0_hz=node.f0_hz, licence_loss=node.license_loss, idle_latency_s=node.latency_s,
        bandwidth_per_node=node.bandwidth_per_node, llc_alpha=node.llc_alpha, llc_ways=ways,
        restricted_ways=max(1, round(node.rdt_fraction * ways)) if node.rdt_class else 0,
        restricted_class=node.rdt_class)


def job(w: Workload) -> truth.Job:
    threads = max(1, math.ceil(w.demand - 1e-9))
    return truth.Job(id=w.id, threads=threads, duty=w.demand / threads, weight=max(w.request_mcpu, 2) / 1000.0,
                     avx512=w.avx512, cpi_core=w.cpi_core, mpki_ref=w.mpki_ref, ref_cache=w.ref_cache,
                     working_set=w.working_set, mlp=w.mlp, partners=tuple(w.talks_to), victim=w.victim)


def restricted(node: Node, classes: Mapping[str, str] | None) -> frozenset[str]:
    if not node.rdt_class or not classes:
        return frozenset()
    return frozenset(c for c, k in classes.items() if k == node.rdt_class)


def score(node: Node, workloads: Sequence[Workload], cpus: Mapping[str, frozenset[int]],
          classes: Mapping[str, str] | None = None) -> tuple[float, float]:
    """(victim slowdown, throughput) by the independent simulator (an agent.bench.scenarios Scorer)."""
    jobs = tuple(job(w) for w in workloads)
    return _score(machine(node), jobs, tuple((j.id, cpus[j.id]) for j in jobs), restricted(node, classes))


@functools.lru_cache(maxsize=8192)
def _score(m: truth.Machine, jobs: tuple[truth.Job, ...], cpus: tuple[tuple[str, frozenset[int]], ...],
           res: frozenset[str]) -> tuple[float, float]:
    """Scores by value (the churn timeline and the optimum's search ask for the same placements)."""
    return truth.score(m, jobs, dict(cpus), res)


def score_without_licence(node: Node, workloads: Sequence[Workload], cpus: Mapping[str, frozenset[int]],
                          classes: Mapping[str, str] | None = None) -> tuple[float, float]:
    """`score` on the same node with a zero licence loss: the difference is what AVX-512 costs there."""
    return score(replace(node, license_loss=0.0), workloads, cpus, classes)


# -- what a node modelled by the independent simulator would report -----------------------------------

def snapshot(node: Node, workloads: Sequence[Workload], cpus: Mapping[str, frozenset[int]],
             classes: Mapping[str, str] | None = None, *, time: float, pmu: bool = True,
             resctrl: bool = True, noise: float = 0.0, rng: random.Random | None = None,
             cache: dict[Any, dict[str, truth.Outcome]] | None = None) -> Snapshot:
    """The Snapshot collectors would report on the independent model's node (an Observer);
    `cache` keeps outcomes per placement, since a steady loop asks for the same one each cycle."""
    classes = classes or {}
    m, jobs = machine(node), tuple(job(w) for w in workloads)
    key = (m, jobs, tuple((j.id, cpus[j.id]) for j in jobs), restricted(node, classes))
    out = cache.get(key) if cache is not None else None
    if out is None:
        out = truth.evaluate(m, jobs, cpus, key[3])
        if cache is not None:
            cache[key] = out
    samples = [ContainerSample(container=_container(node, w, cpus, classes),
                               metrics=derive(_noisy(_metrics(w, out[w.id], node, pmu=pmu, resctrl=resctrl),
                                                     noise, rng)))
               for w in sorted(workloads, key=lambda w: w.id)]
    collectors = {"cgroup": CollectorStatus(up=True), "avx512": CollectorStatus(up=True),
                  "perf": CollectorStatus(up=pmu), "resctrl": CollectorStatus(up=resctrl and bool(node.rdt_class))}
    return Snapshot(time=time, window=10.0, node="truth", topology=node.topology, containers=tuple(samples),
                    kubelet=node.kubelet, reserved=node.reserved, collectors=collectors)


def _container(node: Node, w: Workload, cpus: Mapping[str, frozenset[int]], classes: Mapping[str, str]) -> Container:
    mems = CpuSet(frozenset(c.node for c in node.topology.cpus if c.id in cpus[w.id]))
    return Container(id=w.id, name=w.name or w.id, pod_uid=w.pod_uid, cgroup=f"sim/{w.id}", pod=w.pod,
                     namespace=w.namespace, labels=dict(w.labels), annotations=dict(w.annotations),
                     qos="guaranteed" if w.exclusive else "burstable", cpuset=CpuSet(cpus[w.id]), mems=mems,
                     request_mcpu=w.request_mcpu, memory_bytes=w.memory_bytes, exclusive=w.exclusive,
                     rdt_class=classes.get(w.id, ""))


def _metrics(w: Workload, o: truth.Outcome, node: Node, *, pmu: bool, resctrl: bool) -> dict[str, float]:
    m = {"cpu_usage_cores": o.cores, "avx512_heavy": 1.0 if w.avx512 else 0.0,
         "avx512_active_ratio": 0.6 if w.avx512 else 0.0, "memory_bytes": float(w.memory_bytes)}
    misses = o.mpki / 1000.0 * o.ips
    if pmu:
        cycles = o.cores * o.freq * node.f0_hz
        m.update(instructions_per_second=o.ips, cycles_per_second=cycles,
                 ipc=o.ips / cycles if cycles > 0 else 0.0, llc_mpki=o.mpki, llc_misses_per_second=misses,
                 memory_bandwidth_bytes_per_second=misses * LINE)
    if resctrl:
        m["llc_occupancy_bytes"] = o.cache
    return m


def _noisy(m: dict[str, float], noise: float, rng: random.Random | None) -> dict[str, float]:
    if noise <= 0 or rng is None:
        return m
    return {k: v * max(0.0, 1.0 + rng.gauss(0.0, noise)) if k != "avx512_heavy" else v for k, v in m.items()}


# -- where the two simulators disagree ---------------------------------------------------------------

def disagreement(node: Node, workloads: Sequence[Workload], cpus: Mapping[str, frozenset[int]],
                 classes: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Both simulators' (victim slowdown, throughput) of one placement, the difference, and per
    model element how much of the difference is left with that element switched off."""
    def both(n: Node, ws: Sequence[Workload], m: truth.Machine, jobs: Sequence[truth.Job]) -> tuple[float, float]:
        s_slow, s_thr = sim_score(n, ws, cpus, classes)
        t_slow, t_thr = truth.score(m, jobs, cpus, restricted(node, classes))
        return t_slow - s_slow, t_thr - s_thr
    base_m, base_j = machine(node), tuple(job(w) for w in workloads)
    s_slow, s_thr = sim_score(node, workloads, cpus, classes)
    t_slow, t_thr = truth.score(base_m, base_j, cpus, restricted(node, classes))
    d_slow, d_thr = t_slow - s_slow, t_thr - s_thr
    left: dict[str, dict[str, float]] = {}
    for e in truth.ELEMENTS:
        m, jobs = truth.neutral(base_m, base_j, e)
        n, ws = _sim_neutral(node, workloads, e) if e in SHARED else (node, workloads)
        e_slow, e_thr = both(n, ws, m, jobs)
        left[e] = {"victim_slowdown": round(e_slow, 4), "throughput": round(e_thr, 4)}
    return {"sim": {"victim_slowdown": round(s_slow, 4), "throughput": round(s_thr, 4)},
            "truth": {"victim_slowdown": round(t_slow, 4), "throughput": round(t_thr, 4)},
            "difference": {"victim_slowdown": round(d_slow, 4), "throughput": round(d_thr, 4)},
            "left_without": left,
            "drives": {k: _driver(d, {e: v[k] for e, v in left.items()})
                       for k, d in (("victim_slowdown", d_slow), ("throughput", d_thr))}}


def _driver(diff: float, left: Mapping[str, float]) -> str:
    """The element whose removal shrinks |difference| the most; 'none' when the models agree."""
    if abs(diff) < 0.005:
        return "none (within 0.005)"
    best = max(left, key=lambda e: (abs(diff) - abs(left[e]), e))
    return best if abs(diff) - abs(left[best]) > 0.1 * abs(diff) else "several (no single element)"


def _sim_neutral(node: Node, workloads: Sequence[Workload], element: str) -> tuple[Node, Sequence[Workload]]:
    if element == "licence":
        return replace(node, license_loss=0.0), workloads
    if element == "llc":
        return replace(node, llc_alpha=0.0), workloads
    if element == "bandwidth":
        return replace(node, bandwidth_per_node=1e18), workloads
    return node, [replace(w, talks_to=()) for w in workloads]
