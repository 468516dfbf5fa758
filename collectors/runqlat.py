"""Per-container run-queue latency: how long a container's runnable threads wait for a CPU.

This is what a latency-sensitive victim experiences when it shares CPUs with busy neighbours
(Heracles and PARTIES judge co-location by the victim's latency), and it exists on every Linux
node, with or without a PMU. bpf/runqlat.bpf.c keeps, per cgroup, a cumulative log2 histogram of
wakeup -> switch-in delays (plus their sum), by one of two methods (`collectors.runqlat.method`):
the kernel's own wait accounting read at sched_switch (sched_info: a tp_btf program whose struct
offsets come from the running kernel's BTF, sched_info_layout) or its own stamps at wakeup and
preemption (wakeup_stamps, the fallback where BTF, CONFIG_SCHED_INFO or CONFIG_FAIR_GROUP_SCHED
is missing). This module reads the histograms non-destructively, turns the deltas of one sample
window into a histogram per container and its p50, p99 and mean, and prunes map entries of
cgroups that are gone with the same sweep as the other BPF collectors.

Percentiles are interpolated linearly inside a log2 bucket, so they carry up to a factor of two
of resolution error; they are meant for ratios (shared vs alone, before vs after a move), not
for sub-microsecond figures.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import bpf
from collectors.base import IdleMetrics, LogOnce, Metrics
from collectors.bpfenv.btf import INT, PTR, VMLINUX, Btf, require
from collectors.bpfenv.counting import CountingProgram
from collectors.bpfenv.keys import KeyMaps
from collectors.bpfenv.rawtp import TP_BTF
from collectors.config import RunqlatConfig
from perfbalance import cpus
from perfbalance.errors import FeatureUnavailable, PerfbalanceError
from perfbalance.host import HostPaths
from perfbalance.model import CollectorStatus, Container

log = logging.getLogger(__name__)

SLOTS = 24  # PB_SLOTS in bpf/runqlat.bpf.c
FIELDS = ("slot", "sum_ns")


@dataclass(frozen=True, kw_only=True)
class Histogram:
    """Run-queue waits of one container in one window: log2 buckets of microseconds."""

    slots: tuple[int, ...] = (0,) * SLOTS  # slot i: waits in [2^(i+10), 2^(i+11)) ns (slot 0 from 0)
    sum_ns: int = 0

    def __add__(self, other: Histogram) -> Histogram:
        return Histogram(slots=tuple(a + b for a, b in zip(self.slots, other.slots)),
                         sum_ns=self.sum_ns + other.sum_ns)

    @classmethod
    def from_row(cls, row: Sequence[int]) -> Histogram:
        """A flat map row (SLOTS slots, sum_ns) as read by collectors.bpfenv.maps.read_table."""
        return cls(slots=tuple(row[:SLOTS]), sum_ns=int(row[SLOTS]))

    @property
    def count(self) -> int:
        return sum(self.slots)

    @property
    def mean_seconds(self) -> float | None:
        return self.sum_ns / self.count / 1e9 if self.count else None


def bucket_bounds(i: int) -> tuple[float, float]:
    """[low, high) of slot i in seconds: 2^(i+10) ns doubling (slot 0 starts at 0: it also
    holds waits under 1.024 us)."""
    return (0.0 if i == 0 else (1 << (i + 10)) / 1e9, (1 << (i + 11)) / 1e9)


def percentile(h: Histogram, q: float) -> float | None:
    """The q-quantile (0 < q <= 1) in seconds, linear inside the log2 bucket; None when empty."""
    total = sum(h.slots)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(h.slots):
        if n and seen + n >= rank:
            low, high = bucket_bounds(i)
            return low + (high - low) * (rank - seen) / n
        seen += n
    return bucket_bounds(SLOTS - 1)[1]


def per_container(deltas: Mapping[int, Sequence[int]], owners: Mapping[int, tuple[str, str]]) -> dict[str, Histogram]:
    """Sum the per-key (cgroup id or pid) histograms of each container; unowned keys are ignored."""
    out: dict[str, Histogram] = {}
    for key, row in deltas.items():
        owner = owners.get(key)
        if owner is not None:
            out[owner[0]] = out.get(owner[0], Histogram()) + Histogram.from_row(row)
    return out


def window_metrics(h: Histogram, window: float) -> dict[str, float]:
    """One container's run-queue metrics for a window (names in docs/metrics.md).

    The histogram's non-empty buckets are included as `runqueue_latency_bucket_<i>` (waits in
    [2^(i+10), 2^(i+11)) ns) so a snapshot keeps the shape, not only the percentiles."""
    out: dict[str, float] = {"runqueue_waits": float(h.count)}
    if window > 0:
        out["runqueue_waits_per_second"] = h.count / window
        out["runqueue_wait_seconds_per_second"] = h.sum_ns / 1e9 / window
    if h.count:
        out["runqueue_latency_mean_seconds"] = h.sum_ns / h.count / 1e9
        for name, q in (("p50", 0.50), ("p99", 0.99)):
            value = percentile(h, q)
            if value is not None:
                out[f"runqueue_latency_{name}_seconds"] = value
        out.update({f"runqueue_latency_bucket_{i}": float(n) for i, n in enumerate(h.slots) if n})
    return out


# Delays a CPU gathers before adding them to the shared histogram map (bpf/runqlat.bpf.c). The
# pending histograms are read every cycle, so the bound only caps how long a CPU that stays on one
# key keeps them: the sched_info method flushes at key changes and at a cgroup's last exit
# (measured: 225 ns per switch with 32, 182 with 4096, same alternating runs), the wakeup stamps
# keep the 32 they were measured with.
FLUSH = 32
FLUSH_SCHEDINFO = 4096

# sched_switch's raw arguments after `void *__data` (5.18+: prev_state was added last).
SCHED_SWITCH_ARGS = ("bool", "struct task_struct *", "struct task_struct *", "unsigned int")
# What the sched_info method reads: define -> (struct, member path, sizes, kinds).
SCHEDINFO_MEMBERS: dict[str, tuple[str, str, tuple[int, ...], tuple[int, ...]]] = {
    "PB_OFF_LAST_QUEUED": ("task_struct", "sched_info.last_queued", (8,), (INT,)),
    "PB_OFF_SE_CFS_RQ": ("task_struct", "se.cfs_rq", (8,), (PTR,)),  # CONFIG_FAIR_GROUP_SCHED
    "PB_OFF_CFS_RQ_RQ": ("cfs_rq", "rq", (8,), (PTR,)),
    "PB_OFF_RQ_CLOCK": ("rq", "clock", (8,), (INT,)),
    "PB_OFF_CGROUPS": ("task_struct", "cgroups", (8,), (PTR,)),
    "PB_OFF_DFL_CGRP": ("css_set", "dfl_cgrp", (8,), (PTR,)),
    "PB_OFF_KN": ("cgroup", "kn", (8,), (PTR,)),
    "PB_OFF_KN_ID": ("kernfs_node", "id", (8,), (INT,)),
    "PB_OFF_POPULATED": ("cgroup", "nr_populated_csets", (4,), (INT,)),
    "PB_OFF_TGID": ("task_struct", "tgid", (4,), (INT,)),
}


@dataclass(frozen=True, kw_only=True)
class SchedInfoLayout:
    """Where the sched_info method reads, on this kernel: the tp_btf target and the offsets."""

    btf_id: int  # typedef btf_trace_sched_switch
    offsets: Mapping[str, int]  # SCHEDINFO_MEMBERS' defines -> byte offsets


def sched_info_layout(btf: Btf) -> SchedInfoLayout:
    """The sched_info method's offsets from `btf`, or FeatureUnavailable naming what is missing
    or not as the program reads it (a kernel without CONFIG_SCHED_INFO has no
    task_struct.sched_info.last_queued, one without CONFIG_FAIR_GROUP_SCHED no
    task_struct.se.cfs_rq; one before 5.18 has no prev_state argument)."""
    btf_id, args = btf.raw_tracepoint("sched_switch")
    if tuple(args) != SCHED_SWITCH_ARGS:
        raise FeatureUnavailable("btf", f"{btf.source}: sched_switch arguments are ({', '.join(args)}), "
                                        f"not ({', '.join(SCHED_SWITCH_ARGS)})")
    offsets = {define: require(btf.member(struct, path), f"{struct}.{path}", size=sizes, kind=kinds, source=btf.source)
               for define, (struct, path, sizes, kinds) in SCHEDINFO_MEMBERS.items()}
    return SchedInfoLayout(btf_id=btf_id, offsets=offsets)


def host_layout(host: HostPaths) -> SchedInfoLayout:
    """sched_info_layout of the running kernel (its BTF under host.sysfs)."""
    return sched_info_layout(Btf.read(os.path.join(host.sysfs, VMLINUX)))


def bpf_defines(config: RunqlatConfig, *, pid_keys: bool, ncpu: int, layout: SchedInfoLayout | None = None
                ) -> dict[str, bpf.DefineValue]:
    """The -D flags of bpf/runqlat.bpf.c for this configuration (pure: `doctor --dump-bpf`) on a
    node of `ncpu` possible CPUs: the sched_info method's when `layout` is given, else the wakeup
    stamps'."""
    common: dict[str, bpf.DefineValue] = {"PB_MAX_KEYS": config.max_keys, "PB_KEY_PID": pid_keys, "PB_NCPU": ncpu}
    if layout is not None:
        return {**common, "PB_FLUSH": FLUSH_SCHEDINFO, "PB_SCHEDINFO": True, **layout.offsets}
    return {**common, "PB_FLUSH": FLUSH, "PB_TASK_BITS": max(10, (config.max_tasks - 1).bit_length())}


