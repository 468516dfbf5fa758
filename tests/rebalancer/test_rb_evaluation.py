"""After a move settles, the measured gain is compared with the prediction; misses roll back."""

from __future__ import annotations

from dataclasses import replace

from perfbalance.cpuset import CpuSet
from perfbalance.model import Action, Snapshot
from rebalancer import RebalancerConfig, plan

from rb_builders import avx_vs_scalar

CFG = RebalancerConfig(settle_seconds=30.0, dwell_seconds=60.0)


def applied(s: Snapshot, p, time: float, ips: dict[str, float] | None = None) -> Snapshot:  # type: ignore[no-untyped-def]
    """`s` after the plan's cpuset actions, `time` later, with optional instructions/s."""
    to = {a.container: a.to for a in p.actions}
    out = []
    for c in s.containers:
        cont = replace(c.container, cpuset=CpuSet.parse(to.get(c.id, str(c.container.cpuset))))
        m = dict(c.metrics)
        if ips and c.id in ips:
            m["instructions_per_second"] = ips[c.id]
        out.append(replace(c, container=cont, metrics=m))
    return replace(s, containers=tuple(out), time=time)


def with_ips(s: Snapshot, ips: dict[str, float]) -> Snapshot:
    return replace(s, containers=tuple(
        replace(c, metrics={**c.metrics, "instructions_per_second": ips[c.id]}) if c.id in ips else c
        for c in s.containers))


def test_move_that_did_not_help_is_rolled_back() -> None:
    s0 = with_ips(avx_vs_scalar(), {"web-a": 1e9, "web-b": 1e9})
    p1 = plan(s0, CFG, None, s0.time)
    later = applied(s0, p1, s0.time + 40, ips={"web-a": 1e9, "web-b": 1e9})  # no gain measured
    p2 = plan(later, CFG, p1.state, later.time)
    rollbacks = {a.container: a.to for a in p2.actions if a.kind == "rollback"}
    assert rollbacks == {a.container: a.frm for a in p1.actions}


def test_move_that_helped_is_kept() -> None:
    s0 = with_ips(avx_vs_scalar(), {"web-a": 1e9, "web-b": 1e9})
    p1 = plan(s0, CFG, None, s0.time)
    later = applied(s0, p1, s0.time + 40, ips={"web-a": 1.25e9, "web-b": 1.25e9})
    p2 = plan(later, CFG, p1.state, later.time)
    assert not [a for a in p2.actions if a.kind == "rollback"]
    assert any(c.get("rejected") == "kept: the move helped" for c in p2.considered)


def test_nothing_is_judged_before_the_settle_time() -> None:
    s0 = with_ips(avx_vs_scalar(), {"web-a": 1e9, "web-b": 1e9})
    p1 = plan(s0, CFG, None, s0.time)
    later = applied(s0, p1, s0.time + 10, ips={"web-a": 1e9, "web-b": 1e9})
    p2 = plan(later, CFG, p1.state, later.time)
    assert p2.actions == () and len(p2.state.pending) == 1


def test_without_a_pmu_the_model_proxy_confirms_an_effective_move() -> None:
    s0 = avx_vs_scalar()  # software events only: no instructions_per_second
    p1 = plan(s0, CFG, None, s0.time)
    later = applied(s0, p1, s0.time + 40)
    p2 = plan(later, CFG, p1.state, later.time)
    note = next(c for c in p2.considered if c.get("kind") == "evaluation")
    assert note["method"] == "model" and note["rejected"] == "kept: the move helped"


def test_a_move_that_was_never_applied_is_dropped() -> None:
    s0 = avx_vs_scalar()
    p1 = plan(s0, CFG, None, s0.time)
    later = replace(s0, time=s0.time + 40)  # dry run: nothing changed
    p2 = plan(later, CFG, p1.state, later.time)
    assert p2.state.pending == () and not [a for a in p2.actions if a.kind == "rollback"]


def test_rolled_back_containers_cool_down() -> None:
    s0 = with_ips(avx_vs_scalar(), {"web-a": 1e9, "web-b": 1e9})
    p1 = plan(s0, CFG, None, s0.time)
    later = applied(s0, p1, s0.time + 40, ips={"web-a": 1e9, "web-b": 1e9})
    p2 = plan(later, CFG, p1.state, later.time)
    assert p2.state.cooldown_until["avx"] == later.time + CFG.cooldown_seconds


def test_a_decision_id_is_on_its_actions_its_judgement_and_its_rollbacks() -> None:
    s0 = with_ips(avx_vs_scalar(), {"web-a": 1e9, "web-b": 1e9})
    p1 = plan(s0, CFG, None, s0.time)
    (pending,) = p1.state.pending
    assert p1.actions and {a.decision for a in p1.actions} == {pending.decision}
    assert all(Action.from_json(a.to_json()).decision == a.decision for a in p1.actions)  # in the plan JSON
    later = applied(s0, p1, s0.time + 40, ips={"web-a": 1e9, "web-b": 1e9})
    p2 = plan(later, CFG, p1.state, later.time)
    (judged,) = p2.judgements
    assert (judged.decision, judged.rolled_back, judged.realized) == (pending.decision, True, 0.0)
    assert judged.to_json() in p2.considered
    assert {a.decision for a in p2.actions if a.kind == "rollback"} == {pending.decision}
