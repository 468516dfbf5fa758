"""VM sandboxes, the acting part: find a pod's VMM, classify its threads, set their affinity.

In a Kata or KubeVirt pod the kubelet's cpusets land on cgroups whose work really runs on the
VMM's vCPU threads; left alone those threads float over every CPU of the host, including CPUs the
kubelet dedicated to someone else (the Kata cpu-manager issue, seed 000). Each cycle, and after every move, the loop
calls `VmSandboxes.sync(...)`, which:

1. groups VM-sandboxed containers by pod and finds the VMM process among the processes in the
   pod's cgroup subtree (by comm or executable name, else by vCPU-named threads);
2. classifies its threads from `<procfs>/<pid>/task/<tid>/comm`: vCPU threads (QEMU `CPU n/KVM`,
   Cloud Hypervisor `vcpun`, Firecracker `fc_vcpu n`, configurable) and helpers (main loop, I/O
   threads, vhost workers; also kernel `vhost-<vmm pid>` workers found in the pod's cgroups);
3. plans with the pure `rebalancer.vm.plan_sandbox` (sandbox mask, 1:1 pinning for dedicated
   CPUs with a stable host CPU <-> vCPU mapping, helpers on the shared pool);
4. applies it with `sched_setaffinity` per TID, only where the thread's current affinity differs
   (so calling it every cycle is cheap and idempotent), and reads every write back.

It never raises for a sandbox's trouble: problems and refused writes come back in the report.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from agent.config import VmSection
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.cpuset import CpuSet
from perfbalance.errors import ContainerGone, PerfbalanceError
from perfbalance.model import Container, KubeletState, Snapshot
from perfbalance.topology import Topology
from rebalancer import vm

MAX_COMM_BYTES = 64
VHOST_PREFIX = "vhost-"


# -- pure classification ------------------------------------------------------------------------

def parse_comm(text: str) -> str:
    """A `comm` file: the thread name (at most 15 bytes) and a newline."""
    return text.rstrip("\n")


def compile_patterns(patterns: Iterable[str]) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


def vcpu_index(comm: str, patterns: Sequence[re.Pattern[str]]) -> int | None:
    """The vCPU index a thread name carries (group 1 of the first matching pattern), else None."""
    for p in patterns:
        m = p.search(comm)
        if m and m.lastindex:
            try:
                return int(m.group(1))
            except ValueError:
                continue
    return None


@dataclass(frozen=True, kw_only=True)
class VmmThreads:
    """One VMM process and its threads sorted into vCPUs and helpers."""

    pid: int
    comm: str
    vcpus: Mapping[int, int]  # vCPU index -> TID
    helpers: tuple[int, ...]  # TIDs: main loop, I/O threads, vhost workers, ...
    names: Mapping[int, str] = field(default_factory=dict)  # TID -> comm


def classify(pid: int, comms: Mapping[int, str], patterns: Sequence[re.Pattern[str]], *,
             vhost: Mapping[int, str] | None = None) -> VmmThreads:
    """Sort a VMM's threads (TID -> comm) into vCPUs and helpers; `vhost` are kernel vhost workers
    (TID -> comm) found elsewhere in the pod, always helpers. Two threads claiming one vCPU index
    (a pattern too broad) keep the lower TID as the vCPU and make the other a helper."""
    vcpus: dict[int, int] = {}
    helpers: list[int] = []
    for tid in sorted(comms):
        idx = vcpu_index(comms[tid], patterns)
        if idx is None or idx in vcpus:
            helpers.append(tid)
        else:
            vcpus[idx] = tid
    helpers.extend(t for t in sorted(vhost or {}) if t not in comms)
    return VmmThreads(pid=pid, comm=comms.get(pid, ""), vcpus=dict(sorted(vcpus.items())),
                      helpers=tuple(helpers), names={**(vhost or {}), **comms})


def is_vmm(comm: str, exe: str, patterns: Sequence[re.Pattern[str]]) -> bool:
    names = (comm, os.path.basename(exe)) if exe else (comm,)
    return any(p.search(n) for p in patterns for n in names if n)


def pod_key(c: Container) -> str:
    """Containers of one pod share a sandbox: pod UID, else the parent cgroup."""
    return c.pod_uid or os.path.dirname(c.cgroup.strip("/"))


def pod_cgroup(containers: Sequence[Container]) -> str:
    """The cgroup holding all of a pod's containers (their common parent)."""
    parents = [os.path.dirname(c.cgroup.strip("/")) for c in containers]
    common = os.path.commonpath(parents) if parents and all(parents) else ""
    return common


