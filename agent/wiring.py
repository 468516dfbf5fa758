"""The agent's parts, built from the configuration: readers, collectors, actuators, exports.

`agent.loop.Agent` drives a cycle through this one object, so the loop stays about the order of
things (collect, snapshot, plan, act, report) and this module about which concrete part does
each step on this node. Every part that cannot work here is left out with its reason, once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any

from agent.act.classnode import ACTION_KINDS, ClassNode
from agent.act.dispatch import CpusetMoves, Dispatch, RdtMoves
from agent.act.early import EarlyClasses
from agent.act.rdt import RdtNode
from agent.act.vcpu import VcpuActuator
from agent.config import Config
from agent.discover import podmeta
from agent.discover.containers import discover
from agent.discover.kubelet import KubeletStateReader
from agent.discover.sysfs import read_topology
from agent.discover.vmm import VmmDiscovery
from agent.export.report import AgentState
from agent.nri.metadata import container_of, pod_infos
from agent.nri.model import Ctr, Placement, Pod
from agent.nri.runtime import ACTUATION_STATUS_FILE, NriRuntime, NriSettings, write_status
from agent.snapshot.nodecpu import NodeCpu
from collectors.base import Collector
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.cpuset import CpuSet
from perfbalance.errors import ContainerGone, ParseError, PerfbalanceError
from perfbalance.host import HostPaths
from perfbalance.model import Action, CollectorStatus, Container, KubeletState, Snapshot
from perfbalance.sandbox import VcpuPinning, VmmProcess
from perfbalance.topology import Topology

log = logging.getLogger("perfbalance.parts")

# Sections read when the parts are built; a reload logs that they apply at the next start.
RESTART_SECTIONS = ("host", "collectors", "metrics", "mqtt", "runtime")


def host_paths(config: Config) -> HostPaths:
    h = config.host
    return HostPaths(sysfs=h.sysfs_root, procfs=h.procfs_root, cgroup=h.cgroup_root,
                     tracefs=h.tracefs_root, modules=h.modules_root, kubelet=h.kubelet_root,
                     run_dir=config.agent.run_dir, headers_search=tuple(h.headers_search))


class Parts:
    """Everything one agent uses on this node."""

    def __init__(self, config: Config, node: str, *, config_source: str = "embedded defaults") -> None:
        self.config, self.node, self.config_source = config, node, config_source
        self.host = host_paths(config)
        self.cgfs = Cgroupfs(root=config.host.cgroup_root)
        self.topology: Topology = read_topology(config.host.sysfs_root, procfs_root=config.host.procfs_root)
        self.kubelet_reader = KubeletStateReader(config.host.kubelet_root)
        self.kubelet: KubeletState = KubeletState()
        self.collectors: list[Collector] = []
        self._collector_errors: list[str] = []
        self._last_status: dict[str, tuple[bool, str]] = {}
        self.podmeta = podmeta.open_pod_metadata(config, node=node, env=os.environ)
        self.resctrl = self._make_resctrl()
        self._make_collectors()
        self.nri = NriRuntime(NriSettings.from_config(config.runtime),
                              kubelet=KubeletStateReader(config.host.kubelet_root).read,
                              classes=self._classes_at_creation, started=self._started,
                              applied=lambda: {cid: Placement(cpus=str(cpus), mems=str(mems))
                                               for cid, (_, cpus, mems) in self.cpusets.applied().items()})
        self._actuation_written: dict[str, object] = {}
        self.node_cpu = NodeCpu(procfs=self.host.procfs)  # after the BPF compiles: not node load
        self.cpusets = self._make_cpuset_actuator()
        self.classes = ClassNode(config, self.cgfs, rdt=self.resctrl)  # RDT, block-I/O, real-time classes
        # a container NRI reports started gets its classes at once, not at the next cycle
        self.early = EarlyClasses(self.classes, self._find_started, enabled=lambda: not self.config.agent.dry_run)
        rt = config.runtime  # read at start, like the rest of the runtime: section
        self.runtime_classes = {"blockio": rt.nri_blockio_classes, "rdt": rt.nri_rdt_classes}
        self.dispatch = Dispatch({"cpuset": CpusetMoves(self.cpusets.apply),
                                  **dict.fromkeys(ACTION_KINDS, self.classes)})
        if not self.classes.uses("rdt"):  # no resctrl: the refusal says why (ResctrlError, ENODEV)
            self.dispatch.actuators["rdt_class"] = RdtMoves(self.resctrl.apply_class)
        self.vms = self._make_vms()
        self.vcpus = VcpuActuator()
        self._vmms: tuple[VmmProcess, ...] = ()
        self._vm_notes: dict[str, tuple[str, ...]] = {}  # pod -> the notes last logged
        self._containers: list[Container] = []

    # -- construction ---------------------------------------------------------------------
    def _make_collectors(self) -> None:
        from agent.snapshot.collectors import make_collectors

        self.collectors = make_collectors(self.config, self.host, self.cgfs, self.topology)
        self.collectors.append(self.resctrl.collector)
        for c in self.collectors:
            status = c.start()
            self._log_status(c.name, status)

    def _make_cpuset_actuator(self) -> Any:
        from agent.act.cpuset import CpusetActuator

        return CpusetActuator(self.cgfs, reserved=self.unusable_cpus(), kubelet=self.kubelet,
                              topology=self.topology, allow_isolated=self.config.cpuset.allow_isolated,
                              reassert_drift=self.config.cpuset.reassert_drift, route=self.nri)

    def _make_resctrl(self) -> RdtNode:
        from agent.act.rdt import make_resctrl

        return make_resctrl(self.config, self.host, self.cgfs, source=self.config_source)

    def _make_vms(self) -> VmmDiscovery | None:
        """VMM discovery (threads, hugepages) for the snapshot; the vCPU actuator is always made."""
        if not self.config.vm.enabled:
            return None
        return VmmDiscovery(config=self.config.vm, procfs_root=self.host.procfs,
                            cgroupfs=self.cgfs, sysfs_root=self.host.sysfs)

    def _log_status(self, name: str, status: CollectorStatus) -> None:
        """Log a collector's state once per change, never per cycle."""
        key = (status.up, status.reason)
        if self._last_status.get(name) == key:
            return
        self._last_status[name] = key
        if status.up:
            log.info("collector %s up%s", name, f" ({status.reason})" if status.reason else "")
        else:
            log.warning("collector %s down: %s", name, status.reason)

    def reconfigure(self, config: Config) -> None:
        """Take a reloaded config; parts whose settings are read per cycle follow at once, the
        sections bound at start (RESTART_SECTIONS) at the next start, which is logged."""
        later = [name for name in RESTART_SECTIONS if getattr(config, name) != getattr(self.config, name)]
        if later:
            log.warning("config changes in %s take effect at the next start of the agent", ", ".join(later))
        old, self.config = self.config, config
        self.resctrl.reconfigure(config)
        self.classes.reconfigure(config)
        if self.podmeta is not None:
            podmeta.reconfigure(self.podmeta, config)
        self.cpusets.reassert_drift = config.cpuset.reassert_drift
        self.cpusets.allow_isolated = config.cpuset.allow_isolated
        if config.vm != old.vm:  # patterns, enabled: a new VM sandbox part from the new section
            self.vms = self._make_vms()
            self._vmms = ()  # found by the old part: the next discovery finds them again, or not
            log.info("vm: VM sandbox support %s with the reloaded settings",
                     "rebuilt" if self.vms is not None else "off")

    def start(self) -> None:
        """At agent start: the NRI session (its own thread; cgroupfs until it is connected)."""
        self.early.start()
        for line in self.classes.unknown_names(self.runtime_classes):
            log.warning("runtime.nri_%s", line)
        self.nri.start()

    def actuation(self) -> dict[str, object]:
        """Which path moves take now (nri or cgroupfs) and why: for the report, the metrics and
        (through <run_dir>/actuation-status.json, written on change) `perfbalance doctor`."""
        status = self.nri.status()
        if status != self._actuation_written and \
                write_status(os.path.join(self.config.agent.run_dir, ACTUATION_STATUS_FILE), status):
            self._actuation_written = status
        return status

    def _classes_at_creation(self, pod: Pod, ctr: Ctr) -> dict[str, str]:
        """NRI CreateContainer: the classes to hand to the runtime (only names the operator
        listed in runtime.nri_blockio_classes / nri_rdt_classes; docs/nri.md)."""
        if self.config.agent.dry_run or not any(self.runtime_classes.values()):
            return {}
        return self.classes.at_creation(container_of(pod, ctr, podmeta.options_from_config(self.config)),
                                        self.runtime_classes)

    def _started(self, pod: Pod, ctr: Ctr) -> None:
        """NRI StartContainer (the session's thread): classes now, for a container a rule concerns."""
        if self.classes.wants_class(container_of(pod, ctr, podmeta.options_from_config(self.config))):
            self.early.started(ctr.id)

    def _find_started(self, container_id: str) -> Container | None:
        """A container NRI reports started, as this cycle's discovery would see it."""
        found = discover(self.cgfs, kubernetes=self.config.discovery.kubernetes, globs=self.config.discovery.globs,
                         kubelet=self.kubelet, procfs_root=self.config.host.procfs_root, only={container_id})
        view = self.nri.view
        if found and view is not None:
            found = podmeta.enrich(found, pod_infos(view), options=podmeta.options_from_config(self.config))
        return found[0] if found else None

    # -- per cycle --------------------------------------------------------------------------
    def unusable_cpus(self) -> CpuSet:
        reserved = CpuSet.parse(self.config.cpuset.reserved_cpus)
        if self.config.cpuset.allow_isolated:
            return reserved
        return reserved | self.topology.isolated

    def discover(self, errors: list[str]) -> tuple[list[Container], KubeletState]:
        self.kubelet = self.kubelet_reader.read()
        if self.kubelet_reader.last_error is not None:
            errors.append(str(self.kubelet_reader.last_error))
        try:
            containers = discover(self.cgfs, kubernetes=self.config.discovery.kubernetes,
                                  globs=self.config.discovery.globs, kubelet=self.kubelet,
                                  procfs_root=self.config.host.procfs_root)
        except (ParseError, PerfbalanceError) as e:  # keep the last good view, lose nothing
            errors.append(f"discovery failed, using the previous cycle's containers: {e}")
            return list(self._containers), self.kubelet
        view = self.nri.view  # names, annotations, sandbox kind: before RDT labelling
        if view is not None:  # the runtime's view while NRI is connected; no API server needed
            containers = exclusive_by_name(podmeta.enrich(containers, pod_infos(view),
                                                          options=podmeta.options_from_config(self.config)),
                                           self.kubelet)
        elif self.podmeta is not None:
            containers = exclusive_by_name(self.podmeta.enrich(containers), self.kubelet)
            errors.extend(self.classes.annotation_problems(containers))
        if self.vms is not None:  # pods whose VMM was found by its threads are VMs to the planner
            found = self.vms.find(containers)
            errors.extend(found.errors)
            self._vmms = found.vmms
            containers = mark_sandboxed(containers, {v.pod for v in found.vmms})
        self.classes.restore(containers)  # first discovery only: the previous run's classes
        containers = self.resctrl.label(containers)
        self.cpusets.update(kubelet=self.kubelet, reserved=self.unusable_cpus(), containers=containers)
        self._containers = containers
        return containers, self.kubelet

    def collect(self, containers: Sequence[Container], now: float) -> dict[str, dict[str, float]]:
        self._collector_errors = []
        merged: dict[str, dict[str, float]] = {c.id: {} for c in containers}
        for col in self.collectors:
            try:
                got = col.collect(containers, now)
            except Exception as e:  # a collector bug must not stop the agent
                log.exception("collector %s failed", col.name)
                self._collector_errors.append(f"collector {col.name}: {type(e).__name__}: {e}")
                continue
            self._log_status(col.name, col.status())
            for cid, metrics in got.items():
                if cid in merged:
                    merged[cid].update(metrics)
        from agent.snapshot.derive import derive

        return {cid: derive(metrics) for cid, metrics in merged.items()}

    def collector_errors(self) -> list[str]:
        return list(self._collector_errors)

    def collector_status(self) -> dict[str, CollectorStatus]:
        out = {c.name: c.status() for c in self.collectors}
        if self.podmeta is not None:
            out["kubernetes_api"] = self.podmeta.status()
        return out

    def node_metrics(self) -> dict[str, float]:
        return {**self.resctrl.node_metrics(), **self.node_cpu.metrics()}

    def apply(self, action: Action, container: Container) -> str | None:
        """One planned action, by the actuator of its kind (agent/act/dispatch.py); the path a
        cpuset move took (nri or cgroupfs)."""
        return self.dispatch.apply(action, container)

    def maintain(self, snapshot: Snapshot, state: AgentState,
                 pinning: Sequence[VcpuPinning] = ()) -> list[str]:
        """Per-cycle upkeep: drift re-assertion, RDT thread re-sweep, and the plan's VMM thread
        pinning (`Plan.vcpu_pinning`, planned with this cycle's moves)."""
        errors: list[str] = []
        self.nri.observe(snapshot)  # topology, reserved and exclusive CPUs for placement at creation
        containers = [s.container for s in snapshot.containers]
        n, errs = self.cpusets.maintain(containers)
        errors.extend(errs)
        if n:
            with state.lock:
                state.drift_reasserted_total += n
        errors.extend(self.early.drain())  # classes applied at NRI's StartContainer since the last cycle
        errors.extend(self.classes.sync(containers))  # RDT, block-I/O and real-time classes
        errors.extend(self.resctrl.maintain(containers))  # RDT: new threads into the class set
        with state.lock:
            state.extra.update(self.resctrl.extra())
        if self.vms is not None:
            errors.extend(self.vcpus.apply(pinning).errors)
            errors.extend(f"pod {p.pod}: {why}" for p in pinning for why in p.problems)
            self._vm_notes = log_new_notes(pinning, self._vm_notes)
        return errors

    def class_report(self, snapshot: Snapshot) -> dict[str, Any]:
        """Classes per container and per controller, for the cycle's report."""
        return self.classes.report([s.container for s in snapshot.containers])

    def vmms(self) -> tuple[VmmProcess, ...]:
        """The VMMs this cycle's discovery found (for `Snapshot.vmms`)."""
        return self._vmms

    def vcpu_map(self) -> dict[str, dict[int, int]]:
        return self.vcpus.vcpu_map()

    def vcpu_pinning(self) -> tuple[VcpuPinning, ...]:
        """The VMM thread pinnings last applied (their guest NUMA layouts go into the report)."""
        return self.vcpus.last.pinnings

    def close(self) -> None:
        self.nri.stop()  # bounded: the session thread is joined with a timeout
        self.early.stop()
        for c in self.collectors:
            try:
                c.close()
            except Exception:
                log.exception("closing collector %s", c.name)
        self.resctrl.close()


