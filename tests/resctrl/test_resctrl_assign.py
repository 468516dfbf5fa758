"""Assignment on the emulated kernel with real multi-threaded processes: every thread, re-sweeps,
owned groups only, orphans, and degradation when CLOSIDs or RMIDs run out."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time

import pytest

from perfbalance.errors import ResctrlError
from perfbalance.model import Container
from resctrl.actuator import ResctrlActuator
from rchelpers import open_on

CLASSES = "classes: {gold: {l3: '50%', mb: '50%'}, bronze: {l3: '0-3', mb: '20%'}}\nqos_classes: {guaranteed: gold}"


def tasks(emu, rel: str) -> set[int]:
    return {int(t) for t in (emu.mount / rel / "tasks").read_text().split()}


def container(cid: str, **kw: object) -> Container:
    return Container(id=cid, cgroup=f"pbtest/{cid}", **kw)  # type: ignore[arg-type]


def test_every_thread_of_a_multithreaded_process_is_assigned(emulator, threaded) -> None:
    emu = emulator("full")
    m = open_on(emu, CLASSES).manager
    proc = threaded(6)
    assert len(proc.tids()) == 7
    result = m.assign("c1", "gold", proc.tids())
    assert result.moved == 7 and tasks(emu, "perfbalance.gold") == set(proc.tids())


def test_one_task_id_per_write(emulator, threaded) -> None:
    emu = emulator("full")
    m = open_on(emu, CLASSES).manager
    proc = threaded(3)
    m.assign("c1", "gold", proc.tids())
    writes = [line for line in emu.journal() if line.startswith("tasks perfbalance.gold ")]
    assert sorted(int(w.split()[-1]) for w in writes) == proc.tids()


def test_resweep_catches_a_thread_created_after_the_first_sweep(emulator, threaded) -> None:
    emu = emulator("full")
    m = open_on(emu, CLASSES).manager
    proc = threaded(2)
    late = max(proc.tids())
    time.sleep(0.05)  # the emulator infers inheritance from start times in clock ticks (10 ms)
    m.assign("c1", "gold", [t for t in proc.tids() if t != late])  # the fork race: `late` was not listed yet
    assert late not in tasks(emu, "perfbalance.gold")
    time.sleep(0.05)
    proc.spawn_thread()  # created by the (moved) main thread: inherits gold, as in the kernel
    again = m.assign("c1", "gold", proc.tids())
    assert tasks(emu, "perfbalance.gold") == set(proc.tids())
    assert again.moved == 1  # only the missing thread is written


def test_resweep_writes_nothing_when_all_threads_are_in_place(emulator, threaded) -> None:
    emu = emulator("full")
    m = open_on(emu, CLASSES).manager
    proc = threaded(2)
    m.assign("c1", "gold", proc.tids())
    assert m.assign("c1", "gold", proc.tids()).moved == 0


def test_exited_threads_are_ignored(emulator, threaded) -> None:
    emu = emulator("full")
    m = open_on(emu, CLASSES).manager
    proc = threaded(2)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    result = m.assign("c1", "gold", proc.tids() + [dead.pid])
    assert result.gone == 1 and result.moved == 3


def test_class_move_keeps_the_container_monitored(emulator, threaded) -> None:
    emu = emulator("full")
    m = open_on(emu, CLASSES).manager
    proc = threaded(3)
    m.assign("c1", "gold", proc.tids())
    old = m.monitor("c1", proc.tids())
    assert old == "perfbalance.gold/mon_groups/perfbalance.c-c1" and tasks(emu, old) == set(proc.tids())
    m.assign("c1", "bronze", proc.tids())  # the kernel drops the threads from their monitoring group
    new = m.mon["c1"]
    assert new == "perfbalance.bronze/mon_groups/perfbalance.c-c1"
    assert tasks(emu, new) == set(proc.tids()) and not (emu.mount / old).exists()


def test_degraded_class_leaves_the_container_in_the_root_group(emulator, threaded) -> None:
    emu = emulator("full", num_closids=2)  # the root and one class
    setup = open_on(emu, CLASSES)
    assert "bronze" in setup.report.degraded and "out of CLOSIDs" in setup.report.degraded["bronze"]
    assert "Out of CLOSIDs" in setup.report.degraded["bronze"]
    proc = threaded(2)
    result = setup.manager.assign("c1", "bronze", proc.tids())
    assert result.group == "" and "out of CLOSIDs" in result.degraded


def test_closid_exhaustion_does_not_stop_the_other_classes(emulator) -> None:
    emu = emulator("full", num_closids=2)
    setup = open_on(emu, CLASSES)
    assert setup.report.created == ("perfbalance.gold",)
    assert not (emu.mount / "perfbalance.bronze").exists()


def test_out_of_rmids_monitors_by_class_and_says_so(emulator, threaded) -> None:
    emu = emulator("full", num_rmids=4)  # root + gold + bronze + one monitoring group
    m = open_on(emu, CLASSES).manager
    a, b = threaded(1), threaded(1)
    m.assign("a", "gold", a.tids())
    m.assign("b", "gold", b.tids())
    assert m.monitor("a", a.tids()) is not None
    assert m.monitor("b", b.tids()) is None
    assert "b" in m.by_class and "out of RMIDs" in m.mon_reason and "Out of RMIDs" in m.mon_reason
    assert m.monitoring_mode() == "per-container+by-class"


def test_rmid_exhaustion_is_not_retried_until_one_is_freed(emulator, threaded) -> None:
    emu = emulator("full", num_rmids=4)
    m = open_on(emu, CLASSES).manager
    a, b = threaded(1), threaded(1)
    m.assign("a", "gold", a.tids())
    m.assign("b", "gold", b.tids())
    m.monitor("a", a.tids())
    m.monitor("b", b.tids())
    before = len(emu.journal())
    m.monitor("b", b.tids())
    assert len(emu.journal()) == before  # no second failing mkdir in the same state
    a.stop()
    m.gc({"b"})  # a left: its (now empty) group is removed, one RMID is free again
    assert m.monitor("b", b.tids()) is not None


def test_mbm_only_host_starts_monitors_and_writes_no_schemata(emulator, threaded) -> None:
    emu = emulator("mon_only")
    setup = open_on(emu, CLASSES)
    m = setup.manager
    assert m is not None and set(setup.report.degraded) == {"gold", "bronze"}
    proc = threaded(2)
    m.assign("c1", "gold", proc.tids())
    rel = m.monitor("c1", proc.tids())
    assert rel == "mon_groups/perfbalance.c-c1" and tasks(emu, rel) == set(proc.tids())
    assert not [line for line in emu.journal() if line.startswith("schemata")]
    assert not (emu.mount / "schemata").exists()


def test_seed_host_with_only_mb_gets_no_l3_line(emulator) -> None:
    emu = emulator("mb_only")
    setup = open_on(emu, CLASSES)
    assert setup.manager is not None and not setup.report.degraded
    writes = [line for line in emu.journal() if line.startswith("schemata")]
    assert writes and all("L3" not in w for w in writes)
    assert (emu.mount / "perfbalance.gold" / "schemata").read_text() == "MB:0= 50;1= 50;2= 50;3= 50\n"


def test_seed_failure_reproduced_by_the_emulator(emulator) -> None:
    """What cri-resource-manager wrote on that host fails as it did, now with the reason."""
    emu = emulator("mb_only")
    os.mkdir(emu.mount / "cri-resmgr.BestEffort")
    with pytest.raises(OSError) as e:
        (emu.mount / "cri-resmgr.BestEffort" / "schemata").write_text("L3:0=1;1=1;2=1;3=1\nMB:0=100;1=100;2=100;3=100\n")
    assert e.value.errno == errno.EINVAL and emu.last_cmd_status() == "Unknown or unsupported resource name 'L3'"


def test_restart_after_a_crash_cleans_our_orphans_and_nothing_else(emulator, threaded) -> None:
    emu = emulator("full")
    first = open_on(emu, CLASSES).manager
    proc, gone = threaded(2), threaded(1)
    first.assign("alive", "gold", proc.tids())
    first.monitor("alive", proc.tids())
    first.assign("gone", "gold", gone.tids())
    first.monitor("gone", gone.tids())
    os.mkdir(emu.mount / "perfbalance.retired")  # a class removed from the configuration since
    os.mkdir(emu.mount / "other-team")  # someone else's groups
    os.mkdir(emu.mount / "other-team" / "mon_groups" / "theirs")
    os.mkdir(emu.mount / "mon_groups" / "perfbalance.c-stale")
    gone.stop()  # the agent "crashed"; a container exited meanwhile
    report = open_on(emu, CLASSES).report
    assert set(report.removed) == {"perfbalance.retired", "perfbalance.gold/mon_groups/perfbalance.c-gone",
                                   "mon_groups/perfbalance.c-stale"}
    assert (emu.mount / "other-team" / "mon_groups" / "theirs").is_dir()
    assert "perfbalance.gold/mon_groups/perfbalance.c-alive" in report.kept  # non-empty: kept, adopted later
    assert set(report.reused) == {"perfbalance.gold", "perfbalance.bronze"}


def test_restarted_agent_adopts_the_monitoring_group_of_a_running_container(emulator, threaded) -> None:
    emu = emulator("full")
    first = open_on(emu, CLASSES).manager
    proc = threaded(2)
    first.assign("c1", "gold", proc.tids())
    first.monitor("c1", proc.tids())
    second = open_on(emu, CLASSES).manager
    second.assign("c1", "gold", proc.tids())
    mkdirs = [line for line in emu.journal() if line.startswith("mkdir")]
    assert second.monitor("c1", proc.tids()) == "perfbalance.gold/mon_groups/perfbalance.c-c1"
    assert [line for line in emu.journal() if line.startswith("mkdir")] == mkdirs


def test_a_non_empty_retired_class_group_is_never_removed(emulator, threaded) -> None:
    emu = emulator("full")
    os.mkdir(emu.mount / "perfbalance.retired")
    proc = threaded(1)
    (emu.mount / "perfbalance.retired" / "tasks").write_text(str(proc.pid))
    report = open_on(emu, CLASSES).report
    assert "perfbalance.retired" in report.kept and (emu.mount / "perfbalance.retired").is_dir()


def test_only_the_last_path_element_is_created_and_names_are_not_paths(emulator) -> None:
    emu = emulator("full")
    m = open_on(emu, CLASSES).manager
    for bad in ("a/b", "..", ".", "", "tasks"):
        with pytest.raises(ValueError):
            m.fs.mkdir("", bad)
    with pytest.raises(ResctrlError) as e:
        m.fs.mkdir("nonexistent/mon_groups", "perfbalance.x")
    assert e.value.errno == errno.ENOENT


def test_container_ids_become_safe_group_names(emulator) -> None:
    emu = emulator("full")
    m = open_on(emu, CLASSES).manager
    name = m.mon_group_name("../../etc/x")
    assert "/" not in name and name.startswith("perfbalance.c-") and name != m.mon_group_name("__.._etc_x")


def test_kernel_errors_carry_last_cmd_status(emulator) -> None:
    emu = emulator("full")
    m = open_on(emu, CLASSES).manager
    with pytest.raises(ResctrlError) as e:
        m.fs.write("perfbalance.gold", "schemata", "L3:0=f7\n")
    assert e.value.errno == errno.EINVAL and e.value.last_cmd_status == "The mask f7 has non-consecutive 1-bits"
    assert "last_cmd_status: The mask f7" in str(e.value)


def test_writes_hold_an_exclusive_flock_on_the_mount(emulator) -> None:
    emu = emulator("full")
    m = open_on(emu, CLASSES).manager
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError:\n    print('held')")
    with m.fs.lock():
        held = subprocess.run([sys.executable, "-c", probe, str(emu.mount)], capture_output=True, text=True).stdout
    free = subprocess.run([sys.executable, "-c", probe, str(emu.mount)], capture_output=True, text=True).stdout
    assert (held.strip(), free.strip()) == ("held", "free")


def test_actuator_applies_planner_class_over_the_qos_default(emulator, threaded) -> None:
    emu = emulator("full")
    act = ResctrlActuator(manager=open_on(emu, CLASSES).manager)
    proc = threaded(2)
    c = container("c1", qos="guaranteed")
    act.sweep([c], lambda _: proc.tids())
    assert tasks(emu, "perfbalance.gold") == set(proc.tids())
    act.apply_class(c, "bronze", proc.tids())
    act.sweep([c], lambda _: proc.tids())  # the planner's choice sticks across sweeps
    assert tasks(emu, "perfbalance.bronze") == set(proc.tids()) and not tasks(emu, "perfbalance.gold")


def test_actuator_refuses_an_unconfigured_class(emulator) -> None:
    emu = emulator("full")
    act = ResctrlActuator(manager=open_on(emu, CLASSES).manager)
    with pytest.raises(ResctrlError, match="not configured"):
        act.apply_class(container("c1"), "../../x", [os.getpid()])


def test_annotation_selects_a_class_only_when_allowed(emulator, threaded) -> None:
    emu = emulator("full")
    text = ("classes: {gold: {l3: '50%'}, secret: {l3: '0-3', allow_annotation: false}}\n"
            "qos_classes: {besteffort: gold}")
    r = open_on(emu, text).manager.resolution
    ok = container("c1", qos="besteffort", annotations={"rdt.perfbalance.io/class": "gold"})
    denied = container("c2", qos="besteffort", annotations={"rdt.perfbalance.io/class": "secret"})
    unknown = container("c3", qos="besteffort", annotations={"rdt.perfbalance.io/class": "../../tasks"})
    assert r.class_for(ok) == ("gold", "annotation rdt.perfbalance.io/class")
    assert r.class_for(denied)[0] == "gold" and "does not allow annotations" in r.class_for(denied)[1]
    assert r.class_for(unknown)[0] == "gold" and "names no configured class" in r.class_for(unknown)[1]


def test_container_annotation_overrides_the_pod_annotation(emulator) -> None:
    emu = emulator("full")
    r = open_on(emu, CLASSES).manager.resolution
    c = container("c1", name="web", annotations={"rdt.perfbalance.io/class": "gold",
                                                 "rdt.perfbalance.io/class.container.web": "bronze"})
    assert r.class_for(c)[0] == "bronze"


def test_a_container_leaving_its_class_goes_back_to_the_root_group(emulator, threaded) -> None:
    emu = emulator("full")
    m = open_on(emu, CLASSES).manager
    proc = threaded(2)
    m.assign("c1", "gold", proc.tids())
    m.assign("c1", None, proc.tids())
    assert not tasks(emu, "perfbalance.gold") and set(proc.tids()) <= tasks(emu, "")


def test_sweep_moves_every_container_and_notes_degraded_classes(emulator, threaded) -> None:
    emu = emulator("full", num_closids=2)  # bronze does not fit
    text = CLASSES.replace("{guaranteed: gold}", "{guaranteed: gold, besteffort: bronze}")
    act = ResctrlActuator(manager=open_on(emu, text).manager)
    a, b = threaded(2), threaded(2)
    procs = {"a": a, "b": b}
    report = act.sweep([container("a", qos="guaranteed"), container("b", qos="besteffort")], lambda c: procs[c.id].tids())
    assert tasks(emu, "perfbalance.gold") == set(a.tids())
    assert not report.errors and any(n.startswith("b: ") and "out of CLOSIDs" in n for n in report.notes)


def test_reload_retires_a_class_once_its_containers_left_it(emulator, threaded) -> None:
    from resctrl.resolve import resolve
    from rchelpers import config
    emu = emulator("full")
    m = open_on(emu, CLASSES).manager
    act = ResctrlActuator(manager=m)
    proc = threaded(2)
    c = container("c1", qos="guaranteed")
    act.sweep([c], lambda _: proc.tids())
    new = config("classes: {silver: {l3: '25%'}}\nqos_classes: {guaranteed: silver}")
    report = m.reconfigure(resolve(new, m.info))
    assert "perfbalance.gold" in report.kept  # still has the container's threads
    sweep = act.sweep([c], lambda _: proc.tids())
    assert tasks(emu, "perfbalance.silver") == set(proc.tids())
    assert "perfbalance.gold" in sweep.removed and not (emu.mount / "perfbalance.gold").exists()


@pytest.mark.root
def test_threads_are_listed_from_a_real_cgroup(threaded) -> None:
    from resctrl.tids import cgroup_tids
    unified = "/sys/fs/cgroup/unified" if os.path.isdir("/sys/fs/cgroup/unified") else "/sys/fs/cgroup"
    rel = f"pbtest-resctrl-{os.getpid()}"
    path = os.path.join(unified, rel)
    os.mkdir(path)
    proc = threaded(3)
    try:
        with open(os.path.join(path, "cgroup.procs"), "w") as f:
            f.write(str(proc.pid))
        assert cgroup_tids("/sys/fs/cgroup", rel) == proc.tids()
    finally:
        proc.stop()
        os.rmdir(path)
