"""Victim health: what a container experiences, measured, so that moves are judged by it.

The cost model predicts CPU time lost to AVX-512 licenses, cache and bandwidth contention; on a
node without a PMU the only "measurement" of those is the model re-run on itself, which can
never catch a model error. Heracles, PARTIES and CPI2 judge co-location by what the victim
experiences. Signals that exist on every Linux node measure that directly:

* run-queue wait (collectors/runqlat.py): seconds per second the container's runnable threads
  spent waiting for a CPU (wakeup or preemption -> switch-in), its mean and p99 per wait. A
  thread throttled by its own CFS quota stays runnable, so throttled time is in the wait too;
* CPU pressure (PSI `some` avg10): the fraction of time at least one of its threads waited,
  the fallback where BPF is unavailable (a lower bound of the wait);
* throttled time (cgroupfs cpu.stat): the fraction of wall time its own quota held it back,
  which tells a delay that a move can cure from one it cannot;
* IPC (PMU, when one exists): how well it runs once it runs.

`loss` is the wait, in seconds per second (threads waiting for a CPU on average; the same unit
as the cost model's core-seconds per second). `score` = usage / (usage + loss) is the fraction
of the CPU time the container wanted that it got: 1 is healthy. docs/cost-model.md has the
formulas. Pure: metrics in, numbers out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal

from perfbalance.model import Container

Source = Literal["runqueue", "psi"]

# Metrics the health reads (smoothed by rebalancer.inputs like every planner input).
HEALTH_METRICS = (
    "runqueue_wait_seconds_per_second", "runqueue_latency_p99_seconds", "runqueue_latency_mean_seconds",
    "runqueue_waits", "psi_cpu_some", "cpu_throttled_seconds_per_second", "cpu_throttled_ratio",
)
TARGET_ANNOTATION = "perfbalance.io/runqueue-p99-target"
SENSITIVE_ANNOTATION = "perfbalance.io/latency-sensitive"  # as rebalancer.admit reads it


@dataclass(frozen=True, kw_only=True)
class Health:
    """One container's measured health in one (smoothed) window."""

    usage: float  # CPU-seconds per second it ran
    wait: float  # seconds per second its runnable threads waited for a CPU
    p99: float | None  # run-queue latency p99, seconds (None: too few waits to say)
    mean: float | None  # mean run-queue latency, seconds
    throttled: float  # fraction of wall time throttled by its own CFS quota (0..1)
    psi: float | None  # CPU pressure `some`, 0..1
    ipc: float | None  # instructions per cycle (PMU only)
    source: Source

    @property
    def loss(self) -> float:
        return self.wait

    @property
    def score(self) -> float:
        """Fraction of the CPU time it wanted that it got (1: never waited)."""
        total = self.usage + self.wait
        return self.usage / total if total > 0 else 1.0


def measure(m: Mapping[str, float], *, min_waits: int = 20) -> Health | None:
    """Health from one container's metrics; None when neither run-queue nor PSI data exists.
    p99 needs at least `min_waits` waits in the window (a percentile of three waits is noise)."""
    psi = m.get("psi_cpu_some")
    wait = m.get("runqueue_wait_seconds_per_second")
    if wait is None and psi is None:  # most containers of a node without the run-queue collector
        return None
    usage = max(0.0, m.get("cpu_usage_cores", 0.0))
    throttled = m.get("cpu_throttled_seconds_per_second", m.get("cpu_throttled_ratio", 0.0))
    common = {"usage": usage, "psi": psi, "throttled": min(1.0, max(0.0, throttled)), "ipc": m.get("ipc")}
    if wait is not None:
        enough = m.get("runqueue_waits", 0.0) >= min_waits
        return Health(wait=max(0.0, wait), p99=m.get("runqueue_latency_p99_seconds") if enough else None,
                      mean=m.get("runqueue_latency_mean_seconds"), source="runqueue", **common)
    if psi is not None:
        return Health(wait=max(0.0, psi), p99=None, mean=None, source="psi", **common)
    return None


def noise(history: Sequence[float], *, floor: float) -> float:
    """Window-to-window variation of a loss series: the sample standard deviation (at least
    `floor`; `floor` alone with fewer than three windows)."""
    if len(history) < 3:
        return floor
    mean = sum(history) / len(history)
    var = sum((x - mean) ** 2 for x in history) / (len(history) - 1)
    return max(floor, math.sqrt(var))


def push(history: Sequence[float], value: float, keep: int) -> tuple[float, ...]:
    return (*history, value)[-keep:]


# --- latency-sensitive containers and their targets ----------------------------------------------

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ns|us|µs|ms|s)?\s*$")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}


def parse_duration(text: str) -> float:
    """'2ms', '500us', '0.002' (seconds) -> seconds; ValueError naming the text otherwise."""
    m = _DURATION.match(text)
    if not m or float(m[1]) <= 0:
        raise ValueError(f"{text!r} is not a positive duration (e.g. 2ms, 500us, 0.002)")
    return float(m[1]) * _UNIT[m[2]]


def ident(c: Container) -> str:
    """namespace/pod/container, the string config selectors match (ids stand in for names)."""
    return f"{c.namespace or '-'}/{c.pod or c.pod_uid or '-'}/{c.name or c.id}"


def target_of(c: Container, selectors: Mapping[str, float], *,
              default: float | None = None) -> tuple[float | None, str]:
    """(run-queue p99 target in seconds or None, problem). The pod annotation wins over config
    selectors (globs on namespace/pod/container, or a container id); the most specific
    (longest) matching selector wins among those; a container annotated
    `perfbalance.io/latency-sensitive: "true"` (the placement hint of rebalancer/admit.py)
    without either gets `default`. A bad annotation is a problem, not a crash."""
    text = c.annotations.get(TARGET_ANNOTATION)
    if text is not None:
        try:
            return parse_duration(text), ""
        except ValueError as e:
            return None, f"{c.id}: annotation {TARGET_ANNOTATION}: {e}"
    if selectors:  # most nodes configure none: no name to build for each container
        name = ident(c)
        for sel in sorted(selectors, key=lambda s: (-len(s), s)):
            if sel == c.id or fnmatchcase(name, sel):
                return selectors[sel], ""
    flag = c.annotations.get(SENSITIVE_ANNOTATION, "").strip().lower() in ("true", "1", "yes")
    return (default if flag else None), ""
