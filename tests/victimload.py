"""Workloads and cgroup weights for the victim-health tests (run-queue latency, real processes).

The machine these tests run on has two CPUs shared with other jobs. So that "alone on a CPU"
means alone, every test cgroup lives under one parent with the largest v1 `cpu.shares` (v2
`cpu.weight` 10000 where that is the cpu hierarchy): outside load then barely delays our tasks,
while inside the parent our containers compete by their own weights. The busy neighbour gets
8x the latency container's weight, as a batch pod requesting 8 CPUs would next to a 1-CPU
service (kubelet sets shares from requests); then the latency container's waits are dominated
by the neighbour, many times above what the rest of the machine adds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from perfbalance.cgroupfs import Cgroupfs
from perfbalance.model import Container

CONTROLLERS = ("cpuset", "cpu", "cpuacct", "memory")

# Short bursts (0.5 ms of work) and sleeps (2 ms): a request-serving thread, about 20% of a CPU.
LATENCY = [sys.executable, "-c",
           "import time\n"
           "while True:\n"
           "    t = time.perf_counter()\n"
           "    while time.perf_counter() - t < 0.0005: pass\n"
           "    time.sleep(0.002)\n"]
BUSY = ["sh", "-c", "while :; do :; done"]


def bounded(argv: Sequence[str], secs: float) -> list[str]:
    """argv killed (SIGKILL) after `secs` seconds of wall time whatever happens to the test."""
    return ["timeout", "-s", "KILL", str(secs), *argv]


class Group:
    """Cgroups under one high-weight parent named after the test helper; close() undoes all."""

    def __init__(self, fs: Cgroupfs, tag: str) -> None:
        self.fs = fs
        self.parent = f"pbtest-victim-{tag}-{os.getpid()}"
        self.procs: list[subprocess.Popen[bytes]] = []
        fs.create(self.parent, CONTROLLERS)
        self.weight(self.parent, 262144)

    def weight(self, rel: str, shares: int) -> None:
        """v1 cpu.shares (else v2 cpu.weight, shares / 1024 * 100 clamped to 1..10000)."""
        if self.fs.has("cpu"):
            self.fs.write(rel, "cpu", "cpu.shares", str(shares))
        else:
            self.fs.write(rel, None, "cpu.weight", str(max(1, min(10000, shares * 100 // 1024))))

    def new(self, name: str, *, shares: int = 1024) -> Container:
        rel = f"{self.parent}/{name}"
        self.fs.create(rel, CONTROLLERS)
        self.weight(rel, shares)
        return Container(id=name, name=name, cgroup=rel)

    def run(self, c: Container, argv: Sequence[str], *, cpus: set[int] | None = None) -> subprocess.Popen[bytes]:
        """Start argv already inside the container's cgroup (it joins before exec)."""
        fs, rel = self.fs, c.cgroup

        def enter() -> None:
            fs.attach(rel, os.getpid())
            if cpus is not None:
                os.sched_setaffinity(0, cpus)

        p = subprocess.Popen(list(argv), preexec_fn=enter, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def stop(self, procs: Sequence[subprocess.Popen[bytes]]) -> None:
        """Kill each process's whole session (timeout(1) leaves its child when killed itself)."""
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)

    def close(self) -> None:
        self.stop(self.procs)
        self.fs.remove(self.parent)
