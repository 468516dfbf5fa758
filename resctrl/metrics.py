"""Per-class LLC occupancy and MBM bytes, and the CLOSID/RMID budget, for the exporters.

A control group's mon_data covers its own RMID and all its monitoring groups (rdtgroup.c
mon_event_count sums the children), so class numbers include every container in the class.
Counters are summed over cache domains; totals are our monotonic accumulations (see counters.py).
Free CLOSIDs/RMIDs are counted from the directory tree: the kernel does not publish them, and an
RMID freed recently may still be in limbo (not reusable until its occupancy drains), so the RMID
figure is an upper bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from perfbalance.errors import ResctrlError
from resctrl.fs import Counter
from resctrl.manager import ResctrlManager

EVENTS = ("llc_occupancy", "mbm_total_bytes", "mbm_local_bytes")


@dataclass(frozen=True, kw_only=True)
class ClassUsage:
    llc_occupancy_bytes: float | None = None  # gauge
    mbm_total_bytes_total: float | None = None  # counter (ours, monotonic)
    mbm_local_bytes_total: float | None = None
    unavailable: tuple[str, ...] = ()  # events that read "Unavailable"/"Error" this time


@dataclass(frozen=True, kw_only=True)
class ResctrlMetrics:
    classes: Mapping[str, ClassUsage] = field(default_factory=dict)  # class name ("root" for the root group)
    num_closids: int = 0
    free_closids: int = 0
    num_rmids: int = 0
    free_rmids: int = 0
    monitoring: str = "off"
    monitoring_reason: str = ""
    degraded: Mapping[str, str] = field(default_factory=dict)

    def node_metrics(self) -> dict[str, float]:
        """Flat node-level numbers for Snapshot.node_metrics, named as the exporter and node status read them."""
        out = {"resctrl_closids_total": float(self.num_closids), "resctrl_closids_free": float(self.free_closids),
               "resctrl_rmids_total": float(self.num_rmids), "resctrl_rmids_free": float(self.free_rmids),
               "resctrl_degraded_classes": float(len(self.degraded))}
        return out


def budget(manager: ResctrlManager) -> tuple[int, int]:
    """(free CLOSIDs, free RMIDs) counted from every group on the mount, ours or not."""
    fs, info = manager.fs, manager.info
    ctrl = fs.ctrl_groups()
    free_closids = max(0, info.num_closids - 1 - len(ctrl)) if info.alloc_capable else 0
    if info.mon is None:
        return free_closids, 0
    mon = sum(len(fs.mon_groups(g)) for g in [""] + ctrl)
    return free_closids, max(0, info.mon.num_rmids - 1 - len(ctrl) - mon)


def class_metrics(manager: ResctrlManager) -> ResctrlMetrics:
    """Read every class group's counters once (and the root's) and the budget."""
    info = manager.info
    groups = {"root": ""} | {cls: rel for cls, rel in manager.class_groups.items()}
    usage = {}
    if info.mon_capable:
        for cls, rel in groups.items():
            try:
                usage[cls] = _usage(manager, ("class", cls), manager.fs.counters(rel))
            except ResctrlError:
                continue
    free_closids, free_rmids = budget(manager)
    return ResctrlMetrics(classes=usage, num_closids=info.num_closids, free_closids=free_closids,
                          num_rmids=info.mon.num_rmids if info.mon else 0, free_rmids=free_rmids,
                          monitoring=manager.monitoring_mode(), monitoring_reason=manager.mon_reason,
                          degraded=dict(manager.degraded))


def _usage(manager: ResctrlManager, key: tuple[str, str], counters: Mapping[str, Mapping[int, Counter]]) -> ClassUsage:
    unavailable = []
    values: dict[str, float | None] = {}
    for event in EVENTS:
        doms = counters.get(event)
        if doms is None:
            values[event] = None
            continue
        if any(c.value is None for c in doms.values()):
            unavailable.append(event)
        if event == "llc_occupancy":
            known = [c.value for c in doms.values() if c.value is not None]
            values[event] = float(sum(known)) if known else None
            continue
        for d, c in doms.items():
            manager.tracker.update((key, event, d), c.value)
        totals = [manager.tracker.total((key, event, d)) for d in doms]
        values[event] = float(sum(t for t in totals if t is not None)) if any(t is not None for t in totals) else None
    return ClassUsage(llc_occupancy_bytes=values["llc_occupancy"], mbm_total_bytes_total=values["mbm_total_bytes"],
                      mbm_local_bytes_total=values["mbm_local_bytes"], unavailable=tuple(unavailable))
