"""The node's busy CPUs per window, from /proc/stat: what the planner cannot see otherwise.

The run-queue wait model (rebalancer/latency.py) scales a victim's wait with the load on its
CPUs, and only the containers the agent discovered are in the snapshot. Work outside them
(other pods' runtimes, system services, the kubelet, interrupts) delays the victims as much and
does not move when the planner moves them. `cpu_busy_cores` (CPU-seconds per second the whole
node was busy: user, nice, system, irq, softirq, steal) lets the planner count it: the busy
cores no container accounts for are spread over the CPUs as unseen load.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from perfbalance.errors import PerfbalanceError
from perfbalance.safefs import read_text

log = logging.getLogger(__name__)

STAT_MAX_BYTES = 1 << 20  # /proc/stat: one line per CPU plus a few
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system [idle iowait] irq softirq steal (guest is in user)


@dataclass(frozen=True, kw_only=True)
class CpuTimes:
    busy: int  # clock ticks, all CPUs
    total: int


def parse_stat(text: str) -> CpuTimes:
    """The aggregate `cpu ` line of /proc/stat; ValueError naming the line when it is not there."""
    for line in text.splitlines():
        if line.startswith("cpu "):
            ticks = [int(x) for x in line.split()[1:9]]
            if len(ticks) < 8:
                break
            return CpuTimes(busy=sum(ticks[i] for i in BUSY_FIELDS), total=sum(ticks))
    raise ValueError("no aggregate 'cpu' line with 8 fields")


class NodeCpu:
    """Busy cores of the node over each window between two calls of `metrics()`."""

    def __init__(self, *, procfs: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.clock = os.path.join(procfs, "stat"), clock
        self._last: tuple[CpuTimes, float] | None = None
        self._warned = False
        self._tick = os.sysconf("SC_CLK_TCK")
        self.metrics()  # the first window starts now

    def metrics(self) -> dict[str, float]:
        """{"cpu_busy_cores": x} for the window since the last call; {} on the first call or
        when /proc/stat cannot be read (said once)."""
        now = self.clock()
        try:
            times = parse_stat(read_text(self.path, STAT_MAX_BYTES, "/proc/stat"))
        except (OSError, ValueError, PerfbalanceError) as e:
            if not self._warned:
                log.warning("node CPU: %s: %s; the planner counts no unseen load", self.path, e)
                self._warned = True
            return {}
        last, self._last = self._last, (times, now)
        if last is None or now <= last[1] or times.busy < last[0].busy:
            return {}
        return {"cpu_busy_cores": (times.busy - last[0].busy) / self._tick / (now - last[1])}
