"""A node simulator: turns a placement into per-container performance and Snapshot metrics.

It is the yardstick of `perfbalance bench plan`: the planner only sees the Snapshots this module
emits (the same metric names the collectors produce), and its decisions are scored here. The
models are the ones documented below, written independently of the planner's
cost model (the planner estimates from measurements; this module is the ground truth):

* CPU sharing: water-filling of each cpuset group's demand (rebalancer.sharing, CFS-like);
* AVX-512 license per physical core: P(core licensed) = 1 - prod_t (1 - min(1, r x a_t)) over its
  SMT threads, a_t = AVX-512 busy time on thread t, r = 1.2 for the 0.65-2 ms the license is held
  after the last 512-bit instruction; every thread of a licensed core runs at (1 - loss) x f0;
* LLC: LRU shares an L3 domain in proportion to insertion (miss) rate; a container's threads
  in a domain see only what it holds there; misses follow
  MPKI(C) = MPKI_ref x (min(C, WS) / C_ref)^-a (flat beyond the working set); an RDT class caps a
  member's share; solved by fixed-point iteration together with bandwidth;
* memory: loaded latency L(u) = L_idle x factor(u) (flat to 40 %, 1.5x at 80 %, +5x per unit
  beyond) of the node's sustainable bandwidth; bandwidth = misses x 64 B;
* sharing with a partner (producer/consumer, `talks_to`): T transfers of shared cache lines per
  1000 instructions, each served at the distance between the two: same L3 domain COMM_L3
  (20 ns), another L3 of the same NUMA node COMM_DIE (50 ns), another NUMA node COMM_REMOTE
  (120 ns), weighted by the fractions of their cpusets in each domain; this is what affinity
  annotations ask the planner for, and the planner never sees T;
* CPI = CPI_core + (MPKI/1000 x L(u) + T/1000 x L_comm) x f / MLP; instructions/s = granted CPU x f / CPI;
* a container's performance is its instructions/s over what it would get alone on the node
  (full demand, no license unless it is AVX-512 itself, cache up to its working set, idle memory,
  its partners in the same L3 domain).

A workload carries the pod metadata discovery would give (pod, namespace, pod labels,
annotations), so annotations such as affinity reach the planner as they would on a node.

Pure: no I/O, no clock; noise comes from a seeded `random.Random` passed in.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent.snapshot.derive import derive
from perfbalance.cpuset import CpuSet
from perfbalance.model import CollectorStatus, Container, ContainerSample, KubeletState, Snapshot
from perfbalance.topology import Topology
from rebalancer.costmodel import loaded_latency_factor
from rebalancer.sharing import fill_order, water_fill
from rebalancer.topoindex import TopoIndex

LINE = 64
MIB = 1 << 20
GIB = 1 << 30
RELAX = 1.2  # license held a little beyond the AVX-512 busy time
COMM_L3, COMM_DIE, COMM_REMOTE = 20e-9, 50e-9, 120e-9  # shared-line transfer latency by distance


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What a container does, independent of where it runs."""

    id: str
    demand: float  # CPUs of work it would use if unconstrained
    request_mcpu: int = 0
    avx512: bool = False
    cpi_core: float = 1.0
    mpki_ref: float = 0.0  # LLC misses per 1000 instructions with `ref_cache` bytes of LLC
    ref_cache: float = 4 * MIB
    working_set: float = 4 * MIB
    mlp: float = 2.0
    memory_bytes: int = 1 * GIB
    exclusive: bool = False  # kubelet-dedicated CPUs (never moves)
    victim: bool = False  # counted in the victim slowdown
    pod_uid: str = ""
    name: str = ""
    pod: str = ""
    namespace: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)  # the pod's labels
    annotations: Mapping[str, str] = field(default_factory=dict)  # the pod's annotations
    talks_to: tuple[tuple[str, float], ...] = ()  # (partner id, shared-line transfers per 1000 instr.)


