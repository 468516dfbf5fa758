"""PMU counters per container: BPF attribution at sched_switch, per-cgroup fallback, software events.

This machine has no hardware PMU: the same code paths run with software events (task-clock,
context-switches, cpu-migrations), and hardware events are expected to fail to open.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from collector_helpers import PYTHON, SH_BUSY, Cgroups, bounded
from collectors import events as ev
from collectors import perf
from collectors.bpfenv import keys
from perfbalance.cgroupfs import CgroupPathRefused, Cgroupfs
from collectors.config import PerfConfig
from perfbalance.model import Container
from perfbalance import cpus
from perfbalance.errors import ParseError
from perfbalance.host import HostPaths

SOFTWARE = PerfConfig(events=("task_clock", "context_switches", "cpu_migrations"))


# --- pure ----------------------------------------------------------------------------------------

def test_known_event_names_and_aliases_parse() -> None:
    assert ev.parse_event("task-clock") == ev.KNOWN["task_clock"]
    assert ev.parse_event("cache-misses").name == "llc_misses"


def test_raw_event_gets_a_metric_safe_name_and_its_config() -> None:
    e = ev.parse_event("CORE_POWER.LVL2_TURBO_LICENSE=0x28c")
    assert (e.name, e.type, e.config) == ("core_power_lvl2_turbo_license", ev.PERF_TYPE_RAW, 0x28C)


def test_unknown_event_is_rejected_with_the_known_list() -> None:
    with pytest.raises(ParseError, match="bogus.*|known"):
        ev.parse_event("bogus")


def test_multiplexed_count_is_scaled_by_enabled_over_running() -> None:
    assert perf.scaled(1000, 4000, 1000) == 4000.0
    assert perf.scaled(1000, 1000, 1000) == 1000.0
    assert perf.scaled(5, 100, 0) == 0.0


def test_rates_and_totals_of_each_event() -> None:
    events = ev.parse_events(["instructions", "cycles", "llc_misses"])
    counts = {"instructions": 2e9, "cycles": 1e9, "llc_misses": 4e6}
    m = perf.derive(events, counts, counts, 2.0)
    assert m["instructions_per_second"] == 1e9 and m["cycles_per_second"] == 5e8 and m["llc_misses_total"] == 4e6


def test_task_clock_is_reported_in_seconds() -> None:
    events = (ev.KNOWN["task_clock"],)
    counts = perf.window_counts(events, perf.Raw(counter=(1_500_000_000,), enabled=(1,), running=(1,)))
    m = perf.derive(events, counts, counts, 3.0)
    assert m["task_clock_seconds_total"] == 1.5 and m["task_clock_seconds_per_second"] == 0.5


def test_map_value_splits_into_counter_enabled_running() -> None:
    assert perf.split_row((1, 2, 3, 4, 5, 6), 2) == perf.Raw(counter=(1, 2), enabled=(3, 4), running=(5, 6))


def test_reading_of_a_counting_fd_parses_value_and_times() -> None:
    raw = (7).to_bytes(8, "little") + (9).to_bytes(8, "little") + (8).to_bytes(8, "little")
    assert perf.parse_reading(raw) == perf.Reading(counter=7, enabled=9, running=8)


# --- this host: no PMU ---------------------------------------------------------------------------

@pytest.mark.root
def test_oversized_cpu_list_is_an_error_naming_the_file(tmp_path: Path) -> None:
    online = tmp_path / "devices/system/cpu/online"
    online.parent.mkdir(parents=True)
    online.write_text("0-1" + " " * cpus.CPULIST_MAX_BYTES)
    with pytest.raises(ParseError, match="cpu list online.*larger than"):
        perf.online_cpus(str(tmp_path))


def test_without_a_pmu_hardware_events_fall_back_to_software_events() -> None:
    if perf.probe_events(["cycles"])["cycles"] == "ok":
        pytest.skip("this host has a hardware PMU")
    events, notes = perf.choose_events(ev.parse_events(["instructions", "cycles"]))
    assert [e.name for e in events] == ["task_clock"]  # no software event feeds the planner
    assert any("no hardware PMU" in n for n in notes)


def test_only_the_events_asked_for_are_read() -> None:
    # Every event is a counter read at each switch that changes cgroup: none is added unasked.
    events, _ = perf.choose_events(ev.parse_events(["context_switches"]))
    assert [e.name for e in events] == ["context_switches"]
    assert "llc_references" not in PerfConfig().events
    assert set(PerfConfig().events) == {"instructions", "cycles", "llc_misses"}  # what derive() uses


@pytest.mark.root
def test_hardware_event_on_a_host_without_pmu_fails_to_open_with_errno() -> None:
    if perf.probe_events(["cycles"])["cycles"] == "ok":
        pytest.skip("this host has a hardware PMU")
    with pytest.raises(OSError):
        perf.perf_event_open(ev.KNOWN["cycles"], pid=-1, cpu=0)


# --- real BPF attribution ------------------------------------------------------------------------

def busy_and_idle(col: object, cgroups: Cgroups) -> dict[str, dict[str, float]]:
    busy, idle = cgroups.new("busy"), cgroups.new("idle")
    col.collect([busy, idle], time.time())  # type: ignore[attr-defined]
    procs = [cgroups.run(busy, bounded(SH_BUSY, 2)), cgroups.run(idle, ["sleep", "2"])]
    for p in procs:
        p.wait(timeout=60)
    out = dict(col.collect([busy, idle], time.time()))  # type: ignore[attr-defined]
    out["kernel"] = {"busy": cgroups.cpuacct_seconds(busy), "idle": cgroups.cpuacct_seconds(idle)}
    return out


@pytest.mark.root
@pytest.mark.bpf
def test_bpf_attribution_credits_busy_cgroup_with_its_cpu_time(host: HostPaths, cgroups: Cgroups) -> None:
    col = perf.BpfPerfCollector(config=SOFTWARE, host=host, cgroupfs=cgroups.fs)
    st = col.start()
    try:
        assert st.up and st.detail["mode"] == "bpf", st.reason
        got = busy_and_idle(col, cgroups)
    finally:
        col.close()
    kernel = got["kernel"]["busy"]
    assert kernel > 0.5  # the loop really ran
    assert got["busy"]["task_clock_seconds_total"] == pytest.approx(kernel, rel=0.10)
    assert got["busy"]["context_switches_total"] > 0


@contextmanager
def started_bpf(host: HostPaths, cgroups: Cgroups) -> Iterator[perf.BpfPerfCollector]:
    """The BPF attribution collector on software events, started (asserted up), closed after."""
    col = perf.BpfPerfCollector(config=SOFTWARE, host=host, cgroupfs=cgroups.fs)
    assert col.start().up
    try:
        yield col
    finally:
        col.close()


def two_loops_on_one_cpu(col: perf.BpfPerfCollector, cgroups: Cgroups, *, same: bool) -> dict[str, object]:
    """Two busy loops sharing CPU 0, in one cgroup (same) or in two."""
    tag = "same" if same else "apart"
    a = cgroups.new(f"{tag}-a")
    b = a if same else cgroups.new(f"{tag}-b")
    group = [a] if same else [a, b]
    col.collect(group, time.time())
    before = col.switches(cpu=0)
    procs = [cgroups.run(a, bounded(SH_BUSY, 2), cpu=0), cgroups.run(b, bounded(SH_BUSY, 2), cpu=0)]
    for p in procs:
        p.wait(timeout=60)
    got = col.collect(group, time.time())
    after = col.switches(cpu=0)
    return {"metrics": got, "kernel": {c.id: cgroups.cpuacct_seconds(c) for c in group},
            "read": after[0] - before[0], "skipped": after[1] - before[1]}


@pytest.mark.root
@pytest.mark.bpf
def test_switches_within_one_cgroup_read_no_counters_and_attribution_stays_exact(host: HostPaths, cgroups: Cgroups) -> None:
    with started_bpf(host, cgroups) as col:
        same = two_loops_on_one_cpu(col, cgroups, same=True)
        apart = two_loops_on_one_cpu(col, cgroups, same=False)  # control: every switch changes cgroup
    # the two loops of one cgroup switch between each other every time slice: no read there
    assert same["skipped"] > 100 and same["skipped"] > apart["skipped"], (same, apart)
    # and the skipped switches lose nothing: each cgroup is credited with what the kernel counted
    for case in (same, apart):
        for cid, seconds in case["kernel"].items():  # type: ignore[union-attr]
            assert seconds > 0.5
            assert case["metrics"][cid]["task_clock_seconds_total"] == pytest.approx(seconds, rel=0.10), case


ECHO = ["sh", "-c", "while read -r line; do echo \"$line\"; done"]  # blocks on stdin between lines


@contextmanager
def busy_parent_on_cpu0(col: perf.BpfPerfCollector, cgroups: Cgroups, other: str,
                        task: Callable[[Container], list[str]]) -> Iterator[tuple[Container, Container, Any]]:
    """Two busy loops of a new cgroup `parent` on CPU 0 (their switches are skips, so the time
    between reads piles up unread) and `task(other)` started in `parent` on CPU 0 with pipes, beside a
    new cgroup `other` (both collected once before anything runs in them); this process runs
    away from CPU 0 meanwhile (so that the task is woken from a loop, not from us). Yields
    (parent, other, task's process); kills them afterwards."""
    others = [c for c in perf.online_cpus() if c != 0]
    if not others:
        pytest.skip("needs a second online CPU (for us, away from the loops on CPU 0)")
    parent, second = cgroups.new("parent"), cgroups.new(other)
    col.collect([parent, second], time.time())
    loops = [cgroups.run(parent, bounded(SH_BUSY, 60), cpu=0) for _ in range(2)]
    proc = cgroups.run(parent, task(second), cpu=0, pipes=True)
    assert proc.stdin is not None and proc.stdout is not None
    ours = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(others))
    try:
        yield parent, second, proc
    finally:
        os.sched_setaffinity(0, ours)
        for p in (*loops, proc):
            p.kill()
            p.wait(timeout=10)


