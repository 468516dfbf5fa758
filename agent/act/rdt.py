"""RDT on this node: the resctrl manager, its actuator and monitoring collector, or a reason.

`resctrl.rdt: off` never touches resctrl; `auto` uses it when mounted; `on` makes startup fail
clearly when it is unusable (cri-resource-manager's tri-state knob). Without a manager the
monitoring collector still exists and reports down with the reason, so `run --json`, metrics and
`doctor` all say why there are no LLC/MBM numbers.

Which class a container is in is decided by the agent's one class mechanism
(agent/act/classes.py, `RdtClasses` below is RDT's ClassController): the same order (planner,
container annotation, pod annotation, QoS default), the same bad-input rule (the container keeps
its class) and checkpoint as block I/O and real time. What stays here is RDT's own: the sweep
that catches threads started since the last cycle and collects departed containers' groups.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from agent.config import Config
from perfbalance.cgroupfs import Cgroupfs
from collectors.resctrl_mon import ResctrlMonCollector
from perfbalance.classes import ClassRules, decide
from perfbalance.errors import ResctrlError
from perfbalance.host import HostPaths
from perfbalance.model import Container
from resctrl.actuator import ResctrlActuator
from resctrl.config import ResctrlConfig
from resctrl.resolve import resolve
from resctrl.info import cache_sizes
from resctrl.setup import open_resctrl

log = logging.getLogger("perfbalance.resctrl")


class RdtNode:
    """The resctrl parts of one agent (manager may be None: then only the down collector)."""

    def __init__(self, config: Config, host: HostPaths, cgfs: Cgroupfs, *, source: str) -> None:
        self.host, self.cgfs, self.source = host, cgfs, source
        setup = open_resctrl(config.resctrl, procfs=host.procfs, sysfs=host.sysfs, source=source)
        self.manager = setup.manager
        self.reason = setup.reason
        if setup.report is not None:
            log.info("resctrl started: %s", setup.report)
        elif setup.reason:
            log.info("resctrl not used: %s", setup.reason)
        self.rules = rdt_rules(config.resctrl)
        self.actuator = ResctrlActuator(manager=self.manager, decides=False) if self.manager is not None else None
        self.collector = ResctrlMonCollector(manager=self.manager, reason=self.reason,
                                             tids_of=self.tids_of, cgroup_root=host.cgroup)

    def tids_of(self, c: Container) -> Sequence[int]:
        return self.cgfs.tids(c.cgroup, recursive=True)

    def label(self, containers: list[Container]) -> list[Container]:
        """Each container with the RDT class it is (or will be) in."""
        if self.actuator is None:
            return containers
        out = []
        for c in containers:
            if c.id in self.actuator.overrides:
                cls = self.actuator.overrides[c.id]
            else:  # not in a class yet: the one it will be put in after this cycle's plan
                d = decide(c, self.rules)
                cls = None if d.error else d.wanted
            out.append(dataclasses.replace(c, rdt_class=cls or ""))
        return out

    def adopt(self, placements: Mapping[str, tuple[str, str]], containers: Sequence[Container]) -> int:
        """Take back the RDT classes the planner chose before a restart (container id -> (cgroup,
        class), from the checkpoint) for containers still in that cgroup; returns how many."""
        if self.actuator is None:
            return 0
        cgroups = {c.id: c.cgroup for c in containers}
        n = 0
        for cid, (cgroup, cls) in sorted(placements.items()):
            if cgroups.get(cid) != cgroup:
                continue
            if self.actuator.adopt(cid, cls or None):
                n += 1
            else:
                log.warning("restart: RDT class %r chosen for %s is no longer configured; "
                            "its annotation/QoS class applies", cls, cid)
        return n

    def apply_class(self, container: Container, class_name: str) -> None:
        if self.actuator is None:
            raise ResctrlError(f"assign {container.id} to class", class_name, errno.ENODEV, self.reason)
        result = self.actuator.apply_class(container, class_name or None, self.tids_of(container))
        if result.error:  # ContainerGone from tids_of propagates as it is
            raise ResctrlError(f"assign {container.id} to class", class_name, errno.EINVAL, result.error)

    def maintain(self, containers: Sequence[Container]) -> list[str]:
        if self.actuator is None:
            return []
        report = self.actuator.sweep(containers, self.tids_of)
        return list(report.errors) + list(report.notes)

    def reconfigure(self, config: Config) -> None:
        self.rules = rdt_rules(config.resctrl)
        if self.manager is None:
            return
        report = self.manager.reconfigure(resolve(config.resctrl, self.manager.info,
                                                  cache_bytes=cache_sizes(self.host.sysfs),
                                                  source=self.source))
        log.info("resctrl reconfigured: %s", report)

    def node_metrics(self) -> dict[str, float]:
        cm = self.collector.class_metrics
        return cm.node_metrics() if cm is not None else {}

    def extra(self) -> dict[str, Any]:
        """CLOSID/RMID budget and per-class usage, under the keys the exporter reads."""
        cm = self.collector.class_metrics
        if cm is None:
            return {}
        return {**cm.node_metrics(), "resctrl_classes": dict(cm.classes), "resctrl_monitoring": cm.monitoring}

    def close(self) -> None:
        self.collector.close()


def rdt_rules(cfg: ResctrlConfig) -> ClassRules:
    """RDT's decision rules: its annotation key, every configured class, its QoS defaults."""
    allow = {name: c.allow_annotation for p in cfg.partition_map().values() for name, c in p.classes.items()}
    return ClassRules(controller="rdt", annotation=cfg.annotation, allow_annotation=allow,
                      qos_defaults=dict(cfg.qos_classes))


class RdtClasses:
    """RDT as one ClassController of the class mechanism (agent/act/classes.py).

    `apply` moves every thread now and records the class for RdtNode's per-cycle sweep, which
    then keeps new threads in it (so the class need not be re-applied every cycle)."""

    name = "rdt"
    reapply = False

    def __init__(self, node: RdtNode) -> None:
        self.node = node

    def unavailable(self) -> str:
        return "" if self.node.actuator is not None else (self.node.reason or "resctrl not in use")

    def begin_cycle(self) -> None:
        pass

    def apply(self, container: Container, class_name: str | None) -> list[str]:
        """Raises ResctrlError (refused, or the class is not configured) or ContainerGone."""
        if self.node.actuator is None:
            raise ResctrlError(f"assign {container.id} to class", class_name or "", errno.ENODEV, self.node.reason)
        result = self.node.actuator.apply_class(container, class_name, self.node.tids_of(container))
        if result.error:
            raise ResctrlError(f"assign {container.id} to class", class_name or "", errno.EINVAL, result.error)
        return [f"rdt: {container.id}: {result.degraded}"] if result.degraded else []

    def adopt(self, container_id: str, class_name: str | None) -> None:
        if self.node.actuator is not None:
            self.node.actuator.adopt(container_id, class_name)

    def forget(self, alive: Sequence[str]) -> None:
        pass  # the sweep forgets departed containers (and collects their groups)


def make_resctrl(config: Config, host: HostPaths, cgfs: Cgroupfs, *, source: str = "config") -> RdtNode:
    return RdtNode(config, host, cgfs, source=source)
