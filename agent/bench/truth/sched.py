"""The discrete-time half of the independent simulator: which thread runs where, step by step.

Each job's threads wake and sleep on a seeded timeline (bursts with an exponential length whose
mean is Machine.burst_s, the sleeps sized to the job's duty cycle) that depends on the job and
the seed only, so two placements of the same jobs see the same work (common random numbers).
Every step of Machine.dt_s:

* CFS-like sharing: runnable threads are served in order of their job's virtual runtime (run
  time over its CFS weight; a job waking after a sleep starts no more than 3 ms behind the
  others, as CFS places a woken entity near min_vruntime), then the thread's own;
* wake-up placement as select_idle_sibling does: the previous CPU if free, else an idle whole
  core of the previous L3 domain, else a free CPU there, else an idle core anywhere allowed,
  else any free allowed CPU; a thread that finds none waits;
* AVX-512 licence per physical core (field notes section 2): taken in a step in which any of its
  threads runs 512-bit code, held for Machine.licence_hold_s after the last such step; every
  thread of the core runs at the licensed frequency meanwhile (the SMT sibling shares it);
* SMT: a thread whose sibling runs in the same step is marked "shared" (its core part is slower);
* migrations: to another L3 domain (the footprint there is lost), or within the domain while
  still cache-hot (ran within Machine.migration_hot_s);
* shared-line distance: for each partner, where the partner ran last (same core, L3, node, else).

The result is counters per job; agent.bench.truth turns them into instructions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent.bench.truth.machine import Job, Machine, Place

WAKE_LAG_S = 3e-3  # CFS: a woken entity is placed at most sched_latency/2-ish behind min_vruntime


@dataclass(frozen=True, kw_only=True)
class Usage:
    """What one job did over the window (seconds of CPU time and event counts)."""

    run_s: float
    by_state: Mapping[tuple[bool, bool], float]  # (licensed, sibling busy) -> seconds
    by_l3: Mapping[int, float]
    by_node: Mapping[int, float]
    cross_l3_migrations: int
    hot_migrations: int
    distance: Mapping[tuple[str, int], float]  # (partner, 0 core / 1 L3 / 2 node / 3 remote) -> seconds


@dataclass(kw_only=True)
class _Thread:
    job: str
    idx: int
    awake: list[bool]
    vrun: float = 0.0
    last: int = -1
    last_step: int = -10**9
    tie: int = 0  # a seeded order between equals, so no job wins ties by its name


@dataclass(kw_only=True)
class _Acc:
    run: float = 0.0
    state: dict[tuple[bool, bool], float] = field(default_factory=dict)
    l3: dict[int, float] = field(default_factory=dict)
    node: dict[int, float] = field(default_factory=dict)
    cross: int = 0
    hot: int = 0
    dist: dict[tuple[str, int], float] = field(default_factory=dict)


def timeline(seed: str, job: Job, idx: int, steps: int, dt: float, burst: float) -> list[bool]:
    """Whether thread `idx` of `job` is runnable in each step."""
    if job.duty >= 0.999:
        return [True] * steps
    rng = random.Random(f"{seed}/{job.id}/{idx}")
    duty = max(job.duty, 1e-3)
    mean = {True: burst, False: burst * (1.0 - duty) / duty}
    state = rng.random() < duty
    left = rng.expovariate(1.0 / mean[state]) * rng.random()
    out = []
    for _ in range(steps):
        out.append(state)
        left -= dt
        while left <= 0:
            state = not state
            left += rng.expovariate(1.0 / mean[state])
    return out


def run(machine: Machine, jobs: Sequence[Job], cpus: Mapping[str, frozenset[int]],
        awake: Mapping[tuple[str, int], Sequence[bool]] | None = None) -> dict[str, Usage]:
    """Simulate one window of `jobs` placed on `cpus`; `awake` replaces the seeded timeline of
    the threads it names ((job, thread index) -> runnable per step)."""
    steps = max(1, round(machine.window_s / machine.dt_s))
    dt = machine.dt_s
    hold = max(0, math.ceil(machine.licence_hold_s / dt - 1e-9))
    hot = max(1, round(machine.migration_hot_s / dt))
    place = {p.cpu: p for p in machine.places}
    sibs: dict[tuple[int, int, int], list[int]] = {}
    for p in machine.places:
        sibs.setdefault(p.core, []).append(p.cpu)
    allowed = {j.id: sorted(c for c in cpus[j.id] if c in place) for j in jobs}
    ok = {j: frozenset(a) for j, a in allowed.items()}
    by_id = {j.id: j for j in jobs}
    given = awake or {}
    threads = [_Thread(job=j.id, idx=i, awake=list(given[(j.id, i)]) if (j.id, i) in given
                       else timeline(machine.seed, j, i, steps, dt, machine.burst_s),
                       tie=random.Random(f"{machine.seed}/tie/{j.id}/{i}").getrandbits(32))
               for j in jobs for i in range(j.threads)]
    acc = {j.id: _Acc() for j in jobs}
    jv = {j.id: 0.0 for j in jobs}
    was_awake: set[str] = set()
    last_avx: dict[tuple[int, int, int], int] = {}
    last_cpu: dict[str, int] = {}
    for s in range(steps):
        ready = [t for t in threads if t.awake[s] and allowed[t.job]]
        awake = {t.job for t in ready}
        if awake:
            floor = min((jv[j] for j in awake & was_awake), default=min(jv[j] for j in awake))
            for j in awake - was_awake:
                jv[j] = max(jv[j], floor - WAKE_LAG_S)
        was_awake = awake
        ready.sort(key=lambda t: (jv[t.job], t.vrun, t.tie))
        busy: dict[int, _Thread] = {}
        for t in ready:
            c = _choose(t, allowed[t.job], ok[t.job], busy, place, sibs)
            if c is None:
                continue
            if t.last >= 0 and c != t.last:
                if place[c].l3 != place[t.last].l3:
                    acc[t.job].cross += 1
                elif s - t.last_step <= hot:
                    acc[t.job].hot += 1
            busy[c] = t
        for c, t in busy.items():
            if by_id[t.job].avx512:
                last_avx[place[c].core] = s
        for c, t in busy.items():
            p = place[c]
            lic = s - last_avx.get(p.core, -10**9) <= hold
            shared = any(o != c and o in busy for o in sibs[p.core])
            a = acc[t.job]
            a.run += dt
            a.state[(lic, shared)] = a.state.get((lic, shared), 0.0) + dt
            a.l3[p.l3] = a.l3.get(p.l3, 0.0) + dt
            a.node[p.node] = a.node.get(p.node, 0.0) + dt
            for partner, _ in by_id[t.job].partners:
                if partner in last_cpu:
                    key = (partner, _distance(p, place[last_cpu[partner]]))
                    a.dist[key] = a.dist.get(key, 0.0) + dt
            t.vrun += dt
            jv[t.job] += dt / max(by_id[t.job].weight, 1e-3)
            t.last, t.last_step = c, s
            last_cpu[t.job] = c
    return {j: Usage(run_s=a.run, by_state=dict(a.state), by_l3=dict(a.l3), by_node=dict(a.node),
                     cross_l3_migrations=a.cross, hot_migrations=a.hot, distance=dict(a.dist))
            for j, a in acc.items()}


def _distance(a: Place, b: Place) -> int:
    if a.core == b.core:
        return 0
    if a.l3 == b.l3:
        return 1
    return 2 if a.node == b.node else 3


def _choose(t: _Thread, allowed: list[int], ok: frozenset[int], busy: Mapping[int, _Thread],
            place: Mapping[int, Place], sibs: Mapping[tuple[int, int, int], list[int]]) -> int | None:
    if t.last in ok and t.last not in busy:
        return t.last
    free = [c for c in allowed if c not in busy]
    if not free:
        return None
    if t.last < 0:  # first placement (fork balancing): the idlest L3 domain, an idle core there
        load: dict[int, int] = {}
        for c in busy:
            load[place[c].l3] = load.get(place[c].l3, 0) + 1
        return min(free, key=lambda c: (load.get(place[c].l3, 0), not _idle_core(c, busy, place, sibs), c))
    home = place[t.last].l3
    return min(free, key=lambda c: (place[c].l3 != home, not _idle_core(c, busy, place, sibs), c))


def _idle_core(c: int, busy: Mapping[int, _Thread], place: Mapping[int, Place],
               sibs: Mapping[tuple[int, int, int], list[int]]) -> bool:
    return all(o not in busy for o in sibs[place[c].core])
