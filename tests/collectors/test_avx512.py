"""AVX-512 per container: real 512-bit use apart from EVEX-256, smoothed with hysteresis."""

from __future__ import annotations

import time
from typing import Any

import pytest

from collectors.bpfenv import keys
from collectors import avx512
from collectors.avx512 import Avx512Collector, Counts, Smoothed, per_container, smooth, window_metrics
from collectors.config import Avx512Config
from perfbalance.host import HostPaths

from collector_helpers import NUMPY_EXP, SH_BUSY, Cgroups, bounded

CFG = Avx512Config(threshold_on=0.10, threshold_off=0.05, ewma_alpha=0.5)


# --- pure: smoothing and hysteresis ---------------------------------------------------------------

@pytest.mark.parametrize(("ratios", "heavy"), [
    ([0.3], True),  # above threshold_on at once
    ([0.3, 0.0], True),  # EWMA 0.15: still above threshold_off
    ([0.3, 0.0, 0.0, 0.0], False),  # EWMA 0.15, 0.075, then 0.0375 <= threshold_off
    ([0.08, 0.08, 0.08], False),  # between the thresholds, never crossed on
    ([0.3, 0.08, 0.08, 0.08], True),  # between the thresholds after being on: stays on
])
def test_heavy_follows_hysteresis_of_the_smoothed_ratio(ratios: list[float], heavy: bool) -> None:
    state = None
    for r in ratios:
        state = smooth(state, r, 0.0, CFG)
    assert state is not None and state.heavy is heavy


def test_window_without_switches_keeps_the_previous_state() -> None:
    before = Smoothed(active=0.4, evex256=0.1, heavy=True)
    assert smooth(before, None, None, CFG) is before


def test_ewma_weights_the_newest_window_by_alpha() -> None:
    s = smooth(Smoothed(active=0.0, evex256=1.0, heavy=False), 1.0, 0.0, CFG)
    assert s is not None and (s.active, s.evex256) == (0.5, 0.5)


def test_metrics_of_a_window_give_rates_ratios_and_the_flag() -> None:
    m = window_metrics(Counts(zmm=20, evex256=10, all=100), Smoothed(active=0.2, evex256=0.1, heavy=True), 10.0, coarse=False)
    assert m == {"avx512_coarse": 0.0, "avx512_heavy": 1.0, "avx512_switches_per_second": 2.0,
                 "evex256_switches_per_second": 1.0, "fpu_switches_per_second": 10.0,
                 "avx512_active_ratio": 0.2, "evex256_ratio": 0.1}


def test_keys_of_one_container_are_summed_and_unowned_keys_ignored() -> None:
    owners = {1: ("a", "/x"), 2: ("a", "/x/child"), 3: ("b", "/y")}
    got = per_container({1: (1, 2, 10), 2: (3, 0, 5), 9: (100, 100, 100)}, owners)
    assert got == {"a": Counts(zmm=4, evex256=2, all=15)}


# --- real BPF ------------------------------------------------------------------------------------

def collect_around(col: Avx512Collector, cgroups: Cgroups, runs: dict[str, list[str]],
                   cpu: int | None = None) -> dict[str, dict[str, float]]:
    """One collection window around the runs (all pinned to `cpu` when given)."""
    containers = [cgroups.new(tag) for tag in runs]
    col.collect(containers, time.time())
    procs = [cgroups.run(c, runs[c.id], cpu=cpu) for c in containers]
    for p in procs:
        p.wait(timeout=60)
    return dict(col.collect(containers, time.time()))


@pytest.fixture
def bpf_collector(host: HostPaths, cgroups: Cgroups):  # type: ignore[no-untyped-def]
    col = Avx512Collector(config=CFG, host=host, cgroupfs=cgroups.fs)
    st = col.start()
    try:
        assert st.up and st.detail["source"] == "bpf", st.reason
        yield col
    finally:
        col.close()


@pytest.mark.root
@pytest.mark.bpf
@pytest.mark.avx512
def test_numpy_exp_loop_is_classified_avx512_heavy(bpf_collector: Avx512Collector, cgroups: Cgroups) -> None:
    # The two share one CPU, as on a contended node: time slices make the context switches whose
    # saved FPU state the tracepoint reads. (Alone on an idle CPU a busy loop is barely switched
    # out, and its start-up, numpy's import, would be most of the few switches it has.)
    m = collect_around(bpf_collector, cgroups, {"numpy": bounded(NUMPY_EXP, 3), "sh": bounded(SH_BUSY, 3)},
                       cpu=0)
    assert m["numpy"]["avx512_heavy"] == 1.0 and m["numpy"]["avx512_active_ratio"] > CFG.threshold_on, m
    assert m["sh"]["avx512_active_ratio"] == 0.0 and m["sh"]["evex256_ratio"] > 0, m


