"""CpusetActuator on fake trees: write order for nested cgroups, refusals, idempotence, drift backoff.

Fake trees are plain files: the kernel's own checks (EACCES/EBUSY/EINVAL) and effective sets
are exercised on real cgroups in test_actuator_real.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fakecg
from agent.act.cpuset import CpusetActuator, CpusetNotGranted, CpusetRefused
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.cpuset import CpuSet
from perfbalance.model import Container, KubeletState
from perfbalance.topology import synthetic

TOPO = synthetic(packages=1, nodes_per_package=2, cores_per_node=2)  # CPUs 0-1 node 0, 2-3 node 1
UID = "6c2e0d4a-1111-4b5c-9d7e-0123456789ab"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def v2_tree(tmp_path: Path) -> tuple[Cgroupfs, Path]:
    root = fakecg.v2(tmp_path)
    fakecg.mkcg(root, "demo/c", {"": {"cpuset.cpus": "0-1", "cpuset.mems": "0"}})
    fakecg.mkcg(root, "demo/c/container", {"": {"cpuset.cpus": "0-1", "cpuset.mems": "0"}})
    fakecg.mkcg(root, "demo/c/exec", {"": {"cpuset.cpus": "", "cpuset.mems": ""}})
    return Cgroupfs(root=str(root)), root


def container(rel: str = "demo/c", **kw: object) -> Container:
    return Container(id=rel.replace("/", ":"), cgroup=rel, **kw)  # type: ignore[arg-type]


def actuator(cgfs: Cgroupfs, *, kubelet: KubeletState = KubeletState(), reserved: str = "",
             known: tuple[Container, ...] = (), clock: Clock | None = None) -> CpusetActuator:
    a = CpusetActuator(cgfs, reserved=CpuSet.parse(reserved), kubelet=kubelet, topology=TOPO,
                       clock=clock or Clock())
    a.observe(known or (container(),))
    return a


def test_v2_widens_parent_first_and_shrinks_child_first(tmp_path: Path) -> None:
    cgfs, root = v2_tree(tmp_path)
    r = actuator(cgfs).apply(container(), CpuSet.parse("2"))
    assert r.writes == (
        "demo/c/cpuset.mems <- 0-1", "demo/c/cpuset.cpus <- 0-2",
        "demo/c/container/cpuset.mems <- 0-1", "demo/c/container/cpuset.cpus <- 0-2",
        "demo/c/container/cpuset.cpus <- 2", "demo/c/container/cpuset.mems <- 1",
        "demo/c/cpuset.cpus <- 2", "demo/c/cpuset.mems <- 1",
    )
    assert (root / "demo/c/exec/cpuset.cpus").read_text() == ""  # inherits; left alone


def test_mems_follow_numa_nodes_of_cpus(tmp_path: Path) -> None:
    cgfs, root = v2_tree(tmp_path)
    r = actuator(cgfs).apply(container(), CpuSet.parse("1-2"))
    assert r.mems == CpuSet.parse("0-1")
    assert (root / "demo/c/cpuset.mems").read_text() == "0-1"


def test_apply_twice_writes_nothing_the_second_time(tmp_path: Path) -> None:
    cgfs, _ = v2_tree(tmp_path)
    a = actuator(cgfs)
    assert a.apply(container(), CpuSet.parse("3")).changed
    again = a.apply(container(), CpuSet.parse("3"))
    assert not again.changed and again.writes == ()
    assert a.counters["unchanged_total"] == 1


def test_not_granted_when_effective_differs(tmp_path: Path) -> None:
    cgfs, root = v2_tree(tmp_path)
    (root / "demo/c/cpuset.cpus.effective").write_text("0-1\n")  # a "kernel" that ignores us
    with pytest.raises(CpusetNotGranted, match="wanted 3"):
        actuator(cgfs).apply(container(), CpuSet.parse("3"))


def test_refuses_cgroup_not_matched_by_discovery(tmp_path: Path) -> None:
    cgfs, root = v2_tree(tmp_path)
    a = actuator(cgfs, known=(container("demo/other"),))
    with pytest.raises(CpusetRefused, match="not matched by discovery"):
        a.apply(container(), CpuSet.parse("2"))
    assert (root / "demo/c/cpuset.cpus").read_text() == "0-1"


def test_refuses_same_id_with_a_different_cgroup(tmp_path: Path) -> None:
    cgfs, _ = v2_tree(tmp_path)
    a = actuator(cgfs)
    forged = Container(id="demo:c", cgroup="demo/c/container")
    with pytest.raises(CpusetRefused):
        a.apply(forged, CpuSet.parse("2"))


@pytest.mark.parametrize("cpus,reason", [("", "empty"), ("7", "not online"), ("0", "reserved")])
def test_refusals_write_nothing(tmp_path: Path, cpus: str, reason: str) -> None:
    cgfs, root = v2_tree(tmp_path)
    with pytest.raises(CpusetRefused, match=reason):
        actuator(cgfs, reserved="0").apply(container(), CpuSet.parse(cpus))
    assert (root / "demo/c/cpuset.cpus").read_text() == "0-1"


def test_refuses_cpus_dedicated_to_another_container(tmp_path: Path) -> None:
    cgfs, _ = v2_tree(tmp_path)
    kl = KubeletState(policy="static", exclusive={(UID, "db"): CpuSet([3])})
    with pytest.raises(CpusetRefused, match="dedicated by the kubelet to other containers"):
        actuator(cgfs, kubelet=kl).apply(container(), CpuSet.parse("2-3"))


def test_refuses_to_move_an_exclusive_container(tmp_path: Path) -> None:
    cgfs, _ = v2_tree(tmp_path)
    c = container(pod_uid=UID, name="db", exclusive=True)
    kl = KubeletState(policy="static", exclusive={(UID, "db"): CpuSet([3])})
    with pytest.raises(CpusetRefused, match="owns it"):
        actuator(cgfs, kubelet=kl, known=(c,)).apply(c, CpuSet.parse("2"))


def test_refuses_isolated_unless_allowed(tmp_path: Path) -> None:
    cgfs, _ = v2_tree(tmp_path)
    topo = synthetic(packages=1, cores_per_node=4)
    topo = type(topo)(cpus=topo.cpus, isolated=CpuSet([3]))
    a = CpusetActuator(cgfs, reserved=CpuSet(), kubelet=KubeletState(), topology=topo)
    a.observe((container(),))
    with pytest.raises(CpusetRefused, match="isolated"):
        a.apply(container(), CpuSet.parse("3"))
    a.allow_isolated = True
    assert a.apply(container(), CpuSet.parse("3")).cpus == CpuSet([3])


def test_drift_detected_and_reasserted(tmp_path: Path) -> None:
    cgfs, root = v2_tree(tmp_path)
    a = actuator(cgfs)
    a.apply(container(), CpuSet.parse("2"))
    (root / "demo/c/cpuset.cpus").write_text("0-1")  # the runtime re-applied its own set
    drift = a.check_drift([container(cpuset=CpuSet.parse("0-1"))])
    assert [d.container.id for d in drift] == ["demo:c"]
    assert [o.ok for o in a.reassert(drift)] == [True]
    assert (root / "demo/c/cpuset.cpus").read_text() == "2"
    assert a.counters["drift_reasserted_total"] == 1


def test_no_drift_when_cpuset_is_what_we_applied(tmp_path: Path) -> None:
    cgfs, _ = v2_tree(tmp_path)
    a = actuator(cgfs)
    a.apply(container(), CpuSet.parse("2"))
    assert a.check_drift([container(cpuset=CpuSet.parse("2"), mems=CpuSet.parse("1"))]) == []


def test_vanished_container_is_forgotten_at_next_observe(tmp_path: Path) -> None:
    cgfs, _ = v2_tree(tmp_path)
    a = actuator(cgfs)
    a.apply(container(), CpuSet.parse("2"))
    a.observe([])
    assert a.applied() == {}


def test_reassert_backs_off_exponentially_on_failure(tmp_path: Path) -> None:
    cgfs, root = v2_tree(tmp_path)
    clock = Clock()
    a = actuator(cgfs, clock=clock)
    a.apply(container(), CpuSet.parse("2"))
    (root / "demo/c/cpuset.cpus").write_text("0-1")
    (root / "demo/c/cpuset.cpus.effective").write_text("0-1")  # and the "kernel" won't grant 2
    drift = a.check_drift([container(cpuset=CpuSet.parse("0-1"))])
    first = a.reassert(drift)[0]
    assert not first.ok and first.retry_at == clock.t + 10
    assert a.reassert(drift)[0].skipped  # same moment: no retry
    clock.t += 10
    second = a.reassert(drift)[0]
    assert not second.skipped and second.retry_at == clock.t + 20
    assert a.counters["drift_reassert_failed_total"] == 2
    assert a.counters["drift_backoff_skipped_total"] == 1
    (root / "demo/c/cpuset.cpus.effective").unlink()
    clock.t += 20
    assert a.reassert(drift)[0].ok


def test_reassert_lets_go_when_cpus_became_dedicated(tmp_path: Path) -> None:
    cgfs, root = v2_tree(tmp_path)
    a = actuator(cgfs)
    a.apply(container(), CpuSet.parse("2"))
    (root / "demo/c/cpuset.cpus").write_text("0-1")
    drift = a.check_drift([container(cpuset=CpuSet.parse("0-1"))])
    a.observe([container(cpuset=CpuSet.parse("0-1"))],
              kubelet=KubeletState(policy="static", exclusive={(UID, "db"): CpuSet([2])}))
    out = a.reassert(drift)[0]
    assert not out.ok and "dedicated" in out.error and a.applied() == {}


def test_v2_cgroup_without_cpuset_files_is_feature_unavailable(tmp_path: Path) -> None:
    from perfbalance.errors import FeatureUnavailable
    root = fakecg.v2(tmp_path, controllers="cpu memory")
    fakecg.mkcg(root, "demo/c", {"": {"cgroup.procs": ""}})
    a = actuator(Cgroupfs(root=str(root)))
    with pytest.raises(FeatureUnavailable, match="subtree_control"):
        a.apply(container(), CpuSet.parse("1"))


def test_stale_discovery_after_our_own_move_is_not_drift(tmp_path: Path) -> None:
    cgfs, _ = v2_tree(tmp_path)
    a = actuator(cgfs)
    before = container(cpuset=CpuSet.parse("0-1"))  # discovered at the start of the cycle
    a.apply(before, CpuSet.parse("2"))
    assert a.check_drift([before]) == []


def test_maintain_reports_count_and_errors(tmp_path: Path) -> None:
    cgfs, root = v2_tree(tmp_path)
    a = actuator(cgfs)
    a.apply(container(), CpuSet.parse("2"))
    (root / "demo/c/cpuset.cpus").write_text("0-1")
    assert a.maintain([container()]) == (1, [])
    assert a.maintain([container()]) == (0, [])


def test_maintain_without_reassert_lets_go(tmp_path: Path) -> None:
    cgfs, root = v2_tree(tmp_path)
    a = actuator(cgfs)
    a.reassert_drift = False
    a.apply(container(), CpuSet.parse("2"))
    (root / "demo/c/cpuset.cpus").write_text("0-1")
    assert a.maintain([container()]) == (0, [])
    assert (root / "demo/c/cpuset.cpus").read_text() == "0-1" and a.applied() == {}
