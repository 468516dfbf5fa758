"""Fixtures for the NRI tests: one real containerd 1.7 per module, a kubelet-shaped CRI client."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from containerd_env import Containerd, cleanup, missing, new_containerd, remove_cgroups  # noqa: E402


@pytest.fixture(scope="module")
def containerd() -> Iterator[Containerd]:
    if os.geteuid() != 0:
        pytest.skip("needs root (containerd, runc, cgroups)")
    why = missing()
    if why:
        pytest.skip(why)
    c = new_containerd("t")
    try:
        c.start()
        c.import_image()
        yield c
    finally:
        cleanup(c)


@pytest.fixture
def kubelet(containerd: Containerd) -> Iterator[object]:
    from cri import Kubelet
    parent = f"pbnri-{os.getpid()}"
    k = Kubelet(containerd.cri_address, parent)
    try:
        yield k
    finally:
        for pod in k.pods:
            try:
                k.stop_remove_pod(pod)
            except Exception:
                pass
        k.close()
        remove_cgroups(parent)
