"""Prometheus metrics and the node view's data, computed from the agent's latest report.

Why a custom collector: every scrape turns the latest immutable CycleReport (plus the agent's
running totals in AgentState) into fresh metric families. Nothing is read from the host and no
counter is reset at scrape time (cri-resource-manager deleted BPF map keys on scrape; cAdvisor
exported containers x CPUs x events). So series of departed containers disappear with the next
report, per-CPU series exist only at node level, and every label value is bounded and sanitized.

The derived, correlated numbers (per-CPU heat, memory bandwidth per NUMA domain, the last
decision per container) are pure functions of a report, shared by the Prometheus collector and
`/api/state` (docs/metrics.md lists every series); AVX-512 contamination and reason codes come
from agent.export.report, computed once per report.
"""

from __future__ import annotations

import math
import platform
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from agent.export import selfmem
from agent.export.report import AgentState, Applied, CycleReport, Realized, effective_cpus, heavy_cores, is_heavy
from perfbalance import __version__
from perfbalance.model import ContainerSample, Snapshot

MAX_LABEL_CHARS = 128
MAX_REASONS = 32  # distinct `reason` label values; the rest are folded into "other"
DEFAULT_CLASS = "default"  # the resctrl root group: containers with no RDT class
ID = ("namespace", "pod", "container")

# (metric suffix, ContainerSample.metrics key, help). Counters get `_total` from the client.
CONTAINER_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("cpu_seconds", "cpu_seconds_total", "CPU time used by the container, seconds."),
    ("cpu_throttled_seconds", "cpu_throttled_seconds_total", "Time the container was throttled by its CFS quota, seconds."),
    ("instructions", "instructions_total", "Instructions retired (PMU)."),
    ("cycles", "cycles_total", "CPU cycles (PMU)."),
    ("llc_references", "llc_references_total", "Last-level cache references (PMU)."),
    ("llc_misses", "llc_misses_total", "Last-level cache misses (PMU)."),
    ("memory_bandwidth_bytes", "mbm_total_bytes_total", "Memory traffic measured by resctrl MBM (total), bytes."),
    ("memory_bandwidth_local_bytes", "mbm_local_bytes_total", "Memory traffic to the local NUMA node measured by resctrl MBM, bytes."),
)
CONTAINER_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("cpu_usage_cores", "cpu_usage_cores", "CPU-seconds per second used in the last window."),
    ("cpu_throttled_ratio", "cpu_throttled_ratio", "Throttled CFS periods / periods in the last window."),
    ("psi_cpu_some_ratio", "psi_cpu_some", "CPU pressure (PSI some avg10) as a 0..1 fraction."),
    ("psi_memory_some_ratio", "psi_memory_some", "Memory pressure (PSI some avg10) as a 0..1 fraction."),
    ("memory_bytes", "memory_bytes", "Memory usage of the container's cgroup, bytes."),
    ("runqueue_wait_seconds_per_second", "runqueue_wait_seconds_per_second", "Seconds per second the container's runnable threads waited for a CPU in the last window (eBPF)."),
    ("runqueue_latency_p50_seconds", "runqueue_latency_p50_seconds", "Median run-queue wait (wakeup or preemption -> switch-in) in the last window, seconds."),
    ("runqueue_latency_p99_seconds", "runqueue_latency_p99_seconds", "99th percentile run-queue wait in the last window, seconds."),
    ("runqueue_latency_mean_seconds", "runqueue_latency_mean_seconds", "Mean run-queue wait in the last window, seconds."),
    ("ipc", "ipc", "Instructions per cycle in the last window."),
    ("llc_mpki", "llc_mpki", "Last-level cache misses per thousand instructions in the last window."),
    ("avx512_active_ratio", "avx512_active_ratio", "Smoothed fraction of FPU-state switches with 512-bit state (ZMM_Hi256) in use."),
    ("evex256_ratio", "evex256_ratio", "Smoothed fraction of FPU-state switches with only EVEX-256 state (opmask/Hi16_ZMM)."),
    ("avx512_heavy", "avx512_heavy", "1 when the container is AVX-512-heavy (after hysteresis)."),
    ("llc_occupancy_bytes", "llc_occupancy_bytes", "LLC occupancy measured by resctrl CMT, bytes."),
    ("memory_bandwidth_bytes_per_second", "memory_bandwidth_bytes_per_second", "Memory bandwidth in the last window (MBM, or LLC misses x 64 B when estimated)."),
    ("memory_bandwidth_estimated", "memory_bandwidth_estimated", "1 when memory bandwidth is estimated from LLC misses rather than measured by MBM."),
    ("memory_bandwidth_bytes_per_instruction", "bytes_per_instruction", "Memory bandwidth / instructions retired in the last window, bytes per instruction."),
    ("io_read_bytes_per_second", "io_read_bytes_per_second", "Block-I/O bytes read per second in the last window (blkio/io stats)."),
    ("io_write_bytes_per_second", "io_write_bytes_per_second", "Block-I/O bytes written per second in the last window."),
    ("io_read_ops_per_second", "io_read_ops_per_second", "Block-I/O read operations per second in the last window."),
    ("io_write_ops_per_second", "io_write_ops_per_second", "Block-I/O write operations per second in the last window."),
)


