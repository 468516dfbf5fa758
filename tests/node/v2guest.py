"""Runs inside a throwaway cgroup-v2-only guest (tests/node/test_cgroup_v2.py boots it with vng)
and prints one JSON line of what it saw: perfbalance's discovery, cpuset actuator and BPF
collectors against real processes on a real cgroup2 hierarchy.

The guest has no systemd as init (`vng --systemd` never runs the script: docs/tested-against.md,
"systemd in the cgroup-v2 guest") and no kubelet, so the systemd-driver layout the kubelet would
make is laid out here by hand with mkdir:
kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_with_underscores>.slice/
cri-containerd-<id>.scope (Guaranteed pods directly under kubepods.slice). Everything above that
(the kernel's cgroup2, cpuset semantics, processes, forks, BPF) is real.

Exit status: 0 when every step ran (the test asserts on the JSON), 1 when a step raised (the
error is in the JSON), or the status given with `--exit N` at once (the control case: the test
must see a failing guest fail).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

ROOT = "/sys/fs/cgroup"
MARK = "V2GUEST-RESULT "
POD_QOS = {"burstable": "kubepods.slice/kubepods-burstable.slice",
           "besteffort": "kubepods.slice/kubepods-besteffort.slice",
           "guaranteed": "kubepods.slice"}
# A container that keeps forking: a new `sleep` every 0.1 s, each a new process of the container.
FORKING = "while :; do sleep 0.1; done"
NUMPY_EXP = "import numpy as np\na = np.random.rand(1 << 16)\nwhile True:\n    np.exp(a)"


def write(path: str, text: str) -> None:
    """One write(2) of `text` (a newline for "": writing nothing would not reach the kernel)."""
    with open(path, "w") as f:
        f.write(text or "\n")


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def cpus_allowed(pid: int) -> str:
    for line in read(f"/proc/{pid}/status").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return ""


def enable(rel: str, controllers: str = "+cpuset +cpu +memory") -> None:
    write(os.path.join(ROOT, rel, "cgroup.subtree_control"), controllers)


def lay_out_pod(qos: str) -> tuple[str, str, str]:
    """mkdir the kubelet's systemd-driver slices for one pod with one container: (uid, id, rel)."""
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    parent = POD_QOS[qos]
    pod = f"kubepods-{qos}-pod{uid.replace('-', '_')}.slice" if qos != "guaranteed" \
        else f"kubepods-pod{uid.replace('-', '_')}.slice"
    rels = [parent.split("/")[0], parent, f"{parent}/{pod}", f"{parent}/{pod}/cri-containerd-{cid}.scope"]
    for rel in dict.fromkeys(rels):
        path = os.path.join(ROOT, rel)
        if not os.path.isdir(path):
            os.mkdir(path)
        if rel != rels[-1]:
            enable(rel)
    return uid, cid, rels[-1]


