"""Restart recovery through the real actuator: half-done moves finished or reverted, drift
detection resumed from the checkpoint, hostile trees refused without crashing the actuator."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fakecg
from agent.persist.checkpoint import Checkpoint, recover
from agent.act.cpuset import CpusetActuator
from perfbalance.cgroupfs import CgroupPathRefused, Cgroupfs
from perfbalance.cpuset import CpuSet
from perfbalance.model import Container, KubeletState
from perfbalance.topology import synthetic

TOPO = synthetic(packages=1, nodes_per_package=2, cores_per_node=2)  # CPUs 0-1 node 0, 2-3 node 1


def tree(tmp_path: Path, cpus: str = "0-1", mems: str = "0") -> tuple[Cgroupfs, Path]:
    root = fakecg.v2(tmp_path)
    fakecg.mkcg(root, "demo/c", {"": {"cpuset.cpus": cpus, "cpuset.mems": mems}})
    return Cgroupfs(root=str(root)), root


def discovered(root: Path) -> Container:
    """What discovery would report now (cpuset read from the tree)."""
    cpus = (root / "demo/c/cpuset.cpus").read_text().strip()
    return Container(id="demo:c", cgroup="demo/c", cpuset=CpuSet.parse(cpus))


def actuator(cgfs: Cgroupfs, known: Container) -> CpusetActuator:
    a = CpusetActuator(cgfs, reserved=CpuSet(), kubelet=KubeletState(), topology=TOPO)
    a.observe([known])
    return a


def test_agent_killed_mid_move_finishes_it_after_restart(tmp_path: Path) -> None:
    cgfs, root = tree(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    Checkpoint(str(run)).begin_move("demo:c", "demo/c", "0-1", "2-3", mems="1")
    (root / "demo/c/cpuset.cpus").write_text("0-3")  # the widen pass happened, then SIGKILL
    # restart:
    ck = Checkpoint(str(run))
    data = ck.load()
    assert data is not None
    now = discovered(root)
    [step] = recover(data, [now], usable_cpus=TOPO.online)
    assert step.action == "finish"
    actuator(cgfs, now).apply(now, CpuSet.parse(step.value), CpuSet.parse(step.mems))
    ck.end_move(step.container)
    assert (root / "demo/c/cpuset.cpus").read_text() == "2-3"
    assert (root / "demo/c/cpuset.mems").read_text() == "1"
    assert ck.placed[("demo:c", "cpuset")].value == "2-3" and not ck.pending


def test_agent_killed_mid_move_reverts_when_the_target_became_reserved(tmp_path: Path) -> None:
    cgfs, root = tree(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    Checkpoint(str(run)).begin_move("demo:c", "demo/c", "0-1", "2-3", mems="1")
    (root / "demo/c/cpuset.cpus").write_text("0-3")
    (root / "demo/c/cpuset.mems").write_text("0-1")
    data = Checkpoint(str(run)).load()
    assert data is not None
    now = discovered(root)
    [step] = recover(data, [now], usable_cpus=CpuSet.parse("0-1"))  # 2-3 reserved meanwhile
    assert (step.action, step.value) == ("revert", "0-1")
    actuator(cgfs, now).apply(now, CpuSet.parse(step.value))
    assert (root / "demo/c/cpuset.cpus").read_text() == "0-1"
    assert (root / "demo/c/cpuset.mems").read_text() == "0"


def test_drift_detection_resumes_after_restart_from_the_checkpoint(tmp_path: Path) -> None:
    cgfs, root = tree(tmp_path, cpus="2-3", mems="1")
    run = tmp_path / "run"
    run.mkdir()
    Checkpoint(str(run)).place("demo:c", "demo/c", "2-3", mems="1")
    (root / "demo/c/cpuset.cpus").write_text("0-3")  # the kubelet re-applied its set while we were down
    ck = Checkpoint(str(run))
    ck.load()
    now = discovered(root)
    a = actuator(cgfs, now)
    assert a.adopt(ck.cpuset_placements()) == 1
    n, errors = a.maintain([now])
    assert (n, errors) == (1, [])
    assert (root / "demo/c/cpuset.cpus").read_text() == "2-3"


def test_adopt_ignores_placements_of_containers_not_discovered_or_moved(tmp_path: Path) -> None:
    cgfs, root = tree(tmp_path)
    a = actuator(cgfs, discovered(root))
    placements = {"gone": ("demo/gone", CpuSet.parse("0"), CpuSet.parse("0")),
                  "demo:c": ("demo/elsewhere", CpuSet.parse("0"), CpuSet.parse("0"))}
    assert a.adopt(placements) == 0 and a.applied() == {}


def test_symlink_planted_in_a_container_subtree_is_refused_and_rolled_back(tmp_path: Path) -> None:
    cgfs, root = tree(tmp_path)
    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.unlink(root / "demo/c/cpuset.mems")
    os.symlink(victim, root / "demo/c/cpuset.mems")
    now = discovered(root)
    with pytest.raises(CgroupPathRefused):
        actuator(cgfs, now).apply(now, CpuSet.parse("2-3"))
    assert victim.read_text() == "keep"
    assert (root / "demo/c/cpuset.cpus").read_text() == "0-1"


def test_drift_reassert_into_a_refused_path_backs_off_instead_of_crashing(tmp_path: Path) -> None:
    cgfs, root = tree(tmp_path, cpus="2-3", mems="1")
    now = discovered(root)
    a = actuator(cgfs, now)
    a.adopt({"demo:c": ("demo/c", CpuSet.parse("2-3"), CpuSet.parse("1"))})
    (root / "demo/c/cpuset.cpus").write_text("0-3")
    os.unlink(root / "demo/c/cpuset.mems")
    os.symlink(tmp_path / "elsewhere", root / "demo/c/cpuset.mems")
    n, errors = a.maintain([now])
    assert n == 0 and len(errors) == 1 and "symlink" in errors[0]
    n, errors = a.maintain([now])  # within the backoff: not retried
    assert n == 0 and errors == [] and a.counters["drift_backoff_skipped_total"] == 1