# -- label hygiene ----------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def label_value(value: object) -> str:
    """A label value that cannot break the exposition or explode: no control chars, bounded."""
    text = _CONTROL.sub("_", str(value))
    return text if len(text) <= MAX_LABEL_CHARS else text[: MAX_LABEL_CHARS - 1] + "~"


def container_ident(sample: ContainerSample) -> tuple[str, str, str]:
    """(namespace, pod, container) label values; non-Kubernetes containers use the cgroup name."""
    c = sample.container
    name = c.name or c.cgroup.rstrip("/").rsplit("/", 1)[-1] or c.id[:12]
    return (label_value(c.namespace), label_value(c.pod), label_value(name))


def display_name(sample: ContainerSample) -> str:
    ns, pod, name = container_ident(sample)
    return "/".join(p for p in (ns, pod, name) if p)


# -- pure derivations from a report ------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class CpuHeat:
    """What may run on one CPU, aggregated over the containers whose cpuset includes it."""

    cpu: int
    core: int
    node: int
    l3: int
    avx512: float  # max avx512_active_ratio of its containers
    heavy: bool  # an AVX-512-heavy container may run on this CPU's physical core
    mpki: float  # max llc_mpki of its containers
    bandwidth: float  # sum of the containers' bandwidth shares (split evenly over their CPUs)
    classes: tuple[str, ...]
    containers: tuple[str, ...]  # display names


def rdt_class(sample: ContainerSample) -> str:
    return sample.container.rdt_class or DEFAULT_CLASS


def cpu_heat(snap: Snapshot) -> list[CpuHeat]:
    """One cell per online CPU for the node view and the per-CPU series."""
    heavy = heavy_cores(snap)
    by_cpu: dict[int, list[ContainerSample]] = {c.id: [] for c in snap.topology.cpus}
    for s in snap.containers:
        for cpu in effective_cpus(s, snap):
            by_cpu.setdefault(cpu, []).append(s)
    cells = []
    for c in snap.topology.cpus:
        on = by_cpu.get(c.id, [])
        cells.append(CpuHeat(
            cpu=c.id, core=c.core, node=c.node, l3=c.l3,
            avx512=max((s.metrics.get("avx512_active_ratio", 0.0) for s in on), default=0.0),
            heavy=c.id in heavy,
            mpki=max((s.metrics.get("llc_mpki", 0.0) for s in on), default=0.0),
            bandwidth=sum(_bandwidth_share(s, snap) for s in on),
            classes=tuple(sorted({rdt_class(s) for s in on})),
            containers=tuple(display_name(s) for s in on),
        ))
    return cells


def domain_bandwidth(snap: Snapshot) -> dict[int, float]:
    """Memory bandwidth per NUMA node: measured node-level values win, else the containers' sum."""
    out: dict[int, float] = {}
    for node in snap.topology.nodes():
        measured = snap.node_metrics.get(f"node{node}_memory_bandwidth_bytes_per_second")
        out[node] = measured if measured is not None else 0.0
    if any(f"node{n}_memory_bandwidth_bytes_per_second" in snap.node_metrics for n in out):
        return out
    for s in snap.containers:
        share = _bandwidth_share(s, snap)
        for cpu in effective_cpus(s, snap):
            node = _node_of(snap, cpu)
            if node is not None:
                out[node] = out.get(node, 0.0) + share
    return out