@dataclass(frozen=True, kw_only=True)
class Node:
    topology: Topology
    reserved: CpuSet = field(default_factory=CpuSet)
    kubelet: KubeletState = field(default_factory=KubeletState)
    f0_hz: float = 2.5e9
    license_loss: float = 0.2  # true frequency loss while a core holds the AVX-512 license
    latency_s: float = 90e-9
    bandwidth_per_node: float = 60e9
    llc_alpha: float = 0.5
    rdt_fraction: float = 0.2  # share of an L3 the restricted RDT class may fill
    rdt_class: str = ""  # name of that class ("" = no RDT on this node)


@dataclass(frozen=True, kw_only=True)
class Perf:
    granted: float
    freq: float  # fraction of f0
    cache: float  # LLC bytes held
    mpki: float
    cpi: float
    ips: float
    perf: float  # ips / ips alone


def simulate(node: Node, workloads: Sequence[Workload], cpus: Mapping[str, frozenset[int]],
             classes: Mapping[str, str] | None = None) -> dict[str, Perf]:
    """Steady-state performance of every workload placed on `cpus`."""
    idx = TopoIndex.build(node.topology)
    classes = classes or {}
    wl = {w.id: w for w in workloads}
    granted, per_cpu = _share_cpu(workloads, cpus)
    freq = _frequencies(node, idx, wl, granted, per_cpu)
    cache, mpki, cpi, ips = _memory_fixed_point(node, idx, wl, cpus, classes, granted, freq)
    return {cid: Perf(granted=granted[cid], freq=freq[cid], cache=cache[cid], mpki=mpki[cid],
                      cpi=cpi[cid], ips=ips[cid], perf=ips[cid] / alone_ips(node, wl[cid]))
            for cid in sorted(wl)}


def alone_ips(node: Node, w: Workload) -> float:
    c = min(w.working_set, float(node.topology.l3_size_bytes or w.working_set))
    mpki = _mpki(w, c, node.llc_alpha)
    f = 1.0 - (node.license_loss if w.avx512 else 0.0)
    stall = mpki / 1000.0 * node.latency_s + sum(t for _, t in w.talks_to) / 1000.0 * COMM_L3
    cpi = w.cpi_core + stall * f * node.f0_hz / w.mlp
    return max(w.demand, 1e-9) * f * node.f0_hz / cpi


def _mpki(w: Workload, cache: float, alpha: float) -> float:
    if w.mpki_ref <= 0:
        return 0.0
    c = max(min(cache, w.working_set), 64 * 1024.0)
    return w.mpki_ref * (c / w.ref_cache) ** -alpha


def _share_cpu(workloads: Sequence[Workload], cpus: Mapping[str, frozenset[int]],
               ) -> tuple[dict[str, float], dict[str, dict[int, float]]]:
    groups: dict[frozenset[int], list[Workload]] = {}
    for w in workloads:
        groups.setdefault(cpus[w.id], []).append(w)
    keys = sorted(groups, key=fill_order)
    contribs, _ = water_fill([(k, sum(w.demand for w in groups[k])) for k in keys])
    granted: dict[str, float] = {}
    per_cpu: dict[str, dict[int, float]] = {}
    for k, contrib in zip(keys, contribs):
        total = sum(w.demand for w in groups[k])
        for w in groups[k]:
            share = w.demand / total if total > 0 else 0.0
            per_cpu[w.id] = {c: x * share for c, x in contrib.items()}
            granted[w.id] = sum(per_cpu[w.id].values())
    return granted, per_cpu


def _frequencies(node: Node, idx: TopoIndex, wl: Mapping[str, Workload], granted: Mapping[str, float],
                 per_cpu: Mapping[str, Mapping[int, float]]) -> dict[str, float]:
    avx: dict[int, float] = {}
    for cid, w in wl.items():
        if w.avx512:
            for c, x in per_cpu[cid].items():
                avx[c] = avx.get(c, 0.0) + x
    free: dict[tuple[int, int, int], float] = {}
    for c, a in avx.items():
        key = idx.core_of[c]
        free[key] = free.get(key, 1.0) * (1.0 - min(1.0, RELAX * a))
    out = {}
    for cid, w in wl.items():
        if w.avx512:
            out[cid] = 1.0 - node.license_loss
            continue
        g = granted[cid]
        lic = sum(x * (1.0 - free.get(idx.core_of[c], 1.0)) for c, x in per_cpu[cid].items())
        out[cid] = 1.0 - node.license_loss * (lic / g if g > 0 else 0.0)
    return out


