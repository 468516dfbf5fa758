"""Real-time classes on real cgroups: a `chrt -f` SCHED_FIFO busy loop whose share of its CPU is
capped by its class's budget, next to the same loop in a class with five times the budget."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from agent.act.rt import Group, RtController, plan_budget, to_ratio
from perfbalance.classes import ClassError, RtSection
from perfbalance.model import Container
from perfbalance.settings import build

pytestmark = [pytest.mark.root]

PERIOD = 1_000_000


def section(classes: dict) -> RtSection:
    return build(RtSection, {"classes": classes}, source="test", path="rt")


def container(rel: str, name: str) -> Container:
    return Container(id=name, name=name, pod="p", namespace="ns", cgroup=rel)


@pytest.fixture
def rt(cgfs):
    ctl = RtController(section=section({"small": {"runtime_us": 100_000}, "big": {"runtime_us": 500_000},
                                        "huge": {"runtime_us": 990_000}}), cgroupfs=cgfs)
    why = ctl.unavailable()
    if why:
        pytest.skip(why)
    for tool in ("chrt", "taskset"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} (util-linux) not installed")
    return ctl


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fifo_share(cgroups, rel: str, cpu: int, seconds: float = 2.0) -> float:
    """Fraction of one CPU a SCHED_FIFO busy loop pinned to `cpu` gets inside `rel`."""
    p = cgroups.spawn(rel, ["taskset", "-c", str(cpu), "chrt", "-f", "10", "sh", "-c", "while :; do :; done"],
                      controllers=("cpu",))
    time.sleep(0.3)
    assert p.poll() is None, p.stderr.read() if p.stderr else ""
    with open(f"/proc/{p.pid}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[38] == "1", "not SCHED_FIFO"  # field 41: policy
    c0, t0 = cpu_seconds(p.pid), time.monotonic()
    time.sleep(seconds)
    share = (cpu_seconds(p.pid) - c0) / (time.monotonic() - t0)
    p.kill()
    p.wait()
    return share


def test_fifo_loop_is_capped_by_its_class_budget(rt, cgfs, cgroups):
    capped, control = cgroups.make("capped", ("cpu",)), cgroups.make("control", ("cpu",))
    # The parent (the test's prefix group) starts with no RT budget: it must get one first.
    assert cgfs.read_int(cgroups.prefix, "cpu", "cpu.rt_runtime_us") == 0
    rt.apply(container(capped, "capped"), "small")
    rt.apply(container(control, "control"), "big")
    assert cgfs.read_int(capped, "cpu", "cpu.rt_runtime_us") == 100_000
    assert to_ratio(PERIOD, cgfs.read_int(cgroups.prefix, "cpu", "cpu.rt_runtime_us")) >= to_ratio(PERIOD, 600_000)
    cpu = os.cpu_count() - 1
    small = fifo_share(cgroups, capped, cpu)
    big = fifo_share(cgroups, control, cpu)
    assert small < 0.25, (small, big)
    assert big > 2 * small and big > 0.3, (small, big)


def test_without_a_class_a_container_cannot_run_fifo(rt, cgroups):
    """The control of the class itself: with RT group scheduling a group without budget refuses
    SCHED_FIFO (this is what makes the class necessary)."""
    rel = cgroups.make("none", ("cpu",))
    p = cgroups.spawn(rel, ["chrt", "-f", "10", "true"], controllers=("cpu",))
    assert p.wait() != 0


def test_a_budget_the_root_cannot_give_is_refused_naming_pod_key_value(rt, cgfs, cgroups):
    # Small budgets before: a group removed by an earlier test may hold its budget until the
    # kernel has taken it offline (css offline runs after rmdir returns).
    a, b = cgroups.make("a", ("cpu",)), cgroups.make("b", ("cpu",))
    rt.apply(container(a, "a"), "small")
    with pytest.raises(ClassError) as e:
        rt.apply(container(b, "b"), "huge")
    assert "pod ns/p container b" in str(e.value) and "class='huge'" in str(e.value)
    assert "budget cannot be given" in str(e.value)
    assert cgfs.read_int(b, "cpu", "cpu.rt_runtime_us") == 0  # nothing written


def test_leaving_the_class_under_running_fifo_tasks_is_refused(rt, cgfs, cgroups):
    rel = cgroups.make("busy", ("cpu",))
    c = container(rel, "busy")
    rt.apply(c, "small")
    p = cgroups.spawn(rel, ["chrt", "-f", "10", "sleep", "30"], controllers=("cpu",))
    time.sleep(0.2)
    with pytest.raises(ClassError, match="EBUSY"):
        rt.apply(c, None)
    assert cgfs.read_int(rel, "cpu", "cpu.rt_runtime_us") == 100_000
    p.kill()
    p.wait()
    rt.apply(c, None)
    assert cgfs.read_int(rel, "cpu", "cpu.rt_runtime_us") == 0


@pytest.mark.parametrize("own, parent_runtime, others, expect", [
    (100_000, 0, 0, ["top", "c"]),  # parent raised first
    (100_000, 300_000, 0, ["c"]),  # parent already has enough
    (100_000, 150_000, 100_000, ["top", "c"]),  # the sibling's share counts
])
def test_plan_gives_parents_budget_first(own, parent_runtime, others, expect):
    chain = [Group(rel="c", runtime_us=0, period_us=PERIOD, others=0),
             Group(rel="top", runtime_us=parent_runtime, period_us=PERIOD, others=to_ratio(PERIOD, others))]
    writes = plan_budget(chain, runtime_us=own, period_us=PERIOD, root_ratio=to_ratio(PERIOD, 950_000),
                         root_others=0)
    assert [w.rel for w in writes] == expect
    assert writes[-1].value == own
    if writes[0].rel == "top":  # the least budget the kernel's check accepts
        need = to_ratio(PERIOD, own) + to_ratio(PERIOD, others)
        assert to_ratio(PERIOD, writes[0].value) >= need > to_ratio(PERIOD, writes[0].value - 1)


def test_plan_refuses_what_the_root_cannot_give():
    chain = [Group(rel="c", runtime_us=0, period_us=PERIOD, others=0),
             Group(rel="top", runtime_us=0, period_us=PERIOD, others=0)]
    with pytest.raises(ValueError, match="root group has 15.0% of real-time CPU left"):
        plan_budget(chain, runtime_us=200_000, period_us=PERIOD, root_ratio=to_ratio(PERIOD, 950_000),
                    root_others=to_ratio(PERIOD, 800_000))