# -- procfs reading -----------------------------------------------------------------------------

class Procfs:
    """The few procfs files this module reads; the root is passed in (`/host/proc` in a pod)."""

    def __init__(self, *, root: str = "/proc") -> None:
        self.root = root

    def tids(self, pid: int) -> list[int]:
        try:
            names = os.listdir(os.path.join(self.root, str(pid), "task"))
        except OSError as e:
            raise ContainerGone(f"pid {pid}", e.strerror or "") from None
        return sorted(int(n) for n in names if n.isdigit())

    def comm(self, pid: int, tid: int | None = None) -> str:
        path = (os.path.join(self.root, str(pid), "task", str(tid), "comm") if tid is not None
                else os.path.join(self.root, str(pid), "comm"))
        try:
            with open(path, "rb") as f:
                return parse_comm(f.read(MAX_COMM_BYTES).decode("utf-8", errors="replace"))
        except OSError as e:
            raise ContainerGone(f"pid {pid}", f"{path}: {e.strerror}") from None

    def exe(self, pid: int) -> str:
        """The executable's path; "" when it cannot be read (kernel threads, gone, no permission)."""
        try:
            return os.readlink(os.path.join(self.root, str(pid), "exe"))
        except OSError:
            return ""

    def thread_comms(self, pid: int) -> dict[int, str]:
        out: dict[int, str] = {}
        for tid in self.tids(pid):
            try:
                out[tid] = self.comm(pid, tid)
            except ContainerGone:
                continue  # the thread exited between listing and reading
        return out


# -- the actuator -------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class SandboxStatus:
    """One recognised VM sandbox after a sync."""

    pod: str
    cgroup: str
    vmm_pid: int
    vmm_comm: str
    vcpus: Mapping[int, int]  # vCPU index -> TID
    helpers: tuple[int, ...]
    plan: vm.SandboxPlan


@dataclass(frozen=True, kw_only=True)
class SyncReport:
    sandboxes: tuple[SandboxStatus, ...] = ()
    writes: int = 0  # sched_setaffinity calls made (0 when everything already was right)
    errors: tuple[str, ...] = ()  # refused writes, unreadable processes
    problems: tuple[str, ...] = ()  # what the plan could not do (named per pod)


Affinity = Callable[[int], set[int]]
SetAffinity = Callable[[int, Iterable[int]], None]


