"""Fixtures for the real-node suite: a private containerd per test module, this suite's cgroup name."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.containerd import Containerd, missing_tools, remove_cgroups


@pytest.fixture(scope="module")
def top() -> str:
    """This module's cgroup name: unique, and says who made it."""
    return f"pbnode-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def containerd(top: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    if os.geteuid() != 0:
        pytest.skip("needs root: containerd and runc create cgroups")
    missing = missing_tools()
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} (scripts/setup.sh test installs them)")
    base = Path(tmp_path_factory.mktemp("node-containerd"))
    ctd = Containerd(base, top=top, ns=f"node-{os.getpid()}")
    try:
        ctd.start()
        yield ctd
    finally:
        ctd.close()
        left = remove_cgroups(top)
        assert not left, f"cgroups left behind: {left}"
