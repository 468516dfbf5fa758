"""`perfbalance demo` on this 2-CPU machine: each CPU is its own core, so the AVX-512 island is
one CPU and the scalar and cache workloads share the other."""

from __future__ import annotations

import os
import re

import pytest

from agent.cli.demo import DEMO_BASE
from tests.e2e.conftest import run_agent

pytestmark = [pytest.mark.root, pytest.mark.bpf, pytest.mark.slow]


@pytest.mark.avx512
def test_demo_islands_the_avx512_workload_and_cleans_up():
    res = run_agent("demo", "--seconds", "20", "--interval", "1", timeout=240)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert re.search(rf"moved: {DEMO_BASE}:avx512 0-1 -> \d$", out, re.M), out
    final = dict(re.findall(r"^\s+(avx512|scalar|cache)\s+pid \d+\s+CPUs (\S+)", out, re.M))
    assert final["avx512"] not in (final["scalar"], "0-1")
    assert final["scalar"] == final["cache"]
    assert "AVX-512-heavy" in out
    for hierarchy in ("cpuset", "cpu", "unified"):
        assert not os.path.exists(f"/sys/fs/cgroup/{hierarchy}/{DEMO_BASE}")
