"""Find the node's containers in the cgroup tree and say what each one is entitled to.

The agent cannot ask the container runtime (no CRI client, no NRI stub in Python), so it reads
what the kubelet and runtimes leave in cgroupfs: the path names a pod (UID) and a container (id),
the parent slice names the QoS class, and cpu.shares/cpu.weight, the CFS quota and the memory
limit encode the container's requests and limits. Non-Kubernetes workloads (demos, plain
docker) are picked up by cgroup path globs from the config. See docs/containers.md for the
naming table and the estimation heuristics.

A scan reads one hierarchy (the cpuset one, since that is where the actuator writes); a cgroup
that vanishes mid-scan is skipped (ContainerGone), never fatal. Names and ids taken from paths
are validated: a hostile directory name is skipped with a warning.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from perfbalance import cgroupfs as cg
from perfbalance.cgroupfs import Cgroupfs, CgroupfsError, check_glob
from perfbalance import mcpu
from perfbalance.cpuset import CpuSet
from perfbalance.errors import ContainerGone, FeatureUnavailable, ParseError
from perfbalance.model import Container, KubeletState
from perfbalance.names import PATH_ELEMENT, name_problem

log = logging.getLogger(__name__)

KUBEPODS = ("kubepods.slice", "kubepods")
# A pod UID is a UUID, except for static pods: the kubelet names those by a 32-hex-digit hash of
# the manifest (pkg/kubelet/config: types.UID(hex of md5)).
_UID = (r"(?:[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
        r"|[0-9a-fA-F]{32})")
_ID = r"[0-9a-zA-Z][0-9a-zA-Z_.-]{0,127}"
SYSTEMD_POD = re.compile(rf"^kubepods(?:-(burstable|besteffort))?-pod({_UID})\.slice$")
CGROUPFS_POD = re.compile(rf"^pod({_UID})$")
QOS_DIRS = {"kubepods-burstable.slice": "burstable", "kubepods-besteffort.slice": "besteffort",
            "burstable": "burstable", "besteffort": "besteffort"}
# (regex on the container cgroup's name, runtime); crio-conmon-* and sandboxes are not matched.
CONTAINER_NAMES = (
    (re.compile(rf"^cri-containerd-({_ID})\.scope$"), "containerd"),
    (re.compile(r"crio-conmon-.*"), ""),
    (re.compile(rf"^crio-({_ID})\.scope$"), "crio"),
    (re.compile(rf"^docker-({_ID})\.scope$"), "docker"),
    (re.compile(r"^([0-9a-f]{64})$"), "containerd"),  # cgroupfs driver: the bare id
)
DEFAULT_V1_SHARES = 1024
DEFAULT_V2_WEIGHT = 100
MIN_SHARES = 2


def check_name(name: str, *, what: str = "cgroup name") -> str:
    """A single path element from the cgroup tree, safe to log, label and compare."""
    problem = name_problem(name, PATH_ELEMENT)
    if problem:
        raise ParseError(what, name[:80], problem.removeprefix(f"{name!r} "))
    return name


def scan_controller(cgfs: Cgroupfs) -> str | None:
    """The hierarchy a scan walks: cpuset's (where the actuator writes), else v2, else cpu."""
    if cgfs.has("cpuset"):
        return "cpuset"
    return None if cgfs.has(None) else "cpu"


# ---------------------------------------------------------------------------------------------
# where containers are
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Found:
    """A container cgroup recognised by its path, before its files are read."""

    rel: str
    id: str
    name: str = ""
    runtime: str = "generic"
    pod_uid: str = ""
    qos: str = "unknown"


def parse_pod_dir(name: str) -> tuple[str, str | None] | None:
    """A pod cgroup name -> (pod uid with dashes, QoS from the name or None); else None."""
    m = SYSTEMD_POD.fullmatch(name)
    if m:
        return m.group(2).replace("_", "-").lower(), m.group(1)
    m = CGROUPFS_POD.fullmatch(name)
    if m:
        return m.group(1).replace("_", "-").lower(), None
    return None


