"""Parsing of placement annotations and class annotations (pure)."""

from __future__ import annotations

import pytest

from perfbalance.classes import ClassRules, decide
from perfbalance.hints import HintKeys, affinity_terms, parse_affinity, problems
from perfbalance.model import Container
from perfbalance.names import name_problem

KEYS = HintKeys()


def c(**ann: str) -> Container:
    return Container(id="c1", name="web", pod="shop", namespace="prod", cgroup="x", qos="besteffort",
                     annotations=ann)


def test_affinity_terms_parse() -> None:
    (t1, t2) = parse_affinity("app=db,tier=x@numa*0.5; container=cache@core!", "anti-affinity")
    assert t1.labels == (("app", "db"), ("tier", "x")) and t1.scope == "numa" and t1.weight == 0.5 and not t1.hard
    assert t2.container == "cache" and t2.scope == "core" and t2.hard


@pytest.mark.parametrize("value, why", [
    ("app=db", "missing '@scope'"),
    ("app=db@rack", "scope 'rack'"),
    ("app=db@l3*-1", "must be in (0, 100]"),
    ("app=db@l3*x", "is not a number"),
    ("app@l3", "is not label=value"),
    ("", "no term"),
])
def test_bad_affinity_is_named_with_pod_key_and_value(value: str, why: str) -> None:
    (line,) = problems(c(**{KEYS.anti_affinity: value}), KEYS)
    assert line.startswith(f"pod prod/shop container web: annotation {KEYS.anti_affinity}={value!r}")
    assert why in line
    assert affinity_terms(c(**{KEYS.anti_affinity: value}), KEYS) == ()  # ignored by the planner


def test_hard_affinity_is_refused() -> None:
    with pytest.raises(ValueError, match="only anti-affinity can be hard"):
        parse_affinity("app=db@l3!", "affinity")


def test_bad_avx512_value_is_reported() -> None:
    (line,) = problems(c(**{f"{KEYS.avx512}.container.web": "maybe"}), KEYS)
    assert f"{KEYS.avx512}.container.web='maybe'" in line and "expected true or false" in line


@pytest.mark.parametrize("name, bad", [("gold", False), ("a/b", True), ("..", True), ("x\n", True),
                                       ("-x", True), ("x" * 64, True), ("", True)])
def test_class_names_fullmatch(name: str, bad: bool) -> None:
    assert (name_problem(name) is not None) == bad


def test_decision_order() -> None:
    rules = ClassRules(controller="blockio", annotation="k", allow_annotation={"a": True, "b": True},
                       qos_defaults={"besteffort": "b"})
    assert decide(c(), rules).wanted == "b"
    assert decide(c(k="a"), rules).source == "annotation k"
    assert decide(c(k="b", **{"k.container.web": "a"}), rules).wanted == "a"
    assert decide(c(k="a"), rules, planner="").wanted is None
