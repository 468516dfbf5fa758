"""Configuration of the collectors (the `collectors:` section)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from perfbalance.settings import setting


@dataclass(frozen=True, kw_only=True)
class Avx512Config:
    enabled: bool = setting(True, "Count AVX-512 use per container with eBPF (falls back to /proc arch_status).")
    threshold_on: float = setting(0.10, "Smoothed avx512_active_ratio above which a container becomes AVX-512-heavy.", min=0.0, max=1.0)
    threshold_off: float = setting(0.05, "Smoothed ratio below which an AVX-512-heavy container is no longer heavy (hysteresis).", min=0.0, max=1.0)
    ewma_alpha: float = setting(0.5, "Weight of the newest window in the EWMA of the AVX-512 ratios.", min=0.01, max=1.0)


@dataclass(frozen=True, kw_only=True)
class PerfConfig:
    mode: Literal["auto", "bpf", "cgroup", "off"] = setting("auto", "PMU attribution: BPF perf array + sched_switch (bpf), per-cgroup perf_event_open (cgroup), or auto.")
    events: tuple[str, ...] = setting(factory=lambda: ("instructions", "cycles", "llc_references", "llc_misses"), doc="Hardware events to count; raw events as 'name=0xCONFIG'. Software events are used when no PMU exists.")


@dataclass(frozen=True, kw_only=True)
class CollectorsConfig:
    avx512: Avx512Config = setting(factory=Avx512Config, doc="")
    perf: PerfConfig = setting(factory=PerfConfig, doc="")
    cgroup_stats: bool = setting(True, "CPU usage, throttling and PSI from cgroupfs.")
    resctrl_monitoring: bool = setting(True, "Per-container resctrl monitoring groups (LLC occupancy, MBM) when resctrl is mounted.")