@pytest.mark.root
@pytest.mark.bpf
@pytest.mark.avx512
def test_shell_busy_loop_is_evex256_but_not_avx512(bpf_collector: Avx512Collector, cgroups: Cgroups) -> None:
    m = collect_around(bpf_collector, cgroups, {"sh": bounded(SH_BUSY, 2)})["sh"]
    assert m["evex256_ratio"] > 0 and m["fpu_switches_per_second"] > 0, m
    assert m["avx512_active_ratio"] == 0.0 and m["avx512_heavy"] == 0.0, m


@pytest.mark.root
@pytest.mark.bpf
@pytest.mark.avx512
def test_a_change_of_cgroup_on_a_cpu_moves_the_pending_counts_to_the_map(host: HostPaths, cgroups: Cgroups,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # With no flush by count, a CPU's pending counts reach the map only when another key's event
    # comes on that CPU: two loops alternating on one CPU both get their counts (and their classes).
    monkeypatch.setattr(avx512, "FLUSH", 1 << 40)
    col = Avx512Collector(config=CFG, host=host, cgroupfs=cgroups.fs)
    try:
        assert col.start().up and col.defines["PB_FLUSH"] == 1 << 40
        m = collect_around(col, cgroups, {"numpy": bounded(NUMPY_EXP, 3), "sh": bounded(SH_BUSY, 3)}, cpu=0)
    finally:
        col.close()
    assert m["numpy"]["fpu_switches_per_second"] > 0 and m["sh"]["fpu_switches_per_second"] > 0, m
    assert m["numpy"]["avx512_active_ratio"] > CFG.threshold_on, m
    assert m["sh"]["avx512_active_ratio"] == 0.0 and m["sh"]["evex256_ratio"] > 0, m


@pytest.mark.root
@pytest.mark.bpf
@pytest.mark.avx512
def test_pid_keyed_program_maps_processes_to_their_container(host: HostPaths, cgroups: Cgroups) -> None:
    col = Avx512Collector(config=CFG, host=host, cgroupfs=cgroups.fs, pid_keys=True)
    try:
        assert col.start().detail.get("keys") == "pid"
        c, sh = cgroups.new("numpy"), cgroups.new("sh")
        col.collect([c], time.time())
        # numpy shares its CPU with a scalar loop, as in the cgroup-keyed test: alone on an idle
        # CPU it is barely switched out, and a handful of FPU saves make the ratio a coin toss
        procs = [cgroups.run(c, bounded(NUMPY_EXP, 2), cpu=0), cgroups.run(sh, bounded(SH_BUSY, 2), cpu=0)]
        time.sleep(1.5)  # read while the process lives: a pid key is mapped through its cgroup
        m = col.collect([c], time.time())["numpy"]
        for p in procs:
            p.wait(timeout=30)
    finally:
        col.close()
    assert m["avx512_active_ratio"] > CFG.threshold_on, m


def run_with_partner(cgroups: Cgroups, c: Any) -> None:
    """Run a busy loop in `c` time-sliced with one in another cgroup on one CPU: the key on that
    CPU keeps changing, so `c`'s counts are flushed into the hash (not only pending)."""
    procs = [cgroups.run(c, bounded(SH_BUSY, 0.5), cpu=0),
             cgroups.run(cgroups.new(f"{c.id}-partner"), bounded(SH_BUSY, 0.5), cpu=0)]
    for p in procs:
        p.wait(timeout=30)


@pytest.mark.root
@pytest.mark.bpf
@pytest.mark.avx512
def test_counts_still_pending_on_a_cpu_are_in_the_window(host: HostPaths, cgroups: Cgroups,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # With no flush by count, a loop's counts stay in its CPU's pending entry until another key's
    # event comes there. Once it has exited, hash + pending for its key no longer change (a flush
    # only moves counts between the two): the window must hold exactly that sum. The control is
    # the hash alone, which a window without the pending slots would report.
    monkeypatch.setattr(avx512, "FLUSH", 1 << 40)
    col = Avx512Collector(config=CFG, host=host, cgroupfs=cgroups.fs)
    try:
        assert col.start().up
        c = cgroups.new("lone")
        key = cgroups.fs.cgroup_id(c.cgroup)
        col.collect([c], time.time())
        cgroups.run(c, bounded(SH_BUSY, 1), cpu=1).wait(timeout=30)
        got = col._map.deltas().get(key, (0, 0, 0))  # type: ignore[union-attr]
        hashed, still = hash_and_pending(col, key)
    finally:
        col.close()
    assert got == tuple(h + p for h, p in zip(hashed, still)) and got[2] > 0, (got, hashed, still)


def hash_and_pending(col: Avx512Collector, key: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A key's counts in the hash and in the pending slots, read until two reads agree (a flush
    on some CPU between reading the one and the other moves counts out of both)."""
    table, pending = col._bpf[b"avx_counts"], col._map.pending  # type: ignore[union-attr]
    last = None
    for _ in range(5):
        hashed = tuple(getattr(table[table.Key(key)], f) for f in avx512.FIELDS) if table.Key(key) in table else (0, 0, 0)
        now = (hashed, pending.read().get(key, (0, 0, 0)))  # type: ignore[union-attr]
        if now == last:
            break
        last = now
    return now


@pytest.mark.root
@pytest.mark.bpf
def test_entries_of_vanished_cgroups_are_deleted_from_the_map(bpf_collector: Avx512Collector, cgroups: Cgroups) -> None:
    c = cgroups.new("gone")
    bpf_collector.collect([c], time.time())
    run_with_partner(cgroups, c)
    bpf_collector.collect([c], time.time())
    key = cgroups.fs.cgroup_id(c.cgroup)
    table = bpf_collector._bpf[b"avx_counts"]
    assert table.Key(key) in table
    cgroups.cleanup()
    cgroups.made.clear()
    bpf_collector.collect([], time.time())
    assert table.Key(key) not in table


@pytest.mark.root
@pytest.mark.bpf
def test_entries_of_cgroups_no_container_owned_are_deleted_once_gone(bpf_collector: Avx512Collector, cgroups: Cgroups) -> None:
    """A cgroup created and destroyed between two discoveries (never a container) leaves no entry."""
    stray = cgroups.new("stray")
    key = cgroups.fs.cgroup_id(stray.cgroup)
    run_with_partner(cgroups, stray)
    bpf_collector.collect([], time.time())
    table = bpf_collector._bpf[b"avx_counts"]
    assert table.Key(key) in table
    cgroups.cleanup()
    cgroups.made.clear()
    for _ in range(keys.SWEEP_PERIOD_CYCLES + 1):  # within one sweep period
        bpf_collector.collect([], time.time())
    assert table.Key(key) not in table
    assert key not in bpf_collector._map._delta.keys()  # type: ignore[union-attr]


# --- degraded ------------------------------------------------------------------------------------

@pytest.mark.root
def test_without_headers_bpf_only_source_is_down_with_the_reason(no_headers_host: HostPaths, cgroups: Cgroups) -> None:
    col = Avx512Collector(config=Avx512Config(source="bpf"), host=no_headers_host, cgroupfs=cgroups.fs)
    st = col.start()
    assert not st.up and "no kernel headers" in st.reason
    assert col.collect([cgroups.new("x")], time.time()) == {}


@pytest.mark.root
@pytest.mark.avx512
def test_without_bpf_auto_falls_back_to_the_coarse_arch_status_signal(no_headers_host: HostPaths, cgroups: Cgroups) -> None:
    col = Avx512Collector(config=CFG, host=no_headers_host, cgroupfs=cgroups.fs)
    st = col.start()
    assert st.up and st.detail["source"] == "arch_status" and "no kernel headers" in st.reason
    c = cgroups.new("numpy")
    col.collect([c], time.time())
    p = cgroups.run(c, bounded(NUMPY_EXP, 2))
    time.sleep(1.5)
    m = col.collect([c], time.time())["numpy"]
    p.wait(timeout=30)
    assert m["avx512_coarse"] == 1.0 and m["avx512_active_ratio"] > 0 and "evex256_ratio" not in m


def test_disabled_collector_is_down_and_says_so(host: HostPaths) -> None:
    st = Avx512Collector(config=Avx512Config(enabled=False), host=host, cgroupfs=None).start()
    assert not st.up and "disabled" in st.reason
