"""Containers, snapshots and plans: the values that flow collectors -> planner -> actuators.

A Snapshot is one timestamped sample window: what every collector saw, for every container,
plus what the node offers and what the kubelet owns. A Plan is the planner's answer. Both have a
documented JSON form (docs/snapshot-format.md) so that `perfbalance run --json` output can be
saved and replayed with `perfbalance plan`.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from perfbalance import jsonfields as jf
from perfbalance.cpuset import CpuSet
from perfbalance.errors import ParseError
from perfbalance.sandbox import VcpuPinning, VmmProcess
from perfbalance.topology import Topology

QOS_CLASSES = ("guaranteed", "burstable", "besteffort", "unknown")


@dataclass(frozen=True, kw_only=True)
class Container:
    """A container as discovered from cgroups (and the kubelet state where there is one)."""

    id: str
    name: str = ""
    namespace: str = ""
    pod: str = ""
    pod_uid: str = ""
    cgroup: str  # path relative to the cgroup root, e.g. "kubepods/burstable/pod<uid>/<id>"
    qos: str = "unknown"
    runtime: str = "generic"  # containerd | crio | docker | generic
    cpuset: CpuSet = field(default_factory=CpuSet)
    mems: CpuSet = field(default_factory=CpuSet)
    request_mcpu: int = 0
    limit_mcpu: int | None = None  # None: no CFS quota
    memory_limit_bytes: int | None = None
    memory_bytes: int = 0  # resident (cgroup memory usage), for NUMA migration cost
    exclusive: bool = False  # the kubelet's static policy gave it dedicated CPUs
    rdt_class: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)  # the pod's labels (affinity selectors)
    sandbox: str = ""  # "kata"/"kubevirt" when the workload runs in a VM, else ""

    def __post_init__(self) -> None:
        if self.qos not in QOS_CLASSES:
            raise ParseError("container qos", self.qos, f"must be one of {QOS_CLASSES}")

    @property
    def pod_key(self) -> str:
        """Containers of one pod share a sandbox: the pod UID, else the parent cgroup."""
        return self.pod_uid or posixpath.dirname(self.cgroup.strip("/"))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "name": self.name, "namespace": self.namespace, "pod": self.pod,
            "pod_uid": self.pod_uid, "cgroup": self.cgroup, "qos": self.qos,
            "runtime": self.runtime, "cpuset": str(self.cpuset), "mems": str(self.mems),
            "request_mcpu": self.request_mcpu, "limit_mcpu": self.limit_mcpu,
            "memory_limit_bytes": self.memory_limit_bytes, "memory_bytes": self.memory_bytes,
            "exclusive": self.exclusive, "rdt_class": self.rdt_class,
            "annotations": dict(self.annotations), "sandbox": self.sandbox,
            **({"labels": dict(self.labels)} if self.labels else {}),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, at: jf.At = jf.At(path="container")) -> Container:
        def s(key: str, default: str = "") -> str:
            return jf.text(d.get(key, default), at.key(key))

        def opt_int(key: str) -> int | None:
            v = d.get(key)
            return None if v is None else jf.integer(v, at.key(key))

        qos = s("qos", "unknown")
        if qos not in QOS_CLASSES:
            raise at.key("qos").error(qos, f"must be one of {QOS_CLASSES}")
        return cls(
            id=_req_str(d, "id", at), name=s("name"), namespace=s("namespace"), pod=s("pod"),
            pod_uid=s("pod_uid"), cgroup=_req_str(d, "cgroup", at), qos=qos,
            runtime=s("runtime", "generic"),
            cpuset=jf.cpus(d.get("cpuset", ""), at.key("cpuset")),
            mems=jf.cpus(d.get("mems", ""), at.key("mems")),
            request_mcpu=jf.integer(d.get("request_mcpu", 0), at.key("request_mcpu")),
            limit_mcpu=opt_int("limit_mcpu"), memory_limit_bytes=opt_int("memory_limit_bytes"),
            memory_bytes=jf.integer(d.get("memory_bytes", 0), at.key("memory_bytes")),
            exclusive=bool(d.get("exclusive", False)), rdt_class=s("rdt_class"),
            annotations=jf.strings(d.get("annotations", {}), at.key("annotations")),
            labels=jf.strings(d.get("labels", {}), at.key("labels")), sandbox=s("sandbox"),
        )


@dataclass(frozen=True, kw_only=True)
class KubeletState:
    """What the kubelet's CPU manager owns (read from cpu_manager_state; never written)."""

    policy: str = "none"
    default_cpuset: CpuSet = field(default_factory=CpuSet)
    # (pod uid, container name) -> CPUs dedicated to that container
    exclusive: Mapping[tuple[str, str], CpuSet] = field(default_factory=dict)

    def dedicated(self) -> CpuSet:
        out = CpuSet()
        for cpus in self.exclusive.values():
            out = out | cpus
        return out

    def dedicated_to_others(self, pod_uid: str, name: str) -> CpuSet:
        out = CpuSet()
        for key, cpus in self.exclusive.items():
            if key != (pod_uid, name):
                out = out | cpus
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "default_cpuset": str(self.default_cpuset),
            "exclusive": [{"pod_uid": k[0], "container": k[1], "cpus": str(v)}
                          for k, v in sorted(self.exclusive.items())],
        }

    @classmethod
    def from_json(cls, d: Any, *, at: jf.At = jf.At(path="kubelet")) -> KubeletState:
        d = jf.obj(d, at)
        exclusive = {}
        for i, e in enumerate(jf.arr(d.get("exclusive", []), at.key("exclusive"))):
            e_at = at.key("exclusive").index(i)
            e = jf.obj(e, e_at)
            key = (_req_str(e, "pod_uid", e_at), _req_str(e, "container", e_at))
            exclusive[key] = jf.cpus(e.get("cpus"), e_at.key("cpus"))
        return cls(policy=jf.text(d.get("policy", "none"), at.key("policy")),
                   default_cpuset=jf.cpus(d.get("default_cpuset", ""), at.key("default_cpuset")),
                   exclusive=exclusive)


