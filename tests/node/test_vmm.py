"""Real QEMU/KVM in pod cgroups laid out as Kata and KubeVirt lay them out, kept in place by the real
agent (`perfbalance run --json`, acting): the checks read the real threads' affinity.

Layouts (cgroupfs driver, under this module's cgroup name):
- Kata, sandbox cgroup: QEMU and the shim in `pod<uid>/kata_<sandbox id>`, the containers' own
  cgroups empty (their work runs on the vCPUs);
- Kata, per-container: QEMU in the pod sandbox container's cgroup `pod<uid>/<sandbox id>` (what
  the runtime makes for every container of the pod, the sandbox included);
- KubeVirt: QEMU beside virt-launcher in the `compute` container's cgroup, which holds only the
  container's CPUs (dedicated ones for a Guaranteed VM): every thread is kept within them.
The shim and virt-launcher are stand-in processes (`sleep`): only their presence matters.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.cli.plan import parse_snapshot_text
from perfbalance.cpuset import CpuSet
from perfbalance.model import Action, Plan, Snapshot
from rebalancer.constraints import sandbox_mask, violations
from rebalancer.vm import plan_vcpus, sandboxes
from tests.node.agentproc import LiveAgent, containers, free_port, write_config
from tests.node.containerd import remove_cgroups
from tests.node.qemu import Qemu, make_cgroup, missing, set_cpus, start_in

pytestmark = [pytest.mark.root, pytest.mark.slow]
_seq = itertools.count()


def cid() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


class Node:
    """This test's cgroups, QEMUs and stand-in processes; `close()` removes all of them."""

    def __init__(self, top: str, tmp: Path) -> None:
        self.top, self.tmp = top, tmp
        self.qemus: list[Qemu] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    def pod(self, qos: str = "burstable") -> tuple[str, str]:
        uid = str(uuid.uuid4())
        qos_dir = "" if qos == "guaranteed" else f"{qos}/"
        return uid, f"{self.top}/kubepods/{qos_dir}pod{uid}"

    def qemu(self, cgroup: str, smp: str = "2") -> Qemu:
        q = Qemu(f"node-{os.getpid()}-{next(_seq)}", self.tmp / f"qmp{next(_seq)}.sock", cgroup, smp=smp)
        self.qemus.append(q)
        return q

    def standin(self, cgroup: str) -> subprocess.Popen[bytes]:
        p = start_in(cgroup, ["sleep", "100000"])
        self.procs.append(p)
        return p

    def close(self) -> list[str]:
        for q in self.qemus:
            q.close()
        for p in self.procs:
            p.kill()
            p.wait(10)
        return remove_cgroups(self.top)


@pytest.fixture
def node(top: str, tmp_path: Path) -> Iterator[Node]:
    if os.geteuid() != 0:
        pytest.skip("needs root")
    why = missing()
    if why:
        pytest.skip(why)
    n = Node(f"{top}-vm{next(_seq)}", tmp_path)
    try:
        yield n
    finally:
        left = n.close()
        assert not left, f"cgroups left behind: {left}"


def agent_for(tmp_path: Path, kubelet: dict | None = None, cycles: int = 6) -> LiveAgent:
    kl = tmp_path / "kubelet"
    kl.mkdir(exist_ok=True)
    if kubelet is not None:
        write_kubelet(kl, kubelet)
    cfg = write_config(tmp_path / "config.yaml", run_dir=tmp_path / "run", port=free_port(),
                       extra={"host": {"kubelet_root": str(kl)}})
    return LiveAgent(cfg, cycles=cycles)


def write_kubelet(kl: Path, state: dict) -> None:
    tmp = kl / "cpu_manager_state.tmp"
    tmp.write_text(json.dumps({"policyName": "static", "checksum": 1, **state}))
    tmp.rename(kl / "cpu_manager_state")


def helpers(q: Qemu) -> dict[str, int]:
    return {f"{n}#{tid}": tid for n, tid in _all_threads(q).items() if "/KVM" not in n}


def _all_threads(q: Qemu) -> dict[str, int]:
    out = {}
    for t in Path(f"/proc/{q.pid}/task").iterdir():
        out[f"{(t / 'comm').read_text().strip()}#{t.name}"] = int(t.name)
    return out


def affinities(q: Qemu, tids) -> set[str]:
    return {q.affinity(t) for t in tids}


