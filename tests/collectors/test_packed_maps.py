"""Packed BPF map reads (one batch lookup, entries left as bytes) agree with bcc's entry-by-entry
read on a real map, and the deltas of the two paths are the same."""

from __future__ import annotations

import ctypes
import errno
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from collector_helpers import SH_BUSY, Cgroups, bounded
from collectors.bpfenv.loader import prepare
from collectors.bpfenv.maps import CountingMap, PackedTable, PendingSlots, packed_words, read_table, with_pending
from perfbalance.host import HostPaths

FIELDS = ("n", "per")
TP, FN = b"sched:sched_switch", b"tracepoint__sched__sched_switch"
PROGRAM = """
struct row { u64 n; u64 per[3]; };
BPF_HASH(counts, u64, struct row, 1024);
TRACEPOINT_PROBE(sched, sched_switch) {
    u64 key = bpf_get_current_cgroup_id();
    struct row zero = {};
    struct row *r = counts.lookup_or_try_init(&key, &zero);
    if (r) { __sync_fetch_and_add(&r->n, 1); __sync_fetch_and_add(&r->per[2], 2); }
    return 0;
}
"""


@pytest.fixture
def loaded(host: HostPaths) -> Iterator[Any]:
    b = prepare(host).load(PROGRAM)
    try:
        yield b
    finally:
        b.cleanup()


def burn(cgroups: Cgroups, b: Any, secs: float = 0.3) -> int:
    """A busy loop in a new cgroup while the program is attached, then detached (the map holds
    still); the cgroup's v2 id, its map key."""
    c = cgroups.new("busy")
    cgroups.run(c, bounded(SH_BUSY, secs)).wait(timeout=30)
    b.detach_tracepoint(tp=TP)
    return int(cgroups.fs.cgroup_id(c.cgroup))


def attach(b: Any) -> None:
    b.attach_tracepoint(tp=TP, fn_name=FN)


@pytest.mark.root
@pytest.mark.bpf
def test_packed_read_equals_the_entry_by_entry_read_of_a_real_map(loaded: Any, cgroups: Cgroups) -> None:
    key = burn(cgroups, loaded)
    table = loaded[b"counts"]
    packed = PackedTable.of(table, FIELDS)
    assert packed is not None
    got = {k: packed.unpack(v) for k, v in packed.read().items()}
    assert got == read_table(table, batch=False, fields=FIELDS)
    assert got[key][0] > 0 and got[key][1:] == (0, 0, 2 * got[key][0])


@pytest.mark.root
@pytest.mark.bpf
def test_packed_and_entry_by_entry_deltas_agree_and_only_the_busy_cgroup_moved(loaded: Any, cgroups: Cgroups) -> None:
    burn(cgroups, loaded)
    table = loaded[b"counts"]
    fast = CountingMap(table, fields=FIELDS, batch=True, max_keys=1024)
    slow = CountingMap(table, fields=FIELDS, batch=False, max_keys=1024)
    assert fast.packed is not None and slow.packed is None
    assert fast.deltas() == slow.deltas() == {}  # control: the map held still, nothing moved
    attach(loaded)
    key = burn(cgroups, loaded)
    moved = fast.deltas()
    assert moved == slow.deltas()
    assert moved[key][0] > 0 and set(moved) <= set(read_table(table, batch=False, fields=FIELDS))