@dataclass(frozen=True, kw_only=True)
class CollectorStatus:
    up: bool
    reason: str = ""
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ContainerSample:
    """One container in one sample window: who it is and what the collectors measured.

    Metric names and units are documented in docs/metrics.md (rates per second unless the
    name says otherwise; ratios in 0..1).
    """

    container: Container
    metrics: Mapping[str, float] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return self.container.id


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """One timestamped sample window of the whole node."""

    time: float  # unix seconds at the end of the window
    window: float  # seconds covered by the rates
    node: str
    topology: Topology
    containers: tuple[ContainerSample, ...]
    kubelet: KubeletState = field(default_factory=KubeletState)
    reserved: CpuSet = field(default_factory=CpuSet)
    collectors: Mapping[str, CollectorStatus] = field(default_factory=dict)
    node_metrics: Mapping[str, float] = field(default_factory=dict)
    cycle: int = 0
    vmms: tuple[VmmProcess, ...] = ()  # VM sandboxes' VMM threads (agent/discover/vmm.py)

    def by_id(self) -> dict[str, ContainerSample]:
        return {c.id: c for c in self.containers}

    def to_json(self) -> dict[str, Any]:
        return {
            "cycle": self.cycle, "time": self.time, "window": self.window, "node": self.node,
            "topology": self.topology.to_json(), "kubelet": self.kubelet.to_json(),
            "reserved": str(self.reserved),
            "collectors": {k: {"up": v.up, "reason": v.reason, **({"detail": dict(v.detail)} if v.detail else {})}
                           for k, v in sorted(self.collectors.items())},
            "node_metrics": _finite(self.node_metrics),
            "containers": [{**s.container.to_json(), "metrics": _finite(s.metrics)}
                           for s in self.containers],
            **({"vmms": [v.to_json() for v in self.vmms]} if self.vmms else {}),
        }

    @classmethod
    def from_json(cls, d: Any, *, source: str = "snapshot") -> Snapshot:
        """Load a snapshot (or one line of `perfbalance run --json`); errors name the field
        path and the value."""
        top = jf.At(source)
        if not isinstance(d, Mapping):
            raise ParseError("snapshot", type(d).__name__, "top level must be a JSON object", source=source)
        for key in ("time", "topology", "containers"):
            if key not in d:
                raise ParseError("snapshot", sorted(map(str, d.keys()))[:20], f"missing key {key!r}", source=source)
        containers = tuple(_sample(c, top.key("containers").index(i))
                           for i, c in enumerate(jf.arr(d["containers"], top.key("containers"))))
        ids = [c.id for c in containers]
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise top.key("containers").error(dup, "duplicate container id")
        return cls(
            time=jf.number(d["time"], top.key("time")),
            window=jf.number(d.get("window", 0.0), top.key("window")),
            node=jf.text(d.get("node", ""), top.key("node")),
            cycle=jf.integer(d.get("cycle", 0), top.key("cycle")),
            topology=Topology.from_json(d["topology"], at=top.key("topology")),
            kubelet=KubeletState.from_json(d.get("kubelet", {}), at=top.key("kubelet")),
            reserved=jf.cpus(d.get("reserved", ""), top.key("reserved")),
            collectors=_collectors(d.get("collectors", {}), top.key("collectors")),
            node_metrics=_metrics(d.get("node_metrics", {}), top.key("node_metrics")),
            containers=containers, vmms=_vmms(d.get("vmms", ()), top.key("vmms")),
        )

    @classmethod
    def loads(cls, text: str, *, source: str = "snapshot") -> Snapshot:
        return cls.from_json(jf.loads(text, source=source), source=source)