class VmSandboxes:
    """Keeps VM sandboxes' threads where the containers' cpusets say, and the vCPU mapping.

    `sync()` is what the loop calls every cycle and after moves; `vcpu_map()` is what goes into
    `CycleReport.vcpu_map`; `guest_cpuset()` is what an in-guest agent must apply.
    """

    def __init__(self, *, config: VmSection, procfs_root: str = "/proc",
                 cgroupfs: Cgroupfs | None = None, cgroup_root: str = "/sys/fs/cgroup",
                 setaffinity: SetAffinity = os.sched_setaffinity,
                 getaffinity: Affinity = os.sched_getaffinity) -> None:
        self.config = config
        self.proc = Procfs(root=procfs_root)
        self.cgroupfs = cgroupfs if cgroupfs is not None else Cgroupfs(root=cgroup_root)
        self._vcpu_re = compile_patterns(config.vcpu_patterns)
        self._vmm_re = compile_patterns(config.vmm_patterns)
        self._set, self._get = setaffinity, getaffinity
        self._mapping: dict[str, dict[str, dict[int, int]]] = {}  # pod -> container -> host -> vCPU
        self._last: tuple[SandboxStatus, ...] = ()

    # -- queries ------------------------------------------------------------------------------
    def vcpu_map(self) -> dict[str, dict[int, int]]:
        """container id -> {host cpu: vCPU} for every container pinned 1:1 (for CycleReport)."""
        return {cid: dict(m) for pods in self._mapping.values() for cid, m in pods.items()}

    def guest_cpuset(self, container_id: str) -> CpuSet:
        """The vCPU ids the in-guest agent must give the container (see docs/vm-sandboxes.md)."""
        for s in self._last:
            if container_id in s.plan.guest_cpusets:
                return s.plan.guest_cpusets[container_id]
        raise KeyError(container_id)

    def to_guest(self, container_id: str, host: CpuSet) -> CpuSet:
        """Translate a host cpuset of a pinned container into vCPU ids (VmLayoutError if unmapped)."""
        return vm.to_guest(self.vcpu_map().get(container_id, {}), host, container=container_id)

    def sandboxes(self) -> tuple[SandboxStatus, ...]:
        return self._last

    # -- the cycle ------------------------------------------------------------------------------
    def sync(self, *, containers: Sequence[Container], kubelet: KubeletState = KubeletState(),
             reserved: CpuSet = CpuSet(), online: CpuSet = CpuSet(),
             topology: Topology | None = None) -> SyncReport:
        """Recompute every sandbox's plan from the current cpusets and apply what differs."""
        if not self.config.enabled:
            return SyncReport()
        online = online or (topology.online if topology is not None else CpuSet())
        pool = vm.shared_pool(online=online, kubelet=kubelet, reserved=reserved,
                              containers=containers)
        found, writes, errors, problems = [], 0, [], []
        for pod, members in sorted(self._pods(containers).items()):
            try:
                status = self._sync_pod(pod, members, pool, topology)
            except (PerfbalanceError, OSError) as e:
                errors.append(f"pod {pod}: {e}")
                continue
            if status is None:
                continue
            found.append(status)
            problems.extend(f"pod {pod}: {p}" for p in status.plan.problems)
            n, errs = self._apply(status)
            writes += n
            errors.extend(f"pod {pod}: {e}" for e in errs)
        self._mapping = {s.pod: {c: dict(m) for c, m in s.plan.mapping.items()} for s in found}
        self._last = tuple(found)
        return SyncReport(sandboxes=self._last, writes=writes, errors=tuple(errors),
                          problems=tuple(problems))

    def sync_snapshot(self, snapshot: Snapshot, *,
                      moved: Mapping[str, CpuSet] | None = None) -> SyncReport:
        """`sync` from a Snapshot; `moved` (container id -> new cpuset) overrides the cpusets of
        containers the actuators just moved, so the pinning follows them in the same cycle."""
        moved = moved or {}
        containers = [replace(s.container, cpuset=moved[s.id]) if s.id in moved else s.container
                      for s in snapshot.containers]
        return self.sync(containers=containers, kubelet=snapshot.kubelet,
                         reserved=snapshot.reserved, topology=snapshot.topology)

    def _pods(self, containers: Sequence[Container]) -> dict[str, list[Container]]:
        pods: dict[str, list[Container]] = {}
        for c in containers:
            pods.setdefault(pod_key(c), []).append(c)
        if self.config.detect_unlabelled:
            return pods
        return {k: v for k, v in pods.items() if any(c.sandbox for c in v)}

    def _sync_pod(self, pod: str, members: list[Container], pool: CpuSet,
                  topology: Topology | None) -> SandboxStatus | None:
        cgroup = pod_cgroup(members)
        if not cgroup:
            return None  # containers at the top of the tree: no pod cgroup to search
        vmm = self.find_vmm(cgroup, scan_threads=any(c.sandbox for c in members))
        if vmm is None:
            return None
        plan = vm.plan_sandbox(containers=members, vcpus=vmm.vcpus, pool=pool,
                               previous=self._mapping.get(pod, {}),
                               system_vcpus=self.config.system_vcpus,
                               pin_exclusive=self.config.pin_exclusive, topology=topology)
        return SandboxStatus(pod=pod, cgroup=cgroup, vmm_pid=vmm.pid, vmm_comm=vmm.comm,
                             vcpus=vmm.vcpus, helpers=vmm.helpers, plan=plan)

    # -- finding the VMM ------------------------------------------------------------------------
    def pod_pids(self, cgroup: str) -> list[int]:
        """Processes anywhere in the pod's cgroup subtree (bounded depth)."""
        pids: set[int] = set()
        for rel in self.cgroupfs.walk(cgroup, self._hierarchy(cgroup),
                                      max_depth=self.config.max_cgroup_depth):
            try:
                pids.update(self.cgroupfs.pids(rel))
            except ContainerGone:
                continue
        return sorted(pids)

    def _hierarchy(self, cgroup: str) -> str | None:
        """v2 when the pod is there (v2, systemd hybrid), else v1 cpuset (cgroupfs driver on hybrid)."""
        if self.cgroupfs.has(None) and self.cgroupfs.exists(cgroup, None):
            return None
        return "cpuset"

    def find_vmm(self, cgroup: str, *, scan_threads: bool = True) -> VmmThreads | None:
        """The VMM among the pod's processes: one named like a VMM (comm or exe), else (when
        `scan_threads`) the one with the most vCPU-named threads. None when there is none."""
        pids = self.pod_pids(cgroup)
        comms = {p: c for p in pids if (c := self._comm(p)) is not None}
        named = [p for p in pids if p in comms and is_vmm(comms[p], self.proc.exe(p), self._vmm_re)]
        others = [p for p in pids if p not in named] if scan_threads else []
        best: VmmThreads | None = None
        for pid in named + others:
            if comms.get(pid, "").startswith(VHOST_PREFIX):
                continue
            threads = self._threads(pid, comms)
            if threads is not None and threads.vcpus and (
                    best is None or len(threads.vcpus) > len(best.vcpus)):
                best = threads
        return best

    def _threads(self, pid: int, comms: Mapping[int, str]) -> VmmThreads | None:
        try:
            names = self.proc.thread_comms(pid)
        except ContainerGone:
            return None
        vhost = {}
        for other, comm in comms.items():
            if comm == f"{VHOST_PREFIX}{pid}" and other != pid:
                try:
                    vhost.update(self.proc.thread_comms(other))
                except ContainerGone:
                    continue
        return classify(pid, names, self._vcpu_re, vhost=vhost)

    def _comm(self, pid: int) -> str | None:
        try:
            return self.proc.comm(pid)
        except ContainerGone:
            return None

    # -- applying -------------------------------------------------------------------------------
    def _apply(self, s: SandboxStatus) -> tuple[int, list[str]]:
        wanted: dict[int, CpuSet] = {tid: s.plan.vcpu_affinity[v] for v, tid in s.vcpus.items()}
        wanted.update({tid: s.plan.helper_affinity for tid in s.helpers})
        writes, errors = 0, []
        for tid, cpus in sorted(wanted.items()):
            if not cpus:
                continue
            try:
                if self._get(tid) == set(cpus):
                    continue
                writes += 1
                self._set(tid, set(cpus))
                got = self._get(tid)
            except ProcessLookupError:
                continue  # the thread exited; the next sync sees the new thread list
            except OSError as e:
                errors.append(_affinity_error(tid, cpus, e))
                continue
            if got != set(cpus):
                errors.append(f"tid {tid}: affinity {cpus} read back as {CpuSet(got)} "
                              "(its cgroup's cpuset does not allow all of them)")
        return writes, errors


def _affinity_error(tid: int, cpus: CpuSet, e: OSError) -> str:
    name = errno.errorcode.get(e.errno or 0, str(e.errno))
    hint = {errno.EINVAL: ": none of them is allowed by its cgroup's cpuset or online",
            errno.EPERM: ": not permitted (the agent needs CAP_SYS_NICE and hostPID)"}
    return f"tid {tid}: sched_setaffinity {cpus} refused ({name}){hint.get(e.errno or 0, '')}"