def exclusive_by_name(containers: Sequence[Container], kubelet: KubeletState) -> list[Container]:
    """With container names known, the kubelet's exclusive assignments match by name exactly
    (discovery alone can only match them by cpuset)."""
    out = []
    for c in containers:
        if c.name and c.pod_uid and (c.pod_uid, c.name) in kubelet.exclusive and not c.exclusive:
            c = dataclasses.replace(c, exclusive=True)
        out.append(c)
    return out


def log_new_notes(pinning: Sequence[VcpuPinning],
                  logged: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Log each sandbox's layout notes once, when they first appear (they are state, exported in
    `vm_sandboxes`, not an error of every cycle); returns what is logged now."""
    now = {p.pod: p.notes for p in pinning if p.notes}
    for pod, notes in sorted(now.items()):
        for note in notes:
            if note not in logged.get(pod, ()):
                log.warning("vm: pod %s: %s", pod, note)
    return now


def mark_sandboxed(containers: Sequence[Container], vm_pods: set[str]) -> list[Container]:
    """Containers of pods where a VMM runs get `sandbox="vm"` unless pod metadata named the kind."""
    return [dataclasses.replace(c, sandbox="vm") if not c.sandbox and c.pod_key in vm_pods else c
            for c in containers]


def build_parts(config: Config, node: str, config_source: str = "embedded defaults") -> Parts:
    return Parts(config, node, config_source=config_source)


__all__ = ["Parts", "build_parts", "host_paths", "ContainerGone"]
