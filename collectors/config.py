"""Configuration of the collectors (the `collectors:` section)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from collectors.events import parse_event
from perfbalance.errors import ParseError
from perfbalance.settings import setting

MAX_PMU_EVENTS = 8


def _events(value: tuple[str, ...]) -> str | None:
    if len(value) > MAX_PMU_EVENTS:
        return f"at most {MAX_PMU_EVENTS} events"
    for text in value:
        try:
            parse_event(text)
        except ParseError as e:
            return str(e)
    return None


@dataclass(frozen=True, kw_only=True)
class Avx512Config:
    enabled: bool = setting(True, "Count AVX-512 use per container with eBPF (falls back to /proc arch_status).")
    threshold_on: float = setting(0.10, "Smoothed avx512_active_ratio above which a container becomes AVX-512-heavy.", min=0.0, max=1.0)
    threshold_off: float = setting(0.05, "Smoothed ratio below which an AVX-512-heavy container is no longer heavy (hysteresis).", min=0.0, max=1.0)
    ewma_alpha: float = setting(0.5, "Weight of the newest window in the EWMA of the AVX-512 ratios.", min=0.01, max=1.0)
    source: Literal["auto", "bpf", "arch_status"] = setting("auto", "eBPF (fine: 512-bit vs EVEX-256), /proc arch_status (coarse), or auto (BPF, else arch_status).")
    max_keys: int = setting(10240, "Entries of the BPF map (cgroups or, on v1-only hosts, processes).", min=64, max=1 << 20)
    coarse_max_threads: int = setting(256, "arch_status fallback: threads read per container per cycle.", min=1, max=100000)

    def __post_init__(self) -> None:
        if self.threshold_off > self.threshold_on:
            raise ValueError(f"threshold_off ({self.threshold_off}) must not exceed threshold_on ({self.threshold_on})")


@dataclass(frozen=True, kw_only=True)
class PerfConfig:
    mode: Literal["auto", "bpf", "cgroup", "off"] = setting("auto", "PMU attribution: BPF perf array + sched_switch (bpf), per-cgroup perf_event_open (cgroup), or auto.")
    events: tuple[str, ...] = setting(factory=lambda: ("instructions", "cycles", "llc_misses"), doc="Events to count, each read at every sched_switch that changes cgroup: the default is what the planner uses (IPC, LLC MPKI, bandwidth); add e.g. llc_references, task_clock or raw events 'name=0xCONFIG'. task-clock alone is used when no hardware event opens.", check=_events)
    max_keys: int = setting(10240, "Entries of the BPF map of per-cgroup counts.", min=64, max=1 << 20)


@dataclass(frozen=True, kw_only=True)
class RunqlatConfig:
    enabled: bool = setting(True, "Measure run-queue latency (wakeup -> switch-in delay) per container with eBPF.")
    method: Literal["auto", "sched_info", "wakeup_stamps"] = setting("auto", "How waits are measured: sched_info reads the kernel's own per-task wait accounting (task->sched_info, offsets from the running kernel's BTF) at sched_switch only; wakeup_stamps stamps wakeups and preemptions itself (three tracepoints, a clock read per wait, no struct read); auto takes sched_info where the kernel has BTF, CONFIG_SCHED_INFO and CONFIG_FAIR_GROUP_SCHED, else wakeup_stamps.")
    max_keys: int = setting(10240, "Entries of the BPF map of per-cgroup latency histograms (cgroups or, on v1-only hosts, processes).", min=64, max=1 << 20)
    max_tasks: int = setting(65536, "wakeup_stamps only: slots of the BPF array of runnable-since times, indexed by thread id (rounded up to a power of two; two threads waiting at once whose ids share the low bits lose one wait).", min=1024, max=1 << 22)


@dataclass(frozen=True, kw_only=True)
class CollectorsConfig:
    avx512: Avx512Config = setting(factory=Avx512Config, doc="")
    perf: PerfConfig = setting(factory=PerfConfig, doc="")
    runqlat: RunqlatConfig = setting(factory=RunqlatConfig, doc="")
    cgroup_stats: bool = setting(True, "CPU usage, throttling and PSI from cgroupfs.")
    iostat: bool = setting(True, "Block-I/O bytes and operations per second per container from cgroupfs (v1 blkio.throttle.*_recursive, v2 io.stat).")
    iostat_v1_accounting: bool = setting(True, "cgroup v1: turn on blk-throttle's I/O accounting for each block device (a no-limit rule in an empty cgroup of ours, removed again); newer kernels count v1 blkio.throttle.* only on disks where some cgroup configured a rule, so without it every container reads 0 there.")
    resctrl_monitoring: bool = setting(True, "Per-container resctrl monitoring groups (LLC occupancy, MBM) when resctrl is mounted.")
