"""Hostile paths: symlinks planted in a cgroup tree and impostor filesystems are refused."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

import fakecg
from perfbalance.cgroupfs import CgroupfsError, CgroupPathRefused, Cgroupfs
from perfbalance import safefs
from perfbalance.safefs import SafeTree, UnsafePath

BOTH = pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "walk"])


def _tree(tmp_path: Path) -> Path:
    (tmp_path / "a/b").mkdir(parents=True)
    (tmp_path / "a/b/f").write_text("x\n")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/secret").write_text("s\n")
    return tmp_path


@BOTH
def test_plain_file_under_root_is_read(tmp_path: Path, openat2: bool) -> None:
    t = SafeTree(str(_tree(tmp_path)), use_openat2=openat2)
    assert t.read("a/b/f", 100) == b"x\n"


@BOTH
@pytest.mark.parametrize("where", ["dir", "middle", "file"])
def test_symlink_anywhere_in_the_path_is_refused(tmp_path: Path, openat2: bool, where: str) -> None:
    root = _tree(tmp_path)
    if where == "dir":
        os.symlink(root / "outside", root / "link")
        rel = "link/secret"
    elif where == "middle":
        os.symlink(root / "outside", root / "a/link")
        rel = "a/link/secret"
    else:
        os.symlink(root / "outside/secret", root / "a/b/link")
        rel = "a/b/link"
    with pytest.raises(UnsafePath, match="symlink"):
        SafeTree(str(root), use_openat2=openat2).read(rel, 100)


@BOTH
def test_write_through_a_symlink_never_reaches_the_target(tmp_path: Path, openat2: bool) -> None:
    root = _tree(tmp_path)
    os.symlink(root / "outside/secret", root / "a/cpuset.cpus")
    with pytest.raises(UnsafePath):
        SafeTree(str(root), use_openat2=openat2).write("a/cpuset.cpus", b"0-3")
    assert (root / "outside/secret").read_text() == "s\n"


@pytest.mark.parametrize("rel", ["../etc/passwd", "a/../../x", "/etc/passwd", "a/\x00b"])
def test_escaping_relative_paths_are_refused(tmp_path: Path, rel: str) -> None:
    with pytest.raises(UnsafePath):
        SafeTree(str(_tree(tmp_path))).read(rel, 100)


@BOTH
def test_missing_file_keeps_its_errno(tmp_path: Path, openat2: bool) -> None:
    with pytest.raises(FileNotFoundError):
        SafeTree(str(_tree(tmp_path)), use_openat2=openat2).read("a/nope", 100)


def test_read_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"1" * 5000)
    t = SafeTree(str(tmp_path))
    assert len(t.read("big", 5000)) == 5000
    with pytest.raises(OverflowError, match="larger than 4999"):
        t.read("big", 4999)


def test_wrong_filesystem_is_refused_by_magic(tmp_path: Path) -> None:
    t = SafeTree(str(_tree(tmp_path)), magic=safefs.CGROUP2_SUPER_MAGIC)
    with pytest.raises(UnsafePath, match="expected cgroup2"):
        t.read("a/b/f", 100)


@pytest.mark.root
def test_real_cgroup_files_pass_the_magic_check() -> None:
    assert safefs.fs_magic("/sys/fs/cgroup/unified") == safefs.CGROUP2_SUPER_MAGIC
    t = SafeTree("/sys/fs/cgroup/unified", magic=safefs.CGROUP2_SUPER_MAGIC)
    assert t.read("cgroup.controllers", 4096) is not None


@BOTH
def test_subdirs_lists_real_directories_only(tmp_path: Path, openat2: bool) -> None:
    root = _tree(tmp_path)
    os.symlink(root / "outside", root / "a/link")
    assert SafeTree(str(root), use_openat2=openat2).subdirs("a") == ["b"]


# -- wired into Cgroupfs -----------------------------------------------------------------------

def test_cgroupfs_refuses_a_symlinked_cgroup_directory(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    fakecg.files(tmp_path, "elsewhere", {"cpuset.cpus": "0\n"})
    os.symlink(tmp_path / "elsewhere", root / "evil")
    c = Cgroupfs(root=str(root))
    with pytest.raises(CgroupPathRefused, match="symlink") as e:
        c.read("evil", "cpuset", "cpuset.cpus")
    assert e.value.errno == errno.ELOOP


def test_cgroupfs_write_through_a_planted_symlink_is_refused(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    fakecg.files(root, "pod", {"cgroup.procs": ""})
    target = tmp_path / "target"
    target.write_text("untouched")
    os.symlink(target, root / "pod" / "cpuset.cpus")
    c = Cgroupfs(root=str(root))
    with pytest.raises(CgroupPathRefused):
        c.write("pod", "cpuset", "cpuset.cpus", "0-1")
    assert target.read_text() == "untouched"


def test_cgroupfs_does_not_list_or_walk_into_symlinks(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    fakecg.files(root, "kube/real", {"cgroup.procs": ""})
    fakecg.files(tmp_path, "elsewhere/deep", {"cgroup.procs": ""})
    os.symlink(tmp_path / "elsewhere", root / "kube" / "fake")
    c = Cgroupfs(root=str(root))
    assert c.children("kube") == ["real"]
    assert list(c.walk("kube")) == ["kube", "kube/real"]


def test_cgroupfs_exists_refuses_a_symlink(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    os.symlink(tmp_path, root / "loop")
    with pytest.raises(CgroupPathRefused):
        Cgroupfs(root=str(root)).exists("loop")


def test_cgroupfs_remove_does_not_follow_a_symlink(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    fakecg.files(root, "mine/child", {})
    victim = tmp_path / "victim" / "keep"
    victim.mkdir(parents=True)
    os.symlink(tmp_path / "victim", root / "mine" / "child" / "link")
    c = Cgroupfs(root=str(root))
    with pytest.raises(CgroupfsError):
        c.remove("mine")  # the symlink makes "child" non-empty: rmdir fails, nothing followed
    assert victim.is_dir()


def test_plain_tree_posing_as_cgroup_root_is_refused_with_verification(tmp_path: Path) -> None:
    root = fakecg.v2(tmp_path)
    with pytest.raises(UnsafePath, match="not cgroup2"):
        Cgroupfs(root=str(root), verify_fs=True)


def test_plain_tree_is_accepted_unverified_by_default(tmp_path: Path) -> None:
    c = Cgroupfs(root=str(fakecg.v2(tmp_path)))
    assert c.verify_fs is False


@pytest.mark.root
def test_real_cgroup_root_is_verified_by_default() -> None:
    c = Cgroupfs(root="/sys/fs/cgroup")
    assert c.verify_fs is True
    assert c.read("", "cpuset", "cpuset.cpus").strip()


@pytest.mark.root
def test_impostor_hierarchy_next_to_real_ones_is_refused(tmp_path: Path) -> None:
    # A tree whose "cpuset" is a real cgroup mount (bind) and whose "memory" is a plain directory.
    root = tmp_path / "cg"
    (root / "cpuset").mkdir(parents=True)
    (root / "memory").mkdir()
    (root / "memory" / "cgroup.procs").write_text("")
    subprocess.run(["mount", "--bind", "/sys/fs/cgroup/cpuset", str(root / "cpuset")], check=True)
    try:
        with pytest.raises(UnsafePath, match="memory.*not cgroup"):
            Cgroupfs(root=str(root))
    finally:
        subprocess.run(["umount", str(root / "cpuset")], check=True)
