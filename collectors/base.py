"""The collector protocol: what the agent loop expects of every collector.

Collectors are synchronous (the loop runs them in a worker thread, all in the same window) and
never raise out of `collect`: a per-container failure is skipped (a vanished container is
normal), a collector-wide failure flips `status()` to down with a reason, logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from perfbalance.model import CollectorStatus, Container

Metrics = Mapping[str, Mapping[str, float]]  # container id -> metric name -> value


class Collector(Protocol):
    name: str

    def start(self) -> CollectorStatus:
        """Open what is needed (BPF programs, perf fds, groups). Never raises: returns down+reason."""

    def collect(self, containers: Sequence[Container], now: float) -> Metrics:
        """Metrics for this window: rates over the time since the previous call, per container."""

    def status(self) -> CollectorStatus:
        """Up or down, and why."""

    def close(self) -> None:
        """Release everything (detach BPF, close fds, remove our groups). Idempotent."""


class LogOnce:
    """Log each distinct message of a collector once (cadvisor logs missing features once).

    Messages can name a container, and containers come and go for as long as the agent runs: at
    most `remember` messages are kept, the oldest forgotten first (a forgotten one that recurs is
    logged once more)."""

    def __init__(self, logger: logging.Logger, *, remember: int = 1024) -> None:
        self.logger = logger
        self.remember = remember
        self._seen: dict[str, None] = {}  # insertion-ordered: the oldest first

    def warning(self, msg: str) -> None:
        if msg not in self._seen:
            if len(self._seen) >= self.remember:
                del self._seen[next(iter(self._seen))]
            self._seen[msg] = None
            self.logger.warning("%s", msg)


class IdleMetrics:
    """The metrics of each container's last idle window, to hand out again while it stays idle.

    A window in which a container's counters did not move gives metrics that depend on the
    window only through rates that are zero, so while the container stays idle, and what the
    metrics carry over from before (its `basis`: totals, smoothed state) is the very same object,
    they are the same values: the dict is reused instead of rebuilt (at 1000 mostly idle
    containers, building them was most of a BPF collector's cycle). Containers not seen in a
    cycle are forgotten at `end_cycle`. Metrics are read-only (collectors.base.Metrics).
    """

    def __init__(self) -> None:
        self._last: dict[str, tuple[object, dict[str, float]]] = {}
        self._next: dict[str, tuple[object, dict[str, float]]] = {}

    def get(self, cid: str, basis: object) -> dict[str, float] | None:
        hit = self._last.get(cid)
        if hit is None or hit[0] is not basis:
            return None
        self._next[cid] = hit
        return hit[1]

    def put(self, cid: str, basis: object, metrics: dict[str, float]) -> dict[str, float]:
        self._next[cid] = (basis, metrics)
        return metrics

    def end_cycle(self) -> None:
        self._last, self._next = self._next, {}
