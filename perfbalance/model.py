"""Containers, snapshots and plans: the values that flow collectors -> planner -> actuators.

A Snapshot is one timestamped sample window: what every collector saw, for every container,
plus what the node offers and what the kubelet owns. A Plan is the planner's answer. Both have a
documented JSON form (docs/snapshot-format.md) so that `perfbalance run --json` output can be
saved and replayed with `perfbalance plan`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from perfbalance.cpuset import CpuSet
from perfbalance.errors import ParseError
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
    def from_json(cls, d: Mapping[str, Any], *, source: str = "container") -> Container:
        def opt_int(key: str) -> int | None:
            v = d.get(key)
            return None if v is None else int(v)

        return cls(
            id=_req_str(d, "id", source), name=str(d.get("name", "")),
            namespace=str(d.get("namespace", "")), pod=str(d.get("pod", "")),
            pod_uid=str(d.get("pod_uid", "")), cgroup=_req_str(d, "cgroup", source),
            qos=str(d.get("qos", "unknown")), runtime=str(d.get("runtime", "generic")),
            cpuset=CpuSet.parse(str(d.get("cpuset", "")), source=f"{source}.cpuset"),
            mems=CpuSet.parse(str(d.get("mems", "")), source=f"{source}.mems"),
            request_mcpu=int(d.get("request_mcpu", 0)), limit_mcpu=opt_int("limit_mcpu"),
            memory_limit_bytes=opt_int("memory_limit_bytes"),
            memory_bytes=int(d.get("memory_bytes", 0)), exclusive=bool(d.get("exclusive", False)),
            rdt_class=str(d.get("rdt_class", "")),
            annotations={str(k): str(v) for k, v in dict(d.get("annotations", {})).items()},
            labels={str(k): str(v) for k, v in dict(d.get("labels", {})).items()},
            sandbox=str(d.get("sandbox", "")),
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
    def from_json(cls, d: Mapping[str, Any], *, source: str = "kubelet") -> KubeletState:
        return cls(
            policy=str(d.get("policy", "none")),
            default_cpuset=CpuSet.parse(str(d.get("default_cpuset", "")), source=source),
            exclusive={(str(e["pod_uid"]), str(e["container"])): CpuSet.parse(str(e["cpus"]))
                       for e in d.get("exclusive", [])},
        )


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
        }

    @classmethod
    def from_json(cls, d: Any, *, source: str = "snapshot") -> Snapshot:
        """Load a snapshot (or one line of `perfbalance run --json`); errors name the field."""
        if not isinstance(d, Mapping):
            raise ParseError("snapshot", str(d)[:200], "top level must be a JSON object", source=source)
        for key in ("time", "topology", "containers"):
            if key not in d:
                raise ParseError("snapshot", sorted(d.keys()), f"missing key {key!r}", source=source)
        try:
            containers = []
            for i, c in enumerate(d["containers"]):
                where = f"{source}: containers[{i}]"
                if not isinstance(c, Mapping):
                    raise ParseError("container", c, "must be an object", source=where)
                metrics = c.get("metrics", {})
                if not isinstance(metrics, Mapping):
                    raise ParseError("metrics", metrics, "must be an object", source=where)
                containers.append(ContainerSample(
                    container=Container.from_json(c, source=where),
                    metrics={str(k): _metric(v, f"{where}.metrics.{k}") for k, v in metrics.items()},
                ))
            ids = [c.id for c in containers]
            if len(set(ids)) != len(ids):
                raise ParseError("containers", ids, "duplicate container id", source=source)
            return cls(
                time=float(d["time"]), window=float(d.get("window", 0.0)),
                node=str(d.get("node", "")), cycle=int(d.get("cycle", 0)),
                topology=Topology.from_json(d["topology"], source=f"{source}: topology"),
                kubelet=KubeletState.from_json(d.get("kubelet", {}), source=f"{source}: kubelet"),
                reserved=CpuSet.parse(str(d.get("reserved", "")), source=f"{source}: reserved"),
                collectors={str(k): CollectorStatus(up=bool(v.get("up")), reason=str(v.get("reason", "")))
                            for k, v in dict(d.get("collectors", {})).items()},
                node_metrics={str(k): _metric(v, f"{source}: node_metrics.{k}")
                              for k, v in dict(d.get("node_metrics", {})).items()},
                containers=tuple(containers),
            )
        except ParseError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, RecursionError) as e:
            # OverflowError: int() of a JSON Infinity; RecursionError: str() of absurd nesting
            raise ParseError("snapshot", type(e).__name__, str(e)[:200], source=source) from None

    @classmethod
    def loads(cls, text: str, *, source: str = "snapshot") -> Snapshot:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ParseError("snapshot", text[:80], f"not JSON ({e})", source=source) from None
        except (ValueError, RecursionError) as e:  # huge integer literal, nesting beyond the decoder
            raise ParseError("snapshot", text[:80], f"not usable JSON ({type(e).__name__})",
                             source=source) from None
        return cls.from_json(data, source=source)


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
        if self.detail:
            out["detail"] = {k: _round(v) for k, v in self.detail.items()}
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Action:
        return cls(kind=str(d["kind"]), container=str(d["container"]), frm=str(d.get("from", "")),
                   to=str(d["to"]), reason=str(d.get("reason", "")),
                   benefit=float(d.get("benefit", 0.0)), cost=float(d.get("cost", 0.0)),
                   victims=tuple(str(v) for v in d.get("victims", ())), mems=str(d.get("mems", "")),
                   undoes=str(d.get("undoes", "")),
                   detail={str(k): float(v) for k, v in dict(d.get("detail", {})).items()})

    def with_(self, **changes: Any) -> Action:
        return replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The planner's answer for one snapshot.

    `actions` are to be applied in order; `considered` explains candidates that were rejected
    (net below margin, dwell time, constraint) so that `perfbalance plan` can say why not.
    `state` is the planner state to pass to the next call (opaque to everyone else).
    """

    time: float
    actions: tuple[Action, ...] = ()
    considered: tuple[Mapping[str, Any], ...] = ()
    state: Any = None

    def to_json(self) -> list[dict[str, Any]]:
        return [a.to_json() for a in self.actions]


def _req_str(d: Mapping[str, Any], key: str, source: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v:
        raise ParseError(key, v, "required non-empty string", source=source)
    return v


def _metric(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ParseError("metric", v, "must be a number", source=where)
    f = float(v)
    if not math.isfinite(f):
        raise ParseError("metric", v, "must be finite", source=where)
    return f


def _finite(m: Mapping[str, float]) -> dict[str, float]:
    return {k: _round(v) for k, v in sorted(m.items()) if math.isfinite(v)}


def _round(v: float) -> float:
    return float(f"{v:.6g}")
