"""Hostile trees: resctrl paths are opened without symlinks or mount crossings, on resctrl only,
and every read is bounded; missing info files are named, not a KeyError.

This machine has no resctrl: the "wrong filesystem" cases use a plain directory (ext4) that the
mount table names resctrl, and the FUSE emulator with the magic check forced on; the symlink cases
use plain captured trees, where symlinks can be planted (resctrl itself has none).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from perfbalance.errors import FeatureUnavailable, ParseError
from perfbalance.safefs import UnsafePath
from resctrl import tids
from resctrl.fs import ResctrlFs, ResctrlRefused
from resctrl.info import MountInfo, find_mount, open_tree, read_info

from rchelpers import config
from resctrl.setup import open_resctrl

DATA = Path(__file__).resolve().parent.parent / "data" / "resctrl"


def captured(tmp_path: Path, variant: str = "full") -> Path:
    root = tmp_path / "resctrl"
    shutil.copytree(DATA / variant, root)
    return root


def planted(tmp_path: Path) -> tuple[ResctrlFs, Path]:
    """A captured tree with a control group `evil` that is a symlink to a directory outside it."""
    root = captured(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "tasks").write_text("1\n")
    (outside / "schemata").write_text("L3:0=fffff\n")
    (root / "evil").symlink_to(outside)
    (root / "perfbalance.gold").mkdir()
    (root / "perfbalance.gold" / "tasks").write_text("")
    return ResctrlFs(mount=MountInfo(path=str(root))), outside


# --- symlinks are refused, never followed ---------------------------------------------------------

def test_reading_through_a_symlinked_group_is_refused(tmp_path: Path) -> None:
    fs, _ = planted(tmp_path)
    with pytest.raises(ResctrlRefused, match="symlink") as e:
        fs.tasks("evil")
    assert e.value.errno == errno.ELOOP


def test_writing_through_a_symlinked_group_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    fs, outside = planted(tmp_path)
    with pytest.raises(ResctrlRefused, match="symlink"):
        fs.add_task("evil", 4242)
    assert (outside / "tasks").read_text() == "1\n"


def test_mkdir_under_a_symlinked_parent_is_refused(tmp_path: Path) -> None:
    fs, outside = planted(tmp_path)
    with pytest.raises(ResctrlRefused, match="symlink"):
        fs.mkdir("evil/mon_groups", "m1")
    assert not (outside / "mon_groups").exists()


def test_a_symlinked_group_is_neither_listed_nor_existing(tmp_path: Path) -> None:
    fs, _ = planted(tmp_path)
    assert fs.ctrl_groups() == ["perfbalance.gold"]
    assert not fs.exists("evil") and fs.exists("perfbalance.gold")


def test_oversized_file_under_the_mount_is_refused_naming_it(tmp_path: Path) -> None:
    fs, _ = planted(tmp_path)
    (tmp_path / "resctrl" / "perfbalance.gold" / "tasks").write_text("1\n" * (1 << 21) + "\n")
    with pytest.raises(ResctrlRefused, match=r"perfbalance.gold/tasks refused \(EFBIG\): larger than"):
        fs.tasks("perfbalance.gold")


def test_info_file_that_is_a_symlink_is_not_read(tmp_path: Path) -> None:
    root = captured(tmp_path)
    (tmp_path / "secret").write_text("ff\n")
    (root / "info" / "L3" / "shareable_bits").unlink()
    (root / "info" / "L3" / "shareable_bits").symlink_to(tmp_path / "secret")
    assert read_info(MountInfo(path=str(root))).caches["L3"].shareable_bits == 0


# --- the filesystem must be resctrl --------------------------------------------------------------

def test_a_plain_directory_the_mount_table_calls_resctrl_is_refused(tmp_path: Path) -> None:
    """A mis-set hostPath: the host's mount table says resctrl, the path we see is ext4/tmpfs."""
    root = captured(tmp_path)
    (tmp_path / "mounts").write_text(f"resctrl {root} resctrl rw,relatime 0 0\n")
    mount = find_mount(str(tmp_path))
    assert mount is not None and mount.fstype == "resctrl"
    with pytest.raises(FeatureUnavailable, match="mount table names resctrl here, but it is a"):
        read_info(mount)
    with pytest.raises(UnsafePath):
        ResctrlFs(mount=mount)


def test_rdt_auto_runs_without_resctrl_on_a_foreign_filesystem(tmp_path: Path) -> None:
    root = captured(tmp_path)
    (tmp_path / "mounts").write_text(f"resctrl {root} resctrl rw,relatime 0 0\n")
    setup = open_resctrl(config("rdt: auto"), procfs=str(tmp_path), sysfs=str(tmp_path))
    assert setup.manager is None and "but it is a" in setup.reason


def test_magic_check_forced_on_refuses_the_fuse_emulator(emulator) -> None:  # type: ignore[no-untyped-def]
    emu = emulator("full")
    fs = ResctrlFs(mount=MountInfo(path=str(emu.mount)), verify_fs=True)
    with pytest.raises(ResctrlRefused, match="expected resctrl"):
        fs.read("", "schemata")


def test_auto_check_accepts_the_fuse_emulator_the_mount_table_calls_resctrl(emulator) -> None:  # type: ignore[no-untyped-def]
    emu = emulator("full")
    mount = find_mount(str(emu.procfs))
    assert mount is not None and mount.fstype == "resctrl"
    assert open_tree(mount).magic is None  # FUSE: symlinks and mount crossings still refused
    assert "L3:" in ResctrlFs(mount=mount).read("", "schemata")


# --- missing info files ----------------------------------------------------------------------------

def test_missing_cbm_mask_is_a_parse_error_naming_the_file(tmp_path: Path) -> None:
    root = captured(tmp_path)
    (root / "info" / "L3" / "cbm_mask").unlink()
    with pytest.raises(ParseError, match="info/L3/cbm_mask.*missing|missing.*info/L3/cbm_mask"):
        read_info(MountInfo(path=str(root)))


def test_rdt_auto_with_a_missing_info_file_runs_without_resctrl_and_says_which(tmp_path: Path) -> None:
    root = captured(tmp_path)
    (root / "info" / "MB" / "min_bandwidth").unlink()
    setup = open_resctrl(config("rdt: auto"), procfs=str(tmp_path), sysfs=str(tmp_path),
                         mount=MountInfo(path=str(root)))
    assert setup.manager is None and "info/MB/min_bandwidth" in setup.reason


# --- thread lists --------------------------------------------------------------------------------

def test_thread_list_beyond_its_bound_is_an_error_naming_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "unified" / "pod").mkdir(parents=True)
    (tmp_path / "unified" / "pod" / "cgroup.threads").write_text("1\n2\n3\n4\n5\n6\n")
    monkeypatch.setattr(tids, "TIDS_MAX_BYTES", 8)
    with pytest.raises(ParseError, match="larger than 8 bytes.*unified/pod/cgroup.threads"):
        tids.cgroup_tids(str(tmp_path), "pod")


def test_thread_list_of_a_symlinked_cgroup_is_refused(tmp_path: Path) -> None:
    (tmp_path / "unified").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "cgroup.threads").write_text("1\n")
    (tmp_path / "unified" / "evil").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePath, match="symlink"):
        tids.cgroup_tids(str(tmp_path), "evil")