def _fractions(of: Mapping[int, int], cpus: frozenset[int]) -> dict[int, float]:
    out: dict[int, float] = {}
    for c in cpus:
        out[of[c]] = out.get(of[c], 0.0) + 1.0 / len(cpus)
    return out


def _memory_fixed_point(node: Node, idx: TopoIndex, wl: Mapping[str, Workload],
                        cpus: Mapping[str, frozenset[int]], classes: Mapping[str, str],
                        granted: Mapping[str, float], freq: Mapping[str, float]) -> tuple[dict[str, float], ...]:
    l3f = {cid: _fractions(idx.l3_of, cpus[cid]) for cid in wl}
    nodef = {cid: _fractions(idx.node_of, cpus[cid]) for cid in wl}
    size = float(node.topology.l3_size_bytes or 32 * MIB)
    lat = {n: node.latency_s for n in idx.nodes}
    per_domain = {cid: {d: size for d in l3f[cid]} for cid in wl}
    comm = {cid: _comm_stall(w, l3f, nodef) for cid, w in wl.items()}
    for _ in range(8):
        mpki = {cid: sum(f * _mpki(w, per_domain[cid][d], node.llc_alpha) for d, f in l3f[cid].items())
                for cid, w in wl.items()}
        cpi, ips = _cpi_ips(node, wl, nodef, lat, granted, freq, mpki, comm)
        misses = {cid: mpki[cid] / 1000.0 * ips[cid] for cid in wl}
        per_domain = _llc_shares(node, wl, l3f, classes, misses, size)
        lat = _latencies(node, idx, wl, nodef, misses)
    cache = {cid: sum(per_domain[cid].values()) for cid in wl}
    return cache, mpki, cpi, ips


def _comm_stall(w: Workload, l3f: Mapping[str, Mapping[int, float]],
                nodef: Mapping[str, Mapping[int, float]]) -> float:
    """Seconds of shared-line transfer per instruction: each partner's transfers at the expected
    distance (probability of the same L3 domain, of the same NUMA node, else remote)."""
    out = 0.0
    for partner, t in w.talks_to:
        if partner not in l3f:
            continue
        same_l3 = sum(f * l3f[partner].get(d, 0.0) for d, f in l3f[w.id].items())
        same_node = sum(f * nodef[partner].get(n, 0.0) for n, f in nodef[w.id].items())
        lat = same_l3 * COMM_L3 + (same_node - same_l3) * COMM_DIE + (1.0 - same_node) * COMM_REMOTE
        out += t / 1000.0 * lat
    return out


