"""VM sandboxes, the finding part: a pod's VMM, its threads sorted into vCPUs and helpers.

In a Kata or KubeVirt pod the kubelet's cpusets land on cgroups whose work really runs on the
VMM's vCPU threads; left alone those threads float over every CPU of the host, including CPUs the
kubelet dedicated to someone else. Each cycle, before the snapshot, `VmmDiscovery.find(...)`:

1. groups containers by pod and finds the VMM process among the processes in the pod's cgroup
   subtree (by comm or executable name, else by vCPU-named threads);
2. classifies its threads from `<procfs>/<pid>/task/<tid>/comm`: vCPU threads (QEMU `CPU n/KVM`,
   Cloud Hypervisor `vcpun`, Firecracker `fc_vcpu n`, configurable) and helpers (main loop, I/O
   threads, vhost workers; also kernel `vhost-<vmm pid>` workers found in the pod's cgroups);
3. reads the hugepages the pod holds per host node (agent/discover/hugepages.py);
4. notes which container's cgroup the VMM is in, that cgroup's effective cpuset (the kernel
   keeps every VMM thread within it) and which containers have host processes at all (the
   planner tells Kata's pod sandbox container from KubeVirt's compute container with it).

The result is `Snapshot.vmms`. Where the threads must run is the planner's decision
(`rebalancer.vm.plan_vcpus` -> `Plan.vcpu_pinning`); `agent/act/vcpu.py` applies it. A pod's
trouble never raises: it comes back as one line in `Found.errors`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.config import VmSection
from agent.discover import hugepages
from agent.discover.containers import read_cpuset
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.cpuset import CpuSet
from perfbalance.errors import ContainerGone, ParseError, PerfbalanceError
from perfbalance.model import Container
from perfbalance.sandbox import VmmProcess

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


def _norm(rel: str) -> str:
    return rel.strip("/")


def container_at(containers: Sequence[Container], rel: str) -> str:
    """The id of the container whose cgroup is `rel` or holds it, "" for none."""
    rel = _norm(rel)
    for c in containers:
        own = _norm(c.cgroup)
        if own and (rel == own or rel.startswith(own + "/")):
            return c.id
    return ""


def busy_containers(containers: Sequence[Container], populated: set[str]) -> tuple[str, ...]:
    """Ids of the containers whose cgroup subtree holds one of the `populated` cgroups."""
    return tuple(sorted({cid for rel in populated if (cid := container_at(containers, rel))}))


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


# -- discovery ----------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Found:
    """The VMMs of one discovery pass and what could not be read (named per pod)."""

    vmms: tuple[VmmProcess, ...] = ()
    errors: tuple[str, ...] = ()


class VmmDiscovery:
    """Finds each VM-sandboxed pod's VMM, its threads and the pod's hugepages; decides nothing.

    `find()` runs once per cycle, before the snapshot: its `VmmProcess`es go into
    `Snapshot.vmms`, where the planner (`rebalancer.vm.plan_vcpus`) reads them."""

    def __init__(self, *, config: VmSection, procfs_root: str = "/proc",
                 cgroupfs: Cgroupfs | None = None, cgroup_root: str = "/sys/fs/cgroup",
                 sysfs_root: str = "/sys") -> None:
        self.proc = Procfs(root=procfs_root)
        self.cgroupfs = cgroupfs if cgroupfs is not None else Cgroupfs(root=cgroup_root)
        self.sysfs_root = sysfs_root
        self.config = config

    @property
    def config(self) -> VmSection:
        return self._config

    @config.setter
    def config(self, config: VmSection) -> None:
        """A new `vm:` section takes effect at once, its patterns included."""
        self._config = config
        self._vcpu_re = compile_patterns(config.vcpu_patterns)
        self._vmm_re = compile_patterns(config.vmm_patterns)

    def find(self, containers: Sequence[Container]) -> Found:
        """Every pod's VMM among `containers`' pods (only labelled pods unless
        `detect_unlabelled`); pods without one are left out."""
        if not self.config.enabled:
            return Found()
        sizes = hugepages.page_sizes(self.sysfs_root)
        found, errors = [], []
        for pod, members in sorted(self._pods(containers).items()):
            try:
                vmm = self._find_pod(pod, members, sizes, errors)
            except (PerfbalanceError, OSError) as e:
                errors.append(f"pod {pod}: {e}")
                continue
            if vmm is not None:
                found.append(vmm)
        return Found(vmms=tuple(found), errors=tuple(errors))

    def _pods(self, containers: Sequence[Container]) -> dict[str, list[Container]]:
        pods: dict[str, list[Container]] = {}
        for c in containers:
            pods.setdefault(c.pod_key, []).append(c)
        if self.config.detect_unlabelled:
            return pods
        return {k: v for k, v in pods.items() if any(c.sandbox for c in v)}

    def _find_pod(self, pod: str, members: list[Container], sizes: tuple[int, ...],
                  errors: list[str]) -> VmmProcess | None:
        cgroup = pod_cgroup(members)
        if not cgroup:
            return None  # containers at the top of the tree: no pod cgroup to search
        where = self.pid_cgroups(cgroup)
        threads = self._pick_vmm(sorted(where), scan_threads=any(c.sandbox for c in members))
        if threads is None:
            return None
        home = where.get(threads.pid, "")
        try:
            held = hugepages.pod_hugepages(self.cgroupfs, cgroup, sizes)
        except ParseError as e:
            errors.append(f"pod {pod}: hugepages unknown: {e}")
            held = ()
        return VmmProcess(pod=pod, cgroup=cgroup, pid=threads.pid, comm=threads.comm,
                          vcpus=threads.vcpus, helpers=threads.helpers, hugepages=held,
                          container=container_at(members, home), allowed=self._allowed(pod, home, errors),
                          busy=busy_containers(members, set(where.values())))

    def _allowed(self, pod: str, rel: str, errors: list[str]) -> CpuSet:
        """The effective cpuset of the VMM's cgroup (empty when it cannot be read: no bound)."""
        try:
            return read_cpuset(self.cgroupfs, rel, None)[0]
        except (PerfbalanceError, OSError) as e:
            errors.append(f"pod {pod}: cpuset of the VMM's cgroup {rel} unknown: {e}")
            return CpuSet()

    # -- finding the VMM ------------------------------------------------------------------------
    def pod_pids(self, cgroup: str) -> list[int]:
        """Processes anywhere in the pod's cgroup subtree (bounded depth)."""
        return sorted(self.pid_cgroups(cgroup))

    def pid_cgroups(self, cgroup: str) -> dict[int, str]:
        """pid -> the cgroup it is in, for every process of the pod's subtree (bounded depth)."""
        where: dict[int, str] = {}
        for rel in self.cgroupfs.walk(cgroup, self._hierarchy(cgroup),
                                      max_depth=self.config.max_cgroup_depth):
            try:
                where.update(dict.fromkeys(self.cgroupfs.pids(rel), rel))
            except ContainerGone:
                continue
        return where

    def _hierarchy(self, cgroup: str) -> str | None:
        """v2 when the pod is there (v2, systemd hybrid), else v1 cpuset (cgroupfs driver on hybrid)."""
        if self.cgroupfs.has(None) and self.cgroupfs.exists(cgroup, None):
            return None
        return "cpuset"

    def find_vmm(self, cgroup: str, *, scan_threads: bool = True) -> VmmThreads | None:
        """The VMM among the pod's processes: one named like a VMM (comm or exe), else (when
        `scan_threads`) the one with the most vCPU-named threads. None when there is none."""
        return self._pick_vmm(self.pod_pids(cgroup), scan_threads=scan_threads)

    def _pick_vmm(self, pids: list[int], *, scan_threads: bool) -> VmmThreads | None:
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
