"""The real agent as a child process (`perfbalance run --json`), read one cycle at a time.

Tests act on the node between two cycles (kill a container, rewrite a cpuset, restart the
runtime) and then read the next cycle's JSON line, so "noticed within one cycle" is checked by
cycle number, never by wall-clock time.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
PERFBALANCE = str(REPO / ".venv" / "bin" / "perfbalance")


def free_port(base: int = 21000, span: int = 900) -> int:
    """A free TCP port in this suite's own range (21000-21899), different per test process."""
    start = base + (os.getpid() * 7) % span
    for i in range(span):
        port = base + (start - base + i) % span
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 21000-21899")


def write_config(path: Path, *, run_dir: Path, port: int, bpf: bool = False, globs: list[str] | None = None,
                 extra: dict[str, Any] | None = None) -> Path:
    cfg: dict[str, Any] = {
        "agent": {"run_dir": str(run_dir), "log_format": "text"},
        "discovery": {"kubernetes": True, "globs": globs or []},
        "kubernetes": {"api": "off"},
        "metrics": {"listen": f"127.0.0.1:{port}"},
        "resctrl": {"rdt": "off"},
        "collectors": {"avx512": {"enabled": bpf}, "perf": {"mode": "bpf" if bpf else "off"},
                       "resctrl_monitoring": False},
    }
    for k, v in (extra or {}).items():
        cfg.setdefault(k, {}).update(v)
    path.write_text(yaml.safe_dump(cfg))
    return path


class LiveAgent:
    """`perfbalance run --json --interval I --cycles N --config C` with its JSON lines read on demand."""

    def __init__(self, config: Path, *, cycles: int, interval: float = 1.0, dry_run: bool = False,
                 log: Path | None = None) -> None:
        args = [PERFBALANCE, "run", "--config", str(config), "--json", "--cycles", str(cycles),
                "--interval", str(interval)] + (["--dry-run"] if dry_run else [])
        self.log = log or config.with_suffix(".log")
        self._err = open(self.log, "wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._err,
                                     env={**os.environ, "NODE_NAME": "node-test"})
        self._sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None
        self._sel.register(self.proc.stdout, selectors.EVENT_READ)
        self.reports: list[dict[str, Any]] = []

    @property
    def pid(self) -> int:
        return self.proc.pid

    def next(self, timeout: float = 120.0) -> dict[str, Any]:
        """The next cycle's report (fails with the agent's log when it stops or stalls)."""
        assert self.proc.stdout is not None
        if not self._sel.select(timeout):
            raise AssertionError(f"no cycle within {timeout}s; agent log:\n{self.stderr()}")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"agent exited ({self.proc.wait()}); log:\n{self.stderr()}")
        report = json.loads(line)
        self.reports.append(report)
        return report

    def next_after(self, t: float, timeout: float = 120.0) -> dict[str, Any]:
        """The first cycle that started after unix time `t` (a cycle stamps `time` before it reads
        anything), so a change made at `t` must show in it: "within one cycle"."""
        while True:
            report = self.next(timeout)
            if report["time"] >= t:
                return report

    def stderr(self) -> str:
        self._err.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._err.close()


def containers(report: dict[str, Any], top: str) -> dict[str, dict[str, Any]]:
    """This test's containers in a report, by id."""
    return {c["id"]: c for c in report["containers"] if c["cgroup"].startswith(top + "/")}


def cpus_allowed(pid: int | str, procfs: str = "/proc") -> str:
    for line in Path(f"{procfs}/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")