def bandwidth_peak(snap: Snapshot, node: int, configured: float) -> float:
    """Sustainable bandwidth of a NUMA node: config, else node_metrics; 0 when unknown."""
    if configured > 0:
        return configured
    nm = snap.node_metrics
    return nm.get(f"node{node}_memory_bandwidth_peak_bytes_per_second",
                  nm.get("memory_bandwidth_peak_bytes_per_second", 0.0))


def last_decisions(applied: Sequence[Applied]) -> dict[str, Applied]:
    """The newest successful action per container id."""
    out: dict[str, Applied] = {}
    for a in applied:
        if a.ok and (a.container not in out or a.time >= out[a.container].time):
            out[a.container] = a
    return out


def last_realized(realized: Sequence[Realized]) -> dict[str, Realized]:
    out: dict[str, Realized] = {}
    for r in realized:
        out[r.container] = r  # the list is oldest first
    return out


def _bandwidth_share(s: ContainerSample, snap: Snapshot) -> float:
    cpus = effective_cpus(s, snap)
    return s.metrics.get("memory_bandwidth_bytes_per_second", 0.0) / len(cpus) if cpus else 0.0


def _node_of(snap: Snapshot, cpu: int) -> int | None:
    try:
        return snap.topology.cpu(cpu).node
    except KeyError:
        return None


# -- the Prometheus collector ------------------------------------------------------------------

class Exporter(Collector):
    """Register in a fresh CollectorRegistry: `registry.register(Exporter(state))`."""

    def __init__(self, state: AgentState, *, bandwidth_peak: float = 0.0) -> None:
        self.state = state
        self.bandwidth_peak = bandwidth_peak

    def collect(self) -> Iterator[Metric]:
        view = self.state.view()
        yield from live_families(view)
        report: CycleReport | None = view["latest"]
        if report is not None:
            yield from report_families(report, view, bandwidth_peak=self.bandwidth_peak)

    def describe(self) -> Iterable[Metric]:
        return ()  # families vary with the report; describing none keeps registration I/O-free


def live_families(view: Mapping[str, Any]) -> Iterator[Metric]:
    """The agent's own totals (a few dozen series), which change between cycles: MQTT counters,
    reloads, readiness. Rendered at every scrape."""
    yield from _agent_families(view)


def memory_families(mem: selfmem.SelfMemory) -> Iterator[Metric]:
    """The agent's memory: RSS, and what its allocators hold in use (agent/export/selfmem.py)."""
    fam = _gauge("perfbalance_agent_memory_bytes",
                 "The agent's own memory by kind: resident and anonymous (RSS), malloc_inuse (glibc heap in use), "
                 "malloc_free (free inside glibc's arenas; RSS rises to a plateau as it is reused, no leak).",
                 labels=["kind"])
    for kind, value in mem.by_kind().items():
        fam.add_metric([kind], float(value))
    yield fam
    yield _gauge("perfbalance_agent_python_allocated_blocks", "CPython object blocks the agent has allocated (grows with live objects only).",
                 float(mem.python_blocks))


def report_families(report: CycleReport, view: Mapping[str, Any], *, bandwidth_peak: float = 0.0) -> Iterator[Metric]:
    """Everything a cycle's report determines (containers, CPUs, decisions): it changes once per
    cycle, so agent/export/exposition.py renders it once per report and serves the bytes. The
    agent's own memory is read here too: once per cycle, right after it, when the cycle's
    transient objects are gone (read at a scrape, it would depend on where the cycle was)."""
    yield from memory_families(selfmem.read())
    yield from _cycle_families(report, view["extra"])
    yield from _container_families(report, view)
    yield _vcpu_pins(report)
    yield from _guest_numa(report)
    yield from _node_families(report.snapshot, bandwidth_peak)


