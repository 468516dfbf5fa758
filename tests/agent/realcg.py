"""Real cgroups under a unique prefix and real processes in them, all undone by close()."""

from __future__ import annotations

import os
import signal
import subprocess

from perfbalance.cgroupfs import Cgroupfs

PREFIX = f"pbtest-found-{os.getpid()}"


class RealCgroups:
    """Creates cgroups under PREFIX and processes in them; `close()` undoes everything."""

    def __init__(self, cgfs: Cgroupfs) -> None:
        self.cgfs = cgfs
        self.prefix = PREFIX
        self.procs: list[subprocess.Popen[bytes]] = []

    def rel(self, name: str) -> str:
        return f"{self.prefix}/{name}".rstrip("/")

    def create(self, name: str, controllers: tuple[str, ...] = ("cpuset", "cpu", "cpuacct")) -> str:
        rel = self.rel(name)
        self.cgfs.create(rel, controllers)
        return rel

    def start(self, rel: str, argv: tuple[str, ...] = ("sleep", "300")) -> subprocess.Popen[bytes]:
        """Start a process already inside `rel` (it joins before exec, so no early run elsewhere)."""
        cgfs = self.cgfs

        def join() -> None:
            cgfs.attach(rel, os.getpid())

        p = subprocess.Popen(argv, preexec_fn=join, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen[bytes]) -> None:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)

    def close(self) -> None:
        for p in self.procs:
            self.stop(p)
        self.cgfs.remove(self.prefix)


def cpus_allowed(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")
