"""Helpers for collector tests: real cgroups named pbtest-collectors-<pid>-<n>, processes in them.

Every cgroup is created through perfbalance.cgroupfs in all hierarchies we read (v1 cpu, cpuacct,
cpuset, memory and the v2/unified one) and removed, with its processes killed, at teardown.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfbalance.cgroupfs import Cgroupfs
from perfbalance.model import Container

REPO = Path(__file__).resolve().parents[2]
PYTHON = str(REPO / ".venv" / "bin" / "python")
_seq = itertools.count()

# Bounded workloads (seconds are wall-clock limits, enforced by timeout(1) with SIGKILL).
NUMPY_EXP = [PYTHON, "-c",
             "import numpy as np, time\n"
             "a = np.random.rand(1 << 20)\n"
             "end = time.monotonic() + {secs}\n"
             "while time.monotonic() < end: np.exp(a)\n"]
SH_BUSY = ["sh", "-c", "while :; do :; done"]


def bounded(argv: Sequence[str], secs: float) -> list[str]:
    return ["timeout", "-s", "KILL", str(secs), *[a.replace("{secs}", str(secs)) for a in argv]]


@dataclass
class Cgroups:
    fs: Cgroupfs
    made: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def new(self, tag: str) -> Container:
        rel = f"pbtest-collectors-{os.getpid()}-{next(_seq)}-{tag}"
        self.fs.create(rel, ("cpuset", "cpu", "cpuacct", "memory"))
        self.made.append(rel)
        return Container(id=tag, name=tag, cgroup=rel)

    def run(self, c: Container, argv: Sequence[str], cpu: int | None = None, *,
            pipes: bool = False) -> subprocess.Popen[bytes]:
        """Start argv already inside the cgroup (it moves itself before exec), pinned to `cpu`;
        with `pipes`, its stdin and stdout are pipes to us."""
        fs, rel = self.fs, c.cgroup

        def enter() -> None:
            fs.attach(rel, os.getpid())
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})

        p = subprocess.Popen(list(argv), preexec_fn=enter, stdin=subprocess.PIPE if pipes else None,
                             stdout=subprocess.PIPE if pipes else subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def cpuacct_seconds(self, c: Container) -> float:
        return int(self.fs.read(c.cgroup, "cpuacct", "cpuacct.usage")) / 1e9

    def cleanup(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)
        for rel in self.made:
            for pid in _pids_anywhere(self.fs, rel):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
            self.fs.remove(rel)


def _pids_anywhere(fs: Cgroupfs, rel: str) -> list[int]:
    try:
        return fs.pids(rel)
    except Exception:
        return []

