"""An out-of-tree policy (examples/quiet-policy) installed with pip is found and run by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "quiet-policy"

PROBE = """
import json, sys
from rebalancer import RebalancerConfig, registry
from agent.plan.runner import PolicyRunner
from perfbalance.model import Snapshot
snap = Snapshot.loads(sys.stdin.read())
cfg = RebalancerConfig(policy="quiet", policies={"quiet": {"housekeeping_cpus": "0", "idle_cycles": 2}})
registry.check_config(cfg, source="probe")
runner = PolicyRunner()
outs = [runner.run(snap, cfg, snap.time + i) for i in range(2)]
print(json.dumps({"installed": sorted(registry.available()), "errors": [o.error for o in outs],
                  "moves": [[a.container for a in o.plan.actions] for o in outs],
                  "state": type(outs[-1].plan.state).__name__}))
"""


def _snapshot() -> str:
    sys.path.insert(0, str(REPO / "tests" / "rebalancer"))
    from rb_builders import sample, snap, topo

    s = snap(topo(cores=2, threads=1), sample("idle", "0-1", cpu_usage_cores=0.0),
             sample("busy", "0-1", cpu_usage_cores=1.5))
    return json.dumps(s.to_json())


def _probe(target: Path | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if target is not None:
        env["PYTHONPATH"] = str(target)
    return subprocess.run([sys.executable, "-c", PROBE], input=_snapshot(), capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=120)


@pytest.mark.slow
def test_example_policy_installs_with_pip_and_is_loaded_by_name(tmp_path: Path) -> None:
    absent = _probe(None)  # control: before the install, "quiet" is unknown
    assert absent.returncode != 0 and "rebalancer.policy" in absent.stderr and "quiet" in absent.stderr
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                          "--no-index", "--target", str(target), str(EXAMPLE)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert pip.returncode == 0, pip.stdout + pip.stderr
    assert list(target.glob("perfbalance_quiet-*.dist-info/entry_points.txt"))
    done = _probe(target)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert "quiet" in out["installed"] and out["errors"] == ["", ""]
    assert out["moves"] == [[], ["idle"]]  # idle for two plans, then gathered; busy never moves
    assert out["state"] == "QuietState"
