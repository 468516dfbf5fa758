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


@dataclass
class _Track:
    last: int
    total: float = 0.0


@dataclass
class CounterTracker:
    """Per key (group, event, domain): last raw value and the accumulated total."""

    tracks: dict[Hashable, _Track] = field(default_factory=dict)

    def update(self, key: Hashable, raw: int | None) -> int | None:
        """Feed one reading; the increase since the previous one (None: no sample this time)."""
        if raw is None:
            return None
        track = self.tracks.get(key)
        if track is None:
            self.tracks[key] = _Track(last=raw)
            return None  # first sight: a baseline, not a delta
        delta = raw - track.last if raw >= track.last else raw
        track.last = raw
        track.total += delta
        return delta

    def total(self, key: Hashable) -> float | None:
        track = self.tracks.get(key)
        return None if track is None else track.total

    def forget(self, prefix: Hashable) -> None:
        """Drop keys whose first element is `prefix` (a container that left)."""
        for key in list(self.tracks):
            if isinstance(key, tuple) and key and key[0] == prefix:
                del self.tracks[key]
