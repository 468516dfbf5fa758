"""Fixtures for VM-sandbox tests: real cgroups named pbtest-vm-<pid>-<n> and stand-in VMMs in them."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from agent.act.vcpu import VcpuActuator
from agent.config import VmSection
from agent.discover.vmm import VmmDiscovery
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.cpuset import CpuSet
from perfbalance.model import Container, ContainerSample, KubeletState, Plan, Snapshot
from perfbalance.sandbox import VcpuPinning
from perfbalance.topology import Topology, synthetic
from rebalancer import vm

STANDIN = Path(__file__).with_name("standin_vmm.py")
ALL = CpuSet.parse("0-1")
_seq = itertools.count()

QEMU = ("qemu-system-x86", ["CPU 0/KVM", "CPU 1/KVM", "IO iothread1", "IO mon_iothread"])
CLOUD_HYPERVISOR = ("cloud-hyperviso", ["vcpu0", "vcpu1", "http-server", "signal_handler", "_disk0_q0"])


@dataclass
class StandIn:
    proc: subprocess.Popen[str]
    tids: dict[str, int]  # thread name -> tid

    @property
    def pid(self) -> int:
        return self.proc.pid

    def affinity(self, name: str) -> CpuSet:
        return CpuSet(os.sched_getaffinity(self.tids[name]))


@dataclass
class Pod:
    """A pod cgroup `<top>/pod` with `sandbox/` (the VMM) and container cgroups `ctr-a`, `ctr-b`."""

    cg: Cgroupfs
    top: str
    uid: str
    procs: list[StandIn] = field(default_factory=list)

    @property
    def rel(self) -> str:
        return f"{self.top}/pod"

    def ctr(self, name: str) -> str:
        return f"{self.rel}/{name}"

    def set_cpus(self, name: str, cpus: str) -> None:
        """What the kubelet (UpdateContainerResources) or the cpuset actuator does."""
        self.cg.write(self.ctr(name), "cpuset", "cpuset.cpus", cpus)

    def container(self, name: str, *, exclusive: bool = False) -> Container:
        """The container as discovery would report it: cpuset read from its cgroup."""
        cpus = self.cg.read_cpuset(self.ctr(name), "cpuset", "cpuset.cpus")
        return Container(id=f"{self.uid}-{name}", name=name, pod_uid=self.uid,
                         cgroup=self.ctr(name), cpuset=cpus, exclusive=exclusive, sandbox="kata")

    def spawn(self, main: str, threads: list[str], where: str = "sandbox") -> StandIn:
        proc = subprocess.Popen([sys.executable, str(STANDIN), main, *threads],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        s = StandIn(proc=proc, tids={})
        self.procs.append(s)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "stand-in VMM did not start"
        s.tids = json.loads(line)
        self.cg.attach(self.ctr(where), proc.pid)
        return s

    def stop(self) -> None:
        for s in self.procs:
            if s.proc.poll() is None:
                assert s.proc.stdin is not None
                s.proc.stdin.close()
                try:
                    s.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
                    s.proc.wait()
            if s.proc.stdout is not None:
                s.proc.stdout.close()


@pytest.fixture
def cg() -> Cgroupfs:
    return Cgroupfs(root="/sys/fs/cgroup")


@pytest.fixture
def pod(cg: Cgroupfs) -> Iterator[Pod]:
    if os.geteuid() != 0:
        pytest.skip("needs root (real cgroups)")
    if len(os.sched_getaffinity(0) & {0, 1}) < 2:
        pytest.skip("needs CPUs 0 and 1")
    top = f"pbtest-vm-{os.getpid()}-{next(_seq)}"
    p = Pod(cg=cg, top=top, uid=f"uid-{top}")
    try:
        for name in ("sandbox", "ctr-a", "ctr-b"):
            cg.create(f"{top}/pod/{name}", ("cpuset",))
            for rel in (top, f"{top}/pod", f"{top}/pod/{name}"):
                cg.write(rel, "cpuset", "cpuset.cpus", "0-1")
        yield p
    finally:
        p.stop()
        cg.remove(top)


@dataclass(frozen=True, kw_only=True)
class Synced:
    """One cycle of the three rooms: what was found, planned and applied."""

    sandboxes: tuple[VcpuPinning, ...]
    writes: int
    errors: tuple[str, ...]
    problems: tuple[str, ...]


class Cycle:
    """discover -> plan -> act for VM sandboxes, as the agent's loop does them each cycle:
    `VmmDiscovery.find` into `Snapshot.vmms`, `rebalancer.vm.plan_vcpus` (with the previous
    cycle's pinning) into `Plan.vcpu_pinning`, `VcpuActuator.apply`."""

    def __init__(self, cg: Cgroupfs, config: VmSection = VmSection()) -> None:
        self.config = config
        self.discovery = VmmDiscovery(config=config, procfs_root="/proc", cgroupfs=cg)
        self.actuator = VcpuActuator()
        self.pinning: tuple[VcpuPinning, ...] = ()

    def find_vmm(self, cgroup: str, *, scan_threads: bool = True):
        return self.discovery.find_vmm(cgroup, scan_threads=scan_threads)

    def sync(self, *, containers, kubelet=KubeletState(), online: CpuSet = ALL,
             topology: Topology | None = None) -> Synced:
        topo = topology or synthetic(packages=1, cores_per_node=max(online) + 1)
        found = self.discovery.find(containers)
        snap = Snapshot(time=0.0, window=1.0, node="n", topology=topo, kubelet=kubelet,
                        containers=tuple(ContainerSample(container=c) for c in containers),
                        vmms=found.vmms)
        return self.sync_snapshot(snap, errors=found.errors)

    def sync_snapshot(self, snap: Snapshot, *, plan: Plan | None = None, errors=()) -> Synced:
        if not snap.vmms:
            snap = replace(snap, vmms=self.discovery.find([s.container for s in snap.containers]).vmms)
        actions = plan.actions if plan is not None else ()
        self.pinning = vm.plan_vcpus(snap, actions=actions, previous=self.pinning,
                                     system_vcpus=self.config.system_vcpus,
                                     pin_exclusive=self.config.pin_exclusive)
        applied = self.actuator.apply(self.pinning)
        return Synced(sandboxes=self.pinning, writes=applied.writes, errors=(*errors, *applied.errors),
                      problems=tuple(f"pod {p.pod}: {x}" for p in self.pinning for x in p.problems))

    def vcpu_map(self) -> dict[str, dict[int, int]]:
        return self.actuator.vcpu_map()

    def guest_cpuset(self, container_id: str) -> CpuSet:
        for p in self.pinning:
            if container_id in p.guest_cpusets:
                return p.guest_cpusets[container_id]
        raise KeyError(container_id)

    def to_guest(self, container_id: str, host: CpuSet) -> CpuSet:
        return vm.to_guest(self.vcpu_map().get(container_id, {}), host, container=container_id)


@pytest.fixture
def sandboxes(cg: Cgroupfs) -> Cycle:
    return Cycle(cg)