def make_registry(state: AgentState, *, bandwidth_peak: float = 0.0) -> CollectorRegistry:
    """A registry holding only perfbalance's metrics (no process/GC collectors of the client)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Exporter(state, bandwidth_peak=bandwidth_peak))
    return registry


def _gauge(name: str, doc: str, value: float | None = None, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    if value is not None:
        return GaugeMetricFamily(name, doc, value=value)
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, value: float | None = None, labels: Sequence[str] = ()) -> CounterMetricFamily:
    if value is not None:
        return CounterMetricFamily(name, doc, value=value)
    return CounterMetricFamily(name, doc, labels=list(labels))


def _labelled_counter(name: str, doc: str, label: str, values: Mapping[str, float]) -> CounterMetricFamily:
    fam = _counter(name, doc, labels=[label])
    for key, v in sorted(values.items()):
        fam.add_metric([label_value(key)], v)
    return fam


def _agent_families(view: Mapping[str, Any]) -> Iterator[Metric]:
    info = GaugeMetricFamily("perfbalance_build_info", "Version of the running agent (always 1).",
                             labels=["version", "python"])
    info.add_metric([__version__, platform.python_version()], 1)
    yield info
    yield _gauge("perfbalance_ready", "1 once the first cycle has completed.", float(view["ready"]))
    yield _gauge("perfbalance_config_valid", "1 when the last configuration load or reload was valid (an invalid file is rejected and the last good one stays in force).",
                 float(view["config_valid"]))
    yield _gauge("perfbalance_config_last_reload_timestamp_seconds", "Unix time the configuration in force was loaded.",
                 float(view["config_loaded_time"]))
    yield _labelled_counter("perfbalance_config_reloads", "Configuration reload attempts by result (ok, invalid).",
                            "result", view["config_reloads_total"])
    yield _moves(view["moves_total"])
    yield _counter("perfbalance_rollbacks", "Moves undone because the realized gain fell short.", float(view["rollbacks_total"]))
    yield _counter("perfbalance_drift_reasserted", "Times a cpuset rewritten by the kubelet or runtime was re-asserted.",
                   float(view["drift_reasserted_total"]))
    yield _labelled_counter("perfbalance_action_errors", "Actions that failed, by error (errno name or kind).",
                            "error", view["action_errors_total"])
    yield _labelled_counter("perfbalance_collector_errors", "Collector errors by collector.",
                            "collector", view["collector_errors_total"])
    yield from _mqtt_families(view["extra"].get("mqtt"))


def _moves(moves: Mapping[tuple[str, str], int]) -> CounterMetricFamily:
    """Moves by (kind, reason code) as counted by the loop; codes beyond MAX_REASONS fold into "other"."""
    folded: dict[tuple[str, str], float] = {}
    reasons: set[str] = set()
    for (kind, reason), n in sorted(moves.items()):
        code = label_value(reason)
        if code not in reasons and len(reasons) >= MAX_REASONS:
            code = "other"
        reasons.add(code)
        key = (label_value(kind), code)
        folded[key] = folded.get(key, 0.0) + n
    fam = _counter("perfbalance_rebalance_moves", "Actions applied, by kind (cpuset, rdt_class, rollback) and reason code.",
                   labels=["kind", "reason"])
    for (kind, code), n in sorted(folded.items()):
        fam.add_metric([kind, code], n)
    return fam


def _mqtt_families(mqtt: Mapping[str, Any] | None) -> Iterator[Metric]:
    if not mqtt:
        return
    yield _gauge("perfbalance_mqtt_configured", "1 when an MQTT broker is configured.", float(mqtt.get("configured", 0)))
    yield _gauge("perfbalance_mqtt_connected", "1 while connected to the MQTT broker.", float(mqtt.get("connected", 0)))
    yield _gauge("perfbalance_mqtt_queue_length", "Events waiting to be published.", float(mqtt.get("queue", 0)))
    yield _counter("perfbalance_mqtt_events_published", "Events acknowledged by the broker (QoS 1).", float(mqtt.get("published", 0)))
    yield _counter("perfbalance_mqtt_events_dropped", "Events dropped because the queue was full (oldest first).", float(mqtt.get("dropped", 0)))
    yield _counter("perfbalance_mqtt_connection_errors", "Failed connections or lost sessions.", float(mqtt.get("errors", 0)))


def _cycle_families(report: CycleReport, extra: Mapping[str, Any]) -> Iterator[Metric]:
    snap = report.snapshot
    yield _counter("perfbalance_cycles", "Collect-plan-act cycles completed.", float(report.cycle))
    yield _gauge("perfbalance_last_cycle_timestamp_seconds", "Unix time at the end of the last cycle's sample window.", report.time)
    yield _gauge("perfbalance_plan_duration_seconds", "Time the planner took in the last cycle.", report.plan_seconds)
    yield _gauge("perfbalance_collect_duration_seconds", "Time collection took in the last cycle.", report.collect_seconds)
    yield _gauge("perfbalance_cycle_errors", "Errors reported by the last cycle.", float(len(report.errors)))
    yield _gauge("perfbalance_containers", "Containers seen in the last cycle.", float(len(snap.containers)))
    yield _gauge("perfbalance_plan_actions", "Actions in the last plan (applied or not).", float(len(report.plan.actions)))
    yield _gauge("perfbalance_plan_predicted_net_benefit_cores", "Sum of predicted benefit - cost of the last plan's actions, CPU-seconds per second.",
                 _finite(sum(a.net for a in report.plan.actions)))
    up = _gauge("perfbalance_collector_up", "1 when the collector delivered data in the last cycle.", labels=["collector"])
    for name, status in sorted(snap.collectors.items()):
        up.add_metric([label_value(name)], float(status.up))
    yield up
    yield from _actuation_families(report.actuation)
    yield from _resctrl_families(snap, extra)
    yield from _class_families(report)


def _class_families(report: CycleReport) -> Iterator[Metric]:
    """Block-I/O and real-time classes (CycleReport.classes, agent/act/classnode.py)."""
    controllers: Mapping[str, Mapping[str, Any]] = report.classes.get("controllers") or {}
    used = _gauge("perfbalance_class_controller_used", "1 when the class controller is used on this node (doctor says why not).", labels=["controller"])
    members = _gauge("perfbalance_class_containers", "Containers in a class of a controller (class \"\": taken out of a class by us).", labels=["controller", "class"])
    problems = _gauge("perfbalance_class_problems", "Containers whose wanted class is refused now (bad annotation, bad device, budget); they keep their previous class.", labels=["controller"])
    refusals = _counter("perfbalance_class_refusals", "Class problems reported (each once while it lasts).", labels=["controller"])
    for name, c in sorted(controllers.items()):
        used.add_metric([label_value(name)], float(bool(c.get("used"))))
        for cls, n in sorted((c.get("containers") or {}).items()):
            members.add_metric([label_value(name), label_value(cls)], float(n))
        if c.get("used"):
            problems.add_metric([label_value(name)], float(c.get("problems", 0)))
            refusals.add_metric([label_value(name)], float(c.get("errors_total", 0)))
    yield from (used, members, problems, refusals)


def _actuation_families(actuation: Mapping[str, Any]) -> Iterator[Metric]:
    """Which path cpuset moves take (agent/nri): both label values always present, one of them 1."""
    if not actuation:
        return
    path = _gauge("perfbalance_actuation_path", "1 for the path cpuset moves take now: nri (the runtime's UpdateContainers) or cgroupfs.",
                  labels=["path"])
    for name in ("nri", "cgroupfs"):
        path.add_metric([name], float(actuation.get("path") == name))
    yield path
    yield _gauge("perfbalance_nri_connected", "1 while the NRI session with the container runtime is connected and synchronized.",
                 float(bool(actuation.get("connected"))))
    yield _counter("perfbalance_nri_sessions", "NRI sessions established with the runtime since the agent started (reconnects included).",
                   float(actuation.get("sessions", 0) or 0))


def _resctrl_families(snap: Snapshot, extra: Mapping[str, Any]) -> Iterator[Metric]:
    """CLOSID/RMID budget: AgentState.extra["resctrl_closids_free"] etc., else node_metrics."""
    names = {"closids_free": ("perfbalance_resctrl_closids_free", "Unused resctrl CLOSIDs (control groups)."),
             "closids_total": ("perfbalance_resctrl_closids", "resctrl CLOSIDs the hardware offers."),
             "rmids_free": ("perfbalance_resctrl_rmids_free", "Unused resctrl RMIDs (monitoring groups)."),
             "rmids_total": ("perfbalance_resctrl_rmids", "resctrl RMIDs the hardware offers.")}
    for key, (name, doc) in names.items():
        value = extra.get(f"resctrl_{key}", snap.node_metrics.get(f"resctrl_{key}"))
        if value is not None:
            yield _gauge(name, doc, value)
    classes: Mapping[str, Any] = extra.get("resctrl_classes") or {}
    if not classes:
        return
    occupancy = _gauge("perfbalance_resctrl_class_llc_occupancy_bytes",
                       "LLC occupancy of an RDT class (its control group and monitoring groups).", labels=["class"])
    mbm = {kind: _counter(f"perfbalance_resctrl_class_mbm_{kind}_bytes",
                          f"Memory bandwidth bytes of an RDT class, MBM {kind} (cumulative, wrap-corrected).",
                          labels=["class"]) for kind in ("total", "local")}
    for cls, usage in sorted(classes.items()):
        lv = [label_value(cls)]
        if getattr(usage, "llc_occupancy_bytes", None) is not None:
            occupancy.add_metric(lv, usage.llc_occupancy_bytes)
        for kind, fam in mbm.items():
            value = getattr(usage, f"mbm_{kind}_bytes_total", None)
            if value is not None:
                fam.add_metric(lv, value)
    yield occupancy
    yield from mbm.values()


def _container_families(report: CycleReport, view: Mapping[str, Any]) -> Iterator[Metric]:
    samples = _unique(report.snapshot)
    for suffix, key, doc in CONTAINER_COUNTERS:
        fam = _counter(f"perfbalance_container_{suffix}", doc, labels=ID)
        for ident, s in samples:
            if key in s.metrics:
                fam.add_metric(list(ident), s.metrics[key])
        yield fam
    for suffix, key, doc in CONTAINER_GAUGES:
        fam = _gauge(f"perfbalance_container_{suffix}", doc, labels=ID)
        for ident, s in samples:
            if key in s.metrics:  # derived values (ipc, llc_mpki, ...) come with the snapshot
                fam.add_metric(list(ident), s.metrics[key])
        yield fam
    yield _info(samples)
    yield _class_info(samples, report.classes.get("containers") or {})
    yield _contamination(samples, report.contamination)
    yield from _decision_families(samples, view)


def _unique(snap: Snapshot) -> list[tuple[tuple[str, str, str], ContainerSample]]:
    """Samples with distinct label sets (a duplicate would break the scrape); first id wins."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for s in sorted(snap.containers, key=lambda s: s.id):
        ident = container_ident(s)
        if ident not in seen:
            seen.add(ident)
            out.append((ident, s))
    return out


