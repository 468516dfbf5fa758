"""CPU usage, CFS throttling, pressure (PSI) and memory per container, straight from cgroupfs.

The cheapest signals there are, and the ones the kernel itself accounts: the planner's notion of
"how many cores does this container use" and "is it being throttled or stalled" comes from here.
v1 (cpuacct.usage, cpu.stat, memory.usage_in_bytes), v2 (cpu.stat, memory.current) and hybrid
hosts (v1 controllers + PSI from the unified hierarchy) are read through perfbalance.cgroupfs.
Rates come from deltas between two windows; a counter that went backwards (the cgroup was
re-created under the same path) restarts the series instead of producing a negative rate.
"""

from __future__ import annotations

import errno
import logging
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from perfbalance import cgroupfs as cg
from collectors.base import LogOnce, Metrics
from collectors.filecache import FileCache
from perfbalance.errors import ContainerGone, FeatureUnavailable, ParseError, PerfbalanceError
from perfbalance.model import CollectorStatus, Container

log = logging.getLogger(__name__)


SLOW_EVERY = 2  # memory usage and memory PSI are read every this many cycles per container


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
    if cur.throttled_usec >= prev.throttled_usec:
        out["cpu_throttled_seconds_per_second"] = (cur.throttled_usec - prev.throttled_usec) / 1e6 / window
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

    def __init__(self, *, cgroupfs: Any, enabled: bool = True, max_open_files: int = 20000) -> None:
        self.cgroupfs, self.enabled, self.max_open_files = cgroupfs, enabled, max_open_files
        self._files: FileCache | None = None
        self._prev: dict[str, Reading] = {}
        self._last: float | None = None
        self._status = CollectorStatus(up=False, reason="not started")
        self._log = LogOnce(log)
        self._usage_v1 = self._cpu_v1 = self._mem_v1 = False
        self._psi = False
        self._cycle = 0
        self._raw: dict[str, tuple[RawFiles, Reading]] = {}  # cgroup -> its files' bytes, parsed
        self._out: dict[str, tuple[dict[str, float], bool]] = {}  # id -> last metrics, steady
        self._phases: dict[str, int] = {}
        # without and with the slow files: their RawFiles slots and (controller, name), read back
        # to back (FileCache.read_group)
        self._group: dict[bool, tuple[tuple[int, ...], tuple[tuple[str | None, str], ...]]] = {}

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
        self._files = FileCache.within_budget(fs, wanted=self.max_open_files)
        self._group = {slow: _group(self._files_of(slow)) for slow in (False, True)}
        notes = [] if self._psi else ["no PSI (kernel without CONFIG_PSI or psi=0, or no cgroup v2)"]
        return self._set(True, "; ".join(notes), usage="cpuacct.usage" if self._usage_v1 else "cpu.stat",
                         psi=self._psi)

    def _files_of(self, slow: bool) -> list[tuple[int, str | None, str]]:
        """(RawFiles slot, controller, name) of the files read in a cycle, with or without the slow."""
        out: list[tuple[int, str | None, str]] = [(0, "cpu" if self._cpu_v1 else None, "cpu.stat")]
        out += [(1, "cpuacct", "cpuacct.usage")] if self._usage_v1 else []
        out += [(2, None, "cpu.pressure")] if self._psi else []
        if slow:
            out.append((3, "memory", "memory.usage_in_bytes") if self._mem_v1 else (3, None, "memory.current"))
            out += [(4, None, "memory.pressure")] if self._psi else []
        return out

    def status(self) -> CollectorStatus:
        return self._status

    def close(self) -> None:
        self._prev, self._raw, self._out = {}, {}, {}
        if self._files is not None:
            self._files.close()

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
        last_out, self._out = self._out, {}
        self._cycle += 1
        for c in containers:
            before = prev.get(c.id)
            # Memory usage and memory pressure (a 10 s average) move slowly: each container reads
            # them every SLOW_EVERY cycles, staggered, and keeps the last values in between.
            slow = before is None or (self._cycle + self._phase(c.id)) % SLOW_EVERY == 0
            try:
                cur = self.read(c.cgroup, slow=slow)
            except (PerfbalanceError, OSError) as e:
                if not isinstance(e, ContainerGone):
                    self._log.warning(f"cgroup_stats: {c.id}: {e}")
                continue
            if not slow and before is not None and (cur.memory_bytes, cur.psi_memory_some) != (
                    before.memory_bytes, before.psi_memory_some):
                cur = replace(cur, memory_bytes=before.memory_bytes, psi_memory_some=before.psi_memory_some)
            self._prev[c.id] = cur
            out[c.id] = self._metrics(c.id, cur, before, window, last_out.get(c.id))
        if self._files is not None:
            self._files.retain(c.cgroup for c in containers)
        live = {c.cgroup for c in containers}
        for rel in [r for r in self._raw if r not in live]:
            del self._raw[rel]
        if len(self._phases) > 2 * len(containers):  # containers come and go: forget the gone
            self._phases = {c.id: self._phases[c.id] for c in containers if c.id in self._phases}
        return out

    def _metrics(self, cid: str, cur: Reading, before: Reading | None, window: float,
                 last: tuple[dict[str, float], bool] | None) -> dict[str, float]:
        """metrics(cur, before, window), reused from the last cycle when nothing moved: with the
        same Reading twice every rate is zero whatever the window, so the result is the same."""
        steady = cur is before and window > 0
        m = last[0] if steady and last is not None and last[1] else metrics(cur, before, window)
        self._out[cid] = (m, steady)
        return m

    def _phase(self, cid: str) -> int:
        phase = self._phases.get(cid)
        if phase is None:
            phase = self._phases[cid] = zlib.crc32(cid.encode())
        return phase

    def read(self, rel: str, *, slow: bool = True) -> Reading:
        """One container's counters (ContainerGone when its cgroup vanished). With slow=False the
        memory usage and memory pressure files are not read: their last read values are kept
        (None before the first). When no file's bytes changed since the last read, the same
        Reading object is returned (nothing is parsed; `collect` then reuses its last metrics)."""
        f = self._files if self._files is not None else FileCache(self.cgroupfs, capacity=0)
        last = self._raw.get(rel)
        raw = self._read_raw(f, rel, slow=slow, last=None if last is None else last[0])
        if last is not None and last[0] == raw:
            return last[1]
        reading = parse_files(raw, usage_v1=self._usage_v1, source=rel)
        self._raw[rel] = (raw, reading)
        return reading

    def _read_raw(self, f: FileCache, rel: str, *, slow: bool, last: RawFiles | None) -> RawFiles:
        """The bytes of the files one Reading is parsed from (None: a file this cgroup lacks):
        back to back where all are kept open, else one by one."""
        group = self._group.get(slow)
        data = f.read_group(rel, slow, group[1]) if group is not None else None
        if group is None or data is None:
            return self._read_each(f, rel, slow=slow, last=last)
        slots = group[0]
        raw: list[bytes | None] = [None, None, None, *(last[3:] if last is not None and not slow else (None, None))]
        for slot, d in zip(slots, data):
            raw[slot] = d
        return tuple(raw)  # type: ignore[return-value]

    def _read_each(self, f: FileCache, rel: str, *, slow: bool, last: RawFiles | None) -> RawFiles:
        stat = f.read_bytes(rel, "cpu" if self._cpu_v1 else None, "cpu.stat")
        usage = f.read_bytes(rel, "cpuacct", "cpuacct.usage") if self._usage_v1 else None
        cpu_pressure = self._optional(f, rel, None, "cpu.pressure") if self._psi else None
        if not slow:
            return (stat, usage, cpu_pressure, *(last[3:] if last is not None else (None, None)))
        mem = self._optional(f, rel, "memory" if self._mem_v1 else None,
                             "memory.usage_in_bytes" if self._mem_v1 else "memory.current")
        return (stat, usage, cpu_pressure, mem, self._optional(f, rel, None, "memory.pressure") if self._psi else None)

    def _optional(self, f: FileCache, rel: str, controller: str | None, name: str) -> bytes | None:
        """A file that some cgroups lack (the root's memory.current, a controller not enabled)."""
        try:
            return f.read_bytes(rel, controller, name)
        except cg.CgroupPathRefused:
            raise
        except cg.CgroupfsError as e:
            if e.errno != errno.ENOENT:
                raise
            return None  # the cgroup is there, this file is not
        except ContainerGone:
            # Gone only if the container's CPU cgroup is gone too: a container need not have a
            # cgroup in every hierarchy of a hybrid host (e.g. none in v1 memory).
            if self.cgroupfs.exists(rel, controller):
                return None
            if not self.cgroupfs.exists(rel, "cpu" if self._cpu_v1 else None):
                raise
            return None