def _cpi_ips(node: Node, wl: Mapping[str, Workload], nodef: Mapping[str, Mapping[int, float]],
             lat: Mapping[int, float], granted: Mapping[str, float], freq: Mapping[str, float],
             mpki: Mapping[str, float], comm: Mapping[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    cpi, ips = {}, {}
    for cid, w in wl.items():
        f_hz = freq[cid] * node.f0_hz
        latency = sum(frac * lat[n] for n, frac in nodef[cid].items())
        cpi[cid] = w.cpi_core + (mpki[cid] / 1000.0 * latency + comm[cid]) * f_hz / w.mlp
        ips[cid] = granted[cid] * f_hz / cpi[cid]
    return cpi, ips


def _llc_shares(node: Node, wl: Mapping[str, Workload], l3f: Mapping[str, Mapping[int, float]],
                classes: Mapping[str, str], misses: Mapping[str, float], size: float,
                ) -> dict[str, dict[int, float]]:
    """Per container, the LLC bytes it holds in each L3 domain it runs in."""
    domains = sorted({d for f in l3f.values() for d in f})
    cache: dict[str, dict[int, float]] = {cid: {} for cid in wl}
    for d in domains:
        w_in = {cid: misses[cid] * f[d] + 1e-3 for cid, f in l3f.items() if d in f}
        restricted = {c for c in w_in if node.rdt_class and classes.get(c) == node.rdt_class}
        total = sum(w_in.values())
        res_total = sum(w_in[c] for c in restricted)
        res_cap = min(node.rdt_fraction * size, size * res_total / total) if restricted else 0.0
        un_total = total - res_total
        for c, x in w_in.items():
            if c in restricted:
                cache[c][d] = res_cap * x / res_total
            else:
                cache[c][d] = (size - res_cap) * x / un_total
    return cache


def _latencies(node: Node, idx: TopoIndex, wl: Mapping[str, Workload],
               nodef: Mapping[str, Mapping[int, float]], misses: Mapping[str, float]) -> dict[int, float]:
    used = {n: 0.0 for n in idx.nodes}
    for cid in wl:
        for n, frac in nodef[cid].items():
            used[n] += misses[cid] * LINE * frac
    return {n: node.latency_s * loaded_latency_factor(b / node.bandwidth_per_node, 0.4, 0.8)
            for n, b in used.items()}


# -- Snapshots ----------------------------------------------------------------------------------

def snapshot(node: Node, workloads: Sequence[Workload], cpus: Mapping[str, frozenset[int]],
             classes: Mapping[str, str] | None = None, *, time: float, pmu: bool = True,
             resctrl: bool = True, noise: float = 0.0, rng: random.Random | None = None) -> Snapshot:
    """The Snapshot collectors would report for this placement (optionally noisy)."""
    classes = classes or {}
    perf = simulate(node, workloads, cpus, classes)
    idx = TopoIndex.build(node.topology)
    samples = []
    for w in sorted(workloads, key=lambda w: w.id):
        p = perf[w.id]
        m = _metrics(w, p, node, pmu=pmu, resctrl=resctrl)
        if noise > 0 and rng is not None:
            m = {k: v * max(0.0, 1.0 + rng.gauss(0.0, noise)) if k != "avx512_heavy" else v
                 for k, v in m.items()}
        c = Container(id=w.id, name=w.name or w.id, pod_uid=w.pod_uid, cgroup=f"sim/{w.id}",
                      pod=w.pod, namespace=w.namespace, labels=dict(w.labels),
                      annotations=dict(w.annotations),
                      qos="guaranteed" if w.exclusive else "burstable",
                      cpuset=CpuSet(cpus[w.id]), mems=CpuSet(idx.nodes_of(cpus[w.id])),
                      request_mcpu=w.request_mcpu, memory_bytes=w.memory_bytes,
                      exclusive=w.exclusive, rdt_class=classes.get(w.id, ""))
        samples.append(ContainerSample(container=c, metrics=derive(m)))  # as the agent builds a Snapshot
    collectors = {"cgroup": CollectorStatus(up=True), "avx512": CollectorStatus(up=True),
                  "perf": CollectorStatus(up=pmu), "resctrl": CollectorStatus(up=resctrl and bool(node.rdt_class))}
    return Snapshot(time=time, window=10.0, node="sim", topology=node.topology,
                    containers=tuple(samples), kubelet=node.kubelet, reserved=node.reserved,
                    collectors=collectors)


def _metrics(w: Workload, p: Perf, node: Node, *, pmu: bool, resctrl: bool) -> dict[str, float]:
    m = {"cpu_usage_cores": p.granted, "avx512_heavy": 1.0 if w.avx512 else 0.0,
         "avx512_active_ratio": 0.6 if w.avx512 else 0.0, "memory_bytes": float(w.memory_bytes)}
    misses = p.mpki / 1000.0 * p.ips
    if pmu:
        m.update(instructions_per_second=p.ips, cycles_per_second=p.granted * p.freq * node.f0_hz,
                 ipc=1.0 / p.cpi, llc_mpki=p.mpki, llc_misses_per_second=misses,
                 memory_bandwidth_bytes_per_second=misses * LINE)
    if resctrl:
        m["llc_occupancy_bytes"] = p.cache
    return m
