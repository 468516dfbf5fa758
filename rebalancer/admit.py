"""Where a new container goes at creation (NRI CreateContainer), before any sample of it exists.

The same constraints as moves (rebalancer.constraints): never a CPU the kubelet dedicated to a
container (static CPU manager), never a reserved CPU, never an exclusive container's cpuset. A
container the kubelet gave dedicated CPUs keeps the kubelet's choice. Without a hint the
container gets the whole shared pool (the runtime's default, minus what is not ours to give);
the planner refines it once samples exist. Two annotations are hints before data exists:

* `perfbalance.io/avx512: "true"` - expected heavy 512-bit use: whole cores (Intel's license
  levels lower the frequency per core), preferring cores no latency-sensitive container uses;
* `perfbalance.io/latency-sensitive: "true"`, or a run-queue latency target
  (`perfbalance.io/runqueue-p99-target`, rebalancer.health) - kept off the cpusets of
  AVX-512-annotated containers while the pool allows.

Pure: a function of the snapshot, the new container and the cpusets of running containers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from perfbalance import mcpu
from perfbalance.cpuset import CpuSet
from perfbalance.model import Snapshot
from rebalancer.allocator import allocate
from rebalancer.constraints import shareable
from rebalancer.health import TARGET_ANNOTATION
from rebalancer.topoindex import TopoIndex

AVX_ANNOTATION = "perfbalance.io/avx512"
LATENCY_ANNOTATION = "perfbalance.io/latency-sensitive"


@dataclass(frozen=True, kw_only=True)
class NewContainer:
    pod_uid: str
    name: str
    request_mcpu: int = 0
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Running:
    """A running container as the runtime reports it (cpuset and annotations)."""
    cpus: CpuSet
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Admission:
    cpus: CpuSet | None  # None: leave the runtime's (the kubelet's) choice
    mems: CpuSet | None
    reason: str


def _flag(annotations: Mapping[str, str], key: str) -> bool:
    return annotations.get(key, "").strip().lower() in ("true", "1", "yes")


def _latency(annotations: Mapping[str, str]) -> bool:
    return _flag(annotations, LATENCY_ANNOTATION) or bool(annotations.get(TARGET_ANNOTATION, "").strip())


def _avx(annotations: Mapping[str, str]) -> bool:
    return _flag(annotations, AVX_ANNOTATION)


def _cpus_of(running: Mapping[str, Running], which: Callable[[Mapping[str, str]], bool]) -> frozenset[int]:
    out: set[int] = set()
    for r in running.values():
        if which(r.annotations):
            out |= r.cpus.ids
    return frozenset(out)


def admit(snapshot: Snapshot, new: NewContainer, running: Mapping[str, Running]) -> Admission:
    if (new.pod_uid, new.name) in snapshot.kubelet.exclusive:
        return Admission(cpus=None, mems=None, reason="the kubelet dedicated CPUs to it")
    pool = shareable(snapshot)
    if not pool:
        return Admission(cpus=None, mems=None, reason="no shareable CPU left")
    idx = TopoIndex.build(snapshot.topology)
    cpus, reason = pool, "shared pool"
    if _avx(new.annotations):
        count = max(1, mcpu.to_cpus(new.request_mcpu))
        away = pool - _cpus_of(running, _latency)
        got = allocate(idx, away, count, whole_cores=True) or allocate(idx, pool, count, whole_cores=True)
        if got:
            cpus = got
            reason = "AVX-512 annotation: whole cores" + (" away from latency-sensitive work" if got <= away else "")
    elif _latency(new.annotations):
        away = pool - _cpus_of(running, _avx)
        if away:
            cpus, reason = away, "latency-sensitive annotation: off AVX-512 cores"
    return Admission(cpus=CpuSet(cpus), mems=CpuSet(idx.nodes_of(cpus)), reason=reason)