def _guest_numa(report: CycleReport) -> Iterable[GaugeMetricFamily]:
    """Each VM sandbox's guest NUMA nodes (vCPUs and hugepages per guest node and the host node
    it sits on) and the hugepages the pod holds per host node: one series per node, bounded by
    the VM's vCPUs and the host's nodes. `sandbox` is the pod UID (or the pod's cgroup)."""
    labels = ["sandbox", "guest_node", "host_node"]
    vcpus = _gauge("perfbalance_vm_guest_numa_vcpus", "vCPUs of a VM sandbox's guest NUMA node, pinned to one host NUMA node.",
                   labels=labels)
    pages = _gauge("perfbalance_vm_guest_numa_hugepages", "Hugepages of a VM sandbox's guest NUMA node, on its host NUMA node.",
                   labels=labels)
    held = _gauge("perfbalance_vm_hugepages", "Hugepages a VM-sandboxed pod holds on a host NUMA node (hugetlb cgroup).",
                  labels=["sandbox", "host_node", "page_size_bytes"])
    for p in report.vcpu_pinning:
        for n in p.guest_numa:
            key = [p.pod, str(n.id), str(n.host_node)]
            vcpus.add_metric(key, len(n.vcpus))
            pages.add_metric(key, n.hugepages)
        for h in p.hugepages:
            for node, count in sorted(h.per_node.items()):
                held.add_metric([p.pod, str(node), str(h.page_size_bytes)], count)
    return vcpus, pages, held


