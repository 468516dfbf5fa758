"""Restart recovery of the real agent: a half-done move is finished, placements are adopted and
nothing already placed is moved again (no thrash after restart), after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from agent.persist.checkpoint import Checkpoint
from agent.config import load_config
from tests.e2e.conftest import PERFBALANCE, cpus_allowed, run_agent

pytestmark = [pytest.mark.root, pytest.mark.bpf, pytest.mark.slow]


def _lines(out: str) -> list[dict]:
    return [json.loads(x) for x in out.splitlines() if x.strip()]


def test_half_done_move_is_finished_after_a_crash(demo_workloads, write_config, base):
    cfg = write_config({"rebalancer": {"enabled": False}})
    run_dir = load_config(str(cfg)).agent.run_dir
    scalar = next(w for w in demo_workloads if w.name == "scalar")
    os.makedirs(run_dir)
    ck = Checkpoint(run_dir, node="e2e-node")
    ck.load()
    ck.begin_move(f"{base}:scalar", f"{base}/scalar", "0-1", "1", "cpuset", mems="0")  # then "crash"
    assert cpus_allowed(scalar.proc.pid) == "0-1"
    res = run_agent("run", "--config", str(cfg), "--cycles", "1", "--interval", "0.5")
    assert res.returncode == 0, res.stderr
    assert "recovery: finish cpuset" in res.stderr
    assert cpus_allowed(scalar.proc.pid) == "1"
    again = Checkpoint(run_dir, node="e2e-node")
    data = again.load()
    assert data is not None and not data.pending
    assert again.placed[(f"{base}:scalar", "cpuset")].value == "1"


@pytest.mark.avx512
def test_no_thrash_after_sigkill_and_restart(demo_workloads, write_config):
    cfg = write_config({"rebalancer": {"dwell_seconds": 30.0}})
    first = subprocess.Popen([PERFBALANCE, "run", "--config", str(cfg), "--interval", "1", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None
        for _ in range(30):
            report = json.loads(first.stdout.readline())
            if [a for a in report["applied"] if a["ok"]]:
                break
        else:
            pytest.fail("the first agent never moved anything")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    placed = {w.name: cpus_allowed(w.proc.pid) for w in demo_workloads}
    res = run_agent("run", "--config", str(cfg), "--cycles", "4", "--interval", "1", "--json")
    assert res.returncode == 0, res.stderr
    assert "placement(s) of the previous run adopted" in res.stderr
    assert all(r["applied"] == [] for r in _lines(res.stdout)), "moved again after the restart"
    assert {w.name: cpus_allowed(w.proc.pid) for w in demo_workloads} == placed
