"""Cumulative MBM counters turned into rates and our own monotonic totals.

The kernel already widens the hardware's 24-bit MBM counters (mbm_overflow_count), so a value
read from mon_data only goes down when the RMID behind the file changed: the group was removed and
recreated, or the container got a new monitoring group. That is treated as a counter reset
(Prometheus semantics: the new value is the delta since the reset). A read of "Unavailable" or
"Error" (resctrl.rst: the RMID has no valid data yet, or the hardware failed) gives no sample:
the previous value is kept, the window reports no rate, and totals do not move.
Totals are ours, not the kernel's, so they stay monotonic across group recreation: export them
as counters; occupancy is a gauge.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from perfbalance.counters import CounterDeltas


@dataclass
class CounterTracker:
    """Per key (group, event, domain): last raw value (perfbalance.counters) and our total."""

    deltas: CounterDeltas[Hashable] = field(default_factory=CounterDeltas)
    totals: dict[Hashable, float] = field(default_factory=dict)

    def update(self, key: Hashable, raw: int | None) -> int | None:
        """Feed one reading; the increase since the previous one (None: no sample this time,
        or the first reading, which is a baseline)."""
        if raw is None:
            return None
        delta = self.deltas.one(key, raw)
        self.totals[key] = self.totals.get(key, 0.0) + (delta or 0)
        return delta

    def total(self, key: Hashable) -> float | None:
        return self.totals.get(key)

    def forget(self, prefix: Hashable) -> None:
        """Drop keys whose first element is `prefix` (a container that left)."""
        gone = [k for k in self.totals if isinstance(k, tuple) and k and k[0] == prefix]
        self.deltas.forget(gone)
        for key in gone:
            del self.totals[key]
