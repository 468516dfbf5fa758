"""Fixtures for end-to-end runs of the real agent on real cgroups and BPF."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agent.cli.demo import BUSY, workloads
from perfbalance.cgroupfs import Cgroupfs

REPO = Path(__file__).resolve().parents[2]
PERFBALANCE = str(REPO / ".venv" / "bin" / "perfbalance")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def base() -> str:
    return f"pbtest-e2e-{os.getpid()}"


@pytest.fixture
def cgfs() -> Cgroupfs:
    return Cgroupfs(root="/sys/fs/cgroup")


@pytest.fixture
def write_config(tmp_path: Path, base: str):
    """Write an agent config for the test's cgroups; returns its path."""

    def write(extra: dict | None = None, *, name: str = "config.yaml") -> Path:
        cfg = {
            "agent": {"run_dir": str(tmp_path / "run"), "log_format": "text"},
            "discovery": {"kubernetes": False, "globs": [f"{base}/*"]},
            "metrics": {"listen": f"127.0.0.1:{free_port()}"},
            "rebalancer": {"avx512_license_loss": {_cpu_model(): 0.2}, "dwell_seconds": 0.0, "margin": 0.001},
        }
        for k, v in (extra or {}).items():
            cfg.setdefault(k, {}).update(v)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(cfg))
        return path

    return write


def _cpu_model() -> str:
    from agent.discover.sysfs import parse_cpu_model

    return parse_cpu_model(Path("/proc/cpuinfo").read_text()) or "unknown"


@pytest.fixture
def demo_workloads(cgfs: Cgroupfs, base: str) -> Iterator[list]:
    with workloads(cgfs, BUSY, base=base) as started:
        for w in started:  # past start-up (numpy's import) and into the loop
            wait_cpu_seconds(w.proc.pid, 0.5)
        yield started


def wait_cpu_seconds(pid: int, seconds: float, timeout: float = 30.0) -> None:
    """Wait until `pid` has used `seconds` of CPU (user+system), so its loop is running."""
    import time

    tick = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if (int(fields[11]) + int(fields[12])) / tick >= seconds:
            return
        time.sleep(0.1)
    raise AssertionError(f"workload {pid} did not start running within {timeout}s")


def run_agent(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PERFBALANCE, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "NODE_NAME": "e2e-node"})


def cpus_allowed(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


__all__ = ["run_agent", "cpus_allowed", "free_port", "sys"]
