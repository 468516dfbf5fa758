"""Fixtures for collector tests (helpers in collector_helpers.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector_helpers import Cgroups
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.host import HostPaths


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    cg = Cgroups(fs=Cgroupfs())
    try:
        yield cg
    finally:
        cg.cleanup()


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("pb-run"))


@pytest.fixture
def host(run_dir: str) -> HostPaths:
    """The real host, with a private run dir (the merged header tree goes there)."""
    return HostPaths(run_dir=run_dir)


@pytest.fixture
def no_headers_host(tmp_path: Path) -> HostPaths:
    """The real host, but the header search points at empty directories (no host, no packaged)."""
    if os.path.exists("/sys/kernel/kheaders.tar.xz"):
        pytest.skip("this host has /sys/kernel/kheaders.tar.xz: headers cannot be made absent")
    empty = tmp_path / "empty"
    empty.mkdir()
    return HostPaths(run_dir=str(tmp_path / "run"), modules=str(empty), headers_search=(str(empty),))
