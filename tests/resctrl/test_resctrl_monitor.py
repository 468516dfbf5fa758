"""The resctrl monitoring collector and the exported class metrics, counters driven by the test."""

from __future__ import annotations

from perfbalance.model import Container
from collectors.resctrl_mon import ResctrlMonCollector
from resctrl.counters import CounterTracker
from resctrl.metrics import class_metrics
from rchelpers import open_on

CLASSES = "classes: {gold: {l3: '50%'}}\nqos_classes: {guaranteed: gold}"
MON = "perfbalance.gold/mon_groups/perfbalance.c-c1"


def started(emulator, threaded, variant: str = "full", **kw: object):
    emu = emulator(variant, **kw)
    m = open_on(emu, CLASSES).manager
    proc = threaded(2)
    col = ResctrlMonCollector(manager=m, tids_of=lambda c: proc.tids())
    assert col.start().up
    c = Container(id="c1", cgroup="pbtest/c1", qos="guaranteed")
    m.assign("c1", "gold", proc.tids())
    col.proc = proc  # type: ignore[attr-defined]
    return emu, m, col, c


def test_rates_and_totals_come_from_counter_deltas(emulator, threaded) -> None:
    emu, m, col, c = started(emulator, threaded)
    emu.set_counter(MON, "mbm_total_bytes", 1000)
    emu.set_counter(MON, "mbm_local_bytes", 400)
    emu.set_counter(MON, "llc_occupancy", 3 << 20)
    col.collect([c], 100.0)  # creates the group; first reading is a baseline
    emu.set_counter(MON, "mbm_total_bytes", 1000 + 5000)
    emu.set_counter(MON, "mbm_local_bytes", 400 + 1000)
    got = col.collect([c], 110.0)["c1"]
    assert got["mbm_total_bytes_per_second"] == 2 * 5000 / 10  # two domains
    assert got["mbm_local_bytes_per_second"] == 2 * 1000 / 10
    assert got["mbm_total_bytes_total"] == 10000 and got["llc_occupancy_bytes"] == 2 * (3 << 20)
    assert got["memory_bandwidth_bytes_per_second"] == 1000 and got["memory_bandwidth_estimated"] == 0


def test_unavailable_gives_no_rate_and_keeps_the_total(emulator, threaded) -> None:
    emu, m, col, c = started(emulator, threaded)
    emu.set_counter(MON, "mbm_total_bytes", 1000)
    col.collect([c], 0.0)
    emu.set_counter(MON, "mbm_total_bytes", 3000)
    col.collect([c], 10.0)
    emu.set_counter(MON, "mbm_total_bytes", "Unavailable", domain=1)
    got = col.collect([c], 20.0)["c1"]
    assert "mbm_total_bytes_per_second" not in got and got["mbm_total_bytes_total"] == 4000


def test_a_counter_reset_is_not_a_negative_rate(emulator, threaded) -> None:
    emu, m, col, c = started(emulator, threaded)
    emu.set_counter(MON, "mbm_total_bytes", 10_000)
    col.collect([c], 0.0)
    emu.set_counter(MON, "mbm_total_bytes", 500)  # the RMID behind the file changed
    got = col.collect([c], 10.0)["c1"]
    assert got["mbm_total_bytes_per_second"] == 2 * 500 / 10 and got["mbm_total_bytes_total"] == 1000


def test_tracker_counts_a_decrease_as_a_reset() -> None:
    t = CounterTracker()
    assert [t.update("k", v) for v in (100, 150, 20, None, 50)] == [None, 50, 20, None, 30]
    assert t.total("k") == 100


def test_class_metrics_sum_the_class_and_count_the_budget(emulator, threaded) -> None:
    emu, m, col, c = started(emulator, threaded)
    emu.set_counter("perfbalance.gold", "mbm_total_bytes", 100)
    emu.set_counter(MON, "mbm_total_bytes", 1000)
    col.collect([c], 0.0)
    emu.set_counter(MON, "mbm_total_bytes", 2000)
    col.collect([c], 10.0)
    metrics = col.class_metrics
    assert metrics is not None and metrics.classes["gold"].mbm_total_bytes_total == 2 * 1000
    assert metrics.free_closids == 8 - 1 - 1  # num_closids 8 (MB), minus root and gold
    assert metrics.free_rmids == 32 - 1 - 1 - 1  # minus root, gold and c1's monitoring group
    assert metrics.node_metrics()["resctrl_closids_free"] == 6


def test_foreign_groups_count_against_the_budget(emulator, threaded) -> None:
    emu, m, col, c = started(emulator, threaded)
    (emu.mount / "other-team").mkdir()
    free_closids = class_metrics(m).free_closids
    assert free_closids == 8 - 1 - 2


def test_containers_without_rmid_are_reported_in_status(emulator, threaded) -> None:
    emu, m, col, c = started(emulator, threaded, num_rmids=3)  # root, gold, one more
    other = Container(id="c2", cgroup="pbtest/c2", qos="guaranteed")
    got = col.collect([c, other], 0.0)
    assert set(got) == {"c1"}
    st = col.status()
    assert st.up and st.detail["monitored_by_class"] == 1 and "out of RMIDs" in st.detail["reason"]


def test_monitoring_group_of_a_departed_container_is_removed(emulator, threaded) -> None:
    emu, m, col, c = started(emulator, threaded)
    col.collect([c], 0.0)
    assert (emu.mount / MON).is_dir()
    col.proc.stop()  # type: ignore[attr-defined]  # the container exited: its threads are gone
    col.collect([], 10.0)
    assert not (emu.mount / MON).exists()


def test_monitoring_group_with_live_threads_is_never_removed(emulator, threaded) -> None:
    emu, m, col, c = started(emulator, threaded)
    col.collect([c], 0.0)
    col.collect([], 10.0)  # the container left our view but its threads still run
    assert (emu.mount / MON).is_dir()


def test_no_resctrl_is_down_with_reason() -> None:
    col = ResctrlMonCollector(manager=None, reason="resctrl is not mounted (no resctrl line in /proc/mounts)")
    st = col.start()
    assert not st.up and "not mounted" in st.reason and col.collect([], 0.0) == {}


def test_no_monitoring_hardware_is_down_with_reason(emulator) -> None:
    emu = emulator("l2_only")
    col = ResctrlMonCollector(manager=open_on(emu, "classes: {gold: {l2: '50%'}}").manager)
    st = col.start()
    assert not st.up and "no monitoring" in st.reason and "L2" in st.reason