def moves_under_a_busy_cgroup(col: perf.BpfPerfCollector, cgroups: Cgroups, *, rounds: int = 50,
                              gap: float = 0.02) -> dict[str, object]:
    """Two busy loops of cgroup `parent` share CPU 0 (their switches are skips, so the time
    between reads piles up unread), beside a child started in `parent` on CPU 0 that blocks
    between lines. Each round moves the blocked child, whose last switch-out was in the other
    cgroup, into `moved` or back, then wakes it for one line: a switch from a loop of `parent`
    into a task whose pmu_task entry names `parent` but that now runs in `moved`."""
    with busy_parent_on_cpu0(col, cgroups, "moved", lambda _: ECHO) as (parent, moved, child):
        before = col.switches(cpu=0)
        for i in range(2 * rounds):
            time.sleep(gap)
            cgroups.fs.attach((moved if i % 2 == 0 else parent).cgroup, child.pid)
            child.stdin.write(b"%d\n" % i)
            child.stdin.flush()
            assert child.stdout.readline() == b"%d\n" % i
        after = col.switches(cpu=0)
    group = [parent, moved]
    got = col.collect(group, time.time())
    return {"metrics": got, "kernel": {c.id: cgroups.cpuacct_seconds(c) for c in group},
            "read": after[0] - before[0], "skipped": after[1] - before[1]}


