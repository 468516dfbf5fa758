"""`perfbalance doctor` on this machine: every section answers available + reason."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from agent.cli.doctor import SECTIONS
from tests.conftest import HOST_AVX512
from tests.e2e.conftest import run_agent

pytestmark = [pytest.mark.root, pytest.mark.bpf]


def _doctor(*args: str) -> dict:
    res = run_agent("doctor", "--json", *args)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_every_section_says_available_and_why(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"agent": {"run_dir": str(tmp_path / "run")}}))
    out = _doctor("--config", str(cfg))
    for key in ("kernel", "bpf", "perf", "avx512", "resctrl", "cgroup", "kubelet"):
        assert isinstance(out[key]["available"], bool) and out[key]["reason"], key
    assert set(SECTIONS) <= set(out)
    # What this machine is known to offer:
    assert out["bpf"]["available"] and out["bpf"]["headers"]["source"] in ("host", "packaged", "kheaders")
    assert out["kernel"]["btf"] is True
    assert out["cgroup"]["layout"] == "hybrid" and "cpuset" in out["cgroup"]["controllers"]
    # AVX-512 is what this CPU has (the suite's machines differ): doctor agrees with /proc/cpuinfo
    if HOST_AVX512:
        assert out["avx512"]["available"] and "avx512f" in out["avx512"]["cpu_flags"]
    else:
        assert not out["avx512"]["available"] and "no AVX-512" in out["avx512"]["reason"]
    assert out["perf"]["available"] and not out["perf"]["hardware_pmu"]
    assert not out["resctrl"]["available"] and "not mounted" in out["resctrl"]["reason"]


def test_kubelet_state_and_policy_are_reported(tmp_path):
    (tmp_path / "kubelet").mkdir()
    (tmp_path / "kubelet" / "cpu_manager_state").write_text(json.dumps({
        "policyName": "static", "defaultCpuSet": "0", "entries": {"uid-1": {"app": "1"}}, "checksum": 1}))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"host": {"kubelet_root": str(tmp_path / "kubelet")},
                                   "agent": {"run_dir": str(tmp_path / "run")}}))
    kubelet = _doctor("--config", str(cfg))["kubelet"]
    assert kubelet["available"] and kubelet["policy"] == "static" and kubelet["exclusive"] == 1


def test_missing_headers_are_a_reason_not_a_crash(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"host": {"headers_search": [str(tmp_path / "none")],
                                            "modules_root": str(tmp_path / "none")},
                                   "agent": {"run_dir": str(tmp_path / "run")}}))
    bpf = _doctor("--config", str(cfg))["bpf"]
    assert not bpf["available"] and "header" in bpf["reason"]


def test_invalid_config_is_shown_with_key_and_value(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("mqtt:\n  port: 99999\n")
    out = _doctor("--config", str(cfg))
    assert not out["config"]["available"]
    assert "mqtt.port" in out["config"]["reason"] and "99999" in out["config"]["reason"]


def test_dump_bpf_prints_each_program_with_its_flags_and_loads_nothing(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"agent": {"run_dir": str(tmp_path / "run")},
                                   "collectors": {"perf": {"mode": "bpf"}, "runqlat": {"max_keys": 512}}}))
    res = run_agent("doctor", "--dump-bpf", "--config", str(cfg))
    assert res.returncode == 0, res.stderr
    for name in ("avx512", "pmu", "runqlat"):
        assert f"===== {name} (collector " in res.stdout
    assert "-DPB_MAX_KEYS=512" in res.stdout and "TRACEPOINT_PROBE(sched, sched_switch)" in res.stdout
    assert not (tmp_path / "run").exists()  # nothing was started: no run directory, no checkpoint


def _status_section(tmp_path, text: str) -> dict:
    from agent.cli.doctor import config_status
    from agent.config import load_config
    from agent.loop import CONFIG_STATUS_FILE

    run = tmp_path / "run"
    run.mkdir()
    (run / CONFIG_STATUS_FILE).write_text(text)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"agent": {"run_dir": str(run)}}))
    return config_status(load_config(str(cfg)), "")


def test_running_agent_rejection_is_read_from_its_status_file(tmp_path):
    pid = os.getpid()  # a live process stands for the running agent
    out = _status_section(tmp_path, json.dumps({"valid": False, "pid": pid, "error": "mqtt.port: 99999"}))
    assert not out["available"] and f"pid {pid}" in out["reason"] and "mqtt.port: 99999" in out["reason"]


def test_a_status_left_by_an_agent_that_is_gone_is_not_the_running_ones(tmp_path):
    dead = _dead_pid()
    out = _status_section(tmp_path, json.dumps({"valid": False, "pid": dead, "error": "mqtt.port: 99999"}))
    assert out["available"] and out["reason"] == "valid" and out["stale_agent_status"]["pid"] == dead


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("text", ["[1, 2]", '"valid"', json.dumps({"valid": False, "pad": "x" * (1 << 16)})])
def test_status_file_that_is_no_agent_status_leaves_the_file_verdict(tmp_path, text):
    # a JSON value that is no object, or a file beyond the bound, is as if there were none
    out = _status_section(tmp_path, text)
    assert out == {"available": True, "reason": "valid"}
