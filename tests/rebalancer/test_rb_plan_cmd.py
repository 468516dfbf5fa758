"""`perfbalance plan SNAPSHOT.json` end to end on saved files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.cli import main
from agent.bench.scenarios import avx512_large
from agent.bench.sim import snapshot


def saved(tmp_path: Path, name: str = "snap.json") -> Path:
    s = avx512_large()
    path = tmp_path / name
    path.write_text(json.dumps(snapshot(s.node, s.workloads, s.initial, time=5000.0, pmu=False).to_json()))
    return path


def test_plan_explains_the_moves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(saved(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert "cpuset avx-0" in out and "AVX-512 island" in out and "net" in out


def test_plan_json_lists_actions_and_rejections(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--json", str(saved(tmp_path))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {a["kind"] for a in out["actions"]} == {"cpuset"} and "considered" in out


def test_run_json_lines_plan_the_last_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = json.loads(saved(tmp_path).read_text())
    first = {**one, "containers": [], "cycle": 1, "plan": [], "applied": [], "errors": [], "vcpu_map": {}}
    last = {**one, "cycle": 2, "plan": [], "applied": [], "errors": [], "vcpu_map": {}}
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(first) + "\n" + json.dumps(last) + "\n")
    assert main(["plan", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["actions"]


@pytest.mark.parametrize("text, names", [
    ("", "empty"),
    ("{not json", "not JSON"),
    ('{"time": 1, "containers": []}', "'topology'"),
    ('{"time": 1, "topology": {"cpus": []}, "containers": [{"id": "a"}]}', "cgroup"),
    ('{"time": 1, "topology": {"cpus": [{"id": 0}]}, "containers": [{"id": "a", "cgroup": "x", "cpuset": "0-a"}]}',
     "containers[0].cpuset"),
    ('{"time": 1, "topology": {"cpus": [{"id": 0}]}, "containers": [{"id": "a", "cgroup": "x", "metrics": {"ipc": "x"}}]}',
     "metrics.ipc"),
])
def test_malformed_snapshot_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             text: str, names: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert names in err and "Traceback" not in err


def test_missing_file_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err


def test_config_file_section_is_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rebalancer:\n  margin: 100.0\n")
    assert main(["plan", "--json", "--config", str(cfg), str(saved(tmp_path))]) == 0
    assert json.loads(capsys.readouterr().out)["actions"] == []


@pytest.mark.parametrize("value", ["../../tmp/x", "squeeze\n"])
def test_aggressor_class_that_is_not_a_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      value: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"rebalancer:\n  rdt_aggressor_class: {json.dumps(value)}\n")
    assert main(["plan", "--json", "--config", str(cfg), str(saved(tmp_path))]) == 2
    captured = capsys.readouterr()
    assert "rebalancer.rdt_aggressor_class" in captured.err and repr(value) in captured.err
    assert "Traceback" not in captured.err and "tmp/x" not in captured.out
