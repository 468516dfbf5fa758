"""What perfbalance keeps of NRI's pods and containers, converted purely from the protobufs.

Frozen values so the agent thread can read the plugin's view while the connection thread
replaces it. Only what discovery, placement and the metadata need is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

STATES = {0: "unknown", 1: "created", 2: "paused", 3: "running", 4: "stopped"}


@dataclass(frozen=True, kw_only=True, slots=True)
class Pod:
    id: str
    name: str
    uid: str
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    runtime_handler: str = ""
    cgroup_parent: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Ctr:
    id: str
    pod_id: str
    name: str
    state: str = "unknown"
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    cgroups_path: str = ""
    pid: int = 0
    cpus: str = ""
    mems: str = ""
    cpu_shares: int = 0  # what the kubelet derived from the CPU request (1024 per CPU)
    cpu_quota: int = 0  # CFS quota and period from the CPU limit (0: none)
    cpu_period: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class Placement:
    """What perfbalance sets for a container through the runtime; empty fields are left alone."""
    cpus: str = ""
    mems: str = ""
    rdt_class: str = ""
    blockio_class: str = ""  # class names the operator listed as known to the runtime (runtime.nri_*_classes)


@dataclass(frozen=True, kw_only=True, slots=True)
class View:
    pods: Mapping[str, Pod] = field(default_factory=dict)
    containers: Mapping[str, Ctr] = field(default_factory=dict)
    synchronized: bool = False


def pod_from_pb(p: Any) -> Pod:
    return Pod(id=p.id, name=p.name, uid=p.uid, namespace=p.namespace,
               labels=MappingProxyType(dict(p.labels)), annotations=MappingProxyType(dict(p.annotations)),
               runtime_handler=p.runtime_handler, cgroup_parent=p.linux.cgroup_parent)


def ctr_from_pb(c: Any) -> Ctr:
    cpu = c.linux.resources.cpu
    return Ctr(id=c.id, pod_id=c.pod_sandbox_id, name=c.name, state=STATES.get(c.state, "unknown"),
               labels=MappingProxyType(dict(c.labels)), annotations=MappingProxyType(dict(c.annotations)),
               cgroups_path=c.linux.cgroups_path, pid=c.pid, cpus=cpu.cpus, mems=cpu.mems,
               cpu_shares=cpu.shares.value, cpu_quota=max(0, cpu.quota.value), cpu_period=cpu.period.value)


def fill_resources(res: Any, placement: Placement) -> None:
    """Set a LinuxResources protobuf from a placement (unset fields stay unset: no change)."""
    if placement.cpus:
        res.cpu.cpus = placement.cpus
    if placement.mems:
        res.cpu.mems = placement.mems
    if placement.rdt_class:
        res.rdt_class.value = placement.rdt_class
    if placement.blockio_class:
        res.blockio_class.value = placement.blockio_class
