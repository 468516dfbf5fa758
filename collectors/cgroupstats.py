"""CPU usage, CFS throttling, pressure (PSI) and memory per container, straight from cgroupfs.

The cheapest signals there are, and the ones the kernel itself accounts: the planner's notion of
"how many cores does this container use" and "is it being throttled or stalled" comes from here.
v1 (cpuacct.usage, cpu.stat, memory.usage_in_bytes), v2 (cpu.stat, memory.current) and hybrid
hosts (v1 controllers + PSI from the unified hierarchy) are read through collectors.cgroupfs.
Rates come from deltas between two windows; a counter that went backwards (the cgroup was
re-created under the same path) restarts the series instead of producing a negative rate.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from collectors import cgroupfs as cg
from collectors.bpfenv import LogOnce
from collectors.base import Metrics
from perfbalance.errors import ContainerGone, FeatureUnavailable, PerfbalanceError
from perfbalance.model import CollectorStatus, Container

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Reading:
    """Cumulative counters of one container at one time (units: microseconds, bytes)."""

    usage_usec: int | None
    nr_periods: int = 0
    nr_throttled: int = 0
    throttled_usec: int = 0
    memory_bytes: int | None = None
    psi_cpu_some: float | None = None
    psi_memory_some: float | None = None


def metrics(cur: Reading, prev: Reading | None, window: float) -> dict[str, float]:
    """One container's metrics for a window (pure)."""
    out: dict[str, float] = {"cpu_throttled_seconds_total": cur.throttled_usec / 1e6}
    if cur.usage_usec is not None:
        out["cpu_seconds_total"] = cur.usage_usec / 1e6
    for name in ("memory_bytes", "psi_cpu_some", "psi_memory_some"):
        value = getattr(cur, name)
        if value is not None:
            out[name] = float(value)
    if prev is None or window <= 0:
        return out
    if cur.usage_usec is not None and prev.usage_usec is not None and cur.usage_usec >= prev.usage_usec:
        out["cpu_usage_cores"] = (cur.usage_usec - prev.usage_usec) / 1e6 / window
    periods = cur.nr_periods - prev.nr_periods
    throttled = cur.nr_throttled - prev.nr_throttled
    if periods > 0 and throttled >= 0:
        out["cpu_throttled_ratio"] = min(1.0, throttled / periods)
    elif periods == 0:
        out["cpu_throttled_ratio"] = 0.0
    return out


class CgroupStatsCollector:
    """The `cgroup_stats` collector. Implements collectors.base.Collector."""

    name = "cgroup_stats"

    def __init__(self, *, cgroupfs: Any, enabled: bool = True) -> None:
        self.cgroupfs, self.enabled = cgroupfs, enabled
        self._prev: dict[str, Reading] = {}
        self._last: float | None = None
        self._status = CollectorStatus(up=False, reason="not started")
        self._log = LogOnce(log)
        self._usage_v1 = self._cpu_v1 = self._mem_v1 = False
        self._psi = False

    def start(self) -> CollectorStatus:
        if not self.enabled:
            return self._set(False, "disabled in config (collectors.cgroup_stats)")
        fs = self.cgroupfs
        try:
            self._usage_v1 = fs.has("cpuacct") and fs.version("cpuacct") == 1
            self._cpu_v1 = fs.has("cpu") and fs.version("cpu") == 1
            self._mem_v1 = fs.has("memory") and fs.version("memory") == 1
            self._psi = fs.has(None) and _exists(fs, "", "cpu.pressure")
            if not self._usage_v1 and not fs.has(None):
                raise FeatureUnavailable("cgroup_stats", f"neither v1 cpuacct nor cgroup v2 under {fs.root}")
        except (PerfbalanceError, OSError) as e:
            return self._set(False, getattr(e, "reason", str(e)))
        notes = [] if self._psi else ["no PSI (kernel without CONFIG_PSI or psi=0, or no cgroup v2)"]
        return self._set(True, "; ".join(notes), usage="cpuacct.usage" if self._usage_v1 else "cpu.stat",
                         psi=self._psi)

    def status(self) -> CollectorStatus:
        return self._status

    def close(self) -> None:
        self._prev = {}

    def _set(self, up: bool, reason: str, **detail: Any) -> CollectorStatus:
        self._status = CollectorStatus(up=up, reason=reason, detail=detail)
        return self._status

    def collect(self, containers: Sequence[Container], now: float) -> Metrics:
        if not self._status.up:
            return {}
        window = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        out: dict[str, dict[str, float]] = {}
        prev, self._prev = self._prev, {}
        for c in containers:
            try:
                cur = self.read(c.cgroup)
            except (PerfbalanceError, OSError) as e:
                if not isinstance(e, ContainerGone):
                    self._log.warning(f"cgroup_stats: {c.id}: {e}")
                continue
            self._prev[c.id] = cur
            out[c.id] = metrics(cur, prev.get(c.id), window)
        return out

    def read(self, rel: str) -> Reading:
        """One container's counters (ContainerGone when its cgroup vanished)."""
        fs = self.cgroupfs
        stat = cg.parse_cpu_stat(fs.read(rel, "cpu" if self._cpu_v1 else None, "cpu.stat"))
        usage = cg.parse_cpuacct_usage(fs.read(rel, "cpuacct", "cpuacct.usage")) if self._usage_v1 else stat.usage_usec
        mem_text = fs.try_read(rel, "memory" if self._mem_v1 else None,
                               "memory.usage_in_bytes" if self._mem_v1 else "memory.current")
        return Reading(usage_usec=usage, nr_periods=stat.nr_periods, nr_throttled=stat.nr_throttled,
                       throttled_usec=stat.throttled_usec,
                       memory_bytes=cg.parse_memory_usage(mem_text) if mem_text else None,
                       psi_cpu_some=self._pressure(rel, "cpu.pressure"),
                       psi_memory_some=self._pressure(rel, "memory.pressure"))

    def _pressure(self, rel: str, name: str) -> float | None:
        if not self._psi:
            return None
        text = self.cgroupfs.try_read(rel, None, name)
        return cg.parse_psi(text).some_avg10 if text else None


def _exists(fs: Any, rel: str, name: str) -> bool:
    try:
        return fs.try_read(rel, None, name) is not None
    except (PerfbalanceError, OSError):
        return False