def parse_container_dir(name: str) -> tuple[str, str] | None:
    """A container cgroup name -> (container id, runtime); None for conmon and anything else."""
    for pattern, runtime in CONTAINER_NAMES:
        m = pattern.fullmatch(name)
        if m:
            return (m.group(1), runtime) if runtime else None
    return None


def _kubepods_roots(cgfs: Cgroupfs, ctl: str | None) -> list[str]:
    """kubepods.slice / kubepods at the root or one level down (kubelet --cgroup-root)."""
    out = [k for k in KUBEPODS if cgfs.exists(k, ctl)]
    if out:
        return out
    for top in _children(cgfs, "", ctl):
        out += [f"{top}/{k}" for k in KUBEPODS if cgfs.exists(f"{top}/{k}", ctl)]
    return out


def _children(cgfs: Cgroupfs, rel: str, ctl: str | None) -> list[str]:
    try:
        kids = cgfs.children(rel, ctl)
    except ContainerGone:
        return []
    out = []
    for k in kids:
        try:
            out.append(check_name(k))
        except ParseError as e:
            log.warning("skipping cgroup under %s/: %s", rel or "<root>", e)
    return out


def _pods(cgfs: Cgroupfs, kubepods: str, ctl: str | None) -> Iterator[tuple[str, str, str]]:
    """(pod cgroup rel, pod uid, qos) under one kubepods root."""
    for name in _children(cgfs, kubepods, ctl):
        if name in QOS_DIRS:
            for pod in _children(cgfs, f"{kubepods}/{name}", ctl):
                parsed = parse_pod_dir(pod)
                if parsed:
                    yield f"{kubepods}/{name}/{pod}", parsed[0], QOS_DIRS[name]
            continue
        parsed = parse_pod_dir(name)
        if parsed:  # directly under kubepods: Guaranteed pods have no QoS level
            yield f"{kubepods}/{name}", parsed[0], "guaranteed"


def find_kubernetes(cgfs: Cgroupfs, ctl: str | None) -> list[Found]:
    out = []
    for root in _kubepods_roots(cgfs, ctl):
        for pod_rel, uid, qos in _pods(cgfs, root, ctl):
            for name in _children(cgfs, pod_rel, ctl):
                parsed = parse_container_dir(name)
                if parsed:
                    out.append(Found(rel=f"{pod_rel}/{name}", id=parsed[0], runtime=parsed[1],
                                     pod_uid=uid, qos=qos))
    return out


def _glob(cgfs: Cgroupfs, ctl: str | None, base: str, parts: list[str]) -> Iterator[str]:
    if not parts:
        yield base
        return
    for name in _children(cgfs, base, ctl):
        if fnmatch.fnmatchcase(name, parts[0]):
            yield from _glob(cgfs, ctl, f"{base}/{name}".strip("/"), parts[1:])


def find_globbed(cgfs: Cgroupfs, ctl: str | None, globs: Sequence[str]) -> list[Found]:
    out = []
    for pattern in globs:
        for rel in _glob(cgfs, ctl, "", check_glob(pattern)):
            out.append(Found(rel=rel, id=rel.replace("/", ":"), name=rel.rsplit("/", 1)[-1]))
    return out


# ---------------------------------------------------------------------------------------------
# what each container is entitled to (estimated from its cgroup files)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class CpuKnobs:
    """The raw CPU controls of a cgroup, normalised to v1 units."""

    shares: int | None  # v1 cpu.shares, or v2 cpu.weight mapped back; None when unreadable
    default_shares: bool  # the runtime default (v1 1024 / v2 weight 100): no request was set
    quota_usec: int | None
    period_usec: int