@pytest.mark.root
@pytest.mark.bpf
def test_a_task_moved_since_it_last_switched_out_does_not_take_its_old_cgroups_time(
        host: HostPaths, cgroups: Cgroups) -> None:
    # Its pmu_task entry still names the old cgroup: skipping the read at its switch-in would
    # credit the parent's unread time to the cgroup it moved into (cgroup_attach_task makes the
    # entry stale): `moved` would get up to a whole gap of the loops' time per round.
    with started_bpf(host, cgroups) as col:
        got = moves_under_a_busy_cgroup(col, cgroups)
    kernel, metrics = got["kernel"], got["metrics"]
    assert kernel["parent"] > 0.5 and kernel["moved"] > 0  # the loops ran, and the child in `moved`
    assert got["skipped"] > 50, got  # the loops' switches among themselves still read nothing
    assert metrics["moved"]["task_clock_seconds_total"] == pytest.approx(kernel["moved"], abs=0.005), got
    assert metrics["parent"]["task_clock_seconds_total"] == pytest.approx(kernel["parent"], rel=0.10), got


# A forker: a child that exits at once leaves its thread id X, last switched out in our cgroup;
# per line on stdin, clone3 a child with that same id X (set_tid) straight into the v2 cgroup
# argv[1] (CLONE_INTO_CGROUP: no cgroup_attach_task) that exits at once, then leave the next X
# the same way; print both ids.
REUSE = [PYTHON, "-c", """
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
into = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
def exited():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid
old = exited()
while sys.stdin.readline():
    tid = (ctypes.c_int * 1)(old)
    args = struct.pack("=11Q", 0x200000000, 0, 0, 0, 17, 0, 0, 0, ctypes.addressof(tid), 1, into)
    new = libc.syscall(435, ctypes.create_string_buffer(args, len(args)), len(args))
    if new == 0:
        os._exit(0)
    if new > 0:
        os.waitpid(new, 0)
    print(old, new, flush=True)
    old = exited()
"""]