def _vcpu_pins(report: CycleReport) -> GaugeMetricFamily:
    """The host CPU <-> vCPU mapping of VM-sandboxed containers with dedicated CPUs.

    The one series with a CPU next to a container: each pinned host CPU belongs to exactly one
    vCPU of one container, so there are at most as many series as CPUs, never CPUs x containers.
    """
    fam = _gauge("perfbalance_vcpu_pin_info", "A vCPU of a VM-sandboxed container pinned 1:1 to a host CPU (always 1).",
                 labels=[*ID, "vcpu", "host_cpu"])
    by_id = {s.id: s for s in report.snapshot.containers}
    for cid, mapping in sorted(report.vcpu_map.items()):
        sample = by_id.get(cid)
        if sample is None:
            continue
        ident = container_ident(sample)
        for host_cpu, vcpu in sorted(mapping.items()):
            fam.add_metric([*ident, str(vcpu), str(host_cpu)], 1)
    return fam


def _info(samples: Sequence[tuple[tuple[str, str, str], ContainerSample]]) -> GaugeMetricFamily:
    fam = _gauge("perfbalance_container_info", "Where the container is placed: RDT class, cpuset and QoS (always 1).",
                 labels=[*ID, "class", "cpuset", "qos"])
    for ident, s in samples:
        fam.add_metric([*ident, label_value(rdt_class(s)), label_value(s.container.cpuset), s.container.qos], 1)
    return fam