def test_kata_sandbox_cgroup_vcpus_get_the_containers_mask(node: Node, tmp_path: Path):
    _, pod = node.pod()
    sandbox = f"{pod}/kata_{uuid.uuid4().hex}"
    a, b = cid(), cid()
    make_cgroup(sandbox)
    make_cgroup(f"{pod}/{a}", "0")
    make_cgroup(f"{pod}/{b}", "0")
    shim = node.standin(sandbox)
    q = node.qemu(sandbox)
    _, other_pod = node.pod()  # control: a pod without a VMM
    c = cid()
    make_cgroup(f"{other_pod}/{c}")
    p = node.standin(f"{other_pod}/{c}")
    os.sched_setaffinity(p.pid, {1})  # what a VMM sync would undo if it wrongly took this pod
    assert set(q.vcpus()) == {0, 1} and affinities(q, q.vcpus().values()) == {"0-1"}  # before: float
    agent = agent_for(tmp_path)
    try:
        seen = containers(agent.next(), node.top)
        assert {a, b} <= set(seen)  # the containers, with empty host cgroups, are found
        assert affinities(q, q.vcpus().values()) == {"0"}  # the OR of the containers' cpusets
        assert affinities(q, helpers(q).values()) == {"0-1"}  # helpers: the shared pool
        assert q.affinity(shim.pid) == "0-1"  # control: the shim is not a VMM thread
        assert q.affinity(p.pid) == "1"  # control: a pod without a VMM is left alone
        set_cpus(f"{pod}/{a}", "1")  # the kubelet updates one container: the mask widens
        agent.next_after(time.time())
        assert affinities(q, q.vcpus().values()) == {"0-1"}
        set_cpus(f"{pod}/{b}", "1")  # and the other: the mask moves to CPU 1
        agent.next_after(time.time())
        assert affinities(q, q.vcpus().values()) == {"1"}
        assert affinities(q, helpers(q).values()) == {"0-1"}
    finally:
        agent.close()


def test_kata_per_container_layout_mask_is_the_workload_containers(node: Node, tmp_path: Path):
    _, pod = node.pod()
    sandbox, a = cid(), cid()
    make_cgroup(f"{pod}/{sandbox}")  # the pod sandbox container: the pod's CPUs (0-1)
    make_cgroup(f"{pod}/{a}", "1")  # the workload: its host cgroup is empty, its work is in the VM
    q = node.qemu(f"{pod}/{sandbox}")
    # Control: the same layout with a host process in the other container (a KubeVirt sidecar):
    # the VMM's container is then a workload and its cpuset counts in the mask.
    _, pod2 = node.pod()
    compute, sidecar = cid(), cid()
    make_cgroup(f"{pod2}/{compute}")
    make_cgroup(f"{pod2}/{sidecar}", "1")
    node.standin(f"{pod2}/{sidecar}")
    q2 = node.qemu(f"{pod2}/{compute}")
    agent = agent_for(tmp_path, cycles=3)
    try:
        r = agent.next()
        assert affinities(q, helpers(q).values()) == {"0-1"}
        assert affinities(q, q.vcpus().values()) == {"1"}  # the sandbox container does not widen it
        assert affinities(q2, q2.vcpus().values()) == {"0-1"}  # control: the VMM's container counts
        assert not [e for e in r["errors"] if "pod" in e], r["errors"]
        snap = parse_snapshot_text(json.dumps(r), source="run --json")  # what the planner sees
        assert planner_mask(snap, a) == {"1"}  # the mask the real vCPUs got, not the pod's 0-1
        assert planner_mask(snap, sidecar) == {"0-1"}  # control
        whole = to_cpu0(snap, sandbox, a)  # the Kata pod moved whole to CPU 0
        assert violations(snap, whole) == []  # its sandbox container runs no vCPU: no NUMA refusal
        refused = violations(snap, to_cpu0(snap, compute, sidecar))  # control: compute runs them
        assert any(compute in v and "vCPUs per host NUMA node" in v for v in refused), refused
        (pinning,) = [p for p in plan_vcpus(snap, actions=whole.actions) if p.vmm_pid == q.pid]
        assert {str(pinning.affinity[t]) for t in q.vcpus().values()} == {"0"}  # what the move applies
    finally:
        agent.close()


def to_cpu0(snap: Snapshot, *members: str) -> Plan:
    return Plan(time=snap.time, actions=tuple(
        Action(kind="cpuset", container=c, frm=str(snap.by_id()[c].container.cpuset), to="0",
               reason="test") for c in members))


def planner_mask(snap: Snapshot, member: str) -> set[str]:
    """The vCPUs' mask the planner counts capacity on for the VM pod of `member`."""
    (sb,) = [sb for sb in sandboxes((s.container for s in snap.containers), overhead_mcpu=0,
                                    vmms=snap.vmms) if member in sb.members]
    return {str(CpuSet(sandbox_mask({s.id: s.container.cpuset.ids for s in snap.containers}, sb)))}


