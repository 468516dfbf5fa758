"""bpfenv: headers for bcc on a node without matching ones, kernel minimums, tracefs, map deltas."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

import bpf
from collector_helpers import Cgroups
from collectors import doctor
from collectors.bpfenv import headers, kernel, keys, maps, progstats, tracefs
from collectors.bpfenv.kernel import KernelVersion
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.errors import FeatureUnavailable, ParseError
from perfbalance.host import HostPaths


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def debian_headers(src: Path, version: str = "6.1.0-57") -> None:
    tree(src / f"linux-headers-{version}-amd64", {
        "include/generated/autoconf.h": "#define CONFIG_X86 1\n",
        "arch/x86/include/generated/asm/x.h": "gen\n", "Makefile": "amd64\n"})
    tree(src / f"linux-headers-{version}-common", {
        "include/linux/kernel.h": "kernel\n", "arch/x86/include/asm/y.h": "common\n",
        "Makefile": "common\n"})


# --- kernel versions ---------------------------------------------------------------------------

def test_release_parses_with_vendor_suffix() -> None:
    assert kernel.parse_release("6.18.44-fc-v595") == KernelVersion(major=6, minor=18, patch=44)


def test_bad_release_is_a_parse_error_naming_the_value() -> None:
    with pytest.raises(ParseError, match="linux"):
        kernel.parse_release("linux")


def test_requirements_are_minimums_not_exact_matches() -> None:
    checks = kernel.check_kernel(KernelVersion(major=4, minor=16))
    assert checks["bpf_perf_event_read_value"]["ok"]
    assert not checks["bpf_get_current_cgroup_id"]["ok"]
    assert checks["bpf_get_current_cgroup_id"]["minimum"] == ">= 4.18"


# --- headers -------------------------------------------------------------------------------------

def test_host_build_dir_of_the_running_release_wins(tmp_path: Path) -> None:
    tree(tmp_path / "modules/6.18.0/build", {"include/linux/kernel.h": ""})
    debian_headers(tmp_path / "src")
    host = HostPaths(modules=str(tmp_path / "modules"), headers_search=(str(tmp_path / "src"),),
                     run_dir=str(tmp_path / "run"))
    h = headers.find_headers(host, "6.18.0")
    assert (h.source, h.path) == ("host", str(tmp_path / "modules/6.18.0/build"))


def test_debian_split_headers_are_merged_into_a_private_tree(tmp_path: Path) -> None:
    debian_headers(tmp_path / "src")
    host = HostPaths(modules=str(tmp_path / "none"), headers_search=(str(tmp_path / "src"),),
                     run_dir=str(tmp_path / "run"))
    h = headers.find_headers(host, "6.18.44-fc")
    merged = Path(h.path)
    assert (h.source, h.release) == ("packaged", "6.1.0-57-amd64")
    assert merged == tmp_path / "run/kheaders/6.18.44-fc"
    assert (merged / "include/generated/autoconf.h").read_text().startswith("#define")
    assert (merged / "include/linux/kernel.h").read_text() == "kernel\n"
    assert (merged / "arch/x86/include/asm/y.h").exists() and (merged / "arch/x86/include/generated").exists()
    assert (merged / "Makefile").read_text() == "amd64\n"  # the flavour tree wins on conflicts


def test_nearest_packaged_version_is_chosen(tmp_path: Path) -> None:
    debian_headers(tmp_path / "src", "5.10.0-30")
    debian_headers(tmp_path / "src", "6.1.0-57")
    host = HostPaths(modules=str(tmp_path / "none"), headers_search=(str(tmp_path / "src"),),
                     run_dir=str(tmp_path / "run"))
    assert headers.find_headers(host, "6.18.44").release == "6.1.0-57-amd64"


def test_merged_tree_is_reused_when_its_inputs_are_unchanged(tmp_path: Path) -> None:
    debian_headers(tmp_path / "src")
    parts = [str(tmp_path / "src/linux-headers-6.1.0-57-amd64"), str(tmp_path / "src/linux-headers-6.1.0-57-common")]
    dest = str(tmp_path / "merged")
    headers.merge_trees(parts, dest)
    inode = os.stat(dest).st_ino
    headers.merge_trees(parts, dest)
    assert os.stat(dest).st_ino == inode
    headers.merge_trees(parts[:1], dest)
    assert not (Path(dest) / "include/linux").exists()


def test_kheaders_archive_is_extracted_when_nothing_else_exists(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel").mkdir(parents=True)
    with tarfile.open(tmp_path / "sys/kernel/kheaders.tar.xz", "w:xz") as tar:
        data = b"#define X 1\n"
        info = tarfile.TarInfo("./include/linux/kernel.h")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    host = HostPaths(sysfs=str(tmp_path / "sys"), modules=str(tmp_path / "none"),
                     headers_search=(str(tmp_path / "none"),), run_dir=str(tmp_path / "run"))
    h = headers.find_headers(host, "6.18.0")
    assert h.source == "kheaders"
    assert (Path(h.path) / "include/linux/kernel.h").read_bytes() == b"#define X 1\n"


def test_kheaders_member_escaping_the_target_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "k.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        info = tarfile.TarInfo("../evil.h")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(FeatureUnavailable, match="evil"):
        headers.extract_kheaders(str(archive), str(tmp_path / "out"))
    assert not (tmp_path / "evil.h").exists()


def test_no_headers_anywhere_says_what_was_searched(tmp_path: Path) -> None:
    host = HostPaths(sysfs=str(tmp_path), modules=str(tmp_path / "mods"), headers_search=(str(tmp_path / "src"),),
                     run_dir=str(tmp_path / "run"))
    with pytest.raises(FeatureUnavailable) as e:
        headers.find_headers(host, "6.18.0")
    assert str(tmp_path / "mods/6.18.0/build") in e.value.reason
    assert str(tmp_path / "src") in e.value.reason and "kheaders.tar.xz" in e.value.reason


# --- tracefs -----------------------------------------------------------------------------------

def test_tracepoint_existence_is_read_from_tracefs(tmp_path: Path) -> None:
    tree(tmp_path, {"events/sched/sched_switch/format": "name: sched_switch\n"})
    found = tracefs.tracepoints(str(tmp_path))
    assert found["sched/sched_switch"] and not found["x86_fpu/x86_fpu_regs_deactivated"]
    assert set(found) == {f"{c}/{e}" for p in bpf.PROGRAMS.values() for c, e in p.tracepoints}


def test_a_program_needs_every_one_of_its_tracepoints(tmp_path: Path) -> None:
    tree(tmp_path, {"events/sched/sched_switch/format": "name: sched_switch\n",
                    "events/sched/sched_process_fork/format": "name: sched_process_fork\n"})
    # the PMU program also makes its same-cgroup entries stale when a task moves cgroup
    assert tracefs.missing_tracepoint(str(tmp_path), ["pmu"]) == "cgroup/cgroup_attach_task"
    tree(tmp_path, {"events/cgroup/cgroup_attach_task/format": "name: cgroup_attach_task\n"})
    assert tracefs.missing_tracepoint(str(tmp_path), ["pmu"]) is None
    assert tracefs.missing_tracepoint(str(tmp_path), ["pmu", "runqlat"]) == "sched/sched_wakeup"


def test_unmounted_tracefs_without_permission_to_mount_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(FeatureUnavailable, match="tracefs not mounted"):
        tracefs.ensure_tracefs(str(tmp_path), mount=False)


# --- non-destructive map reads -----------------------------------------------------------------

def test_a_map_wrapped_right_after_load_counts_every_key_it_gains_from_zero(tmp_path: Path) -> None:
    table = FakeTable()
    m = counting(v2_tree(tmp_path, []), table)
    table[7] = Row(3)
    assert m.deltas() == {7: (3,)}


def test_what_a_map_held_before_it_was_wrapped_is_a_baseline(tmp_path: Path) -> None:
    table = FakeTable({7: Row(100)})
    m = counting(v2_tree(tmp_path, []), table)
    table[7] = Row(104)
    assert m.deltas() == {7: (4,)}


# --- pruning: bounded sweeps of what is alive ----------------------------------------------------

class FakeTable(dict):  # type: ignore[type-arg]
    """The part of a bcc hash table CountingMap uses: items(), Key(k), del."""

    Key = int

    def bump(self, key: int) -> None:
        self[key] = Row(self.get(key, Row(0)).n + 1)


class Row:
    def __init__(self, n: int) -> None:
        self.n = n


def v2_tree(root: Path, dirs: list[str]) -> Cgroupfs:
    """A plain-directory cgroup v2 layout (Cgroupfs reads it without magic checks)."""
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for d in dirs:
        (root / d).mkdir(parents=True)
    return Cgroupfs(root=str(root))


def ino(path: Path) -> int:
    return os.stat(path).st_ino


def counting(fs: Cgroupfs, table: FakeTable, *, period: int = 1, budget: int = 100) -> maps.CountingMap:
    live = keys.LiveKeys(fs, pid_keys=False, period=period, budget=budget)
    return maps.CountingMap(table, fields=("n",), batch=False, max_keys=1000, live=live)


def cycle(m: maps.CountingMap) -> int:
    m.deltas()
    return m.prune({}, {})


def test_entry_of_a_removed_cgroup_no_container_owned_is_deleted(tmp_path: Path) -> None:
    fs = v2_tree(tmp_path, ["kubepods/pod1/short-lived", "system.slice/sshd.service"])
    table = FakeTable()
    gone, alive = ino(tmp_path / "kubepods/pod1/short-lived"), ino(tmp_path / "system.slice/sshd.service")
    table.bump(gone)
    table.bump(alive)
    m = counting(fs, table)
    (tmp_path / "kubepods/pod1/short-lived").rmdir()  # never discovered: no container owned it
    assert cycle(m) == 1
    assert list(table) == [alive] and m.rows == 1  # the map and our delta table alike


def test_live_cgroups_no_container_owns_are_kept_across_sweeps(tmp_path: Path) -> None:
    fs = v2_tree(tmp_path, ["system.slice/a.service", "system.slice/b.service/sub", "user.slice"])
    table = FakeTable()
    keys = [ino(tmp_path / d) for d in ("", "system.slice/a.service", "system.slice/b.service/sub", "user.slice")]
    for k in keys:
        table.bump(k)
    m = counting(fs, table)
    for _ in range(5):
        table.bump(keys[1])
        assert cycle(m) == 0
    assert sorted(table) == sorted(keys) and table[keys[1]].n == 6  # never deleted and re-created
    assert m.live is not None and m.live.sweeps == 5


def test_a_sweep_visits_at_most_its_budget_per_cycle_and_still_finds_deep_cgroups(tmp_path: Path) -> None:
    dirs = [f"kubepods/pod{i}/c" for i in range(20)]
    fs = v2_tree(tmp_path, dirs + ["gone"])
    table = FakeTable()
    for d in dirs + ["gone"]:
        table.bump(ino(tmp_path / d))
    (tmp_path / "gone").rmdir()
    m = counting(fs, table, budget=5)
    deleted = [cycle(m) for _ in range(12)]
    assert deleted.index(1) >= 4  # 41 cgroups at 5 per cycle: not done in the first cycles
    assert sum(deleted) == 1 and len(table) == 20


def test_sweeps_start_once_per_period(tmp_path: Path) -> None:
    fs = v2_tree(tmp_path, ["a"])
    m = counting(fs, FakeTable(), period=5)
    for _ in range(11):
        cycle(m)
    assert m.live is not None and m.live.sweeps == 3  # cycles 1, 6 and 11


def test_pid_keys_of_exited_processes_are_deleted(tmp_path: Path) -> None:
    tree(tmp_path, {"1/stat": "", "42/stat": "", "self/stat": ""})
    table = FakeTable()
    for pid in (1, 42, 4242):
        table.bump(pid)
    live = keys.LiveKeys(None, pid_keys=True, procfs=str(tmp_path), period=1)
    m = maps.CountingMap(table, fields=("n",), batch=False, max_keys=1000, live=live)
    assert cycle(m) == 1 and sorted(table) == [1, 42]


def test_proc_cgroup_lines_map_controllers_to_paths() -> None:
    text = "12:cpu,cpuacct:/kubepods/pod1/abc\n1:name=systemd:/system.slice\n0::/unified/x\n"
    assert keys.parse_proc_cgroup(text) == {"cpu": "/kubepods/pod1/abc", "cpuacct": "/kubepods/pod1/abc",
                                              "name=systemd": "/system.slice", "": "/unified/x"}


def test_pid_maps_to_the_container_owning_an_ancestor_cgroup(tmp_path: Path) -> None:
    tree(tmp_path, {"42/cgroup": "4:cpu:/kubepods/pod1/abc/container\n"})
    assert keys.container_of_pid(str(tmp_path), 42, {"kubepods/pod1/abc": "c1"}) == "c1"
    assert keys.container_of_pid(str(tmp_path), 43, {"kubepods/pod1/abc": "c1"}) is None


# --- bounded reads of host files ----------------------------------------------------------------

def test_oversized_proc_cgroup_file_is_an_error_naming_it(tmp_path: Path) -> None:
    tree(tmp_path, {"42/cgroup": "0::/" + "x" * keys.PROC_CGROUP_MAX_BYTES})
    with pytest.raises(ParseError, match=r"process cgroup file.*larger than 65536 bytes.*42/cgroup"):
        keys.container_of_pid(str(tmp_path), 42, {"x": "c1"})


def test_oversized_kernel_release_file_is_an_error_naming_it(tmp_path: Path) -> None:
    tree(tmp_path, {"sys/kernel/osrelease": "6.18.0" + " " * kernel.OSRELEASE_MAX_BYTES})
    with pytest.raises(ParseError, match="kernel release file.*larger than 256 bytes"):
        kernel.running_release(HostPaths(procfs=str(tmp_path)))


def test_oversized_fdinfo_is_an_error_naming_it(tmp_path: Path) -> None:
    tree(tmp_path, {"self/fdinfo/3": "run_cnt:\t1\n" * 10000})
    with pytest.raises(ParseError, match="fdinfo.*larger than"):
        progstats.prog_stats(str(tmp_path), 3)


def test_oversized_marker_means_the_merged_tree_is_rebuilt(tmp_path: Path) -> None:
    tree(tmp_path, {f"dest/{headers.MARKER}": "/a\n" * (headers.MARKER_MAX_BYTES // 3 + 1)})
    assert headers._read_marker(str(tmp_path / "dest")) is None


def test_fdinfo_of_a_bpf_program_gives_run_time_and_count() -> None:
    info = progstats.parse_fdinfo("prog_type:\t5\nrun_time_ns:\t1200\nrun_cnt:\t30\n")
    assert (info["run_time_ns"], info["run_cnt"]) == ("1200", "30")


# --- the real host -------------------------------------------------------------------------------

@pytest.mark.root
def test_probe_on_this_host_reports_headers_tracepoints_and_events(host: HostPaths) -> None:
    report = doctor.probe(host)
    assert report["available"], report["reason"]
    assert report["headers"]["source"] in ("host", "packaged", "kheaders")
    assert report["tracepoints"]["sched/sched_switch"]
    assert report["kernel"]["requirements"]["bpf_get_current_cgroup_id"]["ok"]
    assert report["perf_events"]["task_clock"] == "ok"


@pytest.mark.root
def test_probe_without_headers_is_unavailable_with_the_reason(no_headers_host: HostPaths) -> None:
    report = doctor.probe(no_headers_host)
    assert not report["available"] and "no kernel headers" in report["reason"]


# --- which keys belong to a container ------------------------------------------------------------

@pytest.mark.root
def test_a_leaf_cgroup_has_its_own_id_and_a_child_made_later_joins_at_the_refresh(cgroups: Cgroups) -> None:
    fs = cgroups.fs
    c = cgroups.new("parent")
    km = keys.KeyMap(fs, pid_keys=False, refresh_cycles=1)
    top = fs.cgroup_id(c.cgroup)
    assert km.build([c]) == {top: (c.id, fs.dir(c.cgroup, None))}  # a leaf: st_nlink 2, not listed
    fs.create(f"{c.cgroup}/container", ())  # crun's child, made after the container was seen
    child = fs.cgroup_id(f"{c.cgroup}/container")
    assert km.build([c]) == {top: (c.id, fs.dir(c.cgroup, None)),
                             child: (c.id, fs.dir(f"{c.cgroup}/container", None))}


def test_collectors_sharing_a_key_map_walk_once_per_cycle(tmp_path: Path) -> None:
    from perfbalance.model import Container

    fs = v2_tree(tmp_path, ["pod/a", "pod/b/container"])
    km = keys.KeyMaps(fs).get(pid_keys=False)
    cs = [Container(id="a", cgroup="pod/a"), Container(id="b", cgroup="pod/b")]
    first = km.build(cs, now=1.0)
    assert km.build(cs, now=1.0) is first and km._cycle == 1  # the second collector of the cycle
    assert sorted(cid for cid, _ in first.values()) == ["a", "b", "b"]  # b's child is b's
    assert km.build(cs, now=2.0) == first and km._cycle == 2  # control: the next cycle walks again
    assert km.build(cs[:1], now=2.0) != first and km._cycle == 3  # and so do other containers
    assert keys.KeyMaps(fs).get(pid_keys=False) is not km  # one per agent, not per process
