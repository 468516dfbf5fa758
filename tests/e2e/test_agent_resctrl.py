"""The agent with RDT: the real loop, real Kubernetes-shaped cgroups and processes, and the
kernel-faithful resctrl emulator (tests/resctrl/emulator; no RDT hardware on this machine).

Checks the wiring of agent/act/rdt.py: classes created with their schemata, containers put
in their QoS class with every thread, monitoring groups per container, a planner-style class move,
the CLOSID budget in the exported state, our groups only, and a planner class choice kept across a
restart.
"""

from __future__ import annotations

import dataclasses
import io
import sys
import uuid
from pathlib import Path

import pytest

from agent.config import parse_config
from agent.loop import Agent
from agent.wiring import Parts
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.model import Action, Plan
from rebalancer.planner import POLICY as COSTMODEL

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "resctrl"))
from rchelpers import Threaded, emulated_parts, full_emulator  # noqa: E402

pytestmark = [pytest.mark.root, pytest.mark.slow]

CONFIG = """
agent: {{run_dir: {run_dir}, log_format: text, interval_seconds: 0.5}}
discovery: {{kubernetes: true}}
metrics: {{enabled: false}}
kubernetes: {{api: off}}
rebalancer: {{enabled: false}}
resctrl:
  rdt: on
  classes:
    gold: {{l3: "60%", mb: "100%"}}
    bulk: {{l3: "20%", mb: "40%"}}
  qos_classes: {{besteffort: bulk}}
"""


@pytest.fixture
def emu(tmp_path):
    with full_emulator(tmp_path / "emu") as e:
        yield e


@pytest.fixture
def besteffort_pod():
    """A cgroupfs-driver BestEffort pod with one container running a 5-thread process."""
    cgfs = Cgroupfs(root="/sys/fs/cgroup")
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    rels = ["kubepods", "kubepods/besteffort", f"kubepods/besteffort/pod{uid}",
            f"kubepods/besteffort/pod{uid}/{cid}"]
    if cgfs.exists("kubepods"):
        pytest.skip("this machine runs a kubelet: not creating kubepods")
    for rel in rels:
        cgfs.create(rel)
    proc = Threaded(5)
    try:
        cgfs.attach(rels[-1], proc.pid)
        yield cid, proc
    finally:
        proc.stop()
        for rel in reversed(rels):
            cgfs.remove(rel)


async def test_agent_puts_containers_in_rdt_classes_on_the_emulator(emu, besteffort_pod, tmp_path):
    cid, proc = besteffort_pod
    (tmp_path / "emu").mkdir(exist_ok=True)
    config = parse_config(CONFIG.format(run_dir=tmp_path / "run"), source="t.yaml", node="n")
    made: list[Parts] = []
    agent = Agent(config, node="n", cycles=2, json_out=io.StringIO(), parts_factory=emulated_parts(emu, made))
    assert await agent.run() == 0
    mount = Path(emu.mount)
    assert "L3:0=" in (mount / "perfbalance.gold" / "schemata").read_text()
    bulk_tasks = {int(t) for t in (mount / "perfbalance.bulk" / "tasks").read_text().split()}
    assert set(proc.tids()) <= bulk_tasks  # every thread, not just the main one
    report = agent.state.latest
    assert report is not None and not [e for e in report.errors if "resctrl" in e]
    (sample,) = [s for s in report.snapshot.containers if s.id == cid]
    assert sample.container.rdt_class == "bulk"
    assert report.snapshot.collectors["resctrl"].up
    mon = list((mount / "perfbalance.bulk" / "mon_groups").iterdir())
    assert mon, "no per-container monitoring group"
    assert agent.state.extra["resctrl_closids_total"] >= agent.state.extra["resctrl_closids_free"] > 0

    # A planner "rdt_class" action through the same glue moves every thread.
    made[0].resctrl.apply_class(sample.container, "gold")
    gold_tasks = {int(t) for t in (mount / "perfbalance.gold" / "tasks").read_text().split()}
    assert set(proc.tids()) <= gold_tasks


async def test_a_planner_rdt_class_choice_survives_an_agent_restart(emu, besteffort_pod, tmp_path, monkeypatch):
    """The planner moves the BestEffort container from its QoS class (bulk) to gold; a restarted
    agent keeps it in gold instead of sweeping it back to bulk."""
    cid, proc = besteffort_pod
    mount = Path(emu.mount)
    config = parse_config(CONFIG.replace("rebalancer: {{enabled: false}}", "rebalancer: {{enabled: true}}")
                          .format(run_dir=tmp_path / "run"), source="t.yaml", node="n")
    chosen: dict[int, str] = {}

    def scripted(snapshot, cfg, state, now):  # the cost model's place: one class move, first run only
        actions = tuple(Action(kind="rdt_class", container=s.id, frm=s.container.rdt_class, to=chosen[snapshot.cycle],
                               reason="test: planner class choice", decision="d1")
                        for s in snapshot.containers if s.id == cid and snapshot.cycle in chosen)
        return Plan(time=now, actions=actions, state=state)

    monkeypatch.setattr("rebalancer.planner.POLICY", dataclasses.replace(COSTMODEL, plan=scripted))
    monkeypatch.setattr("rebalancer.plan", scripted)

    def run(cycles: int) -> Agent:
        return Agent(config, node="n", cycles=cycles, json_out=io.StringIO(), parts_factory=emulated_parts(emu))

    def tasks(cls: str) -> set[int]:
        return {int(t) for t in (mount / f"perfbalance.{cls}" / "tasks").read_text().split()}

    chosen[2] = "gold"
    first = run(2)
    assert await first.run() == 0
    assert [a.ok for a in first.state.latest.applied] == [True]
    assert set(proc.tids()) <= tasks("gold")
    chosen.clear()
    second = run(2)
    assert await second.run() == 0
    report = second.state.latest
    (sample,) = [s for s in report.snapshot.containers if s.id == cid]
    assert sample.container.rdt_class == "gold"
    assert set(proc.tids()) <= tasks("gold") and not set(proc.tids()) & tasks("bulk")
