"""Real cgroups on this machine: discover container-like cgroups and move real processes.

Cgroups are created under pbtest-found-<pid>/ in the v1 cpuset, cpu and cpuacct hierarchies and
the unified (v2) one (this host is hybrid), with Kubernetes cgroupfs and systemd naming. The
memory hierarchy is not used: test processes stay in the memory cgroup they started in.
This host has CPUs 0-1 only, so moves are between "0", "1" and "0-1".
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from agent.discover import containers as discovery, kubelet
from agent.act.cpuset import CpusetActuator, CpusetRefused
from agent.discover.sysfs import read_topology
from perfbalance.cgroupfs import Cgroupfs
from realcg import RealCgroups, cpus_allowed
from perfbalance.cpuset import CpuSet
from perfbalance.errors import ContainerGone, CpusetError
from perfbalance.model import Container, KubeletState

pytestmark = pytest.mark.root

UID = "6c2e0d4a-1111-4b5c-9d7e-0123456789ab"
UID_ = UID.replace("-", "_")
CID_A, CID_B = "a" * 64, "b" * 64
BUSY = ("sh", "-c", "while :; do :; done")


@pytest.fixture(autouse=True)
def two_cpus(cgfs: Cgroupfs) -> None:
    if CpuSet.parse(cgfs.read("", "cpuset", "cpuset.cpus")) != CpuSet.parse("0-1"):
        pytest.skip("these tests assume the root cpuset is 0-1")


def mine(real: RealCgroups, cs: list[Container]) -> dict[str, Container]:
    return {c.id: c for c in cs if c.cgroup.startswith(real.prefix + "/")}


def scan(real: RealCgroups, kl: KubeletState = KubeletState(), globs: tuple[str, ...] = ()) -> dict[str, Container]:
    return mine(real, discovery.discover(real.cgfs, kubernetes=True, globs=globs, kubelet=kl))


def actuator(real: RealCgroups, containers: dict[str, Container], *, kl: KubeletState = KubeletState(),
             reserved: str = "", clock: object = None) -> CpusetActuator:
    kw = {"clock": clock} if clock is not None else {}
    a = CpusetActuator(real.cgfs, reserved=CpuSet.parse(reserved), kubelet=kl,
                       topology=read_topology("/sys"), **kw)  # type: ignore[arg-type]
    a.observe(containers.values())
    return a


def test_cgroupfs_driver_container_is_discovered_with_pid_and_cgroup_id(real: RealCgroups) -> None:
    rel = real.create(f"kubepods/burstable/pod{UID}/{CID_A}")
    p = real.start(rel)
    c = scan(real)[CID_A]
    assert (c.qos, c.pod_uid, c.runtime, c.cpuset) == ("burstable", UID, "containerd", CpuSet.parse("0-1"))
    assert real.cgfs.pids(c.cgroup) == [p.pid]
    assert real.cgfs.cgroup_id(c.cgroup) is not None  # the unified twin exists for BPF


def test_systemd_driver_crio_container_is_discovered(real: RealCgroups) -> None:
    pod = f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice"
    real.create(f"{pod}/crio-conmon-{CID_B}.scope")
    rel = real.create(f"{pod}/crio-{CID_A}.scope")
    real.cgfs.write(rel, "cpu", "cpu.shares", "2")
    real.start(rel)
    found = scan(real)
    assert list(found) == [CID_A]
    assert (found[CID_A].qos, found[CID_A].runtime, found[CID_A].request_mcpu) == ("besteffort", "crio", 0)


def test_busy_container_quota_gives_its_limit(real: RealCgroups) -> None:
    rel = real.create(f"kubepods/burstable/pod{UID}/{CID_A}")
    real.cgfs.write(rel, "cpu", "cpu.shares", "102")
    real.cgfs.write(rel, "cpu", "cpu.cfs_quota_us", "10000")  # 10% of a CPU keeps the test cheap
    real.start(rel, BUSY)
    c = scan(real)[CID_A]
    assert (c.request_mcpu, c.limit_mcpu) == (100, 100)


@pytest.mark.parametrize("target", ["1", "0", "0-1"])
def test_move_sets_cpus_allowed_of_the_process(real: RealCgroups, target: str) -> None:
    rel = real.create("demo/web")
    p = real.start(rel)
    found = scan(real, globs=(f"{real.prefix}/demo/*",))
    a = actuator(real, found)
    first = "1" if target != "1" else "0"
    a.apply(found[f"{real.prefix}:demo:web"], CpuSet.parse(first))
    assert cpus_allowed(p.pid) == first
    r = a.apply(found[f"{real.prefix}:demo:web"], CpuSet.parse(target))
    assert r.changed and cpus_allowed(p.pid) == target
    assert real.cgfs.read(rel, "cpuset", "cpuset.effective_cpus").strip() == target


def test_nested_container_and_exec_children_follow_in_order(real: RealCgroups) -> None:
    rel = real.create(f"kubepods/burstable/pod{UID}/{CID_A}")
    inner = real.create(f"kubepods/burstable/pod{UID}/{CID_A}/container")
    exec_ = real.create(f"kubepods/burstable/pod{UID}/{CID_A}/exec")
    p_inner, p_exec = real.start(inner), real.start(exec_)
    found = scan(real)
    a = actuator(real, found)
    for target in ("1", "0", "0-1", "0"):  # each step both widens and shrinks somewhere
        a.apply(found[CID_A], CpuSet.parse(target))
        assert cpus_allowed(p_inner.pid) == target and cpus_allowed(p_exec.pid) == target
    assert real.cgfs.read(rel, "cpuset", "cpuset.cpus").strip() == "0"


def test_naive_order_is_what_the_kernel_refuses(real: RealCgroups, cgfs: Cgroupfs) -> None:
    """The reason for the two-pass order: shrinking a parent below its child is EBUSY."""
    real.create("naive")
    real.create("naive/child")
    cgfs.write(real.rel("naive/child"), "cpuset", "cpuset.cpus", "1")
    with pytest.raises(OSError) as ei:
        cgfs.write(real.rel("naive"), "cpuset", "cpuset.cpus", "0")
    assert ei.value.errno == errno.EBUSY


def test_parent_narrower_than_target_is_cpuset_error_eacces(real: RealCgroups, cgfs: Cgroupfs) -> None:
    real.create("box")
    rel = real.create("box/c1")
    cgfs.write(rel, "cpuset", "cpuset.cpus", "0")
    cgfs.write(real.rel("box"), "cpuset", "cpuset.cpus", "0")
    p = real.start(rel)
    found = scan(real, globs=(f"{real.prefix}/box/*",))
    with pytest.raises(CpusetError) as ei:
        actuator(real, found).apply(found[f"{real.prefix}:box:c1"], CpuSet.parse("1"))
    assert ei.value.errno == errno.EACCES and "box/c1" in str(ei.value) and "'0-1'" in str(ei.value)
    assert cpus_allowed(p.pid) == "0"  # nothing changed


def test_cpus_the_kernel_lacks_are_a_permanent_cpuset_error(real: RealCgroups) -> None:
    """A topology that claims CPUs the kernel does not have: ERANGE (beyond nr_cpu_ids) or EINVAL."""
    from perfbalance.topology import synthetic
    rel = real.create("demo/x")
    real.start(rel)
    found = scan(real, globs=(f"{real.prefix}/demo/*",))
    a = CpusetActuator(real.cgfs, reserved=CpuSet(), kubelet=KubeletState(),
                       topology=synthetic(packages=1, cores_per_node=4))
    a.observe(found.values())
    with pytest.raises(CpusetError) as ei:
        a.apply(found[f"{real.prefix}:demo:x"], CpuSet.parse("3"))
    assert ei.value.errno in (errno.EINVAL, errno.ERANGE) and ei.value.permanent
    assert "0-1,3" in str(ei.value)
    assert real.cgfs.read(rel, "cpuset", "cpuset.cpus").strip() == "0-1"  # rolled back


def test_container_gone_before_move(real: RealCgroups) -> None:
    rel = real.create("demo/short")
    p = real.start(rel)
    found = scan(real, globs=(f"{real.prefix}/demo/*",))
    a = actuator(real, found)
    real.stop(p)
    real.cgfs.remove(rel)
    with pytest.raises(ContainerGone):
        a.apply(found[f"{real.prefix}:demo:short"], CpuSet.parse("1"))
    assert a.counters["gone_total"] == 1


class ExitsMidMove(Cgroupfs):
    """A Cgroupfs whose first cpuset write is followed by the container exiting and its runtime
    removing the cgroup (what containerd does when the task ends)."""

    def __init__(self, real: RealCgroups, rel: str) -> None:
        super().__init__(root=real.cgfs.root)
        self.real, self.rel, self.writes = real, rel, 0

    def write(self, rel: str, controller: str | None, name: str, value: str) -> None:
        super().write(rel, controller, name, value)
        self.writes += 1
        if self.writes == 1:
            for p in self.real.procs:
                self.real.stop(p)
            self.real.cgfs.remove(self.rel)


def test_container_exiting_mid_move_is_container_gone(real: RealCgroups) -> None:
    rel = real.create(f"kubepods/burstable/pod{UID}/{CID_A}")
    real.start(rel)
    found = scan(real)
    cgfs = ExitsMidMove(real, rel)
    a = CpusetActuator(cgfs, reserved=CpuSet(), kubelet=KubeletState(), topology=read_topology("/sys"))
    a.observe(found.values())
    with pytest.raises(ContainerGone):
        a.apply(found[CID_A], CpuSet.parse("1"))
    assert a.applied() == {} and cgfs.writes == 1
    assert CID_A not in scan(real)  # and the next scan simply does not see it


def test_kubelet_exclusive_cpu_stays_untouched(real: RealCgroups, tmp_path: Path) -> None:
    (tmp_path / "cpu_manager_state").write_text(json.dumps(
        {"policyName": "static", "defaultCpuSet": "0", "entries": {UID: {"app": "1"}}, "checksum": 1}))
    kl = kubelet.read_cpu_manager_state(str(tmp_path))
    excl = real.create(f"kubepods/pod{UID}/{CID_A}")
    shared = real.create(f"kubepods/pod{UID}/{CID_B}")
    real.cgfs.write(excl, "cpuset", "cpuset.cpus", "1")
    real.cgfs.write(shared, "cpuset", "cpuset.cpus", "0")
    p_excl, p_shared = real.start(excl), real.start(shared)
    found = scan(real, kl)
    assert (found[CID_A].name, found[CID_A].exclusive) == ("app", True)
    a = actuator(real, found, kl=kl)
    for target in ("1", "0-1"):
        with pytest.raises(CpusetRefused, match="dedicated"):
            a.apply(found[CID_B], CpuSet.parse(target))
    with pytest.raises(CpusetRefused, match="owns it"):
        a.apply(found[CID_A], CpuSet.parse("0"))
    assert (cpus_allowed(p_excl.pid), cpus_allowed(p_shared.pid)) == ("1", "0")


def test_reserved_cpu_is_refused(real: RealCgroups) -> None:
    rel = real.create("demo/r")
    p = real.start(rel)
    found = scan(real, globs=(f"{real.prefix}/demo/*",))
    with pytest.raises(CpusetRefused, match="reserved"):
        actuator(real, found, reserved="0").apply(found[f"{real.prefix}:demo:r"], CpuSet.parse("0"))
    assert cpus_allowed(p.pid) == "0-1"


def test_drift_after_external_rewrite_is_reasserted(real: RealCgroups) -> None:
    rel = real.create("demo/d")
    p = real.start(rel)
    g = (f"{real.prefix}/demo/*",)
    found = scan(real, globs=g)
    a = actuator(real, found)
    a.apply(found[f"{real.prefix}:demo:d"], CpuSet.parse("1"))
    real.cgfs.write(rel, "cpuset", "cpuset.cpus", "0-1")  # the "runtime" re-applies its set
    assert cpus_allowed(p.pid) == "0-1"
    drift = a.check_drift(list(scan(real, globs=g).values()))
    assert [o.ok for o in a.reassert(drift)] == [True]
    assert cpus_allowed(p.pid) == "1" and a.counters["drift_reasserted_total"] == 1


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_drift_reassert_backs_off_while_the_kernel_refuses(real: RealCgroups) -> None:
    real.create("box")
    rel = real.create("box/c")
    p = real.start(rel)
    g = (f"{real.prefix}/box/*",)
    clock = Clock()
    a = actuator(real, scan(real, globs=g), clock=clock)
    a.apply(scan(real, globs=g)[f"{real.prefix}:box:c"], CpuSet.parse("1"))
    real.cgfs.write(rel, "cpuset", "cpuset.cpus", "0")  # rewritten, and the parent narrowed:
    real.cgfs.write(real.rel("box"), "cpuset", "cpuset.cpus", "0")  # "1" is now EACCES
    drift = a.check_drift(list(scan(real, globs=g).values()))
    out = a.reassert(drift)
    assert not out[0].ok and "EACCES" in out[0].error
    for _ in range(3):  # the agent's next cycles, same moment: no writes attempted
        assert a.reassert(drift)[0].skipped
    clock.t = out[0].retry_at
    assert a.reassert(drift)[0].retry_at == clock.t + 2 * (out[0].retry_at - 0.0)
    real.cgfs.write(real.rel("box"), "cpuset", "cpuset.cpus", "0-1")
    clock.t += 3600
    assert a.reassert(drift)[0].ok and cpus_allowed(p.pid) == "1"
    assert a.counters["drift_backoff_skipped_total"] == 3