def start_in(rel: str, argv: list[str]) -> subprocess.Popen[bytes]:
    """Start `argv` already inside `rel`: the shell joins the cgroup, then execs (no early fork
    escapes to the root cgroup)."""
    join = f'echo $$ > {os.path.join(ROOT, rel, "cgroup.procs")} && exec "$@"'
    return subprocess.Popen(["sh", "-c", join, "sh", *argv], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def procs(rel: str) -> list[int]:
    return [int(p) for p in read(os.path.join(ROOT, rel, "cgroup.procs")).split()]


def wait_for(what: str, ok: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:.0f}s")
        time.sleep(0.05)


class Guest:
    def __init__(self) -> None:
        self.out: dict[str, Any] = {"errors": []}
        self.pods: dict[str, dict[str, str]] = {}
        self.procs: list[subprocess.Popen[bytes]] = []

    def step(self, name: str, fn: Callable[[], Any]) -> None:
        try:
            self.out[name] = fn()
        except Exception as e:
            self.out["errors"].append(f"{name}: {type(e).__name__}: {e}\n{traceback.format_exc()}")

    def environment(self) -> dict[str, Any]:
        with open("/proc/self/mounts") as f:
            cgroup_mounts = [ln.split()[:3] for ln in f if ln.split()[2] in ("cgroup", "cgroup2")]
        flags = next((ln.split(":", 1)[1].split() for ln in read("/proc/cpuinfo").splitlines()
                      if ln.startswith("flags")), [])
        return {"kernel": os.uname().release, "cgroup_mounts": cgroup_mounts,
                "controllers": read(f"{ROOT}/cgroup.controllers").split(),
                "online": read("/sys/devices/system/cpu/online"), "avx512f": "avx512f" in flags}

    def lay_out(self) -> dict[str, dict[str, str]]:
        enable("")
        for qos in POD_QOS:
            uid, cid, rel = lay_out_pod(qos)
            self.pods[qos] = {"uid": uid, "id": cid, "cgroup": rel}
        write(os.path.join(ROOT, self.pods["burstable"]["cgroup"], "cpu.weight"), "20")
        argv = {"burstable": ["sh", "-c", FORKING], "besteffort": ["sleep", "100000"],
                "guaranteed": [sys.executable, "-c", NUMPY_EXP]}
        for qos, pod in self.pods.items():
            p = start_in(pod["cgroup"], argv[qos])
            self.procs.append(p)
            pod["pid"] = str(p.pid)
            wait_for(f"pid {p.pid} in {pod['cgroup']}", lambda: p.pid in procs(pod["cgroup"]), 10)
        return self.pods

    def discovery(self) -> list[dict[str, Any]]:
        from agent.discover.containers import discover
        from perfbalance.cgroupfs import Cgroupfs
        from perfbalance.model import KubeletState

        found = discover(Cgroupfs(root=ROOT), kubernetes=True, globs=(), kubelet=KubeletState(),
                         procfs_root="/proc")
        self.containers = found
        return [{"id": c.id, "qos": c.qos, "pod_uid": c.pod_uid, "cgroup": c.cgroup, "runtime": c.runtime,
                 "cpuset": str(c.cpuset), "request_mcpu": c.request_mcpu} for c in found]

    def move(self) -> dict[str, Any]:
        """The actuator moves the forking Burstable container to CPU 1; what the kernel shows."""
        from agent.act.cpuset import CpusetActuator
        from agent.discover.sysfs import read_topology
        from perfbalance.cgroupfs import Cgroupfs
        from perfbalance.cpuset import CpuSet
        from perfbalance.model import KubeletState

        pod = self.pods["burstable"]
        scope, slice_ = pod["cgroup"], pod["cgroup"].rsplit("/", 1)[0]
        c = next(c for c in self.containers if c.id == pod["id"])
        act = CpusetActuator(Cgroupfs(root=ROOT), reserved=CpuSet(), kubelet=KubeletState(),
                             topology=read_topology("/sys", procfs_root="/proc"))
        act.observe(self.containers)
        before = {"cpus": read(f"{ROOT}/{scope}/cpuset.cpus"),
                  "effective": read(f"{ROOT}/{scope}/cpuset.cpus.effective"),
                  "allowed": cpus_allowed(int(pod["pid"]))}
        old = set(procs(scope))
        result = act.apply(c, CpuSet.parse("1"))
        wait_for("a process forked after the move", lambda: bool(set(procs(scope)) - old))
        later = sorted(set(procs(scope)) - old)
        self.actuator, self.moved = act, c
        return {"before": before, "writes": list(result.writes), "changed": result.changed,
                "scope_cpus": read(f"{ROOT}/{scope}/cpuset.cpus"),
                "scope_effective": read(f"{ROOT}/{scope}/cpuset.cpus.effective"),
                "scope_mems": read(f"{ROOT}/{scope}/cpuset.mems"),
                "slice_cpus": read(f"{ROOT}/{slice_}/cpuset.cpus"),
                "slice_effective": read(f"{ROOT}/{slice_}/cpuset.cpus.effective"),
                "allowed_main": cpus_allowed(int(pod["pid"])),
                "allowed_forked_later": {str(p): _allowed_or_gone(p) for p in later}}

    def v2_semantics(self) -> dict[str, Any]:
        """What v2 does where v1 refuses: a parent shrinking under a child (v1: EBUSY) is
        accepted, the child's effective set falls back to the parent's, and the actuator counts
        that as drift; a populated cgroup cannot go back to an empty (inheriting) cpuset.cpus
        (ENOSPC); a CPU that does not exist is refused by the kernel (ERANGE)."""
        pod = self.pods["burstable"]
        scope, slice_ = pod["cgroup"], pod["cgroup"].rsplit("/", 1)[0]
        out: dict[str, Any] = {}
        write(f"{ROOT}/{slice_}/cpuset.cpus", "0")
        out["parent_shrunk"] = {"slice_effective": read(f"{ROOT}/{slice_}/cpuset.cpus.effective"),
                                "scope_cpus": read(f"{ROOT}/{scope}/cpuset.cpus"),
                                "scope_effective": read(f"{ROOT}/{scope}/cpuset.cpus.effective"),
                                "allowed_main": cpus_allowed(int(pod["pid"]))}
        drift = self.actuator.check_drift(self.containers)
        out["drift"] = [{"id": d.container.id, "applied": str(d.applied_cpus), "seen": str(d.seen_cpus)}
                        for d in drift]
        try:  # back to inheriting: refused while tasks are below it (kernel/cgroup/cpuset.c)
            write(f"{ROOT}/{slice_}/cpuset.cpus", "")
            out["parent_emptied"] = "accepted"
        except OSError as e:
            out["parent_emptied"] = errno.errorcode.get(e.errno or 0, str(e.errno))
        write(f"{ROOT}/{slice_}/cpuset.cpus", read("/sys/devices/system/cpu/online"))
        out["parent_restored"] = {"scope_effective": read(f"{ROOT}/{scope}/cpuset.cpus.effective"),
                                  "allowed_main": cpus_allowed(int(pod["pid"])),
                                  "drift": len(self.actuator.check_drift(self.containers))}
        try:
            write(f"{ROOT}/{scope}/cpuset.cpus", "7")
            out["nonexistent_cpu"] = "accepted"
        except OSError as e:
            out["nonexistent_cpu"] = errno.errorcode.get(e.errno or 0, str(e.errno))
        out["after_refusal"] = read(f"{ROOT}/{scope}/cpuset.cpus")
        return out

    def collectors(self) -> dict[str, Any]:
        """avx512, perf and runqlat load with bcc and the 6.1 headers and measure the containers."""
        from agent.cli.doctor import avx512 as doctor_avx512
        from collectors.avx512 import Avx512Collector
        from collectors.config import Avx512Config, PerfConfig, RunqlatConfig
        from collectors.doctor import probe
        from collectors.perf import make_collector
        from collectors.runqlat import RunqlatCollector
        from perfbalance.cgroupfs import Cgroupfs
        from perfbalance.host import HostPaths

        host = HostPaths(run_dir=tempfile.mkdtemp(prefix="pb-v2guest-"))
        cgfs = Cgroupfs(root=ROOT)
        bpf = probe(host, mount_tracefs=True)
        cols = {"avx512": Avx512Collector(config=Avx512Config(), host=host, cgroupfs=cgfs),
                "perf": make_collector(config=PerfConfig(), host=host, cgroupfs=cgfs),
                "runqlat": RunqlatCollector(config=RunqlatConfig(), host=host, cgroupfs=cgfs)}
        out: dict[str, Any] = {"bpf": {"available": bpf["available"], "reason": bpf["reason"],
                                       "cgroup_keys": bpf.get("cgroup_keys")},
                               "doctor_avx512": doctor_avx512(host, bpf)}
        try:
            status = {n: col.start() for n, col in cols.items()}
            for col in cols.values():
                col.collect(self.containers, time.time())
            time.sleep(3.0)
            metrics = {n: col.collect(self.containers, time.time()) for n, col in cols.items()}
        finally:
            for col in cols.values():
                col.close()
        by_qos = {qos: pod["id"] for qos, pod in self.pods.items()}
        for n in cols:
            out[n] = {"up": status[n].up, "reason": status[n].reason, "detail": dict(status[n].detail),
                      "metrics": {qos: dict(metrics[n].get(cid, {})) for qos, cid in by_qos.items()}}
        return out

    def cleanup(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
            p.wait()


def _allowed_or_gone(pid: int) -> str:
    try:
        return cpus_allowed(pid)
    except OSError:
        return "gone"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--exit":
        print(MARK + json.dumps({"control": True}), flush=True)
        return int(argv[1])
    g = Guest()
    g.step("environment", g.environment)
    try:
        g.step("pods", g.lay_out)
        if "pods" in g.out:
            for name in ("discovery", "move", "v2_semantics", "collectors"):
                g.step(name, getattr(g, name))
                if g.out["errors"] and name in ("discovery", "move"):
                    break
    finally:
        g.cleanup()
    print(MARK + json.dumps(g.out), flush=True)
    return 1 if g.out["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
