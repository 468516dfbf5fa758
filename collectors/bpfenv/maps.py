"""Reading BPF hash maps of cumulative counters without destroying them.

Rates are deltas against our previous read (perfbalance.counters.CounterDeltas), never resets:
entries are deleted only when their cgroup (or process) is gone (collectors.bpfenv.keys).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from collectors.bpfenv.keys import LiveKeys, stale_keys
from perfbalance.counters import CounterDeltas


def read_table(table: Any, *, batch: bool, fields: Sequence[str]) -> dict[int, tuple[int, ...]]:
    """All entries of a bcc hash map as key -> flat tuple of `fields` (array fields flattened).

    One BPF_MAP_LOOKUP_BATCH syscall per 64k entries where the kernel has it (5.6+), else
    key-by-key iteration. Never deletes: rates are deltas against our previous read.
    """
    items: Iterable[tuple[Any, Any]]
    if batch:
        try:
            items = list(table.items_lookup_batch())
        except Exception:  # bcc raises bare Exception; EINVAL on kernels without batch ops
            items = list(table.items())
    else:
        items = list(table.items())
    return {int(getattr(k, "value", k)): _flatten(v, fields) for k, v in items}


def _flatten(value: Any, fields: Sequence[str]) -> tuple[int, ...]:
    out: list[int] = []
    for f in fields:
        v = getattr(value, f)
        if isinstance(v, int):
            out.append(v)
        else:
            out.extend(int(x) for x in v)
    return tuple(out)


class CountingMap:
    """A BPF hash of cumulative counters, read non-destructively into per-key deltas."""

    def __init__(self, table: Any, *, fields: Sequence[str], batch: bool, max_keys: int,
                 live: LiveKeys | None = None) -> None:
        self.table, self.fields, self.batch, self.max_keys = table, tuple(fields), batch, max_keys
        self.live = live
        self._delta: CounterDeltas[int] = CounterDeltas()
        self.size = 0
        self.deltas()  # the baseline: the map as its program was just loaded (normally empty)

    def deltas(self) -> dict[int, tuple[int, ...]]:
        rows = read_table(self.table, batch=self.batch, fields=self.fields)
        self.size = len(rows)
        return self._delta.update(rows)

    @property
    def nearly_full(self) -> bool:
        return self.size >= 0.8 * self.max_keys

    @property
    def rows(self) -> int:
        """Rows of the Python-side delta table (mirrors the map as of the last read and deletes)."""
        return len(self._delta)

    def delete(self, keys: Iterable[int]) -> int:
        """Delete entries (of vanished cgroups/processes) and our rows of them."""
        keys = list(keys)
        n = 0
        for k in keys:
            try:
                del self.table[self.table.Key(k)]
                n += 1
            except (KeyError, OSError):
                continue
        self._delta.forget(keys)
        self.size = max(0, self.size - n)
        return n

    def prune(self, before: Mapping[int, tuple[str, str]], now: Mapping[int, tuple[str, str]]) -> int:
        """Drop entries of vanished containers at once, entries of any other cgroup (or process)
        that no longer exists when a sweep of what is alive completes (LiveKeys), and, as a last
        resort when the map is nearly full, every entry no container owns."""
        doomed = set(stale_keys(before, now))
        if self.live is not None:
            doomed |= self.live.step(self._delta.keys())
        if self.nearly_full:
            doomed |= {k for k in self._delta.keys() if k not in now}
        return self.delete(doomed)
