"""A private containerd (Debian's 1.6) and runc, started from a temp dir, running busybox containers
in Kubernetes cgroupfs-driver paths.

Everything lives under one temp dir (config, root, state, gRPC socket, runc root) and one cgroup
name `<top>` (containing "node"), so that nothing of the machine's is touched and several test
sessions can run side by side. `close()` kills every task, deletes every container, stops
containerd and any shim it left, and removes the cgroups runc created in every hierarchy.

runc resolves a relative `--cgroup` path against the cgroup of the process that starts the
container in each hierarchy (libcontainer/cgroups/fs: paths are joined to the caller's own
cgroup), so containers land in `/<top>/kubepods/...` of the cpuset/cpu hierarchies (where this
session sits at the root) and under this session's own memory cgroup in the memory hierarchy
(which the session's supervisor owns): memory limits are enforced without leaving it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
BUSYBOX = Path("/bin/busybox")
TOOLS = ("containerd", "ctr", "runc", "containerd-shim-runc-v2")


def missing_tools() -> list[str]:
    out = [t for t in TOOLS if shutil.which(t) is None]
    if not BUSYBOX.exists():
        out.append(str(BUSYBOX))
    return out


@dataclass(frozen=True, kw_only=True)
class Pod:
    """One Kubernetes pod's cgroup under the cgroupfs driver: guaranteed pods sit directly under
    kubepods, the others under kubepods/<qos> (kubelet pkg/kubelet/cm/qos_container_manager)."""

    uid: str
    qos: str  # guaranteed | burstable | besteffort

    def cgroup(self, top: str) -> str:
        qos_dir = "" if self.qos == "guaranteed" else f"{self.qos}/"
        return f"{top}/kubepods/{qos_dir}pod{self.uid}"


def own_cgroup(controller: str, proc_self: str = "/proc/self/cgroup") -> str:
    """This process's cgroup in the hierarchy of `controller` ("" for the unified one)."""
    for line in Path(proc_self).read_text().splitlines():
        _, ctls, path = line.split(":", 2)
        if (controller == "" and ctls == "") or controller in ctls.split(","):
            return path.lstrip("/")
    return ""


def rootfs(dest: Path) -> Path:
    """A busybox-static root filesystem: /bin/busybox and its applets as symlinks."""
    bin_ = dest / "bin"
    bin_.mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, bin_ / "busybox")
    for applet in ("sh", "sleep", "cat", "true", "head", "yes", "dd", "tail"):
        (bin_ / applet).symlink_to("busybox")
    for d in ("proc", "sys", "dev", "tmp", "etc"):
        (dest / d).mkdir(exist_ok=True)
    return dest


