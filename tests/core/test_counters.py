"""perfbalance.counters: the one rule for deltas of cumulative counters."""

from __future__ import annotations

import struct

from perfbalance.counters import CounterDeltas, PackedDeltas, row_delta


def test_the_first_complete_reading_is_a_baseline_not_a_delta() -> None:
    assert CounterDeltas[int]().update({7: (3, 1, 10)}) == {}


def test_a_key_absent_from_the_previous_complete_reading_counts_from_zero() -> None:
    t = CounterDeltas[int]()
    t.update({8: (1, 1, 1)})
    assert t.update({7: (3, 1, 10), 8: (1, 1, 1)}) == {7: (3, 1, 10)}


def test_later_reads_give_deltas_and_unchanged_keys_nothing() -> None:
    t = CounterDeltas[int]()
    t.update({7: (3, 1, 10), 8: (1, 1, 1)})
    assert t.update({7: (5, 1, 12), 8: (1, 1, 1)}) == {7: (2, 0, 2)}


def test_counter_that_went_backwards_restarts_from_zero() -> None:
    t = CounterDeltas[int]()
    t.update({7: (100, 0, 100)})
    assert t.update({7: (4, 0, 5)}) == {7: (4, 0, 5)}


def test_keys_that_left_the_source_are_forgotten() -> None:
    t = CounterDeltas[int]()
    t.update({7: (1, 0, 1), 8: (1, 0, 1)})
    t.update({8: (2, 0, 2)})
    assert t.keys() == [8]


def test_forgotten_keys_leave_the_table() -> None:
    t = CounterDeltas[int]()
    t.update({7: (1, 0, 1), 8: (1, 0, 1)})
    t.forget([7, 99])
    assert t.keys() == [8]


def test_a_single_counter_s_first_reading_is_a_baseline() -> None:
    t = CounterDeltas[str]()
    assert t.one("a", 1000) is None
    assert t.one("a", 1500) == 500


def test_a_single_counter_that_went_backwards_counts_its_new_value() -> None:
    t = CounterDeltas[str]()
    t.one("a", 1000)
    assert t.one("a", 40) == 40


def test_a_row_of_another_width_was_re_created() -> None:
    assert row_delta((5, 5), (1, 2, 3)) == (1, 2, 3)


def test_packed_rows_follow_the_same_rule_as_unpacked_ones() -> None:
    fmt = struct.Struct("=2Q")
    packed, plain = PackedDeltas[int](fmt.unpack), CounterDeltas[int]()
    readings = [{1: (5, 5)}, {1: (5, 5), 2: (3, 0)}, {1: (7, 5), 2: (1, 0)}, {2: (1, 0)}, {2: (4, 1), 1: (1, 1)}]
    for rows in readings:
        assert packed.update({k: fmt.pack(*v) for k, v in rows.items()}) == plain.update(rows)
    assert packed.keys() == plain.keys()


def test_packed_rows_baseline_then_zero_based_then_reset() -> None:
    fmt = struct.Struct("=2Q")
    d = PackedDeltas[int](fmt.unpack)
    assert d.update({1: fmt.pack(5, 5)}) == {}  # the first reading is a baseline
    assert d.update({1: fmt.pack(5, 5), 2: fmt.pack(3, 0)}) == {2: (3, 0)}  # a new key counts from zero
    assert d.update({1: fmt.pack(7, 5), 2: fmt.pack(1, 0)}) == {1: (2, 0), 2: (1, 0)}  # 2 went back: reset
    assert d.update({2: fmt.pack(1, 0)}) == {} and d.keys() == [2]  # a missing key is forgotten
