"""An independent node simulator: the judge of `perfbalance bench plan`.

agent.bench.sim, the simulator the planner is tuned on, shares its CPU sharing (water-filling),
its loaded-latency curve and its topology index with the planner, so scoring the planner there
is the model agreeing with itself. This package is written from field-notes sections 2 and 7
alone and imports nothing of the planner's (an import-linter contract in pyproject.toml forbids
rebalancer, agent.bench.sim and agent.bench.scenarios): a discrete-time simulation of CFS-like
sharing, wake-up placement, per-core AVX-512 licence windows, SMT sharing and migrations
(agent.bench.truth.sched), then a fixed point of LLC occupancy and memory-bandwidth queueing
over the window (agent.bench.truth.memory):

    seconds/instruction = (CPI_core / s + (MPKI/1000 x L_mem(u) / MLP + transfers) x f) / f

with f the core's frequency in each step (licensed or not), s the SMT speed when the sibling is
busy, L_mem the latency of the NUMA node holding the job's pages (first touch: where its
threads ran) plus a remote penalty when a thread runs on the other node, and the time lost refilling caches after migrations taken off.
A job's performance is its instructions/s over what it does alone on the node (all CPUs
allowed), computed by the same model. Pure: no I/O, no clock; randomness is seeded.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from agent.bench.truth import memory, sched
from agent.bench.truth.machine import LINE, Job, Machine, Place

__all__ = ["ELEMENTS", "Job", "Machine", "Outcome", "Place", "evaluate", "neutral", "score"]

ITERATIONS = 40  # at most; most placements converge in a few
ELEMENTS = ("licence", "smt", "llc", "bandwidth", "remote", "migration", "transfers")


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One job over the window."""

    cores: float  # CPU time / window
    freq: float  # mean fraction of f0 while running
    cache: float  # LLC bytes held (all domains)
    mpki: float
    ips: float
    perf: float  # ips / ips alone
    lost: float  # fraction of its run time refilling caches after migrations


def evaluate(machine: Machine, jobs: Sequence[Job], cpus: Mapping[str, frozenset[int]],
             restricted: frozenset[str] = frozenset()) -> dict[str, Outcome]:
    """Every job's outcome with `jobs` placed on `cpus` (`restricted`: jobs in the RDT class)."""
    raw = _steady(machine, tuple(jobs), cpus, restricted)
    return {j.id: replace(raw[j.id], perf=raw[j.id].ips / alone_ips(machine, j)) for j in jobs}


def score(machine: Machine, jobs: Sequence[Job], cpus: Mapping[str, frozenset[int]],
          restricted: frozenset[str] = frozenset()) -> tuple[float, float]:
    """(victim slowdown, throughput): 1 - the victims' mean performance, and the sum of all."""
    out = evaluate(machine, jobs, cpus, restricted)
    victims = [out[j.id].perf for j in jobs if j.victim]
    return (1.0 - sum(victims) / len(victims) if victims else 0.0), sum(o.perf for o in out.values())


@functools.lru_cache(maxsize=4096)
def alone_ips(machine: Machine, job: Job) -> float:
    """Instructions/s of `job` alone on the node, every CPU allowed."""
    everything = frozenset(p.cpu for p in machine.places)
    # alone means next to its partners: every shared-line transfer within one L3 domain
    ips = _steady(machine, (job,), {job.id: everything}, frozenset(), alone=True)[job.id].ips
    return max(ips, 1e-9)


# The machine parameter whose neutral value switches each machine-side model element off.
_NEUTRAL_MACHINE = {"licence": ("licence_loss", 0.0), "smt": ("smt_speed", 1.0), "llc": ("llc_alpha", 0.0),
                    "bandwidth": ("bandwidth_per_node", 1e18), "remote": ("remote_extra_s", 0.0),
                    "migration": ("refill_bytes_per_s", 1e30)}


def neutral(machine: Machine, jobs: Sequence[Job], element: str) -> tuple[Machine, tuple[Job, ...]]:
    """The node and jobs with one model element switched off (for attributing disagreements)."""
    if element == "transfers":
        return machine, tuple(replace(j, partners=()) for j in jobs)
    if element not in _NEUTRAL_MACHINE:
        raise ValueError(f"unknown model element {element!r}")
    field, value = _NEUTRAL_MACHINE[element]
    return replace(machine, **{field: value}), tuple(jobs)


# -- the fixed point over the window ---------------------------------------------------------------

def _steady(machine: Machine, jobs: tuple[Job, ...], cpus: Mapping[str, frozenset[int]],
            restricted: frozenset[str], *, alone: bool = False) -> dict[str, Outcome]:
    use = sched.run(machine, jobs, cpus)
    by_id = {j.id: j for j in jobs}
    nodes = sorted({p.node for p in machine.places})
    pages = {j.id: _page_nodes(machine, cpus[j.id], use[j.id]) for j in jobs}
    occ = {j.id: {d: machine.l3_bytes for d in use[j.id].by_l3} for j in jobs}
    lat = {n: machine.idle_latency_s for n in nodes}
    ips: dict[str, float] = {}
    mp: dict[str, float] = {}
    for _ in range(ITERATIONS):
        mp = {j.id: _mean_mpki(machine, j, use[j.id], occ[j.id]) for j in jobs}
        ips = {j.id: _ips(machine, j, use[j.id], mp[j.id], _latency(machine, use[j.id], pages[j.id], lat),
                          occ[j.id], alone=alone) for j in jobs}
        new_occ = _occupancy(machine, by_id, use, occ, ips, restricted)
        new_lat = _loaded(machine, nodes, by_id, pages, mp, ips, lat)
        done = _close(new_lat, lat) and all(_close(new_occ[j], occ[j]) for j in occ)
        occ, lat = new_occ, new_lat
        if done:
            break
    return {j.id: Outcome(cores=use[j.id].run_s / machine.window_s, freq=_mean_freq(machine, use[j.id]),
                          cache=sum(occ[j.id].values()), mpki=mp[j.id], ips=ips[j.id], perf=0.0,
                          lost=_lost(machine, j, use[j.id], occ[j.id]))
            for j in jobs}


