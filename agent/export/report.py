"""What one cycle produced, and the agent's running totals: the only thing exports read.

The loop builds one immutable CycleReport per cycle and swaps it in atomically; the Prometheus
collector, the node view, `run --json` and MQTT read it without doing I/O or resetting anything.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perfbalance.avx512 import avx512_heavy
from perfbalance.cpuset import CpuSet
from perfbalance.model import ContainerSample, Plan, Snapshot
from perfbalance.sandbox import VcpuPinning

RECENT_APPLIED = 50  # how many applied actions the node view and /api/state keep

_NON_CODE = re.compile(r"[^a-z0-9]+")


def reason_code(reason: str) -> str:
    """The bounded code of a free-text reason: its head before ':', '(' or '[' as snake_case.

    The `reason` label of perfbalance_rebalance_moves_total and `reason_code` of an MQTT event:
    "avx512_isolation: core 3 shared with web" -> "avx512_isolation".
    """
    head = re.split(r"[:(\[]", reason, maxsplit=1)[0].strip().lower()
    code = _NON_CODE.sub("_", head).strip("_")[:48]
    return code or "unspecified"


def effective_cpus(sample: ContainerSample, snap: Snapshot) -> CpuSet:
    """Where a container may run: its cpuset, or every online CPU when it has none."""
    return sample.container.cpuset or snap.topology.online


def is_heavy(sample: ContainerSample) -> bool:
    """The collector's AVX-512-heavy flag, read by the rule the planner uses."""
    return avx512_heavy(sample.metrics)


def heavy_cores(snap: Snapshot, *, exclude: str = "") -> CpuSet:
    """All CPUs sharing a physical core with a CPU an AVX-512-heavy container may run on."""
    cpus = CpuSet()
    for s in snap.containers:
        if s.id != exclude and is_heavy(s):
            cpus = cpus | effective_cpus(s, snap)
    return snap.topology.whole_cores(cpus) if cpus else cpus


def avx512_contamination(snap: Snapshot) -> dict[str, float]:
    """Per container id: the fraction of its CPUs whose core an AVX-512-heavy *other* container shares.

    The AVX-512 frequency licence is per physical core and the SMT sibling shares it, so a
    neighbour on the same CPU or on the sibling slows this container down.
    """
    # How many heavy containers reach each CPU through their cores (a core's siblings included),
    # so each container's "heavy others" are those counts less its own: linear in containers,
    # where asking heavy_cores() per container would be quadratic (1.4 s at 1000 containers).
    own: dict[str, CpuSet] = {s.id: snap.topology.whole_cores(effective_cpus(s, snap))
                              for s in snap.containers if is_heavy(s)}
    reach = Counter(cpu for cores in own.values() for cpu in cores)
    out: dict[str, float] = {}
    for s in snap.containers:
        mine = effective_cpus(s, snap)
        if not mine:
            continue
        mine_heavy = own.get(s.id, CpuSet())
        shared = sum(1 for cpu in mine if reach[cpu] - (cpu in mine_heavy) > 0)
        out[s.id] = shared / len(mine)
    return out


@dataclass(frozen=True, kw_only=True)
class Applied:
    """An action the actuators carried out (or tried to)."""

    event_id: str
    kind: str
    container: str
    frm: str
    to: str
    reason: str
    ok: bool
    error: str = ""
    predicted_benefit: float = 0.0
    predicted_cost: float = 0.0
    time: float = 0.0
    path: str = ""  # how a cpuset move was made: "nri" (UpdateContainers) or "cgroupfs"

    def to_json(self) -> dict[str, Any]:
        return {"event_id": self.event_id, "kind": self.kind, "container": self.container,
                "from": self.frm, "to": self.to, "reason": self.reason, "ok": self.ok,
                "error": self.error, "predicted_benefit": self.predicted_benefit,
                "predicted_cost": self.predicted_cost, "time": self.time, "path": self.path}


@dataclass(frozen=True, kw_only=True)
class Realized:
    """After a move has settled: what the victims actually gained against the prediction."""

    event_id: str
    container: str
    predicted: float
    realized: float
    rolled_back: bool