def test_kata_dedicated_cpu_pinned_one_to_one_and_kept_across_a_move(node: Node, tmp_path: Path):
    uid, pod = node.pod("guaranteed")
    sandbox, a, b = f"{pod}/kata_{uuid.uuid4().hex}", cid(), cid()
    make_cgroup(sandbox)
    make_cgroup(f"{pod}/{a}", "1")
    make_cgroup(f"{pod}/{b}", "0")
    q = node.qemu(sandbox)
    kl = tmp_path / "kubelet"
    agent = agent_for(tmp_path, kubelet={"defaultCpuSet": "0", "entries": {uid: {"app": "1"}}})
    try:
        r = agent.next()
        seen = containers(r, node.top)
        assert (seen[a]["exclusive"], seen[b]["exclusive"]) == (True, False)
        assert r["vcpu_map"] == {a: {"1": 1}}  # vCPU 0, the guest's boot CPU, is pinned last
        vcpus = q.vcpus()
        assert q.affinity(vcpus[1]) == "1"  # pinned 1:1
        assert q.affinity(vcpus[0]) == "0"  # the rest of the mask, without the pinned CPU
        assert affinities(q, helpers(q).values()) == {"0"}  # shared pool: never the dedicated CPU
        # The kubelet gives the container CPU 0 instead (and the shared pod CPU 1): the same vCPU
        # follows it, so the guest sees no change.
        write_kubelet(kl, {"defaultCpuSet": "1", "entries": {uid: {"app": "0"}}})
        set_cpus(f"{pod}/{b}", "0-1")
        set_cpus(f"{pod}/{a}", "0")
        set_cpus(f"{pod}/{b}", "1")
        r = agent.next_after(time.time())
        assert r["vcpu_map"] == {a: {"0": 1}}
        assert (q.affinity(vcpus[1]), q.affinity(vcpus[0])) == ("0", "1")
        assert affinities(q, helpers(q).values()) == {"1"}
        assert not [e for e in r["errors"] if "pod" in e], r["errors"]
    finally:
        agent.close()


def test_kubevirt_vmm_in_the_compute_container_is_pinned(node: Node, tmp_path: Path):
    uid, pod = node.pod("guaranteed")
    compute = cid()
    make_cgroup(f"{pod}/{compute}", "1")
    launcher = node.standin(f"{pod}/{compute}")  # virt-launcher
    q = node.qemu(f"{pod}/{compute}")
    agent = agent_for(tmp_path, kubelet={"defaultCpuSet": "0", "entries": {uid: {"compute": "1"}}}, cycles=3)
    try:
        r = agent.next()
        assert containers(r, node.top)[compute]["exclusive"] is True
        assert r["vcpu_map"] == {compute: {"1": 1}}
        assert q.affinity(q.vcpus()[1]) == "1"
        assert q.affinity(launcher.pid) == "1"
    finally:
        agent.close()


def test_kubevirt_threads_kept_within_the_compute_container_without_errors(node: Node, tmp_path: Path):
    """The compute container's cgroup holds only the dedicated CPU 1, so the shared pool (0) is out
    of reach: vCPU 0 and the helpers share CPU 1 with the pinned vCPU 1 (what KubeVirt itself does
    without isolateEmulatorThread), said once, with no error in any cycle. The control, where the
    VMM's cgroup covers the pool and the helpers go there, is the Kata test with a dedicated CPU."""
    uid, pod = node.pod("guaranteed")
    compute = cid()
    make_cgroup(f"{pod}/{compute}", "1")
    q = node.qemu(f"{pod}/{compute}")
    agent = agent_for(tmp_path, kubelet={"defaultCpuSet": "0", "entries": {uid: {"compute": "1"}}}, cycles=3)
    try:
        reports = [agent.next() for _ in range(3)]
        for r in reports:
            assert not [e for e in r["errors"] if uid in e], r["errors"]
            assert r["vcpu_map"] == {compute: {"1": 1}}  # 1:1 pinning stays
        vcpus = q.vcpus()
        assert (q.affinity(vcpus[1]), q.affinity(vcpus[0])) == ("1", "1")
        assert affinities(q, helpers(q).values()) == {"1"}
        (note,) = reports[-1]["vm_sandboxes"][uid]["notes"]
        assert "shared pool 0 lies outside the VMM's cgroup cpuset 1" in note
    finally:
        agent.close()
    assert agent.log.read_text().count("shared pool 0 lies outside") == 1  # said once, not per cycle


def test_hot_added_vcpu_is_picked_up(node: Node, tmp_path: Path):
    _, pod = node.pod()
    sandbox, a = f"{pod}/kata_{uuid.uuid4().hex}", cid()
    make_cgroup(sandbox)
    make_cgroup(f"{pod}/{a}", "1")
    q = node.qemu(sandbox, smp="1,maxcpus=2")
    agent = agent_for(tmp_path)
    try:
        agent.next()
        assert set(q.vcpus()) == {0} and affinities(q, q.vcpus().values()) == {"1"}
        q.hot_add_vcpu()
        deadline = time.monotonic() + 30
        while 1 not in q.vcpus() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(q.vcpus()) == {0, 1}
        agent.next_after(time.time())
        assert affinities(q, q.vcpus().values()) == {"1"}
        assert affinities(q, helpers(q).values()) == {"0-1"}
    finally:
        agent.close()
