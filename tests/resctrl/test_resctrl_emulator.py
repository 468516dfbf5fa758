"""The emulator behaves like the kernel where perfbalance depends on it (raw file operations)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest


def fails(fn, *args) -> int:
    with pytest.raises(OSError) as e:
        fn(*args)
    return e.value.errno


def write(path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def test_mkdir_creates_a_control_group_with_its_files(emulator) -> None:
    emu = emulator("full")
    os.mkdir(emu.mount / "g")
    assert sorted(os.listdir(emu.mount / "g")) == ["cpus", "cpus_list", "mode", "mon_data", "mon_groups", "schemata", "size", "tasks"]
    assert sorted(os.listdir(emu.mount / "g" / "mon_data")) == ["mon_L3_00", "mon_L3_01"]


def test_out_of_closids_is_enospc_with_status(emulator) -> None:
    emu = emulator("full", num_closids=2)
    os.mkdir(emu.mount / "a")
    assert fails(os.mkdir, emu.mount / "b") == errno.ENOSPC and emu.last_cmd_status() == "Out of CLOSIDs"


def test_out_of_rmids_is_enospc_with_status(emulator) -> None:
    emu = emulator("full", num_rmids=2)
    os.mkdir(emu.mount / "mon_groups" / "m1")
    assert fails(os.mkdir, emu.mount / "mon_groups" / "m2") == errno.ENOSPC and emu.last_cmd_status() == "Out of RMIDs"


def test_cdp_halves_the_closids(emulator) -> None:
    emu = emulator("cdp")
    for i in range(7):
        os.mkdir(emu.mount / f"g{i}")
    assert fails(os.mkdir, emu.mount / "g7") == errno.ENOSPC


def test_mkdir_outside_the_root_or_mon_groups_is_eperm(emulator) -> None:
    emu = emulator("full")
    os.mkdir(emu.mount / "g")
    assert fails(os.mkdir, emu.mount / "info" / "x") == errno.EPERM
    assert fails(os.mkdir, emu.mount / "g" / "x") == errno.EPERM


def test_monitoring_only_root_refuses_control_groups(emulator) -> None:
    emu = emulator("mon_only")
    assert fails(os.mkdir, emu.mount / "g") == errno.EPERM
    os.mkdir(emu.mount / "mon_groups" / "m")


def test_schemata_write_needs_a_trailing_newline(emulator) -> None:
    emu = emulator("full")
    os.mkdir(emu.mount / "g")
    assert fails(write, emu.mount / "g" / "schemata", "L3:0=ff") == errno.EINVAL


@pytest.mark.parametrize(("variant", "line", "status"), [
    ("mb_only", "L3:0=ff\n", "Unknown or unsupported resource name 'L3'"),
    ("full", "MB:0=5\n", "MB value 5 out of range [10,100]"),
    ("full", "L3:0=ff;0=f\n", "Duplicate domain 0"),
    ("full", "L3:x=ff\n", "Missing '=' or non-numeric domain"),
    ("full", "L3:0=fg\n", "Non-hex character in the mask fg"),
    ("full", "L3\n", "Missing ':'"),
])
def test_schemata_errors_set_last_cmd_status(emulator, variant: str, line: str, status: str) -> None:
    emu = emulator(variant)
    os.mkdir(emu.mount / "g")
    assert fails(write, emu.mount / "g" / "schemata", line) == errno.EINVAL and emu.last_cmd_status() == status


def test_mb_is_rounded_up_to_the_granularity(emulator) -> None:
    emu = emulator("full")
    os.mkdir(emu.mount / "g")
    write(emu.mount / "g" / "schemata", "MB:0=41\n")
    assert "MB:0= 50;1=100" in (emu.mount / "g" / "schemata").read_text()


def test_mbps_mode_takes_any_value(emulator) -> None:
    emu = emulator("mba_mbps")
    os.mkdir(emu.mount / "g")
    write(emu.mount / "g" / "schemata", "MB:0=5;1=20000\n")
    assert "MB:0=  5;1=20000" in (emu.mount / "g" / "schemata").read_text()


def test_new_group_avoids_exclusive_bits(emulator) -> None:
    emu = emulator("full")
    write(emu.mount / "schemata", "L3:0=0000f;1=0000f\n")
    os.mkdir(emu.mount / "x")
    write(emu.mount / "x" / "schemata", "L3:0=000f0;1=000f0\n")
    write(emu.mount / "x" / "mode", "exclusive\n")
    os.mkdir(emu.mount / "y")
    assert (emu.mount / "y" / "schemata").read_text().startswith("L3:0=0000f;1=0000f")  # lowest run of free+shared


def test_tasks_write_of_a_missing_task_is_esrch(emulator) -> None:
    emu = emulator("full")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert fails(write, emu.mount / "tasks", str(dead.pid)) == errno.ESRCH and emu.last_cmd_status() == f"No task {dead.pid}"


def test_one_task_per_write(emulator, threaded) -> None:
    emu = emulator("full")
    os.mkdir(emu.mount / "g")
    a, b = threaded(0).pid, threaded(0).pid
    assert fails(write, emu.mount / "g" / "tasks", f"{a},{b}") == errno.EINVAL


def test_moving_to_a_control_group_drops_the_monitoring_group(emulator, threaded) -> None:
    emu = emulator("full")
    os.mkdir(emu.mount / "g")
    os.mkdir(emu.mount / "g" / "mon_groups" / "m")
    pid = threaded(0).pid
    write(emu.mount / "g" / "tasks", str(pid))
    write(emu.mount / "g" / "mon_groups" / "m" / "tasks", str(pid))
    write(emu.mount / "g" / "tasks", str(pid))
    assert (emu.mount / "g" / "mon_groups" / "m" / "tasks").read_text() == ""
    assert (emu.mount / "g" / "tasks").read_text() == f"{pid}\n"


def test_monitoring_group_of_another_control_group_is_einval(emulator, threaded) -> None:
    emu = emulator("full")
    os.mkdir(emu.mount / "g")
    os.mkdir(emu.mount / "g" / "mon_groups" / "m")
    pid = threaded(0).pid
    assert fails(write, emu.mount / "g" / "mon_groups" / "m" / "tasks", str(pid)) == errno.EINVAL
    assert emu.last_cmd_status() == "Can't move task to different control group"


def test_rmdir_returns_tasks_to_the_root(emulator, threaded) -> None:
    emu = emulator("full")
    os.mkdir(emu.mount / "g")
    pid = threaded(0).pid
    write(emu.mount / "g" / "tasks", str(pid))
    os.rmdir(emu.mount / "g")
    assert str(pid) in (emu.mount / "tasks").read_text().split()


def test_control_group_counters_include_its_monitoring_groups(emulator) -> None:
    emu = emulator("full")
    os.mkdir(emu.mount / "g")
    os.mkdir(emu.mount / "g" / "mon_groups" / "m")
    emu.set_counter("g", "mbm_local_bytes", 10)
    emu.set_counter("g/mon_groups/m", "mbm_local_bytes", 5)
    assert (emu.mount / "g" / "mon_data" / "mon_L3_00" / "mbm_local_bytes").read_text() == "15\n"
    emu.set_counter("g/mon_groups/m", "mbm_local_bytes", "Unavailable")
    assert (emu.mount / "g" / "mon_data" / "mon_L3_00" / "mbm_local_bytes").read_text() == "Unavailable\n"