def _class_info(samples: Sequence[tuple[tuple[str, str, str], ContainerSample]],
                classes: Mapping[str, Mapping[str, str]]) -> GaugeMetricFamily:
    fam = _gauge("perfbalance_container_class_info", "The container's class per class controller (block I/O, real time; always 1).",
                 labels=[*ID, "controller", "class"])
    for ident, s in samples:
        for controller, cls in sorted(classes.get(s.id, {}).items()):
            fam.add_metric([*ident, label_value(controller), label_value(cls)], 1)
    return fam


def _contamination(samples: Sequence[tuple[tuple[str, str, str], ContainerSample]],
                   ratios: Mapping[str, float]) -> GaugeMetricFamily:
    fam = _gauge("perfbalance_container_avx512_contamination_ratio",
                 "Fraction of the container's CPUs whose physical core an AVX-512-heavy other container shares.", labels=ID)
    for ident, s in samples:
        if s.id in ratios:
            fam.add_metric(list(ident), ratios[s.id])
    return fam


def _decision_families(samples: Sequence[tuple[tuple[str, str, str], ContainerSample]],
                       view: Mapping[str, Any]) -> Iterator[Metric]:
    decided = last_decisions(view.get("recent_applied", []))
    realized = last_realized(view["realized"])
    benefit = _gauge("perfbalance_decision_predicted_benefit_cores", "Predicted benefit of the last move of this container, CPU-seconds per second.", labels=ID)
    cost = _gauge("perfbalance_decision_predicted_cost_cores", "Predicted cost of the last move of this container, CPU-seconds per second.", labels=ID)
    when = _gauge("perfbalance_decision_timestamp_seconds", "Unix time of the last move of this container.", labels=ID)
    gain = _gauge("perfbalance_decision_realized_gain_cores", "Gain measured after the last move of this container settled, CPU-seconds per second.", labels=ID)
    predicted = _gauge("perfbalance_decision_realized_predicted_cores", "The prediction the realized gain is judged against, CPU-seconds per second.", labels=ID)
    for ident, s in samples:
        if s.id in decided:
            a = decided[s.id]
            benefit.add_metric(list(ident), _finite(a.predicted_benefit))
            cost.add_metric(list(ident), _finite(a.predicted_cost))
            when.add_metric(list(ident), a.time)
        if s.id in realized:
            gain.add_metric(list(ident), _finite(realized[s.id].realized))
            predicted.add_metric(list(ident), _finite(realized[s.id].predicted))
    yield from (benefit, cost, when, gain, predicted)


def _node_families(snap: Snapshot, configured_peak: float) -> Iterator[Metric]:
    cells = cpu_heat(snap)
    avx = _gauge("perfbalance_cpu_avx512_active_ratio", "Highest AVX-512 active ratio among the containers that may run on the CPU.", labels=["cpu"])
    heavy = _gauge("perfbalance_cpu_avx512_heavy_core", "1 when an AVX-512-heavy container may run on the CPU's physical core.", labels=["cpu"])
    mpki = _gauge("perfbalance_cpu_llc_mpki", "Highest LLC MPKI among the containers that may run on the CPU.", labels=["cpu"])
    bw = _gauge("perfbalance_cpu_memory_bandwidth_bytes_per_second", "Memory bandwidth of the containers on the CPU (each split evenly over its CPUs).", labels=["cpu"])
    cls = _gauge("perfbalance_cpu_rdt_class_info", "RDT classes of the containers that may run on the CPU (always 1).", labels=["cpu", "class"])
    for c in cells:
        cpu = str(c.cpu)
        avx.add_metric([cpu], c.avx512)
        heavy.add_metric([cpu], float(c.heavy))
        mpki.add_metric([cpu], c.mpki)
        bw.add_metric([cpu], c.bandwidth)
        for name in c.classes:
            cls.add_metric([cpu, label_value(name)], 1)
    yield from (avx, heavy, mpki, bw, cls)
    yield from _domain_families(snap, configured_peak)


