"""`perfbalance plan` on hostile snapshots: one line naming the field and the value, exit 2.

And on snapshots with nothing to do: the plan says why, with the numbers, for every container.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.bench.scenarios import avx512_large
from agent.bench.sim import snapshot
from agent.cli import main

PERFBALANCE = Path(sys.executable).with_name("perfbalance")


def doc() -> dict[str, Any]:
    s = avx512_large()
    return snapshot(s.node, s.workloads, s.initial, time=5000.0, pmu=False).to_json()  # type: ignore[no-any-return]


def put(path: str, value: Any) -> Callable[[dict[str, Any]], str]:
    """A snapshot with `value` at `path` (dotted keys, [i] for list items), as JSON text."""
    def build(d: dict[str, Any]) -> str:
        keys = path.replace("[", ".").replace("]", "").split(".")
        target: Any = d
        for k in keys[:-1]:
            target = target[int(k)] if k.isdigit() else target[k]
        last = keys[-1]
        target[int(last) if last.isdigit() else last] = value
        return json.dumps(d)
    return build


def literal(path: str, text: str) -> Callable[[dict[str, Any]], str]:
    """A snapshot whose value at `path` is the raw JSON text `text` (a literal json.dumps cannot write)."""
    def build(d: dict[str, Any]) -> str:
        return put(path, "@@@")(d).replace('"@@@"', text)
    return build


DEEP = "[" * 100_000 + "]" * 100_000
CASES = {
    "5000-digit cycle": (literal("cycle", "9" * 5000), "cycle", "5000 digits"),
    "5000-digit request": (literal("containers[3].request_mcpu", "9" * 5000), "containers[3].request_mcpu", "5000 digits"),
    "5000-digit string": (put("containers[3].memory_bytes", "9" * 5000), "containers[3].memory_bytes", "must be an integer"),
    "nested 100000 deep": (literal("containers[2].annotations", DEEP), "containers[2].annotations[0][0]", "nested deeper"),
    "cpu id -1": (put("topology.cpus[0].id", -1), "topology.cpus[0].id", "-1"),
    "cpu id 10**9": (put("topology.cpus[5].id", 10 ** 9), "topology.cpus[5].id", "1000000000"),
    "numa node -1": (put("topology.cpus[0].node", -1), "topology.cpus[0].node", "-1"),
    "time 1e999": (literal("time", "1e999"), "time", "inf"),
    "window Infinity": (literal("window", "Infinity"), "window", "inf"),
    "metric NaN": (literal("containers[3].metrics.cpu_usage_cores", "NaN"), "containers[3].metrics.cpu_usage_cores", "nan"),
    "cpuset bad range": (put("containers[3].cpuset", "0-99999999"), "containers[3].cpuset", "bad range '0-99999999'"),
    "kubelet cpus bad range": (put("kubelet.exclusive", [{"pod_uid": "u", "container": "c", "cpus": "0-99999999"}]),
                               "kubelet.exclusive[0].cpus", "bad range '0-99999999'"),
    "time noon": (put("time", "noon"), "time", "'noon'"),
    "metric noon": (put("containers[3].metrics.cpu", "noon"), "containers[3].metrics.cpu", "'noon'"),
    "request noon": (put("containers[3].request_mcpu", "noon"), "containers[3].request_mcpu", "'noon'"),
    "package not a number": (put("topology.cpus[2].package", "p"), "topology.cpus[2].package", "'p'"),
    "node memory key": (put("topology.node_mem_bytes", {"x": 1}), "topology.node_mem_bytes", "'x'"),
    "annotations a list": (put("containers[1].annotations", [1, 2]), "containers[1].annotations", "must be an object"),
    "collector not an object": (put("collectors", {"pmu": 3}), "collectors.pmu", "must be an object"),
    "infinite limit": (literal("containers[0].limit_mcpu", "-1e999"), "containers[0].limit_mcpu", "-inf"),
}


def one_error_line(err: str, field: str, value: str) -> None:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[:2000]
    assert field in lines[0] and value in lines[0], lines[0]


@pytest.mark.parametrize("build, field, value", CASES.values(), ids=list(CASES))
def test_hostile_snapshot_is_one_line_naming_field_and_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        build: Callable[[dict[str, Any]], str], field: str, value: str) -> None:
    path = tmp_path / "hostile.json"
    path.write_text(build(doc()))
    assert main(["plan", "--json", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    one_error_line(err, field, value)


@pytest.mark.parametrize("case", ["5000-digit cycle", "nested 100000 deep", "cpu id -1", "time 1e999"])
def test_hostile_snapshot_from_the_installed_command(tmp_path: Path, case: str) -> None:
    build, field, value = CASES[case]
    path = tmp_path / "hostile.json"
    path.write_text(build(doc()))
    p = subprocess.run([str(PERFBALANCE), "plan", str(path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stdout == ""
    one_error_line(p.stderr, field, value)


def test_infinite_now_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(doc()))
    assert main(["plan", "--now", "1e999", str(path)]) == 2
    one_error_line(capsys.readouterr().err, "--now", "inf")


def _strict(text: str) -> Any:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the plan output")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("metric", ["llc_misses_per_second", "memory_bandwidth_bytes_per_second", "cpu_usage_cores"])
def test_plan_output_is_always_valid_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], metric: str) -> None:
    d = doc()
    for c in d["containers"]:
        c["metrics"][metric] = 1e308  # finite, but sums and products of it are not
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(d))
    rc = main(["plan", "--json", str(path)])
    out, err = capsys.readouterr()
    if rc == 0:
        assert _strict(out)["time"] == 5000.0
    else:
        assert rc == 2 and out == ""
        one_error_line(err, str(path), "non-finite")


# -- why nothing is done ----------------------------------------------------------------------

def idle() -> dict[str, Any]:
    d = doc()
    for c in d["containers"]:
        c["metrics"] = {"cpu_usage_cores": 0.2, "avx512_heavy": 0.1}
    return d


def plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str], d: dict[str, Any], *args: str) -> Any:
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(d))
    assert main(["plan", "--json", *args, str(path)]) == 0
    return _strict(capsys.readouterr().out)


def test_no_candidate_says_why_with_the_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "idle.json"
    path.write_text(json.dumps(idle()))
    assert main(["plan", str(path)]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("no actions")]
    assert "nothing pays" not in line
    assert "16 of 16 CPUs shareable" in line and "highest avx512_heavy 0.10, threshold 0.5" in line
    assert "avx-0: avx512_heavy 0.10 <= 0.5" in out


def test_no_free_cpus_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = idle()
    d["reserved"] = "0-15"
    out = plan_json(tmp_path, capsys, d)
    assert "0 of 16 CPUs shareable (none" in out["no_candidate"]


def test_exclusive_container_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = idle()
    d["containers"][0].update(exclusive=True, cpuset="0,8")
    out = plan_json(tmp_path, capsys, d)
    why = {c["container"]: c["rejected"] for c in out["considered"] if c["kind"] == "skipped"}
    assert "exclusive" in why[d["containers"][0]["id"]]


@pytest.mark.parametrize("snap, args", [(doc, ()), (idle, ()), (doc, ("--now", "5000"))], ids=["moves", "idle", "now"])
def test_every_container_is_acted_on_or_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  snap: Callable[[], dict[str, Any]], args: tuple[str, ...]) -> None:
    d = snap()
    out = plan_json(tmp_path, capsys, d, *args)
    named = {a["container"] for a in out["actions"]} | {c.get("container") for c in out["considered"]}
    assert {c["id"] for c in d["containers"]} <= named


def test_rejected_candidates_and_the_rest_are_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rebalancer:\n  margin: 100.0\n")
    d = doc()
    out = plan_json(tmp_path, capsys, copy.deepcopy(d), "--config", str(cfg))
    assert out["actions"] == [] and "no_candidate" not in out
    assert any("below margin" in c["rejected"] for c in out["considered"])
    skipped = {c["container"] for c in out["considered"] if c["kind"] == "skipped"}
    assert skipped and all(c["id"] in skipped or any(e.get("container") == c["id"] for e in out["considered"])
                           for c in d["containers"])