def v2_usage_seconds(cgroups: Cgroups, c: Container) -> float:
    stat = dict(line.split() for line in cgroups.fs.read(c.cgroup, None, "cpu.stat").splitlines())
    return int(stat["usage_usec"]) / 1e6


def reused_ids_under_a_busy_cgroup(col: perf.BpfPerfCollector, cgroups: Cgroups, *, rounds: int = 100,
                                   gap: float = 0.02) -> dict[str, object]:
    """The loops of moves_under_a_busy_cgroup, beside a REUSE forker of `parent` on CPU 0: each
    round a thread of `parent` exits, and a new thread with its id starts in `fresh`, switched
    in from `parent` (the forker or a loop) while the pmu_task entry still names `parent`."""
    reused = 0
    into = lambda fresh: [*REUSE, cgroups.fs.dir(fresh.cgroup, None)]  # noqa: E731 (the forker clones into it)
    with busy_parent_on_cpu0(col, cgroups, "fresh", into) as (parent, fresh, forker):
        for _ in range(rounds):
            time.sleep(gap)
            forker.stdin.write(b"\n")
            forker.stdin.flush()
            old, new = forker.stdout.readline().split()
            reused += old == new
    got = col.collect([parent, fresh], time.time())
    return {"metrics": got, "reused": reused, "kernel": {"parent": cgroups.cpuacct_seconds(parent),
                                                         "fresh": v2_usage_seconds(cgroups, fresh)}}


@pytest.mark.root
@pytest.mark.bpf
def test_a_new_thread_reusing_an_exited_threads_id_does_not_take_its_cgroups_time(
        host: HostPaths, cgroups: Cgroups) -> None:
    # The exited thread's pmu_task entry names `parent`: skipping the read at the new thread's
    # first switch-in would credit the parent's unread time to `fresh` (sched_process_fork clears
    # the entry). The children of `fresh` stay in the parent's v1 cgroups: `fresh`'s own time is
    # its v2 cpu.stat.
    with started_bpf(host, cgroups) as col:
        got = reused_ids_under_a_busy_cgroup(col, cgroups)
    kernel, metrics = got["kernel"], got["metrics"]
    assert got["reused"] > 90, got  # the new thread got the old id (set_tid), nearly every round
    assert kernel["parent"] > 0.5 and kernel["fresh"] > 0, got
    assert metrics["fresh"]["task_clock_seconds_total"] == pytest.approx(kernel["fresh"], abs=0.005), got
    # its children stay in the v1 cgroups of `parent`, whose cpuacct counts them
    assert metrics["parent"]["task_clock_seconds_total"] == pytest.approx(kernel["parent"] - kernel["fresh"], rel=0.10), got


@pytest.mark.root
@pytest.mark.bpf
def test_bpf_attribution_credits_idle_cgroup_with_near_zero(host: HostPaths, cgroups: Cgroups) -> None:
    with started_bpf(host, cgroups) as col:
        got = busy_and_idle(col, cgroups)
    assert got["idle"]["task_clock_seconds_total"] < 0.05
    assert got["idle"]["task_clock_seconds_total"] == pytest.approx(got["kernel"]["idle"], abs=0.02)


@pytest.mark.root
@pytest.mark.bpf
def test_perf_fds_do_not_grow_with_containers(host: HostPaths, cgroups: Cgroups) -> None:
    with started_bpf(host, cgroups) as col:
        col.collect([cgroups.new("one")], time.time())
        few = col.perf_fds
        col.collect([cgroups.new(f"c{i}") for i in range(20)], time.time())
        many = col.perf_fds
    assert few == many == len(col.events) * len(perf.online_cpus())
    assert col.perf_fds == 0


@pytest.mark.root
@pytest.mark.bpf
def test_entries_of_removed_cgroups_no_container_owned_are_deleted(host: HostPaths, cgroups: Cgroups) -> None:
    """sched_switch credits every cgroup that runs: those that vanish must not stay in the map."""
    with started_bpf(host, cgroups) as col:
        stray = cgroups.new("stray")
        key = cgroups.fs.cgroup_id(stray.cgroup)
        cgroups.run(stray, ["true"]).wait(timeout=30)
        col.collect([], time.time())
        table = col._bpf[b"pmu_counts"]
        present = table.Key(key) in table
        cgroups.cleanup()
        cgroups.made.clear()
        for _ in range(keys.SWEEP_PERIOD_CYCLES + 1):
            col.collect([], time.time())
        gone = table.Key(key) not in table
    assert present and gone