@pytest.mark.root
@pytest.mark.bpf
def test_a_failing_packed_read_falls_back_to_entry_by_entry_with_one_line(
        loaded: Any, cgroups: Cgroups, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    key = burn(cgroups, loaded)
    m = CountingMap(loaded[b"counts"], fields=FIELDS, batch=True, max_keys=1024, name="counts")
    assert m.packed is not None

    def refused() -> dict[int, bytes]:
        raise OSError(errno.EINVAL, "BPF_MAP_LOOKUP_BATCH: EINVAL")

    monkeypatch.setattr(m.packed, "read", refused)
    with caplog.at_level(logging.WARNING):
        assert m.deltas() == {}  # a new baseline, read entry by entry
        attach(loaded)
        burn(cgroups, loaded)
        assert m.deltas()  # and it keeps counting
    assert m.packed is None and key in m._delta.keys()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "BPF map counts" in lines[0] and "EINVAL" in lines[0], lines


def test_a_value_with_a_field_that_is_not_u64_is_read_entry_by_entry() -> None:
    class Mixed(ctypes.Structure):
        _fields_ = [("n", ctypes.c_uint64), ("per", ctypes.c_uint32 * 2)]

    class Plain(ctypes.Structure):
        _fields_ = [("n", ctypes.c_uint64), ("per", ctypes.c_uint64 * 2)]

    assert packed_words(Mixed, FIELDS) is None
    assert packed_words(Plain, ("per", "n")) is None  # fields in another order than asked
    assert packed_words(Plain, FIELDS) == 3



# --- pending per-CPU counts (with_pending) -----------------------------------------------------

def test_pending_counts_are_in_the_window_they_gathered_in_and_a_flush_moves_none() -> None:
    # window 1: 5 events pending on some CPU, none in the hash yet
    assert with_pending({}, {}, {7: (1, 0, 5)}) == {7: (1, 0, 5)}
    # window 2: that CPU flushed them (+5 in the hash) and gathered 2 more: only the 2 are new
    assert with_pending({7: (1, 0, 5)}, {7: (1, 0, 5)}, {7: (0, 1, 2)}) == {7: (0, 1, 2)}
    # window 3: flushed again, nothing pending, nothing new
    assert with_pending({7: (0, 1, 2)}, {7: (0, 1, 2)}, {}) == {}
    # control: hash-only deltas with no pending change pass through untouched
    assert with_pending({9: (0, 0, 4)}, {}, {}) == {9: (0, 0, 4)}


def test_a_flush_caught_half_done_is_taken_off_the_next_window_never_below_zero() -> None:
    # read 1 saw the 5 flushed into the hash and still pending (counted twice); read 2 sees them
    # gone from pending with no new hash delta: the window is clamped at zero, not -5
    assert with_pending({}, {7: (0, 0, 5)}, {}) == {}
    assert with_pending({7: (0, 0, 3)}, {7: (0, 0, 5)}, {}) == {}
    assert with_pending({7: (0, 0, 9)}, {7: (0, 0, 5)}, {}) == {7: (0, 0, 4)}


class _Slot:
    def __init__(self, key: int, n: tuple[int, int, int]) -> None:
        self.key = key
        self.n = type("N", (), dict(zip(("zmm", "evex256", "all"), n)))()


class _PerCpu:
    def __init__(self, slots: list[_Slot]) -> None:
        self.slots = slots

    def Key(self, i: int) -> int:  # noqa: N802 (bcc's name)
        return i

    def getvalue(self, key: int) -> list[_Slot]:
        return self.slots


def test_pending_slots_sum_the_cpus_gathering_for_one_key_and_skip_empty_ones() -> None:
    table = _PerCpu([_Slot(7, (1, 0, 3)), _Slot(7, (0, 1, 2)), _Slot(8, (0, 0, 0)), _Slot(9, (0, 0, 1))])
    slots = PendingSlots(table, key_field="key", counts_field="n", fields=("zmm", "evex256", "all"))
    assert slots.read() == {7: (1, 1, 5), 9: (0, 0, 1)}


class _Ways:
    """A BPF_PERCPU_ARRAY of several entries (the ways a CPU gathers in): entry -> per-CPU slots."""

    def __init__(self, entries: list[list[_Slot]]) -> None:
        self.entries = entries
        self.max_entries = len(entries)

    def Key(self, i: int) -> int:  # noqa: N802 (bcc's name)
        return i

    def getvalue(self, key: int) -> list[_Slot]:
        return self.entries[key]


def test_pending_slots_read_every_way_of_every_cpu() -> None:
    # way 0: CPU 0 gathers for 7, CPU 1 for 8; way 1: CPU 0 for 8, CPU 1 for 7; way 2 unused
    table = _Ways([[_Slot(7, (1, 0, 0)), _Slot(8, (0, 2, 0))],
                   [_Slot(8, (0, 0, 3)), _Slot(7, (4, 0, 0))],
                   [_Slot(0, (0, 0, 0)), _Slot(0, (0, 0, 0))]])
    slots = PendingSlots(table, key_field="key", counts_field="n", fields=("zmm", "evex256", "all"))
    assert slots.read() == {7: (5, 0, 0), 8: (0, 2, 3)}


class _CpuBlocks:
    """A plain BPF_ARRAY indexed by CPU whose entry holds that CPU's ways (runqlat's rq_cpus):
    bcc's Array has no getvalue, an entry is read by index and is one struct, not a CPU list."""

    def __init__(self, ways_per_cpu: list[list[_Slot]]) -> None:
        self.blocks = [type("Cpu", (), {"way": ways})() for ways in ways_per_cpu]
        self.max_entries = len(ways_per_cpu)

    def Key(self, i: int) -> int:  # noqa: N802 (bcc's name)
        return i

    def __getitem__(self, key: int) -> object:
        return self.blocks[key]


def test_pending_slots_read_the_ways_inside_each_cpus_entry() -> None:
    table = _CpuBlocks([[_Slot(7, (1, 0, 0)), _Slot(8, (0, 2, 0)), _Slot(0, (0, 0, 0))],
                        [_Slot(8, (0, 0, 3)), _Slot(7, (4, 0, 0)), _Slot(9, (0, 0, 0))]])
    slots = PendingSlots(table, key_field="key", counts_field="n", fields=("zmm", "evex256", "all"),
                         ways_field="way")
    assert slots.read() == {7: (5, 0, 0), 8: (0, 2, 3)}
