"""PMU and software event names: what `collectors.perf.events` may list, parsed purely.

Kept apart from the perf collector so that the configuration can check event names without
importing the collector (and the BPF loader behind it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from perfbalance.errors import ParseError

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE, PERF_TYPE_RAW = 0, 1, 4


@dataclass(frozen=True, kw_only=True)
class EventSpec:
    """One event: a metric-safe name, the perf type/config, and how its unit converts."""

    name: str  # metric stem: instructions, task_clock, core_power_lvl2_turbo_license
    type: int
    config: int
    unit_scale: float = 1.0  # task-clock counts ns -> seconds
    unit: str = ""  # "seconds" for clocks: metric task_clock_seconds_per_second

    @property
    def hardware(self) -> bool:
        return self.type != PERF_TYPE_SOFTWARE

    @property
    def stem(self) -> str:
        return f"{self.name}_{self.unit}" if self.unit else self.name


KNOWN: dict[str, EventSpec] = {e.name: e for e in (
    EventSpec(name="cycles", type=PERF_TYPE_HARDWARE, config=0),
    EventSpec(name="instructions", type=PERF_TYPE_HARDWARE, config=1),
    EventSpec(name="llc_references", type=PERF_TYPE_HARDWARE, config=2),
    EventSpec(name="llc_misses", type=PERF_TYPE_HARDWARE, config=3),
    EventSpec(name="branches", type=PERF_TYPE_HARDWARE, config=4),
    EventSpec(name="branch_misses", type=PERF_TYPE_HARDWARE, config=5),
    EventSpec(name="cpu_clock", type=PERF_TYPE_SOFTWARE, config=0, unit_scale=1e-9, unit="seconds"),
    EventSpec(name="task_clock", type=PERF_TYPE_SOFTWARE, config=1, unit_scale=1e-9, unit="seconds"),
    EventSpec(name="page_faults", type=PERF_TYPE_SOFTWARE, config=2),
    EventSpec(name="context_switches", type=PERF_TYPE_SOFTWARE, config=3),
    EventSpec(name="cpu_migrations", type=PERF_TYPE_SOFTWARE, config=4),
)}
SOFTWARE_FALLBACK = ("task_clock",)
_ALIASES = {"cache_references": "llc_references", "cache_misses": "llc_misses",
            "cpu_cycles": "cycles", "cs": "context_switches", "migrations": "cpu_migrations"}
_RAW = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.\-]*)\s*=\s*(0[xX][0-9a-fA-F]+|\d+)\s*$")


def metric_name(text: str) -> str:
    """`CORE_POWER.LVL2_TURBO_LICENSE` -> `core_power_lvl2_turbo_license`."""
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def parse_event(text: str) -> EventSpec:
    """A known event name (`instructions`, `task-clock`, ...) or a raw one `NAME=0xCONFIG`."""
    m = _RAW.match(text)
    if m:
        return EventSpec(name=metric_name(m[1]), type=PERF_TYPE_RAW, config=int(m[2], 0))
    key = metric_name(text)
    key = _ALIASES.get(key, key)
    if key not in KNOWN:
        raise ParseError("perf event", text, f"unknown (known: {', '.join(sorted(KNOWN))}; raw: NAME=0xCONFIG)")
    return KNOWN[key]


def parse_events(texts: Iterable[str]) -> tuple[EventSpec, ...]:
    out: list[EventSpec] = []
    for t in texts:
        e = parse_event(t)
        if e.name not in {x.name for x in out}:
            out.append(e)
    return tuple(out)
