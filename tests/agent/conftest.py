"""Fixtures for the agent room: real cgroups under a unique prefix, real processes, cleaned up."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from perfbalance.cgroupfs import Cgroupfs  # noqa: E402
from realcg import RealCgroups  # noqa: E402


@pytest.fixture
def cgfs() -> Cgroupfs:
    return Cgroupfs(root="/sys/fs/cgroup")


@pytest.fixture
def real(cgfs: Cgroupfs) -> Iterator[RealCgroups]:
    rc = RealCgroups(cgfs)
    try:
        yield rc
    finally:
        rc.close()