def _domain_families(snap: Snapshot, configured_peak: float) -> Iterator[Metric]:
    bw = _gauge("perfbalance_memory_bandwidth_bytes_per_second", "Memory bandwidth per NUMA domain (measured, or the sum of its containers).", labels=["domain"])
    sat = _gauge("perfbalance_memory_bandwidth_saturation_ratio", "Memory bandwidth / sustainable bandwidth per NUMA domain (only when the peak is known).", labels=["domain"])
    for node, value in sorted(domain_bandwidth(snap).items()):
        bw.add_metric([str(node)], value)
        peak = bandwidth_peak(snap, node, configured_peak)
        if peak > 0:
            sat.add_metric([str(node)], value / peak)
    yield from (bw, sat)


def _finite(v: float) -> float:
    return v if math.isfinite(v) else 0.0


# -- the JSON behind the node view ------------------------------------------------------------

def state_json(view: Mapping[str, Any], *, bandwidth_peak: float = 0.0) -> dict[str, Any]:
    """/api/state: the latest report as `run --json` prints it, plus what the node view draws."""
    report: CycleReport | None = view["latest"]
    out: dict[str, Any] = {
        "node": view["node"], "ready": view["ready"],
        "config": {"valid": view["config_valid"], "error": view["config_error"]},
        "counters": {"rollbacks_total": view["rollbacks_total"],
                     "drift_reasserted_total": view["drift_reasserted_total"],
                     "moves_total": sum(view["moves_total"].values())},
        "mqtt": dict(view["extra"].get("mqtt") or {}),
        "report": None, "view": {"cpus": [], "containers": [], "decisions": [], "domains": []},
    }
    if report is not None:
        out["report"] = report.to_json()
        out["view"] = _view(report, view, bandwidth_peak)
    return json_safe(out)


def _view(report: CycleReport, view: Mapping[str, Any], peak: float) -> dict[str, Any]:
    snap = report.snapshot
    ratios = report.contamination
    names = {s.id: display_name(s) for s in snap.containers}
    return {
        "cycle": report.cycle, "time": report.time, "window": snap.window,
        "cpus": [{"id": c.cpu, "core": c.core, "node": c.node, "l3": c.l3, "avx512": c.avx512,
                  "heavy": c.heavy, "mpki": c.mpki, "bandwidth": c.bandwidth,
                  "classes": list(c.classes), "containers": list(c.containers)} for c in cpu_heat(snap)],
        "containers": [_container_row(s, names[s.id], ratios.get(s.id, 0.0)) for s in snap.containers],
        "decisions": _decision_rows(view, names),
        "domains": [{"domain": n, "bandwidth": v, "peak": bandwidth_peak(snap, n, peak)}
                    for n, v in sorted(domain_bandwidth(snap).items())],
        "collectors": {k: {"up": v.up, "reason": v.reason} for k, v in sorted(snap.collectors.items())},
    }


def _container_row(s: ContainerSample, name: str, contaminated: float) -> dict[str, Any]:
    m = s.metrics
    return {"id": s.id, "name": name, "cpuset": str(s.container.cpuset), "class": rdt_class(s),
            "qos": s.container.qos, "heavy": is_heavy(s), "contamination": contaminated,
            "avx512": m.get("avx512_active_ratio"), "evex256": m.get("evex256_ratio"),
            "ipc": m.get("ipc"), "mpki": m.get("llc_mpki"), "cpu": m.get("cpu_usage_cores"),
            "bandwidth": m.get("memory_bandwidth_bytes_per_second")}


def _decision_rows(view: Mapping[str, Any], names: Mapping[str, str]) -> list[dict[str, Any]]:
    realized = {r.event_id: r for r in view["realized"]}
    rows = []
    for a in reversed(view.get("recent_applied", [])):
        row = a.to_json()
        row["name"] = names.get(a.container, a.container)
        r = realized.get(a.event_id)
        row["realized"] = None if r is None else {"gain": r.realized, "predicted": r.predicted,
                                                   "rolled_back": r.rolled_back}
        rows.append(row)
    return rows


def json_safe(obj: Any) -> Any:
    """Replace NaN/inf (not JSON) by null, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
