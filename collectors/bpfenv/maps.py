"""Reading BPF hash maps of cumulative counters without destroying them.

Rates are deltas against our previous read (perfbalance.counters.CounterDeltas), never resets:
entries are deleted only when their cgroup (or process) is gone (collectors.bpfenv.keys).

Where a map's key is a u64 and its value only u64 fields (every counting map of bpf/), it is read
packed (PackedTable): one BPF_MAP_LOOKUP_BATCH into a buffer kept for the map's life, each entry
left as its bytes, and only entries whose bytes changed since the last read are unpacked. bcc's
items_lookup_batch builds a ctypes object per entry and _flatten a tuple per field: at 1000 keys
that was most of a BPF collector's cycle, for entries of idle containers that had not moved.

A program that gathers counts per CPU before adding them to its hash (bpf/avx512.bpf.c,
bpf/runqlat.bpf.c) also has pending slots per CPU (avx512 one, runqlat one per recent key): (the
key it gathers for, counts not yet in the hash). CountingMap reads those slots after the hash (PendingSlots) and counts their change
since the last read, so a count is in the window it happened in, not only once its CPU flushes
(a CPU-bound thread alone on a core may switch a few times a minute).
"""

from __future__ import annotations

import array
import ctypes
import errno
import logging
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from collectors.bpfenv.keys import LiveKeys, stale_keys
from perfbalance.counters import CounterDeltas, PackedDeltas

log = logging.getLogger(__name__)


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


def packed_words(leaf: Any, fields: Sequence[str]) -> int | None:
    """How many u64 words a value of ctypes type `leaf` holds, if it is exactly `fields` in
    order, each a u64 or an array of u64, without padding (else None: read it field by field)."""
    names = [f[0] for f in getattr(leaf, "_fields_", ())]
    if names != list(fields):
        return None
    words = 0
    for name, typ in leaf._fields_:
        inner, n = (typ._type_, typ._length_) if issubclass(typ, ctypes.Array) else (typ, 1)
        if not _is_u64(inner) or getattr(leaf, name).offset != 8 * words:
            return None
        words += n
    return words if ctypes.sizeof(leaf) == 8 * words else None


def _is_u64(typ: Any) -> bool:
    return isinstance(typ, type) and issubclass(typ, ctypes._SimpleCData) and typ._type_ in ("L", "Q") \
        and ctypes.sizeof(typ) == 8


class PackedTable:
    """A bcc hash map with u64 keys and u64-only values, read whole as key -> value bytes.

    One BPF_MAP_LOOKUP_BATCH call per read (more only if the kernel hands the map out in parts),
    into buffers sized for max_entries and allocated once. Raises OSError with the kernel's errno.
    """

    def __init__(self, table: Any, words: int) -> None:
        self.fd, self.capacity, self.words = int(table.map_fd), int(table.max_entries), words
        self._lookup = _lookup_batch()
        self._keys = ctypes.create_string_buffer(8 * self.capacity)
        self._values = ctypes.create_string_buffer(8 * words * self.capacity)
        self.unpack: Callable[[bytes], tuple[int, ...]] = struct.Struct(f"={words}Q").unpack

    @classmethod
    def of(cls, table: Any, fields: Sequence[str]) -> PackedTable | None:
        """The packed reader of `table`, or None where its layout is not u64 key, u64 fields."""
        words = packed_words(getattr(table, "Leaf", None), fields)
        if words is None or not _is_u64(getattr(table, "Key", None)) or _lookup_batch() is None:
            return None
        return cls(table, words)

    def read(self) -> dict[int, bytes]:
        total = self._fill()
        vsize = 8 * self.words
        keys = array.array("Q", ctypes.string_at(self._keys, 8 * total)).tolist()
        values = ctypes.string_at(self._values, vsize * total)
        return dict(zip(keys, [values[i:i + vsize] for i in range(0, vsize * total, vsize)]))

    def _fill(self) -> int:
        """Batch lookups until the kernel says ENOENT (no more entries); entries read."""
        token_in, token_out, count = ctypes.c_uint32(0), ctypes.c_uint32(0), ctypes.c_uint32(0)
        keys, values, vsize = ctypes.addressof(self._keys), ctypes.addressof(self._values), 8 * self.words
        total, first = 0, True
        while total < self.capacity:
            count.value = self.capacity - total
            res = self._lookup(self.fd, None if first else ctypes.byref(token_in), ctypes.byref(token_out),
                               keys + 8 * total, values + vsize * total, ctypes.byref(count))
            err = ctypes.get_errno()
            total += count.value
            if res != 0:
                if err == errno.ENOENT:
                    break  # the whole map was read
                raise OSError(err, f"BPF_MAP_LOOKUP_BATCH: {errno.errorcode.get(err, err)}")
            if count.value == 0:
                break
            token_in.value, first = token_out.value, False
        return total


def _lookup_batch() -> Any:
    """libbcc's bpf_lookup_batch (libbpf's bpf_map_lookup_batch), None where bcc lacks it."""
    try:
        from bcc.libbcc import lib  # type: ignore[import-untyped]
    except ImportError:
        return None
    return getattr(lib, "bpf_lookup_batch", None)


