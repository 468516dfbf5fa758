"""The memory side of the independent simulator: LLC misses, LLC occupancy, loaded latency.

Written from field-notes section 7, nothing shared with rebalancer.costmodel:
* misses M(C) = M0 (C/C0)^-a, flat beyond the working set and below the L2 size;
* an L3 domain is shared in proportion to the rate at which each job inserts lines (its
  misses there), but no job holds more than its working set: what it cannot use goes to the
  others (LRU keeps what is reused); a restricted RDT class holds at most ways/W of the domain;
* loaded latency: flat to 40 % of the sustained bandwidth, linear to 2x idle at 80 %, then a
  queue: 2 x 0.2 / (1 - u) (8x at 95 %), bounded at 99 %.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.bench.truth.machine import Job, Machine


def mpki(job: Job, cache: float, machine: Machine) -> float:
    """LLC misses per 1000 instructions of `job` holding `cache` bytes of one domain."""
    if job.mpki_ref <= 0:
        return 0.0
    held = min(max(cache, machine.l2_bytes), max(job.working_set, machine.l2_bytes))
    return job.mpki_ref * (held / job.ref_cache) ** -machine.llc_alpha


def latency_factor(u: float) -> float:
    """Loaded over idle memory latency at utilisation `u` of the sustained bandwidth."""
    if u <= 0.4:
        return 1.0
    if u <= 0.8:
        return 1.0 + (u - 0.4) / 0.4
    return 2.0 * 0.2 / (1.0 - min(u, 0.99))


def capped_shares(capacity: float, rate: Mapping[str, float], cap: Mapping[str, float]) -> dict[str, float]:
    """Split `capacity` in proportion to `rate`, nobody above its `cap`; what a capped one leaves
    goes to the rest (repeat until no share exceeds its cap)."""
    out: dict[str, float] = {}
    left, active = capacity, set(rate)
    while active:
        total = sum(rate[j] for j in active)
        share = {j: left * rate[j] / total for j in active}
        full = {j for j in active if share[j] >= cap[j]}
        if not full:
            out.update(share)
            break
        for j in full:
            out[j] = cap[j]
            left -= cap[j]
        active -= full
    return out


def domain_occupancy(machine: Machine, jobs: Mapping[str, Job], inserts: Mapping[str, float],
                     restricted: set[str]) -> dict[str, float]:
    """Bytes of one L3 domain each job holds, from its insertion rate there (misses/s)."""
    rate = {j: r + 1e-3 for j, r in inserts.items()}  # a job that never misses still holds a little
    cap = {j: max(jobs[j].working_set, 64.0 * 1024) for j in rate}
    res = {j for j in rate if j in restricted}
    out: dict[str, float] = {}
    if res:
        res_cap = machine.l3_bytes * machine.restricted_ways / machine.llc_ways
        total = sum(rate.values())
        res_share = min(res_cap, machine.l3_bytes * sum(rate[j] for j in res) / total)
        out.update(capped_shares(res_share, {j: rate[j] for j in res}, cap))
    rest = {j: rate[j] for j in rate if j not in res}
    if rest:
        out.update(capped_shares(machine.l3_bytes - sum(out.values()), rest, cap))
    return out
