"""Shared fixtures. Tests that need root, bcc or real services are marked (see pyproject)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first CPU's flags (the machines this suite runs on are not all alike: some have no AVX-512)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


HOST_AVX512 = "avx512f" in cpu_flags()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not HOST_AVX512:
        skip = pytest.mark.skip(reason="this CPU has no AVX-512F (no avx512f in /proc/cpuinfo): "
                                       "no 512-bit workload to measure or to separate")
        for item in items:
            if "avx512" in item.keywords:
                item.add_marker(skip)
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (real cgroups / BPF)")
    for item in items:
        if "root" in item.keywords or "bpf" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def data_dir() -> Path:
    return DATA


@pytest.fixture
def restore_root_logging() -> Iterator[None]:
    """For tests whose agent sets up logging (handlers on the root logger): put it back after."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    root.setLevel(level)