def _group(files: Sequence[tuple[int, str | None, str]]) -> tuple[tuple[int, ...], tuple[tuple[str | None, str], ...]]:
    return tuple(f[0] for f in files), tuple((f[1], f[2]) for f in files)


# (cpu.stat, cpuacct.usage or None on v2, cpu.pressure, memory usage, memory.pressure) as read
RawFiles = tuple[bytes, bytes | None, bytes | None, bytes | None, bytes | None]


def parse_files(raw: RawFiles, *, usage_v1: bool, source: str = "") -> Reading:
    """One Reading from the bytes of a container's files (pure; ParseError names the file)."""
    stat_b, usage_b, cpu_p, mem_b, mem_p = raw
    stat = cg.parse_cpu_stat(stat_b.decode("utf-8", errors="replace"), source=f"{source}/cpu.stat")
    usage = cg.parse_cpuacct_usage(_text(usage_b), source=f"{source}/cpuacct.usage") if usage_v1 and usage_b is not None \
        else stat.usage_usec
    mem = _text(mem_b)
    return Reading(usage_usec=usage, nr_periods=stat.nr_periods, nr_throttled=stat.nr_throttled,
                   throttled_usec=stat.throttled_usec,
                   memory_bytes=cg.parse_memory_usage(mem, source=f"{source}/memory") if mem else None,
                   psi_cpu_some=parse_psi_some_avg10(_text(cpu_p), source=f"{source}/cpu.pressure") if cpu_p else None,
                   psi_memory_some=parse_psi_some_avg10(_text(mem_p), source=f"{source}/memory.pressure") if mem_p else None)


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", errors="replace")


def parse_psi_some_avg10(text: str, *, source: str = "") -> float:
    """The `some avg10=` value of a pressure file as a 0..1 fraction.

    The hot-path subset of cgroupfs.parse_psi (which parses every field): two of these per
    container per cycle were a third of a 1000-container cycle.
    """
    if text.startswith("some avg10="):
        end = text.find(" ", 11)
        try:
            return float(text[11:end if end > 0 else None]) / 100.0
        except ValueError:
            pass
    raise ParseError("pressure", text[:80], "expected 'some avg10=<percent> ...'", source=source)


def _exists(fs: Any, rel: str, name: str) -> bool:
    try:
        return fs.try_read(rel, None, name) is not None
    except (PerfbalanceError, OSError):
        return False
