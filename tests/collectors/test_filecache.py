"""Kept cgroup files: the caches of one process share its fd limit."""

from __future__ import annotations

import resource
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors import filecache
from collectors.filecache import FileCache
from perfbalance.cgroupfs import Cgroupfs

ROOM = 150  # fds the test leaves the caches above the reserve


def tree(root: Path, n: int) -> Cgroupfs:
    """A plain-directory cgroup v2 layout with n cgroups, each with a cpu.stat."""
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for i in range(n):
        (root / f"c{i}").mkdir()
        (root / f"c{i}" / "cpu.stat").write_text(f"usage_usec {i}\n")
    return Cgroupfs(root=str(root))


@pytest.fixture
def tight_limit() -> Iterator[None]:
    """The soft RLIMIT_NOFILE set so that the caches may keep ROOM more files than they do now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (filecache.RESERVED_FDS + filecache._kept + ROOM, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def read_all(f: FileCache, names: list[str]) -> list[str]:
    return [f.read(n, None, "cpu.stat") for n in names]


def test_two_caches_keep_files_together_within_the_process_limit(tmp_path: Path, tight_limit: None) -> None:
    fs = tree(tmp_path, 200)
    first, second = (FileCache.within_budget(fs, wanted=100) for _ in range(2))
    try:
        assert first.capacity == second.capacity == 100  # each alone could keep 100
        assert read_all(first, [f"c{i}" for i in range(100)])[7] == "usage_usec 7\n"
        assert read_all(second, [f"c{i}" for i in range(100, 200)])[7] == "usage_usec 107\n"  # still read
        assert (len(first), len(second)) == (100, ROOM - 100)  # the second kept only what was left
        first.close()
        read_all(second, [f"c{i}" for i in range(100, 200)])
        assert len(second) == 100  # control: with room again, it keeps them all
    finally:
        first.close()
        second.close()
