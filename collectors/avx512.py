"""Per-container AVX-512 use: real 512-bit execution apart from "EVEX-256", smoothed, with hysteresis.

cri-resource-manager tags nearly every process as an AVX-512 user on a modern glibc because it
counts opmask and ymm16-31 use (bits 5|7 of the saved FPU state). bpf/avx512.bpf.c counts, per
cgroup, FPU-state switches with ZMM_Hi256 (bit 6: 512-bit execution, the frequency-lowering kind),
switches with only bits 5/7 (EVEX-256) and all switches. This module turns the map's cumulative
counts into per-window ratios (never deleting what it reads, except entries of cgroups that no
longer exist), smooths them with an EWMA and classifies a container AVX-512-heavy only after it
crosses `threshold_on`, and not-heavy only below `threshold_off`.

Without BPF, /proc/<tid>/arch_status gives a coarse signal (collectors/archstatus.py) reported
with `avx512_coarse = 1`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import bpf
from collectors import archstatus
from collectors.base import IdleMetrics, LogOnce, Metrics
from collectors.bpfenv.counting import CountingProgram
from collectors.bpfenv.keys import KeyMaps
from collectors.config import Avx512Config
from perfbalance.errors import FeatureUnavailable, PerfbalanceError
from perfbalance.host import HostPaths
from perfbalance.model import CollectorStatus, Container

log = logging.getLogger(__name__)

FIELDS = ("zmm", "evex256", "all")


@dataclass(frozen=True, kw_only=True)
class Counts:
    """FPU-state switches of one container in one window."""

    zmm: int = 0
    evex256: int = 0
    all: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(zmm=self.zmm + other.zmm, evex256=self.evex256 + other.evex256,
                      all=self.all + other.all)


@dataclass(frozen=True, kw_only=True)
class Smoothed:
    active: float  # EWMA of zmm / all
    evex256: float | None  # EWMA of evex256 / all (None in coarse mode)
    heavy: bool


def smooth(prev: Smoothed | None, active: float | None, evex256: float | None,
           cfg: Avx512Config) -> Smoothed | None:
    """One EWMA step plus hysteresis. A window without switches (the container did not run)
    carries no evidence and leaves the state as it was."""
    if active is None:
        return prev
    a = cfg.ewma_alpha
    if prev is None:
        s_active, s_evex = active, evex256
    else:
        s_active = a * active + (1 - a) * prev.active
        s_evex = None if evex256 is None else (
            evex256 if prev.evex256 is None else a * evex256 + (1 - a) * prev.evex256)
    heavy = prev.heavy if prev is not None else False
    if not heavy and s_active >= cfg.threshold_on:
        heavy = True
    elif heavy and s_active <= cfg.threshold_off:
        heavy = False
    return Smoothed(active=s_active, evex256=s_evex, heavy=heavy)


def window_metrics(counts: Counts, state: Smoothed | None, window: float, *, coarse: bool) -> dict[str, float]:
    """The per-container metrics of COMMON/docs/metrics.md for one window."""
    out: dict[str, float] = {"avx512_coarse": 1.0 if coarse else 0.0,
                             "avx512_heavy": 1.0 if state is not None and state.heavy else 0.0}
    if not coarse and window > 0:
        out["avx512_switches_per_second"] = counts.zmm / window
        out["evex256_switches_per_second"] = counts.evex256 / window
        out["fpu_switches_per_second"] = counts.all / window
    if state is not None:
        out["avx512_active_ratio"] = state.active
        if state.evex256 is not None:
            out["evex256_ratio"] = state.evex256
    return out


def per_container(deltas: Mapping[int, tuple[int, ...]], owners: Mapping[int, tuple[str, str]]) -> dict[str, Counts]:
    """Sum the per-key deltas (cgroup ids or pids) of each container."""
    out: dict[str, Counts] = {}
    for key, d in deltas.items():
        owner = owners.get(key)
        if owner is not None:
            out[owner[0]] = out.get(owner[0], Counts()) + Counts(zmm=d[0], evex256=d[1], all=d[2])
    return out


# Events a CPU gathers before adding them to the shared map (bpf/avx512.bpf.c): the map's lookup
# and atomic adds run once per FLUSH events of one key instead of once per event.
FLUSH = 32


def bpf_defines(config: Avx512Config, *, pid_keys: bool) -> dict[str, bpf.DefineValue]:
    """The -D flags of bpf/avx512.bpf.c for this configuration (pure: `doctor --dump-bpf`)."""
    return {"PB_MAX_KEYS": config.max_keys, "PB_KEY_PID": pid_keys, "PB_FLUSH": FLUSH}


class Avx512Collector(CountingProgram):
    """The `avx512` collector (see the module docstring). Implements collectors.base.Collector."""

    name = "avx512"

    def __init__(self, *, config: Avx512Config, host: HostPaths, cgroupfs: Any,
                 pid_keys: bool | None = None, keymaps: KeyMaps | None = None) -> None:
        super().__init__(host=host, cgroupfs=cgroupfs, pid_keys=pid_keys, keymaps=keymaps)
        self.config = config
        self._owners: dict[int, tuple[str, str]] = {}
        self._state: dict[str, Smoothed] = {}
        self._idle = IdleMetrics()
        self._last: float | None = None
        self._log = LogOnce(log)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> CollectorStatus:
        if not self.config.enabled:
            return self._set(False, "disabled in config (collectors.avx512.enabled)")
        bpf_reason = ""
        if self.config.source in ("auto", "bpf"):
            try:
                return self._start_bpf()
            except (FeatureUnavailable, PerfbalanceError, OSError) as e:
                bpf_reason = getattr(e, "reason", str(e))
                self._log.warning(f"avx512: BPF unavailable: {bpf_reason}")
        if self.config.source == "bpf":
            return self._set(False, f"BPF unavailable: {bpf_reason}")
        if archstatus.supported(self.host.procfs):
            why = f"BPF unavailable ({bpf_reason}); " if bpf_reason else ""
            return self._set(True, why + "coarse signal from /proc/<tid>/arch_status (includes EVEX-256)",
                             source="arch_status", coarse=True)
        return self._set(False, (f"BPF unavailable ({bpf_reason}); " if bpf_reason else "")
                         + f"no AVX-512 arch_status in {self.host.procfs} (CPU without AVX-512F?)")

    def _start_bpf(self) -> CollectorStatus:
        return self.load("avx512", lambda pid_keys: bpf_defines(self.config, pid_keys=pid_keys), counts="avx_counts",
                         pending="avx_pending", counts_field="n", fields=FIELDS, max_keys=self.config.max_keys)

    @property
    def coarse(self) -> bool:
        return bool(self._status.detail.get("coarse"))

    # -- collection ---------------------------------------------------------------------------
    def collect(self, containers: Sequence[Container], now: float) -> Metrics:
        if not self._status.up:
            return {}
        window = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        try:
            counts = self._coarse(containers, window) if self.coarse else self._fine(containers, now)
        except (PerfbalanceError, OSError) as e:
            self._log.warning(f"avx512: collection failed: {e}")
            return {}
        return self._metrics(containers, counts, window)

    def _fine(self, containers: Sequence[Container], now: float) -> dict[str, tuple[Counts, float | None, float | None]]:
        assert self._map is not None and self._keys is not None
        deltas = self._map.deltas()
        owners = self._keys.build(containers, deltas.keys(), now=now)
        self._map.prune(self._owners, owners)
        self._owners = owners
        out = {}
        for cid, c in per_container(deltas, owners).items():
            ratios = (c.zmm / c.all, c.evex256 / c.all) if c.all else (None, None)
            out[cid] = (c, *ratios)
        return out

    def _coarse(self, containers: Sequence[Container], window: float) -> dict[str, tuple[Counts, float | None, float | None]]:
        out = {}
        if window <= 0:
            return out
        for c in containers:
            try:
                tids = self.cgroupfs.tids(c.cgroup, recursive=True)[: self.config.coarse_max_threads]
            except (PerfbalanceError, OSError):
                continue
            summary = archstatus.summarize((archstatus.read_arch_status(self.host.procfs, t) for t in tids), window)
            out[c.id] = (Counts(), summary.ratio, None)
        return out

    def _metrics(self, containers: Sequence[Container], counts: Mapping[str, tuple[Counts, float | None, float | None]],
                 window: float) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        state: dict[str, Smoothed] = {}
        coarse, idle = self.coarse, self._idle
        for c in containers:
            got = counts.get(c.id)
            before = self._state.get(c.id)
            if got is None and window > 0:  # no switches: the state stays, the rates are zero
                if before is not None:
                    state[c.id] = before
                out[c.id] = idle.get(c.id, before) or idle.put(
                    c.id, before, window_metrics(Counts(), before, window, coarse=coarse))
                continue
            n, active, evex = got or (Counts(), None, None)
            s = smooth(before, active, evex, self.config)
            if s is not None:
                state[c.id] = s
            out[c.id] = window_metrics(n, s, window, coarse=coarse)
        idle.end_cycle()
        self._state = state  # containers that left are forgotten (churn)
        return out
