"""Which class controllers the agent uses (the tri-state), and the planner's class actions
through the dispatch, on real cgroups (the real-time controller as the example)."""

from __future__ import annotations

import pytest

from agent.act.classes import ClassesUnavailable
from agent.act.classnode import ClassNode, availability
from agent.act.dispatch import Dispatch
from agent.config import parse_config
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.errors import PerfbalanceError
from perfbalance.model import Action, Container


def config(text: str, tmp_path):
    return parse_config(f"agent: {{run_dir: {tmp_path}}}\n{text}", source="t.yaml", node="n")


@pytest.fixture
def no_controllers(tmp_path) -> Cgroupfs:
    """A cgroup-v2-only root offering cpuset and memory (no io controller, no RT groups)."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset memory\n")
    return Cgroupfs(root=str(root))


def test_on_fails_startup_with_the_reason_auto_and_off_do_not(tmp_path, no_controllers):
    rt = "rt: {{mode: {mode}, classes: {{a: {{runtime_us: 1000}}}}}}\nblockio: {{mode: \"off\"}}"
    with pytest.raises(ClassesUnavailable, match="rt.*cgroup v2: no real-time group scheduling"):
        ClassNode(config(rt.format(mode='"on"'), tmp_path), no_controllers)
    auto = ClassNode(config(rt.format(mode="auto"), tmp_path), no_controllers)
    assert auto.manager.slots == {} and "cgroup v2" in auto.reasons["rt"]
    assert auto.reasons["blockio"] == "mode: off"
    off = ClassNode(config(rt.format(mode='"off"'), tmp_path), no_controllers)
    assert off.reasons["rt"] == "mode: off"


def test_doctor_says_why_each_controller_is_unavailable(tmp_path, no_controllers):
    got = availability(config("", tmp_path), no_controllers)
    assert set(got) == {"blockio", "rt"}
    assert not got["blockio"]["available"] and "neither the blkio (v1) nor the io (v2)" in got["blockio"]["reason"]
    assert not got["rt"]["available"] and "cpu.rt_runtime_us exists only in v1" in got["rt"]["reason"]


@pytest.mark.root
def test_a_planner_rt_class_action_is_applied_through_the_dispatch(tmp_path, cgfs, cgroups):
    node = ClassNode(config("rt: {classes: {capped: {runtime_us: 20000}}}", tmp_path), cgfs)
    if "rt" not in node.manager.slots:
        pytest.skip(f"real-time classes unavailable: {node.reasons['rt']}")
    rel, other = cgroups.make("planned", ("cpu",)), cgroups.make("other", ("cpu",))
    c = Container(id="c1", name="main", pod="p", namespace="ns", cgroup=rel)
    dispatch = Dispatch({"rt_class": node, "blockio_class": node})
    dispatch.apply(Action(kind="rt_class", container="c1", frm="", to="capped", reason="test"), c)
    assert cgfs.read_int(rel, "cpu", "cpu.rt_runtime_us") == 20_000
    assert cgfs.read_int(other, "cpu", "cpu.rt_runtime_us") == 0  # control: not chosen, not touched
    assert node.manager.class_of("rt", "c1") == "capped"
    node.sync([c])  # the planner's choice outranks annotations and QoS: it stays
    assert cgfs.read_int(rel, "cpu", "cpu.rt_runtime_us") == 20_000
    if "blockio" not in node.manager.slots:  # no block-I/O classes configured: refused, named
        with pytest.raises(PerfbalanceError, match="blockio classes not in use on this node"):
            dispatch.apply(Action(kind="blockio_class", container="c1", frm="", to="x", reason="t"), c)


@pytest.mark.root
def test_a_reloaded_class_budget_reaches_the_containers_already_in_it(tmp_path, cgfs, cgroups):
    text = "rt: {{classes: {{audio: {{runtime_us: {a}}}, other: {{runtime_us: 7000}}}}, qos_classes: {{besteffort: audio}}}}"
    node = ClassNode(config(text.format(a=20000), tmp_path), cgfs)
    if "rt" not in node.manager.slots:
        pytest.skip(f"real-time classes unavailable: {node.reasons['rt']}")
    rel = cgroups.make("reload", ("cpu",))
    c = Container(id="c1", name="main", pod="p", namespace="ns", cgroup=rel, qos="besteffort")
    assert node.sync([c]) == []
    assert cgfs.read_int(rel, "cpu", "cpu.rt_runtime_us") == 20_000
    node.reconfigure(config(text.format(a=30000), tmp_path))
    node.sync([c])
    assert cgfs.read_int(rel, "cpu", "cpu.rt_runtime_us") == 30_000
    cgfs.write(rel, "cpu", "cpu.rt_runtime_us", "25000")  # control: without a change, nothing is rewritten
    node.sync([c])
    assert cgfs.read_int(rel, "cpu", "cpu.rt_runtime_us") == 25_000
