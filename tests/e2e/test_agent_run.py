"""`perfbalance run` end to end: real cgroups, real BPF, real processes moved."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import cpus_allowed, run_agent

pytestmark = [pytest.mark.root, pytest.mark.bpf, pytest.mark.slow]


def _lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


@pytest.mark.avx512
def test_avx512_workload_is_islanded_away_from_scalar_work(demo_workloads, write_config, base):
    cfg = write_config()
    res = run_agent("run", "--config", str(cfg), "--cycles", "3", "--interval", "1", "--json")
    assert res.returncode == 0, res.stderr
    reports = _lines(res.stdout)
    assert [r["cycle"] for r in reports] == [1, 2, 3]
    applied = [a for r in reports for a in r["applied"] if a["ok"]]
    moved = {a["container"]: a["to"] for a in applied}
    avx, scalar = f"{base}:avx512", f"{base}:scalar"
    # On this machine every CPU is its own core: the island is one CPU, the scalar work the other.
    assert moved[avx] != moved[scalar]
    assert len(moved[avx].split(",")) == 1 and "-" not in moved[avx]
    pids = {w.name: w.proc.pid for w in demo_workloads}
    assert cpus_allowed(pids["avx512"]) == moved[avx]
    assert cpus_allowed(pids["scalar"]) == moved[scalar]
    first = next(a for a in applied if a["container"] == avx)
    assert first["predicted_benefit"] > first["predicted_cost"]
    assert "AVX-512" in first["reason"]


@pytest.mark.avx512
def test_run_json_lines_have_the_documented_keys(demo_workloads, write_config, base):
    res = run_agent("run", "--config", str(write_config()), "--cycles", "1", "--interval", "1",
                    "--json", "--dry-run")
    assert res.returncode == 0, res.stderr
    (report,) = _lines(res.stdout)
    for key in ("cycle", "time", "containers", "plan", "applied", "errors"):
        assert key in report
    c = next(c for c in report["containers"] if c["id"] == f"{base}:avx512")
    for key in ("id", "name", "namespace", "pod", "cgroup", "qos", "cpuset", "metrics"):
        assert key in c
    assert c["cgroup"] == f"{base}/avx512"
    assert c["metrics"]["avx512_heavy"] == 1.0
    assert c["metrics"]["cpu_usage_cores"] > 0.05


@pytest.mark.avx512
def test_dry_run_plans_but_moves_nothing(demo_workloads, write_config):
    res = run_agent("run", "--config", str(write_config()), "--cycles", "3", "--interval", "1",
                    "--json", "--dry-run")
    assert res.returncode == 0, res.stderr
    reports = _lines(res.stdout)
    assert any(r["plan"] for r in reports)
    assert all(r["applied"] == [] for r in reports)
    for w in demo_workloads:
        assert cpus_allowed(w.proc.pid) == "0-1"


def test_saved_run_line_replays_with_perfbalance_plan(demo_workloads, write_config, tmp_path):
    cfg = write_config()
    res = run_agent("run", "--config", str(cfg), "--cycles", "1", "--interval", "1", "--json", "--dry-run")
    saved = tmp_path / "cycle.json"
    saved.write_text(res.stdout)
    live = _lines(res.stdout)[-1]["plan"]
    replay = run_agent("plan", str(saved), "--json", "--config", str(cfg))
    assert replay.returncode == 0, replay.stderr
    replayed = json.loads(replay.stdout)["actions"]
    assert [(a["container"], a["to"]) for a in replayed] == [(a["container"], a["to"]) for a in live]


def test_invalid_config_is_refused_naming_key_and_value(write_config, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rebalancer:\n  margin: -3\n")
    res = run_agent("run", "--config", str(bad), "--cycles", "1")
    assert res.returncode == 2
    assert "rebalancer.margin" in res.stderr and "-3" in res.stderr


def test_rdt_on_without_resctrl_fails_startup_clearly(write_config):
    cfg = write_config({"resctrl": {"rdt": "on"}})
    res = run_agent("run", "--config", str(cfg), "--cycles", "1", "--interval", "1")
    assert res.returncode == 1
    assert "resctrl" in res.stderr and "not mounted" in res.stderr
