"""Fixtures for the NRI tests: one real containerd 1.7 per module, a kubelet-shaped CRI client."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from containerd_env import Containerd, missing, new_containerd, running  # noqa: E402
from tests.node.containerd import remove_cgroups  # noqa: E402


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    if os.geteuid() != 0:
        pytest.skip("needs root (containerd, runc, cgroups)")
    why = missing()
    if why:
        pytest.skip(why)
    with running(new_containerd("t")) as c:
        yield c


@pytest.fixture
def kubelet(containerd: Containerd) -> Iterator[object]:
    from cri import Kubelet
    parent = f"pbnri-{os.getpid()}"
    k = Kubelet(containerd.cri_address, parent)
    try:
        yield k
    finally:
        k.teardown()
        remove_cgroups(parent)