@dataclass(frozen=True, kw_only=True)
class Action:
    """One thing the planner wants done, with its reason and the numbers behind it.

    kind: "cpuset" (move to `to` CPUs, `mems` follows) | "rdt_class" (move to class `to`)
    | "rollback" (undo an earlier move: `to` is the old value; `undoes` names the kind).
    Costs and benefits are in CPU-seconds per second of the affected containers ("core
    seconds saved per second"); see docs/cost-model.md.
    """

    kind: str
    container: str  # container id
    frm: str  # current value (cpuset list or class name)
    to: str
    reason: str
    benefit: float = 0.0
    cost: float = 0.0
    victims: tuple[str, ...] = ()
    mems: str = ""  # for cpuset moves: the cpuset.mems to write ("" = leave as is)
    undoes: str = ""
    decision: str = ""  # the planner's decision id ("d17"), shared by all its actions and its judgement
    detail: Mapping[str, float] = field(default_factory=dict)

    @property
    def net(self) -> float:
        return self.benefit - self.cost

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind, "container": self.container, "from": self.frm, "to": self.to,
            "reason": self.reason, "benefit": _round(self.benefit), "cost": _round(self.cost),
            "net": _round(self.net), "victims": list(self.victims),
        }
        if self.mems:
            out["mems"] = self.mems
        if self.undoes:
            out["undoes"] = self.undoes
        if self.decision:
            out["decision"] = self.decision
        if self.detail:
            out["detail"] = {k: _round(v) for k, v in self.detail.items()}
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Action:
        return cls(kind=str(d["kind"]), container=str(d["container"]), frm=str(d.get("from", "")),
                   to=str(d["to"]), reason=str(d.get("reason", "")),
                   benefit=float(d.get("benefit", 0.0)), cost=float(d.get("cost", 0.0)),
                   victims=tuple(str(v) for v in d.get("victims", ())), mems=str(d.get("mems", "")),
                   undoes=str(d.get("undoes", "")), decision=str(d.get("decision", "")),
                   detail={str(k): float(v) for k, v in dict(d.get("detail", {})).items()})


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """The planner's verdict on an earlier decision once it has settled.

    `outcome` says what came of it ("kept: the move helped", "rolled back", "rollback blocked by
    a constraint", or why it could not be judged); `realized` is None when it was not judged.
    Gains are in core-seconds per second, or s/s of run-queue wait when `method` is "health".
    """

    decision: str  # the id on the decision's actions (Action.decision)
    outcome: str
    predicted: float | None = None
    realized: float | None = None
    method: str = ""  # "health", "health+pmu", "pmu" or "model"
    band: float | None = None  # noise band of a health measurement

    @property
    def rolled_back(self) -> bool:
        return self.outcome == "rolled back"

    def to_json(self) -> dict[str, Any]:
        """The `considered` entry of kind "evaluation" (numbers rounded as everywhere in a plan)."""
        out: dict[str, Any] = {"kind": "evaluation", "decision": self.decision}
        if self.realized is not None:
            out.update(predicted=round(self.predicted or 0.0, 6), realized=round(self.realized, 6),
                       method=self.method)
            if self.band is not None:
                out["band"] = round(self.band, 6)
        out["rejected"] = self.outcome
        return out