@pytest.mark.root
@pytest.mark.bpf
def test_bpf_mode_without_headers_is_down_with_the_reason(no_headers_host: HostPaths, cgroups: Cgroups) -> None:
    col = perf.BpfPerfCollector(config=SOFTWARE, host=no_headers_host, cgroupfs=cgroups.fs)
    st = col.start()
    assert not st.up and "no kernel headers" in st.reason and col.perf_fds == 0


# --- per-cgroup mode (hosts without BPF) ---------------------------------------------------------

@pytest.mark.root
def test_cgroup_mode_counts_a_busy_cgroup_like_the_kernel(host: HostPaths, cgroups: Cgroups) -> None:
    col = perf.CgroupPerfCollector(config=SOFTWARE, host=host, cgroupfs=cgroups.fs)
    st = col.start()
    try:
        assert st.up and st.detail["mode"] == "cgroup", st.reason
        got = busy_and_idle(col, cgroups)
        per_container = col.perf_fds // 2
    finally:
        col.close()
    assert got["busy"]["task_clock_seconds_total"] == pytest.approx(got["kernel"]["busy"], rel=0.10)
    assert got["idle"]["task_clock_seconds_total"] < 0.05
    assert per_container == len(col.events) * len(perf.online_cpus())


@pytest.mark.root
def test_cgroup_mode_refuses_a_symlinked_cgroup_path(host: HostPaths, cgroups: Cgroups, tmp_path: Path) -> None:
    """A symlink planted as a container's cgroup must not count some other (real) cgroup."""
    real = cgroups.fs.dir(cgroups.new("real").cgroup, None)
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    (tmp_path / "evil").symlink_to(real)
    col = perf.CgroupPerfCollector(config=SOFTWARE, host=host, cgroupfs=Cgroupfs(root=str(tmp_path)))
    assert col.start().up
    try:
        with pytest.raises(CgroupPathRefused, match="symlink"):
            col._ensure_open(Container(id="evil", name="evil", cgroup="evil"))
        assert col.collect([Container(id="evil", name="evil", cgroup="evil")], time.time()) == {}
        assert col.perf_fds == 0
    finally:
        col.close()


@pytest.mark.root
def test_auto_mode_without_bpf_falls_back_to_per_cgroup_events(no_headers_host: HostPaths, cgroups: Cgroups) -> None:
    col = perf.make_collector(config=SOFTWARE, host=no_headers_host, cgroupfs=cgroups.fs)
    st = col.start()
    try:
        assert st.up and st.detail["mode"] == "cgroup" and "BPF mode unavailable" in st.reason
    finally:
        col.close()


def test_off_mode_is_down_and_says_why(host: HostPaths) -> None:
    st = perf.make_collector(config=PerfConfig(mode="off"), host=host, cgroupfs=None).start()
    assert not st.up and "off" in st.reason


def test_idle_containers_metrics_are_the_full_computation_s_and_reused_while_idle() -> None:
    col = perf.BpfPerfCollector(config=PerfConfig(), host=HostPaths(), cgroupfs=None)
    col.events = (ev.KNOWN["task_clock"], ev.KNOWN["context_switches"])
    zero = perf.Raw(counter=(0, 0), enabled=(0, 0), running=(0, 0))
    moved = perf.Raw(counter=(1_000_000, 3), enabled=(10, 10), running=(5, 10))
    a, b = Container(id="a", cgroup="a"), Container(id="b", cgroup="b")
    totals: dict[str, dict[str, float]] = {}
    got = []
    for window, raws in [(0.0, {"a": moved}), (1.0, {"b": moved}), (2.0, {}), (1.5, {"a": moved})]:
        got.append(col._metrics([a, b], raws, window))
        for c in ("a", "b"):  # what every container's metrics were before idle ones were reused
            counts = perf.window_counts(col.events, raws.get(c, zero))
            totals[c] = perf.accumulate(totals.get(c, {}), counts)
            assert got[-1][c] == perf.derive(col.events, counts, totals[c], window), (window, c)
    assert got[2]["a"] is got[1]["a"]  # idle twice: the same metrics
    assert got[3]["a"] != got[2]["a"] and got[3]["a"]["task_clock_seconds_per_second"] > 0  # control: it ran
