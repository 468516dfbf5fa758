"""Containers an AVX-512 island confined get its cores back once the island is empty.

Node: 2 sockets, one L3 domain each, 4 cores x 2 threads per socket (CPU c and c + 8 are
siblings; socket 0 is 0-3,8-11). The island was cores 0-1 (CPUs 0-1,8-9); six busy web services
were evicted to the rest, 2-7,10-15, as the `churn` scenario of `perfbalance bench plan` leaves
them when its last AVX-512 job goes.
"""

from __future__ import annotations

import random

import pytest

from perfbalance.cpuset import CpuSet
from perfbalance.model import Action, Plan
from rebalancer import RebalancerConfig, plan
from rebalancer.context import Context
from rebalancer.inputs import smooth
from rebalancer.state import PlannerState
from agent.bench import scenarios as sc
from agent.bench.sim import snapshot

from rb_builders import sample, snap, topo

T = topo(cores=4, packages=2)
WEBS = tuple(f"web-{i}" for i in range(1, 7))
CONFINED = "2-7,10-15"
CFG = RebalancerConfig()


def _webs(cpus: str = CONFINED) -> list:  # type: ignore[type-arg]
    return [sample(w, cpus, request=500, cpu_usage_cores=1.0) for w in WEBS]


def _moves(p: Plan) -> dict[str, str]:
    return {a.container: a.to for a in p.actions if a.kind == "cpuset"}


def test_confined_containers_return_when_the_island_is_empty() -> None:
    s = snap(T, *_webs())
    p = plan(s, CFG, None, s.time)
    assert _moves(p) == dict.fromkeys(WEBS, "0-15")
    first: Action = p.actions[0]
    assert {a.reason for a in p.actions} == {  # one reason for all six: none of them "makes room"
        "return: web-1 and 5 more widened over whole cores 0-1,8-9 that no container uses (to 0-15)"}
    # the gain's reason: the balancer puts 3 of the 6 threads on socket 0's two allowed cores
    # (ℓ = 1.5 each: 2 x (2 x 1.5 - 2) thread-s/s beside a busy sibling, x (1 - 0.6)); none
    # on all 16 CPUs
    assert first.detail["saved_smt"] == pytest.approx(0.8)
    assert first.benefit == pytest.approx(first.detail["saved_smt"])
    assert first.detail["decision_net"] > CFG.margin


@pytest.mark.parametrize("occupant", [
    sample("avx-5", "0-1,8-9", request=750, cpu_usage_cores=1.5, avx512_heavy=1.0),
    # no longer AVX-512-heavy, but still there: its cores are not free for the taking
    sample("avx-5", "0-1,8-9", request=750, cpu_usage_cores=1.5, avx512_heavy=0.0),
])
def test_confinement_stays_while_the_island_has_an_occupant(occupant) -> None:  # type: ignore[no-untyped-def]
    s = snap(T, occupant, *_webs())
    p = plan(s, CFG, None, s.time)
    assert not set(_moves(p)) & set(WEBS)
    assert not [c for c in p.considered if c["kind"] == "island_return"]  # nothing to return to
    ctx = Context.build(s, CFG, PlannerState(), smooth(s, {}, CFG.smoothing_alpha), s.time)
    assert ctx.base_eval.parts["smt"] == 0.0  # the busy island holds the balancer's eye as well


def test_no_return_within_the_dwell_time_of_the_eviction() -> None:
    s = snap(T, *_webs())
    state = PlannerState(time=s.time - 10.0, moved_at=dict.fromkeys(WEBS, s.time - 30.0))
    p = plan(s, CFG, state, s.time)
    assert _moves(p) == {}
    assert any(c["kind"] == "island_return" and "dwell" in c["rejected"] for c in p.considered)
    later = plan(s, CFG, state, s.time + 31.0)  # 61 s after the eviction
    assert _moves(later) == dict.fromkeys(WEBS, "0-15")