def choose_layout(config: RunqlatConfig, host: HostPaths) -> tuple[SchedInfoLayout | None, str]:
    """The sched_info layout to load with (None: the wakeup stamps), and why not sched_info when
    `auto` fell back (""). `sched_info` asked for and unavailable raises FeatureUnavailable."""
    if config.method == "wakeup_stamps":
        return None, ""
    try:
        return host_layout(host), ""
    except FeatureUnavailable as e:
        if config.method == "sched_info":
            raise
        return None, e.reason


class RunqlatCollector(CountingProgram):
    """The `runqlat` collector (see the module docstring). Implements collectors.base.Collector."""

    name = "runqlat"

    def __init__(self, *, config: RunqlatConfig, host: HostPaths, cgroupfs: Any,
                 pid_keys: bool | None = None, keymaps: KeyMaps | None = None) -> None:
        super().__init__(host=host, cgroupfs=cgroupfs, pid_keys=pid_keys, keymaps=keymaps)
        self.config = config
        self._owners: dict[int, tuple[str, str]] = {}
        self._last: float | None = None
        self._log = LogOnce(log)
        self.histograms: dict[str, Histogram] = {}  # the last window's, per container
        self._idle = IdleMetrics()

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> CollectorStatus:
        if not self.config.enabled:
            return self._set(False, "disabled in config (collectors.runqlat.enabled)")
        try:
            return self._start_bpf()
        except (FeatureUnavailable, PerfbalanceError, OSError) as e:
            reason = getattr(e, "reason", str(e))
            self._log.warning(f"runqlat: BPF unavailable: {reason}")
            return self._set(False, f"BPF unavailable: {reason}")

    def _start_bpf(self) -> CollectorStatus:
        layout, why_not = choose_layout(self.config, self.host)
        if layout is not None:
            try:
                return self._load(layout)
            except FeatureUnavailable as e:  # e.g. a verifier that refuses the BTF loads
                if self.config.method == "sched_info":
                    raise
                why_not = e.reason
        if why_not:
            self._log.warning(f"runqlat: sched_info method unavailable ({why_not}); using wakeup stamps")
        return self._load(None, **({"sched_info_unavailable": why_not} if why_not else {}))

    def _load(self, layout: SchedInfoLayout | None, **detail: Any) -> CollectorStatus:
        raw = None if layout is None else (bpf.SCHEDINFO_FUNCTION, layout.btf_id, "sched_switch")
        ncpu = cpus.possible_cpus(self.host.sysfs)
        return self.load("runqlat", lambda pid_keys: bpf_defines(self.config, pid_keys=pid_keys, ncpu=ncpu, layout=layout),
                         counts="rq_hist", pending="rq_cpus", ways_field="way", counts_field="pend", fields=FIELDS,
                         max_keys=self.config.max_keys, raw_tp=raw,
                         method="wakeup_stamps" if layout is None else "sched_info", **detail)

    @property
    def map_keys(self) -> int:
        """Rows of the histogram map as of the last read (for churn tests and `bench collect`)."""
        return self._map.rows if self._map is not None else 0

    def program_fds(self) -> dict[str, tuple[int, tuple[str, str]]]:
        """Loaded programs for `bench collect` (ns per event): event -> (fd, tracepoint), the
        tracepoint (TP_BTF, event) for the sched_info method's BTF raw tracepoint."""
        if self._bpf is None:
            return {}
        if self._raw is not None:
            return {self._raw.event: (self._raw.fd, (TP_BTF, self._raw.event))}
        return {tp[1]: (self._bpf.funcs[f].fd, tp) for tp in bpf.PROGRAMS["runqlat"].tracepoints
                if (f := bpf.probe_function(tp)) in self._bpf.funcs}

    # -- collection ---------------------------------------------------------------------------
    def collect(self, containers: Sequence[Container], now: float) -> Metrics:
        if not self._status.up or self._map is None or self._keys is None:
            return {}
        window = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        try:
            deltas = self._map.deltas()
            owners = self._keys.build(containers, deltas.keys(), now=now)
            self._map.prune(self._owners, owners)
        except (PerfbalanceError, OSError) as e:
            self._log.warning(f"runqlat: collection failed: {e}")
            return {}
        self._owners = owners
        self.histograms = per_container(deltas, owners)
        return self._metrics(containers, window)

    def _metrics(self, containers: Sequence[Container], window: float) -> dict[str, dict[str, float]]:
        """window_metrics of each container; an idle one's (no waits) reused while it stays idle."""
        out: dict[str, dict[str, float]] = {}
        idle = self._idle
        for c in containers:
            h = self.histograms.get(c.id)
            if h is not None or window <= 0:
                out[c.id] = window_metrics(h or Histogram(), window)
            else:
                out[c.id] = idle.get(c.id, None) or idle.put(c.id, None, window_metrics(Histogram(), window))
        idle.end_cycle()
        return out