class PendingSlots:
    """The pending slots of a program that flushes into its hash by batches, one or more per CPU.

    `table` is an array whose entries each hold one slot: the key being gathered in `key_field`
    and the counts not yet added to the hash in `counts_field` (a struct with the hash value's
    `fields`). A BPF_PERCPU_ARRAY gives one such entry per CPU at each index. With `ways_field`,
    an entry is instead one CPU's struct whose `ways_field` array holds its slots (a plain array
    indexed by CPU). read() gives key -> counts summed over the CPUs and slots gathering for it."""

    def __init__(self, table: Any, *, key_field: str, counts_field: str, fields: Sequence[str],
                 ways_field: str | None = None) -> None:
        self.table, self.key_field, self.counts_field = table, key_field, counts_field
        self.ways_field = ways_field
        self.fields = tuple(fields)
        self._indexes = [table.Key(i) for i in range(int(getattr(table, "max_entries", 1)))]
        self._get = getattr(table, "getvalue", None) or table.__getitem__  # per-CPU: every CPU's value

    def _slots(self) -> Iterator[Any]:
        for i in self._indexes:
            value = self._get(i)
            for entry in (value if isinstance(value, (list, ctypes.Array)) else (value,)):  # per CPU
                yield from (getattr(entry, self.ways_field) if self.ways_field else (entry,))

    def read(self) -> dict[int, tuple[int, ...]]:
        out: dict[int, tuple[int, ...]] = {}
        for slot in self._slots():
            row = _flatten(getattr(slot, self.counts_field), self.fields)
            if not any(row):
                continue
            key = int(getattr(slot, self.key_field))
            had = out.get(key)
            out[key] = row if had is None else tuple(a + b for a, b in zip(had, row))
        return out


def with_pending(deltas: dict[int, tuple[int, ...]], before: Mapping[int, tuple[int, ...]],
                 now: Mapping[int, tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """The hash's deltas plus the change of the pending counts from `before` to `now`.

    Counts that a CPU flushed since the last read are in the hash's delta and leave the pending
    slots (a decrease), so each count is in exactly one window. The hash is read before the slots:
    a flush between the two reads puts its counts in neither this time, and in the next window.
    A field is clamped at zero: a flush caught half done (added, not yet cleared) would otherwise
    give a negative count in the window after."""
    for key in now.keys() | before.keys():
        cur, prev = now.get(key), before.get(key)
        width = len(cur if cur is not None else prev)  # type: ignore[arg-type]
        base = deltas.get(key, (0,) * width)
        cur = cur or (0,) * width
        prev = prev or (0,) * width
        row = tuple(max(0, b + c - p) for b, c, p in zip(base, cur, prev))
        if any(row):
            deltas[key] = row
        else:
            deltas.pop(key, None)
    return deltas


class CountingMap:
    """A BPF hash of cumulative counters, read non-destructively into per-key deltas, with the
    counts its program still gathers per CPU (`pending`) counted in the window they happened."""

    def __init__(self, table: Any, *, fields: Sequence[str], batch: bool, max_keys: int,
                 live: LiveKeys | None = None, name: str = "?", pending: PendingSlots | None = None) -> None:
        self.table, self.fields, self.batch, self.max_keys = table, tuple(fields), batch, max_keys
        self.name = name
        self.live = live
        self.pending = pending
        self._pending: dict[int, tuple[int, ...]] = {}
        self.packed = PackedTable.of(table, self.fields) if batch else None
        self._delta: CounterDeltas[int] | PackedDeltas[int] = (
            CounterDeltas() if self.packed is None else PackedDeltas(self.packed.unpack))
        self.size = 0
        self.deltas()  # the baseline: the map as its program was just loaded (normally empty)

    def deltas(self) -> dict[int, tuple[int, ...]]:
        deltas = self._hash_deltas()
        if self.pending is None:
            return deltas
        try:
            now = self.pending.read()
        except (OSError, KeyError, TypeError) as e:  # counts wait in the slots until flushed: late, not lost
            log.warning("BPF map %s: its per-CPU pending counts unreadable (%s); they reach the window "
                        "they are flushed in from now on", self.name, e)
            self.pending, now = None, {}
        before, self._pending = self._pending, now
        return with_pending(deltas, before, now)

    def _hash_deltas(self) -> dict[int, tuple[int, ...]]:
        if self.packed is not None:
            try:
                packed = self.packed.read()
            except OSError as e:  # read it field by field from now on (same rule, from a new baseline)
                log.warning("BPF map %s: packed read failed (%s); reading it entry by entry from now on",
                            self.name, e)
                self.packed, self._delta = None, CounterDeltas()
            else:
                self.size = len(packed)
                return self._delta.update(packed)  # type: ignore[arg-type]
        rows = read_table(self.table, batch=self.batch, fields=self.fields)
        self.size = len(rows)
        return self._delta.update(rows)  # type: ignore[arg-type]

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
