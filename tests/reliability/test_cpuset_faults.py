"""Cgroup write faults the existing actuator tests do not inject: EBUSY and ENOSPC mid-move.

EACCES (parent narrower), EINVAL/ERANGE (CPUs the kernel lacks), a container exiting mid-move and
drift re-assertion with backoff are in tests/agent/test_real_containers.py. Here: a child cgroup
appearing during a move (the kernel's real EBUSY), and ENOSPC (real at the cgroupfs level; injected
through the actuator, which never writes an empty set itself).
"""

from __future__ import annotations

import errno

import pytest

from agent.act.cpuset import CpusetActuator
from agent.discover.sysfs import read_topology
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.cpuset import CpuSet
from perfbalance.errors import CpusetError
from perfbalance.model import Container, KubeletState
from realcg import RealCgroups, cpus_allowed

pytestmark = pytest.mark.root


@pytest.fixture
def real() -> RealCgroups:
    rc = RealCgroups(Cgroupfs(root="/sys/fs/cgroup"))
    rc.prefix = rc.prefix.replace("pbtest-found-", "pbtest-rel-")
    try:
        yield rc  # type: ignore[misc]
    finally:
        rc.close()


class ChildAppearsMidMove(Cgroupfs):
    """After the first write of a move, a runtime starts an exec session: a child cgroup holding
    the container's old CPUs, unknown to the actuator's subtree scan."""

    def __init__(self, rel: str, old: str) -> None:
        super().__init__(root="/sys/fs/cgroup")
        self.rel, self.old, self.writes = rel, old, 0

    def write(self, rel: str, controller: str | None, name: str, value: str) -> None:
        super().write(rel, controller, name, value)
        self.writes += 1
        if self.writes == 1:
            self.create(f"{self.rel}/exec", ("cpuset",))
            super().write(f"{self.rel}/exec", "cpuset", "cpuset.cpus", self.old)


class FailsWith(Cgroupfs):
    """The n-th write fails with `err` (what the kernel says in states we cannot build here)."""

    def __init__(self, err: int, nth: int) -> None:
        super().__init__(root="/sys/fs/cgroup")
        self.err, self.nth, self.writes = err, nth, 0

    def write(self, rel: str, controller: str | None, name: str, value: str) -> None:
        self.writes += 1
        if self.writes == self.nth:
            raise OSError(self.err, errno.errorcode[self.err])
        super().write(rel, controller, name, value)


def container(real: RealCgroups, name: str) -> tuple[Container, int]:
    rel = real.create(name)
    real.cgfs.write(rel, "cpuset", "cpuset.cpus", "0")
    p = real.start(rel)
    return Container(id=name, cgroup=rel, cpuset=CpuSet.parse("0"), mems=CpuSet.parse("0")), p.pid


def actuator(cgfs: Cgroupfs, c: Container) -> CpusetActuator:
    a = CpusetActuator(cgfs, reserved=CpuSet(), kubelet=KubeletState(), topology=read_topology("/sys"))
    a.observe([c])
    return a


def test_child_appearing_mid_move_is_ebusy_retryable_and_rolled_back(real: RealCgroups) -> None:
    c, pid = container(real, "busy")
    cgfs = ChildAppearsMidMove(c.cgroup, "0")
    with pytest.raises(CpusetError) as ei:
        actuator(cgfs, c).apply(c, CpuSet.parse("1"))
    assert ei.value.errno == errno.EBUSY and not ei.value.permanent
    assert "shrink children first" in str(ei.value)
    assert real.cgfs.read(c.cgroup, "cpuset", "cpuset.cpus").strip() == "0"  # rolled back
    assert cpus_allowed(pid) == "0"


def test_emptying_a_populated_cpuset_is_enospc_in_the_kernel(real: RealCgroups) -> None:
    c, _ = container(real, "full")
    with pytest.raises(OSError) as ei:
        real.cgfs.write(c.cgroup, "cpuset", "cpuset.cpus", "\n")
    assert ei.value.errno == errno.ENOSPC


def test_enospc_through_the_actuator_is_a_retryable_cpuset_error_rolled_back(real: RealCgroups) -> None:
    c, pid = container(real, "nospace")
    cgfs = FailsWith(errno.ENOSPC, nth=2)  # write 1 widens to 0-1, write 2 shrinks to 1
    a = actuator(cgfs, c)
    with pytest.raises(CpusetError) as ei:
        a.apply(c, CpuSet.parse("1"))
    assert ei.value.errno == errno.ENOSPC and not ei.value.permanent
    assert real.cgfs.read(c.cgroup, "cpuset", "cpuset.cpus").strip() == "0"
    assert cpus_allowed(pid) == "0" and a.applied() == {} and a.counters["errors_total"] == 1


@pytest.mark.parametrize("err", [errno.EACCES, errno.EBUSY, errno.ENOSPC, errno.EINVAL])
def test_failed_drift_reassert_backs_off_for_every_errno(real: RealCgroups, err: int) -> None:
    c, _ = container(real, f"drift{err}")
    cgfs = FailsWith(err, nth=10 ** 9)
    a = actuator(cgfs, c)
    a.apply(c, CpuSet.parse("1"))
    real.cgfs.write(c.cgroup, "cpuset", "cpuset.cpus", "0")  # the kubelet rewrote it
    cgfs.nth = cgfs.writes + 1  # and the next write fails
    n, errors = a.maintain([c])
    assert n == 0 and len(errors) == 1 and errno.errorcode[err] in errors[0]
    writes = cgfs.writes
    for _ in range(5):  # the next cycles, same moment: backing off, no write attempted
        assert a.maintain([c]) == (0, [])
    assert cgfs.writes == writes