@dataclass(frozen=True, kw_only=True)
class CycleReport:
    cycle: int
    time: float
    snapshot: Snapshot
    plan: Plan
    applied: tuple[Applied, ...] = ()
    realized: tuple[Realized, ...] = ()
    errors: tuple[str, ...] = ()
    plan_seconds: float = 0.0
    collect_seconds: float = 0.0
    vcpu_map: Mapping[str, Mapping[int, int]] = field(default_factory=dict)  # container -> host cpu -> vcpu
    vcpu_pinning: tuple[VcpuPinning, ...] = ()  # applied VMM thread pinnings (guest NUMA, hugepages)
    classes: Mapping[str, Any] = field(default_factory=dict)  # block-I/O/real-time classes (agent/act/classnode.py)
    # the actuation path at the end of the cycle (agent.nri.runtime.NriRuntime.status()):
    # path nri|cgroupfs, connected, mode, reason, runtime, sessions, socket, api
    actuation: Mapping[str, Any] = field(default_factory=dict)
    # container id -> AVX-512 contamination ratio, derived from the snapshot once, when the report is built
    contamination: Mapping[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "contamination", avx512_contamination(self.snapshot))

    def to_json(self) -> dict[str, Any]:
        """The `perfbalance run --json` line (docs/run-json.md)."""
        snap = self.snapshot.to_json()
        return {
            "cycle": self.cycle, "time": self.time, "node": snap["node"], "window": snap["window"],
            "containers": snap["containers"], "plan": self.plan.to_json(),
            "considered": [dict(c) for c in self.plan.considered],
            "applied": [a.to_json() for a in self.applied], "errors": list(self.errors),
            "collectors": snap["collectors"], "topology": snap["topology"],
            "kubelet": snap["kubelet"], "reserved": snap["reserved"],
            "node_metrics": snap["node_metrics"],
            "vcpu_map": {c: {str(h): v for h, v in m.items()} for c, m in self.vcpu_map.items()},
            "vm_sandboxes": {p.pod: p.to_json() for p in self.vcpu_pinning},
            "classes": dict(self.classes),
            **({"vmms": snap["vmms"]} if "vmms" in snap else {}),
            "actuation": dict(self.actuation),
        }


@dataclass
class AgentState:
    """Mutable running state of the agent, shared with the exporters (read under a lock)."""

    node: str = ""
    latest: CycleReport | None = None
    moves_total: Counter[tuple[str, str]] = field(default_factory=Counter)  # (kind, reason_code(reason))
    rollbacks_total: int = 0
    drift_reasserted_total: int = 0
    action_errors_total: Counter[str] = field(default_factory=Counter)  # errno name / kind
    collector_errors_total: Counter[str] = field(default_factory=Counter)
    config_reloads_total: Counter[str] = field(default_factory=Counter)  # "ok" / "invalid"
    config_valid: bool = True
    config_error: str = ""
    config_loaded_time: float = 0.0
    realized: list[Realized] = field(default_factory=list)  # recent, bounded
    ready: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. resctrl free CLOSIDs/RMIDs
    recent_applied: list[Applied] = field(default_factory=list)  # last RECENT_APPLIED, oldest first
    lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, report: CycleReport) -> None:
        with self.lock:
            self.latest = report
            self.ready = True
            self.recent_applied.extend(report.applied)
            del self.recent_applied[:-RECENT_APPLIED]

    def view(self) -> Mapping[str, Any]:
        """A consistent copy for a scrape or a page."""
        with self.lock:
            return {
                "node": self.node, "latest": self.latest, "moves_total": dict(self.moves_total),
                "rollbacks_total": self.rollbacks_total,
                "drift_reasserted_total": self.drift_reasserted_total,
                "action_errors_total": dict(self.action_errors_total),
                "collector_errors_total": dict(self.collector_errors_total),
                "config_reloads_total": dict(self.config_reloads_total),
                "config_valid": self.config_valid, "config_error": self.config_error,
                "config_loaded_time": self.config_loaded_time,
                "realized": list(self.realized), "ready": self.ready, "extra": dict(self.extra),
                "recent_applied": list(self.recent_applied),
            }
