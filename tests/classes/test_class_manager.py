"""The class mechanism on real cgroups (the real-time controller as the example): QoS defaults,
pod- and container-level annotations, bad annotations keeping the previous class and reported
once, the checkpoint across a restart."""

from __future__ import annotations

import dataclasses

import pytest

from agent.act.classes import ClassManager, ClassesUnavailable, Slot, usable
from agent.act.rt import RtController
from perfbalance.classes import RtSection
from perfbalance.model import Container
from perfbalance.settings import build

pytestmark = [pytest.mark.root]

KEY = "rt.perfbalance.io/class"
RT = {"classes": {"low": {"runtime_us": 10_000}, "mid": {"runtime_us": 20_000},
                  "locked": {"runtime_us": 30_000, "allow_annotation": False}},
      "qos_classes": {"burstable": "low"}}


@pytest.fixture
def rt_parts(cgfs, cgroups, tmp_path):
    section = build(RtSection, RT, source="test", path="rt")
    ctl = RtController(section=section, cgroupfs=cgfs)
    if ctl.unavailable():
        pytest.skip(ctl.unavailable())
    rel = cgroups.make("web", ("cpu",))
    c = Container(id="c1", name="web", pod="shop", namespace="prod", cgroup=rel, qos="burstable")

    def manager() -> ClassManager:
        return ClassManager([Slot(controller=RtController(section=section, cgroupfs=cgfs), rules=section.rules())],
                            run_dir=str(tmp_path))
    return manager, c, lambda: cgfs.read_int(rel, "cpu", "cpu.rt_runtime_us")


def test_qos_default_then_pod_then_container_annotation(rt_parts):
    manager, c, runtime = rt_parts
    m = manager()
    cycle = m.sync([c])
    assert runtime() == 10_000 and cycle.changes[0].source == "qos burstable"
    m.sync([dataclasses.replace(c, annotations={KEY: "mid"})])
    assert runtime() == 20_000
    cycle = m.sync([dataclasses.replace(c, annotations={KEY: "low", f"{KEY}.container.web": "mid"})])
    assert runtime() == 20_000 and not cycle.errors  # the container-level key wins
    cycle = m.sync([dataclasses.replace(c, annotations={KEY: "mid", f"{KEY}.container.other": "low"})])
    assert runtime() == 20_000 and not cycle.changes  # another container's key is not ours


@pytest.mark.parametrize("value, why", [
    ("gold", "no configured class 'gold'"),
    ("locked", "class 'locked' does not allow annotations"),
    ("../../cpu", "contains '/' or '..'"),
    ("mid\n", "control characters"),
])
def test_bad_annotation_keeps_the_previous_class_and_is_reported_once(rt_parts, value, why):
    manager, c, runtime = rt_parts
    m = manager()
    m.sync([dataclasses.replace(c, annotations={KEY: "mid"})])
    bad = dataclasses.replace(c, annotations={KEY: value})
    first = m.sync([bad])
    assert runtime() == 20_000
    (err,) = first.errors
    assert f"pod prod/shop container web: annotation {KEY}={value!r}" in err and why in err
    assert not m.sync([bad]).errors  # said once
    assert m.summary()["rt"]["problems"] == 1
    assert m.sync([c]).changes[0].to == "low"  # annotation removed: the QoS default again
    assert m.summary()["rt"]["problems"] == 0


def test_planner_choice_outranks_annotations(rt_parts):
    manager, c, runtime = rt_parts
    m = manager()
    m.sync([c])
    m.choose("rt", c, "locked")  # allow_annotation only limits annotations
    m.sync([dataclasses.replace(c, annotations={KEY: "mid"})])
    assert runtime() == 30_000


def test_restart_restores_the_classes_applied(rt_parts):
    manager, c, runtime = rt_parts
    first = manager()
    first.sync([dataclasses.replace(c, annotations={KEY: "mid"})])
    second = manager()  # a new agent process: its controller knows nothing
    assert second.load([c.id]) == 1
    assert second.class_of("rt", c.id) == "mid"
    cycle = second.sync([dataclasses.replace(c, annotations={KEY: "nonsense"})])
    assert len(cycle.errors) == 1 and "'nonsense'" in cycle.errors[0]
    assert runtime() == 20_000  # the bad annotation after a restart keeps the restored class
    assert second.class_of("rt", c.id) == "mid"


def test_mode_on_fails_when_unavailable_auto_does_not(cgfs):
    class Missing:
        name, reapply = "fake", False

        def unavailable(self) -> str:
            return "fake controller missing"

    assert usable(Missing(), mode="auto") is False
    assert usable(Missing(), mode="off") is False
    with pytest.raises(ClassesUnavailable, match="fake controller missing"):
        usable(Missing(), mode="on")
