"""Deltas of cumulative counters between readings: the one rule every collector uses.

Kernel counters (BPF map entries, MBM bytes, perf counts) only grow; a rate is the difference of
two readings, never a reset of the counter. The rule, per source:

- a first reading is a baseline, not a delta: what was counted before it belongs to no window
  we measured (an adopted resctrl group, a map whose program ran before we looked);
- after a complete reading of a source (every key it has), a key that was absent from it was
  created after it, at zero: its whole count belongs to this window (a BPF program inserts a
  zeroed entry the first time a cgroup runs);
- a counter that went backwards was reset (the entry or group was re-created): its new value is
  the delta since the reset;
- keys missing from a complete reading are forgotten, so the table never outgrows the source.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
Row = tuple[int, ...]


def row_delta(prev: Row | None, cur: Row) -> Row | None:
    """The increase from `prev` to `cur` (None: `prev` is None, a baseline). A row with any
    counter lower than before, or of another width, was re-created: the delta is `cur`."""
    if prev is None:
        return None
    if len(prev) != len(cur) or any(c < p for c, p in zip(cur, prev)):
        return cur
    return tuple(c - p for c, p in zip(cur, prev))


class _Rows(Generic[K]):
    """The previous reading's rows by key, shared by CounterDeltas and PackedDeltas."""

    _prev: dict[K, Any]

    def __len__(self) -> int:
        return len(self._prev)

    def keys(self) -> list[K]:
        return list(self._prev)

    def forget(self, keys: Iterable[K]) -> None:
        """Drop the rows of keys deleted from the source."""
        for k in keys:
            self._prev.pop(k, None)


class CounterDeltas(_Rows[K]):
    """Per-key deltas of cumulative counter rows (see the module docstring for the rule)."""

    def __init__(self) -> None:
        self._prev: dict[K, Row] = {}
        self._complete = False  # a complete reading has been taken: new keys start at zero

    def update(self, current: Mapping[K, Row]) -> dict[K, Row]:
        """Feed a complete reading of the source; the keys whose counters moved, with deltas.

        The first complete reading is the baseline and returns no deltas."""
        zero_based = self._complete
        deltas: dict[K, Row] = {}
        for key, cur in current.items():
            prev = self._prev.get(key)
            if prev is None and zero_based:
                prev = (0,) * len(cur)
            d = row_delta(prev, cur)
            if d is not None and any(d):
                deltas[key] = d
        self._prev, self._complete = dict(current), True
        return deltas

    def one(self, key: K, value: int) -> int | None:
        """Feed one counter of a source that is never read whole; None for its first reading."""
        prev = self._prev.get(key)
        self._prev[key] = (value,)
        d = row_delta(prev, (value,))
        return None if d is None else d[0]


class PackedDeltas(_Rows[K]):
    """CounterDeltas over rows still packed as the source gave them (bytes), for sources read
    whole every cycle where most rows did not move (a BPF map of 1000 idle containers).

    The same rule as CounterDeltas; a row whose bytes equal the previous reading's has no delta
    and is never unpacked, so a steady-state reading costs one bytes comparison per key."""

    def __init__(self, unpack: Callable[[bytes], Row]) -> None:
        self.unpack = unpack
        self._prev: dict[K, bytes] = {}
        self._complete = False

    def update(self, current: Mapping[K, bytes]) -> dict[K, Row]:
        """Feed a complete reading (the mapping is kept, not copied: do not change it after)."""
        prev, zero_based = self._prev, self._complete
        unpack = self.unpack
        deltas: dict[K, Row] = {}
        for key, cur in current.items():
            before = prev.get(key)
            if before == cur:
                continue
            if before is None:
                d = unpack(cur) if zero_based else None
            else:
                d = row_delta(unpack(before), unpack(cur))
            if d is not None and any(d):
                deltas[key] = d
        self._prev, self._complete = dict(current) if not isinstance(current, dict) else current, True
        return deltas