_NO_TIMES: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, kw_only=True)
class PolicyState:
    """What every policy's state shows the agent (each policy extends it with its own fields).

    `moved_at`: container -> when the policy last moved it (dwell); `cooldown_until`: container
    -> until when it must be left alone. The agent checkpoints `cooldown_until` and, after a
    restart, starts the policy from a state of its own type holding both (every field of a
    policy's state therefore has a default).
    """

    moved_at: Mapping[str, float] = field(default_factory=lambda: _NO_TIMES)
    cooldown_until: Mapping[str, float] = field(default_factory=lambda: _NO_TIMES)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The planner's answer for one snapshot.

    `actions` are to be applied in order; `considered` explains candidates that were rejected
    (net below margin, dwell time, constraint) so that `perfbalance plan` can say why not.
    `judgements` are the verdicts on earlier decisions reached in this call.
    `state` is the planner state to pass to the next call.
    `vcpu_pinning` is where every VM sandbox's VMM threads must run (rebalancer.vm.plan_vcpus).
    """

    time: float
    actions: tuple[Action, ...] = ()
    considered: tuple[Mapping[str, Any], ...] = ()
    judgements: tuple[Judgement, ...] = ()
    state: PolicyState | None = None
    vcpu_pinning: tuple[VcpuPinning, ...] = ()

    def to_json(self) -> list[dict[str, Any]]:
        return [a.to_json() for a in self.actions]


def _req_str(d: Mapping[str, Any], key: str, at: jf.At) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v:
        raise at.key(key).error(v, "required non-empty string")
    return v


def _sample(c: Any, at: jf.At) -> ContainerSample:
    c = jf.obj(c, at)
    return ContainerSample(container=Container.from_json(c, at=at),
                           metrics=_metrics(c.get("metrics", {}), at.key("metrics")))


def _metrics(m: Any, at: jf.At) -> dict[str, float]:
    return {str(k): jf.metric(v, at.key(str(k))) for k, v in jf.obj(m, at).items()}


def _vmms(items: Any, at: jf.At) -> tuple[VmmProcess, ...]:
    out = []
    for i, v in enumerate(jf.arr(list(items) if isinstance(items, tuple) else items, at)):
        where = at.index(i)
        try:
            out.append(VmmProcess.from_json(jf.obj(v, where), source=f"{at.source}: {where.path}"))
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError) as e:
            if isinstance(e, ParseError):
                raise
            raise where.error(type(e).__name__, str(e)[:200]) from None
    return tuple(out)


def _collectors(d: Any, at: jf.At) -> dict[str, CollectorStatus]:
    out = {}
    for k, v in jf.obj(d, at).items():
        v = jf.obj(v, at.key(str(k)))
        out[str(k)] = CollectorStatus(up=bool(v.get("up")),
                                      reason=jf.text(v.get("reason", ""), at.key(str(k)).key("reason")))
    return out


def _finite(m: Mapping[str, float]) -> dict[str, float]:
    return {k: _round(v) for k, v in sorted(m.items()) if math.isfinite(v)}


def _round(v: float) -> float:
    return float(f"{v:.6g}")