class Containerd:
    """containerd + runc with a private config; `ns` is the containerd namespace."""

    def __init__(self, base: Path, *, top: str, ns: str = "k8s.io") -> None:
        self.base, self.top, self.ns = base, top, ns
        self.sock = base / "containerd.sock"
        self.runc_root = base / "runc"
        self.rootfs = rootfs(base / "rootfs")
        self.config = base / "config.toml"
        self.config.write_text(
            "version = 2\n"
            f'root = "{base}/root"\nstate = "{base}/state"\n'
            # Only the task/content plugins are needed: no CRI server, no image pulls.
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{self.sock}"\n'
            f'[ttrpc]\n  address = "{self.sock}.ttrpc"\n')
        self.proc: subprocess.Popen[bytes] | None = None
        self.containers: list[str] = []

    # -- the daemon -----------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> None:
        log = open(self.base / "containerd.log", "ab")
        self.proc = subprocess.Popen(["containerd", "--config", str(self.config)], stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"containerd exited with {self.proc.returncode}: {self.log_tail()}")
            if self.sock.exists() and self.ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"containerd did not answer on {self.sock} within {timeout}s: {self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the daemon (its shims and containers live on, as on a real node)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def log_tail(self) -> str:
        p = self.base / "containerd.log"
        return p.read_text(errors="replace")[-2000:] if p.exists() else ""

    def ctr(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(["ctr", "--address", str(self.sock), "--namespace", self.ns, *args],
                             capture_output=True, text=True, timeout=timeout)
        if check and res.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)}: {res.stderr.strip()}")
        return res

    # -- containers -----------------------------------------------------------------------
    def run(self, cid: str, pod: Pod, argv: Sequence[str], *, cpu_shares: int | None = None,
            cpu_quota: int | None = None, memory_limit: int | None = None) -> int:
        """Start a detached container in `pod`'s cgroup; returns its init pid."""
        args = ["run", "--detach", "--null-io", "--env", "PATH=/bin", "--runc-root", str(self.runc_root),
                "--rootfs", "--cgroup", f"{pod.cgroup(self.top)}/{cid}"]
        if cpu_shares is not None:
            args += ["--cpu-shares", str(cpu_shares)]
        if cpu_quota is not None:
            args += ["--cpu-quota", str(cpu_quota), "--cpu-period", "100000"]
        if memory_limit is not None:
            args += ["--memory-limit", str(memory_limit)]
        self.containers.append(cid)
        self.ctr(*args, str(self.rootfs), cid, *argv)
        return self.pid(cid)

    def tasks(self) -> dict[str, tuple[int, str]]:
        """container id -> (pid, status) for every task containerd knows."""
        out = {}
        for line in self.ctr("task", "ls").stdout.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 3:
                out[parts[0]] = (int(parts[1]), parts[2])
        return out

    def pid(self, cid: str) -> int:
        return self.tasks()[cid][0]

    def pids(self, cid: str) -> list[int]:
        """Every process of the container (runc ps reads its cgroup)."""
        res = subprocess.run(["runc", "--root", str(self.runc_root / self.ns), "ps", "--format", "json", cid],
                             capture_output=True, text=True, timeout=30, check=True)
        return sorted(json.loads(res.stdout) or [])

    def update_cpuset(self, cid: str, cpus: str) -> None:
        """What the kubelet's UpdateContainerResources ends in: runc update --cpuset-cpus."""
        subprocess.run(["runc", "--root", str(self.runc_root / self.ns), "update", "--cpuset-cpus", cpus, cid],
                       capture_output=True, text=True, timeout=30, check=True)

    def exec(self, cid: str, exec_id: str, argv: Sequence[str]) -> None:
        self.ctr("task", "exec", "--detach", "--exec-id", exec_id, cid, *argv)

    def remove(self, cid: str) -> None:
        """Kill the task (if any), delete it and the container (runc removes its cgroup)."""
        self.ctr("task", "kill", "--signal", "SIGKILL", cid, check=False)
        for _ in range(50):
            if self.ctr("task", "delete", cid, check=False).returncode == 0 or cid not in self.tasks():
                break
            time.sleep(0.1)
        self.ctr("container", "delete", cid, check=False)
        if cid in self.containers:
            self.containers.remove(cid)

    # -- clean-up -------------------------------------------------------------------------
    def close(self) -> None:
        if self.proc is None and self.sock.exists():
            self.proc = None
        if self.proc is not None and self.proc.poll() is None:
            for cid in list(self.containers):
                try:
                    self.remove(cid)
                except (RuntimeError, subprocess.SubprocessError):
                    pass
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        self._kill_leftovers()
        remove_cgroups(self.top)
        shutil.rmtree(self.base, ignore_errors=True)

    def _kill_leftovers(self) -> None:
        """Shims (and their containers) started for this daemon: found by our socket path on their
        command line, killed by pid."""
        mine = str(self.sock)
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and mine.encode() in cmd:
                try:
                    os.kill(int(d.name), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for cid in self.containers:  # container processes whose shim is gone
            for path in cgroup_dirs(self.top):
                for p in path.rglob("cgroup.procs"):
                    for pid in p.read_text().split():
                        try:
                            os.kill(int(pid), signal.SIGKILL)
                        except (ProcessLookupError, ValueError):
                            pass
            break


def cgroup_dirs(top: str) -> list[Path]:
    """`<hierarchy>/<this session's cgroup>/<top>` in every mounted hierarchy where it exists."""
    out = []
    for h in sorted(CGROUP_ROOT.iterdir()):
        if not h.is_dir():
            continue
        ctl = "" if h.name == "unified" or (h / "cgroup.controllers").exists() else h.name
        if ctl == "systemd":
            ctl = "name=systemd"
        base = h / own_cgroup(ctl) / top
        if base.is_dir():
            out.append(base)
    if (CGROUP_ROOT / "cgroup.controllers").exists() and (CGROUP_ROOT / top).is_dir():  # pure v2 host
        out.append(CGROUP_ROOT / top)
    return out


def remove_cgroups(top: str, timeout: float = 10.0) -> list[str]:
    """rmdir every cgroup under `top`, deepest first; returns what could not be removed."""
    left: list[str] = []
    deadline = time.monotonic() + timeout
    for base in cgroup_dirs(top):
        while True:
            dirs = sorted((p for p in [base, *base.rglob("*")] if p.is_dir()),
                          key=lambda p: len(p.parts), reverse=True)
            busy = []
            for d in dirs:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError:
                    busy.append(str(d))
            if not busy or time.monotonic() > deadline:
                left += busy
                break
            time.sleep(0.2)
    return left