def estimate_mcpu(knobs: CpuKnobs, qos: str) -> tuple[int, int | None]:
    """(request, limit) in milli-CPU from shares and quota, trusting the QoS class first.

    cri-resource-manager's "fix broken requests/limits estimation heuristics": shares alone
    cannot tell "no request" from "2m", and quota alone cannot tell a request; the QoS class can.
    """
    limit = None
    if knobs.quota_usec is not None and knobs.period_usec > 0:
        limit = -(-knobs.quota_usec * mcpu.MILLI // knobs.period_usec)
    if qos == "besteffort":
        return 0, None
    from_shares = _request_from_shares(knobs.shares)
    if qos == "guaranteed":
        request = limit if limit is not None else from_shares
        return request, limit if limit is not None else None
    if qos == "unknown" and knobs.default_shares:
        return 0, limit
    return from_shares, limit


def _request_from_shares(shares: int | None) -> int:
    """Kubernetes sets shares = request * 1024 / 1000 (min 2): invert it; 2 means none."""
    if shares is None or shares <= MIN_SHARES:
        return 0
    return (shares * mcpu.MILLI + 512) // 1024


def shares_from_weight_mid(weight: int) -> int:
    """v2 cpu.weight -> the middle of the shares range runc maps to it (less bias than the low end)."""
    return MIN_SHARES + ((2 * weight - 1) * 262142) // (2 * 9999)


def _opt(cgfs: Cgroupfs, rel: str, ctl: str | None, name: str) -> str | None:
    """A file from a hierarchy other than the scanned one: absent anywhere -> None."""
    if not cgfs.has(ctl):
        return None
    try:
        return cgfs.try_read(rel, ctl, name)
    except (ContainerGone, CgroupfsError, FeatureUnavailable):
        return None


def read_cpu_knobs(cgfs: Cgroupfs, rel: str) -> CpuKnobs:
    if cgfs.has("cpu") and cgfs.version("cpu") == 1:
        shares_t = _opt(cgfs, rel, "cpu", "cpu.shares")
        quota_t = _opt(cgfs, rel, "cpu", "cpu.cfs_quota_us")
        period_t = _opt(cgfs, rel, "cpu", "cpu.cfs_period_us")
        shares = None if shares_t is None else cg.parse_int_text(shares_t, source=f"{rel}/cpu.shares")
        limit = cg.cfs_limit(None if quota_t is None else cg.parse_int_text(quota_t, source=f"{rel}/cpu.cfs_quota_us"),
                             100000 if period_t is None else cg.parse_int_text(period_t, source=f"{rel}/cpu.cfs_period_us"))
        return CpuKnobs(shares=shares, default_shares=shares in (None, DEFAULT_V1_SHARES),
                        quota_usec=limit.quota_usec, period_usec=limit.period_usec)
    weight_t = _opt(cgfs, rel, None, "cpu.weight")
    max_t = _opt(cgfs, rel, None, "cpu.max")
    weight = None if weight_t is None else cg.parse_int_text(weight_t, source=f"{rel}/cpu.weight")
    cmax = cg.parse_cpu_max(max_t, source=f"{rel}/cpu.max") if max_t else cg.CpuMax(quota_usec=None, period_usec=100000)
    return CpuKnobs(shares=None if weight is None else shares_from_weight_mid(weight),
                    default_shares=weight in (None, DEFAULT_V2_WEIGHT),
                    quota_usec=cmax.quota_usec, period_usec=cmax.period_usec)


def read_memory(cgfs: Cgroupfs, rel: str) -> tuple[int | None, int]:
    """(memory limit or None, usage) from v1 memory.* or v2 memory.max/current."""
    if cgfs.has("memory") and cgfs.version("memory") == 1:
        lim, cur = (_opt(cgfs, rel, "memory", "memory.limit_in_bytes"),
                    _opt(cgfs, rel, "memory", "memory.usage_in_bytes"))
    else:
        lim, cur = _opt(cgfs, rel, None, "memory.max"), _opt(cgfs, rel, None, "memory.current")
    return (None if lim is None else cg.parse_memory_limit(lim, source=f"{rel}/memory limit"),
            0 if cur is None else cg.parse_memory_usage(cur, source=f"{rel}/memory usage"))


def read_cpuset(cgfs: Cgroupfs, rel: str, ctl: str | None) -> tuple[CpuSet, CpuSet]:
    """(cpus, mems) in force: the effective sets when the kernel exposes them."""
    if not cgfs.has("cpuset"):
        return CpuSet(), CpuSet()
    v2 = cgfs.version("cpuset") == 2
    out = []
    for kind in ("cpus", "mems"):
        names = (f"cpuset.{kind}.effective", f"cpuset.{kind}") if v2 else \
            (f"cpuset.effective_{kind}", f"cpuset.{kind}")
        value = CpuSet()
        for n in names:
            text = cgfs.try_read(rel, "cpuset", n)
            if text is not None and text.strip():
                value = CpuSet.parse(text, source=f"{cgfs.dir(rel, 'cpuset')}/{n}")
                break
        out.append(value)
    return out[0], out[1]


# ---------------------------------------------------------------------------------------------
# kubelet matching and assembly
# ---------------------------------------------------------------------------------------------

def match_kubelet(kubelet: KubeletState, found: Found, cpuset: CpuSet) -> tuple[str, bool]:
    """(container name, exclusive) from the CPU manager state.

    cgroups do not carry the container name; the kubelet state names containers with dedicated
    CPUs. Among the pod's entries, the one whose CPUs equal this container's cpuset is it (the
    sets are disjoint, so at most one can). V1 checkpoints key by container id instead.
    """
    if ("", found.id) in kubelet.exclusive:
        return "", True
    if not found.pod_uid:
        return "", False
    hits = [name for (uid, name), cpus in kubelet.exclusive.items()
            if uid == found.pod_uid and cpus == cpuset]
    return (hits[0], True) if len(hits) == 1 else ("", False)


def build_container(cgfs: Cgroupfs, found: Found, kubelet: KubeletState, ctl: str | None) -> Container:
    cpus, mems = read_cpuset(cgfs, found.rel, ctl)
    request, limit = estimate_mcpu(read_cpu_knobs(cgfs, found.rel), found.qos)
    mem_limit, mem_used = read_memory(cgfs, found.rel)
    name, exclusive = match_kubelet(kubelet, found, cpus)
    return Container(id=found.id, name=name or found.name, pod_uid=found.pod_uid, cgroup=found.rel,
                     qos=found.qos, runtime=found.runtime, cpuset=cpus, mems=mems,
                     request_mcpu=request, limit_mcpu=limit, memory_limit_bytes=mem_limit,
                     memory_bytes=mem_used, exclusive=exclusive)


def is_pause(cgfs: Cgroupfs, rel: str, procfs_root: str) -> bool:
    """A pod sandbox: its only process is the `pause` binary (containerd keeps it a cgroup)."""
    try:
        pids = cgfs.pids(rel, recursive=True)
    except (ContainerGone, CgroupfsError):
        return False
    if len(pids) != 1:
        return False
    try:
        with open(os.path.join(procfs_root, str(pids[0]), "comm"), "rb") as f:
            return f.read(64).strip() == b"pause"
    except OSError:
        return False


def discover(cgfs: Cgroupfs, *, kubernetes: bool, globs: Sequence[str], kubelet: KubeletState,
             procfs_root: str | None = None, only: Collection[str] | None = None) -> list[Container]:
    """Every container on the node, Kubernetes ones first, then globbed ones (no duplicates).

    `procfs_root`, when given, lets discovery drop pod sandboxes (`pause`). Bad globs raise
    ParseError (a config error); everything per container is skipped with a log line. `only`:
    container ids to build; the others are found by their paths but none of their files is read.
    """
    ctl = scan_controller(cgfs)
    found = (find_kubernetes(cgfs, ctl) if kubernetes else []) + find_globbed(cgfs, ctl, globs)
    out: list[Container] = []
    seen: set[str] = set()
    for f in found:
        if f.rel in seen or f.id in seen:
            continue
        seen.update((f.rel, f.id))
        if only is not None and f.id not in only:
            continue
        c = _one(cgfs, f, kubelet, ctl, procfs_root)
        if c is not None:
            out.append(c)
    return out


def _one(cgfs: Cgroupfs, f: Found, kubelet: KubeletState, ctl: str | None,
         procfs_root: str | None) -> Container | None:
    try:
        if procfs_root is not None and f.pod_uid and is_pause(cgfs, f.rel, procfs_root):
            return None
        return build_container(cgfs, f, kubelet, ctl)
    except ContainerGone:
        log.debug("container cgroup %s vanished during the scan", f.rel)
    except (ParseError, CgroupfsError, FeatureUnavailable) as e:
        log.warning("skipping container cgroup %s: %s", f.rel, e)
    return None
