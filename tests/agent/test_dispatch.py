"""agent/act/dispatch.py: each action goes to the actuator of its kind; failures back off."""

from __future__ import annotations

import pytest

from agent.act.dispatch import BACKOFF_MAX_SECONDS, Backoff, CpusetMoves, Dispatch, RdtMoves, kind_of
from perfbalance.cpuset import CpuSet
from perfbalance.errors import PerfbalanceError
from perfbalance.model import Action, Container

C = Container(id="c1", cgroup="kubepods/pod1/c1")


def _dispatch(calls: list) -> Dispatch:
    return Dispatch({"cpuset": CpusetMoves(lambda c, cpus, mems: calls.append(("cpuset", c.id, cpus, mems))),
                     "rdt_class": RdtMoves(lambda c, cls: calls.append(("rdt", c.id, cls)))})


def test_a_cpuset_action_reaches_the_cpuset_actuator_with_cpus_and_mems() -> None:
    calls: list = []
    _dispatch(calls).apply(Action(kind="cpuset", container="c1", frm="0-3", to="2-3", reason="avx512", mems="0"), C)
    assert calls == [("cpuset", "c1", CpuSet.parse("2-3"), CpuSet.parse("0"))]


def test_a_cpuset_action_without_mems_leaves_them() -> None:
    calls: list = []
    _dispatch(calls).apply(Action(kind="cpuset", container="c1", frm="0-3", to="1", reason="x"), C)
    assert calls == [("cpuset", "c1", CpuSet.parse("1"), None)]


def test_a_rollback_goes_to_the_actuator_of_what_it_undoes() -> None:
    calls: list = []
    rollback = Action(kind="rollback", container="c1", frm="gold", to="bulk", reason="rollback", undoes="rdt_class")
    assert kind_of(rollback) == "rdt_class"
    _dispatch(calls).apply(rollback, C)
    assert calls == [("rdt", "c1", "bulk")]


def test_an_unknown_kind_is_an_error_naming_kind_and_container() -> None:
    calls: list = []
    with pytest.raises(PerfbalanceError, match="'blkio'.*c1"):
        _dispatch(calls).apply(Action(kind="blkio", container="c1", frm="", to="x", reason="x"), C)
    assert calls == []


def test_failures_back_off_doubling_up_to_the_cap_and_a_success_clears() -> None:
    b = Backoff()
    assert b.waiting("c1", 0.0) == ""
    waits = []
    for _ in range(10):
        b.failed("c1", 0.0)
        waits.append(b.failures["c1"][1])
    assert waits[:4] == [10.0, 20.0, 40.0, 80.0] and waits[-1] == BACKOFF_MAX_SECONDS
    assert "10 failed attempt(s)" in b.waiting("c1", 1.0)
    assert b.waiting("c1", BACKOFF_MAX_SECONDS + 1) == ""
    b.succeeded("c1")
    assert b.waiting("c1", 1.0) == "" and "c1" not in b.failures


def test_containers_that_are_gone_are_forgotten() -> None:
    b = Backoff()
    b.failed("gone", 0.0)
    b.failed("alive", 0.0)
    b.retain({"alive"})
    assert set(b.failures) == {"alive"}
