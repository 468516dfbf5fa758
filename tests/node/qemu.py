"""A real QEMU/KVM process (no disk, vCPUs created but held with -S) in a given cgroup, with a QMP
monitor socket for CPU hot-add; and plain cgroups laid out the way Kata and KubeVirt lay out pods.

QEMU names its threads with `-name <n>,debug-threads=on` (`CPU 0/KVM`, `IO mon_iothread`, the main
loop `qemu-system-x86`): those are the names the agent classifies. `-S` keeps the guest from
running (its vCPU threads exist and block in KVM_RUN's wait), so the VMs cost no CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.node.containerd import CGROUP_ROOT

QEMU = "qemu-system-x86_64"
HIERARCHIES = ("cpuset", "cpu", "cpuacct", "unified")


def missing() -> str:
    if shutil.which(QEMU) is None:
        return f"{QEMU} not installed (scripts/setup.sh test installs qemu-system-x86)"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "no usable /dev/kvm"
    return ""


def make_cgroup(rel: str, cpus: str | None = None) -> None:
    """mkdir `rel` (and its parents) in the cpuset, cpu, cpuacct and unified hierarchies; v1
    cpusets start empty, so each new level copies its parent's CPUs and memory nodes."""
    parts = rel.split("/")
    for h in HIERARCHIES:
        root = CGROUP_ROOT / h
        if not root.is_dir():
            continue
        for i in range(1, len(parts) + 1):
            d = root.joinpath(*parts[:i])
            if d.is_dir():
                continue
            d.mkdir()
            if h == "cpuset":
                for f in ("cpuset.mems", "cpuset.cpus"):
                    (d / f).write_text((d.parent / f).read_text().strip() or "0")
    if cpus is not None:
        set_cpus(rel, cpus)


def set_cpus(rel: str, cpus: str) -> None:
    """What the kubelet's UpdateContainerResources ends in for a container of a VM sandbox."""
    (CGROUP_ROOT / "cpuset" / rel / "cpuset.cpus").write_text(cpus)


def join(rel: str, pid: int) -> None:
    for h in HIERARCHIES:
        procs = CGROUP_ROOT / h / rel / "cgroup.procs"
        if procs.exists():
            procs.write_text(str(pid))


def start_in(rel: str, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    """Start `argv` already inside cgroup `rel` (it joins before exec)."""
    def pre() -> None:
        join(rel, os.getpid())
    return subprocess.Popen(argv, preexec_fn=pre, **kw)  # noqa: PLW1509 (joining a cgroup is fork-safe)


class Qemu:
    def __init__(self, name: str, sock: Path, cgroup: str, *, smp: str = "2") -> None:
        self.name, self.sock = name, sock
        self.proc = start_in(cgroup, [
            QEMU, "-enable-kvm", "-cpu", "qemu64", "-name", f"{name},debug-threads=on", "-smp", smp,
            "-m", "64", "-nodefaults", "-display", "none", "-S", "-no-reboot",
            "-qmp", f"unix:{sock},server=on,wait=off"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._qmp: Any = None
        try:
            self.qmp("qmp_capabilities")
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def threads(self) -> dict[str, int]:
        """thread name -> tid."""
        out = {}
        for t in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                out[(t / "comm").read_text().strip()] = int(t.name)
            except OSError:
                continue
        return out

    def vcpus(self) -> dict[int, int]:
        return {int(n.split()[1].split("/")[0]): tid for n, tid in self.threads().items() if n.endswith("/KVM")}

    def affinity(self, tid: int) -> str:
        cpus = sorted(os.sched_getaffinity(tid))
        return ",".join(map(str, cpus)) if len(cpus) != 2 or cpus[1] - cpus[0] != 1 else f"{cpus[0]}-{cpus[1]}"

    def qmp(self, command: str, **arguments: Any) -> Any:
        if self._qmp is None:
            deadline = time.monotonic() + 30
            s = socket.socket(socket.AF_UNIX)
            while True:  # the socket file appears a little before QEMU listens on it
                try:
                    s.connect(str(self.sock))
                    break
                except (FileNotFoundError, ConnectionRefusedError):
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        s.close()
                        err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                        raise RuntimeError(f"qemu did not start: {err}") from None
                    time.sleep(0.05)
            self._qmp = s.makefile("rw")
            self._qmp.readline()  # greeting
        msg = {"execute": command, **({"arguments": arguments} if arguments else {})}
        self._qmp.write(json.dumps(msg) + "\n")
        self._qmp.flush()
        while True:
            reply = json.loads(self._qmp.readline())
            if "event" in reply:
                continue
            if "error" in reply:
                raise RuntimeError(f"qmp {command}: {reply['error']}")
            return reply["return"]

    def hot_add_vcpu(self) -> None:
        """device_add the first empty CPU slot (props from query-hotpluggable-cpus)."""
        free = [c for c in self.qmp("query-hotpluggable-cpus") if "qom-path" not in c]
        self.qmp("device_add", driver=free[0]["type"], id=f"hot{len(free)}", **free[0]["props"])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        if self._qmp is not None:
            self._qmp.close()
        self.sock.unlink(missing_ok=True)