def _close(a: Mapping[int, float], b: Mapping[int, float]) -> bool:
    """The fixed point has converged for these values (one part in a million)."""
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-6 * abs(b[k]) for k in a)


def _page_nodes(machine: Machine, cpus: frozenset[int], use: sched.Usage) -> dict[int, float]:
    """Where a job's memory lives: first touch, so on the NUMA nodes its threads ran on, by run
    time (spread over its cpuset's nodes if it never ran)."""
    if use.run_s > 0:
        return {n: t / use.run_s for n, t in use.by_node.items()}
    mine = [p.node for p in machine.places if p.cpu in cpus]
    return {n: mine.count(n) / len(mine) for n in set(mine)} if mine else {}


def _mean_mpki(machine: Machine, job: Job, use: sched.Usage, occ: Mapping[int, float]) -> float:
    if use.run_s <= 0:
        return memory.mpki(job, machine.l3_bytes, machine)
    return sum(t / use.run_s * memory.mpki(job, occ.get(d, machine.l3_bytes), machine) for d, t in use.by_l3.items())


def _latency(machine: Machine, use: sched.Usage, pages: Mapping[int, float], lat: Mapping[int, float]) -> float:
    """Mean latency of one miss: the page's node loaded latency, plus the remote penalty when the
    thread ran on another node."""
    if use.run_s <= 0:
        return machine.idle_latency_s
    local = {n: t / use.run_s for n, t in use.by_node.items()}
    return sum(f * (lat[n] + (1.0 - local.get(n, 0.0)) * machine.remote_extra_s) for n, f in pages.items())


def _transfer_s(machine: Machine, job: Job, use: sched.Usage, *, alone: bool = False) -> float:
    """Seconds per instruction spent on shared lines; a transfer is a dependent load (no MLP).
    `alone`: the partners are taken to sit in the same L3 domain."""
    if alone:
        return sum(t for _, t in job.partners) / 1000.0 * machine.transfer_s[1]
    if use.run_s <= 0:
        return 0.0
    rate = dict(job.partners)
    return sum(t / use.run_s * rate[p] / 1000.0 * machine.transfer_s[d] for (p, d), t in use.distance.items())


def _ips(machine: Machine, job: Job, use: sched.Usage, mpki: float, latency: float,
         occ: Mapping[int, float], *, alone: bool = False) -> float:
    stall = mpki / 1000.0 * latency / job.mlp + _transfer_s(machine, job, use, alone=alone)
    instr = 0.0
    for (lic, shared), t in use.by_state.items():
        f = machine.f0_hz * (1.0 - machine.licence_loss if lic else 1.0)
        s = machine.smt_speed if shared else 1.0
        instr += t * f / (job.cpi_core / s + stall * f)
    return instr * (1.0 - _lost(machine, job, use, occ)) / machine.window_s


def _lost(machine: Machine, job: Job, use: sched.Usage, occ: Mapping[int, float]) -> float:
    """Fraction of run time refilling: a cross-L3 migration reloads the thread's share of what the
    job held there; a cache-hot one within the domain reloads its L2."""
    if use.run_s <= 0:
        return 0.0
    held = sum(occ.values()) / max(len(occ), 1)
    footprint = min(job.working_set, held) / max(job.threads, 1)
    refill = (use.cross_l3_migrations * footprint + use.hot_migrations * min(job.working_set, machine.l2_bytes))
    return min(0.9, refill / machine.refill_bytes_per_s / use.run_s)


def _occupancy(machine: Machine, jobs: Mapping[str, Job], use: Mapping[str, sched.Usage],
               old: Mapping[str, Mapping[int, float]], ips: Mapping[str, float],
               restricted: frozenset[str]) -> dict[str, dict[int, float]]:
    inserts: dict[int, dict[str, float]] = {}
    for j, u in use.items():
        for d, t in u.by_l3.items():
            rate = memory.mpki(jobs[j], old[j].get(d, machine.l3_bytes), machine) / 1000.0 * ips[j]
            inserts.setdefault(d, {})[j] = rate * t / u.run_s
    out: dict[str, dict[int, float]] = {j: {} for j in use}
    for d, rates in inserts.items():
        for j, b in memory.domain_occupancy(machine, jobs, rates, set(restricted)).items():
            out[j][d] = 0.5 * b + 0.5 * old[j].get(d, b)  # damped: the fixed point oscillates otherwise
    return out


def _loaded(machine: Machine, nodes: Sequence[int], jobs: Mapping[str, Job], pages: Mapping[str, Mapping[int, float]],
            mpki: Mapping[str, float], ips: Mapping[str, float], old: Mapping[int, float]) -> dict[int, float]:
    traffic = {n: 0.0 for n in nodes}
    for j in jobs:
        for n, f in pages[j].items():
            traffic[n] += mpki[j] / 1000.0 * ips[j] * LINE * f
    return {n: (old[n] * machine.idle_latency_s * memory.latency_factor(traffic[n] / machine.bandwidth_per_node)) ** 0.5
            for n in nodes}  # geometric damping: latency and traffic chase each other


def _mean_freq(machine: Machine, use: sched.Usage) -> float:
    if use.run_s <= 0:
        return 1.0
    return sum(t * (1.0 - machine.licence_loss if lic else 1.0) for (lic, _), t in use.by_state.items()) / use.run_s

