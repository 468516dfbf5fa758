"""resctrl monitoring per container: LLC occupancy and memory bandwidth (MBM) in the sample window.

Each container gets a monitoring group under its current control group (resctrl/manager.py keeps
it there across class moves and re-sweeps new threads every cycle). Counters are cumulative bytes:
rates come from deltas over the window, totals are our monotonic sums (resctrl/counters.py: a
decrease is a reset, "Unavailable" is no sample). When RMIDs run out the remaining containers are
monitored by class only, and `status().detail` says how many and why.
Measured bandwidth is labelled memory_bandwidth_estimated=0. Where the node has no MBM, the agent
estimates it from the PMU collector's LLC misses after merging every collector's metrics
(agent/snapshot/derive.py), labelled memory_bandwidth_estimated=1.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from collectors.base import LogOnce, Metrics
from perfbalance.errors import ContainerGone, PerfbalanceError, ResctrlError
from perfbalance.model import CollectorStatus, Container
from resctrl.fs import Counter
from resctrl.manager import ResctrlManager
from resctrl.metrics import ResctrlMetrics, class_metrics
from resctrl.tids import cgroup_tids

log = logging.getLogger(__name__)
TidsOf = Callable[[Container], Sequence[int]]


class ResctrlMonCollector:
    name = "resctrl"

    def __init__(self, *, manager: ResctrlManager | None, reason: str = "", tids_of: TidsOf | None = None,
                 cgroup_root: str = "/sys/fs/cgroup") -> None:
        self.manager = manager
        self._reason = reason
        self.tids_of: TidsOf = tids_of or (lambda c: cgroup_tids(cgroup_root, c.cgroup))
        self._status = CollectorStatus(up=False, reason="not started")
        self._last: dict[str, float] = {}  # container -> time of its previous sample
        self.class_metrics: ResctrlMetrics | None = None  # per class and budget, for exporters
        self._logged = False
        self._log = LogOnce(log)

    def start(self) -> CollectorStatus:
        m = self.manager
        if m is None:
            self._status = CollectorStatus(up=False, reason=self._reason or "resctrl is not available")
        elif not m.info.mon_capable:
            self._status = CollectorStatus(up=False, reason=f"resctrl has no monitoring on this node (no info/L3_MON; offers: {m.info.describe()})")
        else:
            self._status = CollectorStatus(up=True, detail={"features": list(m.info.mon.features) if m.info.mon else []})
        if not self._status.up and not self._logged:
            log.info("resctrl monitoring down: %s", self._status.reason)
            self._logged = True
        return self._status

    def status(self) -> CollectorStatus:
        return self._status

    def collect(self, containers: Sequence[Container], now: float) -> Metrics:
        m = self.manager
        if m is None or not self._status.up:
            return {}
        out: dict[str, dict[str, float]] = {}
        for c in containers:
            try:
                metrics = self._one(m, c, now)
            except ContainerGone:
                continue
            except ResctrlError as e:
                log.warning("resctrl monitoring of %s: %s", c.id, e)
                continue
            except PerfbalanceError as e:  # a refused (symlinked) or oversized thread list
                self._log.warning(f"resctrl monitoring of {c.id}: {e}")
                continue
            if metrics is not None:
                out[c.id] = metrics
        alive = {c.id for c in containers}
        self._last = {k: v for k, v in self._last.items() if k in alive}
        self._finish_cycle(m, alive)
        return out

    def _finish_cycle(self, m: ResctrlManager, alive: set[str]) -> None:
        try:
            m.gc(alive)
            self.class_metrics = class_metrics(m)
        except ResctrlError as e:
            log.warning("resctrl class metrics: %s", e)
        detail = {"mode": m.monitoring_mode(), "monitored_by_class": len(m.by_class & alive)}
        if m.by_class & alive:
            detail["reason"] = m.mon_reason
        self._status = CollectorStatus(up=True, detail=detail)

    def _one(self, m: ResctrlManager, c: Container, now: float) -> dict[str, float] | None:
        rel = m.monitor(c.id, self.tids_of(c))
        if rel is None:
            return None
        counters = m.fs.counters(rel)
        prev = self._last.get(c.id)
        self._last[c.id] = now
        window = now - prev if prev is not None else 0.0
        return _container_metrics(m, c.id, counters, window)

    def close(self) -> None:
        """Forget our state; monitoring groups with tasks stay (never removed) and are adopted next start."""
        if self.manager is not None:
            try:
                self.manager.gc(set())
            except ResctrlError as e:
                log.warning("resctrl close: %s", e)
        self._status = CollectorStatus(up=False, reason="closed")


def _container_metrics(m: ResctrlManager, cid: str, counters: Mapping[str, Mapping[int, Counter]],
                       window: float) -> dict[str, float]:
    out: dict[str, float] = {}
    occ = counters.get("llc_occupancy", {})
    known = [c.value for c in occ.values() if c.value is not None]
    if known:
        out["llc_occupancy_bytes"] = float(sum(known))
    for event, name in (("mbm_total_bytes", "mbm_total_bytes"), ("mbm_local_bytes", "mbm_local_bytes")):
        doms = counters.get(event)
        if not doms:
            continue
        deltas = [m.tracker.update((cid, event, d), c.value) for d, c in doms.items()]
        totals = [m.tracker.total((cid, event, d)) for d in doms]
        out[f"{name}_total"] = float(sum(t for t in totals if t is not None))
        if window > 0 and all(x is not None for x in deltas):
            out[f"{name}_per_second"] = sum(x for x in deltas if x is not None) / window
    if "mbm_total_bytes_per_second" in out:
        out["memory_bandwidth_bytes_per_second"] = out["mbm_total_bytes_per_second"]
        out["memory_bandwidth_estimated"] = 0.0
    return out
