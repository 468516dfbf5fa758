"""The tools docs/policies.md tells a policy author to test with: `perfbalance plan --policy NAME`
on a saved snapshot and `perfbalance bench plan --policy NAME` on the simulator, each with the
cost model as the control."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from agent.bench import scenarios as sc
from agent.bench.sim import snapshot
from agent.cli import main
from agent.plan.runner import planner


def saved(tmp_path: Path) -> Path:
    s = sc.avx512_large()
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snapshot(s.node, s.workloads, s.initial, time=5000.0, pmu=False).to_json()))
    return path


def reasons(capsys: pytest.CaptureFixture[str]) -> set[str]:
    return {a["reason"].split(":")[0] for a in json.loads(capsys.readouterr().out)["actions"]}


def test_plan_runs_the_named_policy_instead_of_the_cost_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap = saved(tmp_path)
    assert main(["plan", "--json", str(snap)]) == 0
    assert reasons(capsys) == {"AVX-512 island"}  # control: the default is the cost model
    assert main(["plan", "--json", "--policy", "spread", str(snap)]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["actions"] == [] and "spread" in json.loads(out)["no_candidate"]


def test_plan_takes_the_policy_from_the_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"rebalancer": {"policy": "spread"}}))
    assert main(["plan", "--json", "--config", str(cfg), str(saved(tmp_path))]) == 0
    assert reasons(capsys) == set()
    assert main(["plan", "--json", "--config", str(cfg), "--policy", "costmodel", str(saved(tmp_path))]) == 0
    assert reasons(capsys) == {"AVX-512 island"}  # the flag wins over the file


def test_a_policy_that_is_not_installed_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--policy", "nope", str(saved(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert "policy 'nope': not installed" in err and "spread" in err and "Traceback" not in err
    assert main(["bench", "plan", "--quick", "--policy", "nope"]) == 2


def test_the_simulator_runs_the_named_policy_in_closed_loop() -> None:
    hog = sc.bandwidth_hog()
    cost, spread = sc.run_perfbalance(hog), sc.run_perfbalance(hog, planner=planner("spread"))
    none = sc.run_none(hog)
    assert spread.moves > 0 and spread.victim_slowdown < none.victim_slowdown  # spread evens the hog out
    assert (spread.moves, spread.victim_slowdown) != (cost.moves, cost.victim_slowdown)
    assert sc.run_perfbalance(sc.avx512_small(), planner=planner("spread")).moves == 0  # no AVX-512 rule in spread


@pytest.mark.slow
def test_bench_plan_reports_which_policy_it_ran(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "plan", "--quick", "--json", "--policy", "spread"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "spread"
    hog = next(r for r in out["scenarios"] if r["name"] == "bandwidth_hog")["results"]
    assert hog["perfbalance"]["victim_slowdown"] < hog["none"]["victim_slowdown"]