def test_confined_containers_on_one_l3_domain_without_sharing_stay() -> None:
    # one socket (one L3 domain), 8 cores: 3 busy services on the 6 cores an island left them
    # run one thread per core; widening gains nothing by the model, so nothing moves
    t = topo(cores=8)
    s = snap(t, *[sample(w, "2-7,10-15", request=500, cpu_usage_cores=1.0) for w in WEBS[:3]])
    p = plan(s, CFG, None, s.time)
    assert _moves(p) == {}
    assert any(c["kind"] == "island_return" and "below margin" in c["rejected"] for c in p.considered)
    # control: 8 busy services on those 6 cores share siblings; the return takes that away
    crowded = snap(t, *[sample(f"web-{i}", "2-7,10-15", request=500, cpu_usage_cores=1.0) for i in range(8)])
    assert set(_moves(plan(crowded, CFG, None, crowded.time)).values()) == {"0-15"}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_avx512_jobs_coming_and_going_confine_and_return_once_each(seed: int) -> None:
    # the closed loop of agent.bench on the same node, 3 % noise on every metric, no PMU (the
    # model check judges the moves): an AVX-512 job arrives, leaves (the webs' dwell has
    # passed), another arrives and leaves; one decision per change, none in between
    base = sc.churn()
    events = (sc.Event(cycle=5, add=sc._avx(0, 1.5)), sc.Event(cycle=25, remove="avx-0"),
              sc.Event(cycle=40, add=sc._avx(1, 1.5)), sc.Event(cycle=60, remove="avx-1"))
    live = {w.id: w for w in base.workloads}
    cpus = {w.id: base.initial[w.id] for w in base.workloads}
    classes: dict[str, str] = {}
    rng, state, kinds = random.Random(seed), None, []
    for cycle in range(80):
        for e in events:
            if e.cycle == cycle:
                sc._event(base, e, live, cpus, classes, lambda w, c, l: c)
        s = snapshot(base.node, list(live.values()), cpus, classes, time=cycle * 10.0, pmu=False, noise=0.03, rng=rng)
        p = plan(s, base.planner, state, cycle * 10.0)
        state = p.state
        kinds += [(cycle, a.reason.split(":")[0]) for a in p.actions if a.benefit > 0 or a.kind == "rollback"]
        sc.apply(p.actions, cpus, classes)
    assert kinds == [(5, "AVX-512 island"), (25, "return"), (40, "AVX-512 island"), (60, "return")]
    assert all(CpuSet(cpus[w.id]) == CpuSet.parse("0-15") for w in base.workloads)


@pytest.mark.parametrize("solver_there", [False, True])
def test_siblings_a_shield_cleared_come_back_when_the_exclusive_avx512_container_is_gone(solver_there: bool) -> None:
    # kubelet static policy, one socket of 8 cores x 2 threads (CPU c and c + 8 are siblings),
    # reserved core 0; pricing has CPU 3 to itself; the shield had cleared 10, the sibling of the
    # exclusive AVX-512 solver's CPU 2, off the shared pool's five busy services
    t = topo(cores=8)
    exclusive = {("pod-g2", "pricing"): "3"}
    others = [sample("pricing", "3", request=1000, exclusive=True, pod_uid="pod-g2", cpu_usage_cores=1.0)]
    if solver_there:
        exclusive[("pod-g1", "solver")] = "2"
        others.append(sample("solver", "2", request=1000, exclusive=True, pod_uid="pod-g1",
                             cpu_usage_cores=1.0, avx512_heavy=1.0))
    webs = [sample(f"web-{i}", "1,4-7,9,11-15", request=600, cpu_usage_cores=1.2) for i in range(5)]
    s = snap(t, *others, *webs, reserved="0,8", exclusive=exclusive)
    p = plan(s, CFG, None, s.time)
    if solver_there:  # control: the shield's reason is still there
        assert _moves(p) == {}
    else:  # CPU 2 is back in the pool: 2 and 10 are a whole core nobody uses
        assert _moves(p) == {f"web-{i}": "1-2,4-7,9-15" for i in range(5)}
        assert p.actions[0].detail["saved_smt"] > CFG.margin


@pytest.mark.parametrize("on_reserved", [False, True])
def test_only_cpusets_inside_the_shareable_cpus_are_returned(on_reserved: bool) -> None:
    # reserved core 0 (CPUs 0, 8), core 1 (1, 9) used by nobody; an island's eviction leaves
    # shareable CPUs only, a cpuset that also holds reserved ones was not confined by the planner
    cpus = "0,2-8,10-15" if on_reserved else CONFINED
    s = snap(T, *_webs(cpus), reserved="0,8")
    moves = _moves(plan(s, CFG, None, s.time))
    assert moves == ({} if on_reserved else dict.fromkeys(WEBS, "1-7,9-15"))
