"""Real containers: containerd 1.6 + runc running busybox in Kubernetes cgroupfs-driver pod cgroups,
seen and acted on by the real agent (`perfbalance run --json` as a child process).

Each test has its control beside it: an idle container next to a busy one, a container that
keeps running next to the one that exits, a process outside the container next to the ones in it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.node.agentproc import LiveAgent, containers, free_port, write_config
from tests.node.containerd import Containerd, Pod, cgroup_dirs
from tests.reliability.churn import hash_map_keys, scrape, series_with

pytestmark = [pytest.mark.root, pytest.mark.slow]

BUSY = ("/bin/sh", "-c", "while :; do :; done")
IDLE = ("/bin/sleep", "100000")
# Exits with status 3 when /tmp/<name> appears in the (shared, host-side) rootfs.
EXIT_ON = "while [ ! -e /tmp/{0} ]; do sleep 0.1; done; exit 3"
# Doubles a shell string once /tmp/<name> appears, until the memory limit's OOM killer ends it.
LEAK_ON = "while [ ! -e /tmp/{0} ]; do sleep 0.1; done; a=0123456789abcdef; while :; do a=$a$a; done"


def cid() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


def pod(qos: str) -> Pod:
    return Pod(uid=str(uuid.uuid4()), qos=qos)


@pytest.fixture
def agent_config(tmp_path: Path, top: str):
    def make(**kw) -> Path:
        return write_config(tmp_path / "config.yaml", run_dir=tmp_path / "run", port=free_port(), **kw)
    return make


@pytest.fixture
def started(containerd: Containerd) -> Iterator[list[str]]:
    """Container ids a test started; removed afterwards (the module keeps containerd running)."""
    ids: list[str] = []
    yield ids
    for c in ids:
        containerd.remove(c)


def _wait_status(ctd: Containerd, c: str, status: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ctd.tasks().get(c, (0, ""))[1] == status:
            return
        time.sleep(0.1)
    raise AssertionError(f"task {c} not {status} within {timeout}s: {ctd.tasks().get(c)}")


def test_discovery_names_real_ids_qos_and_requests(containerd, started, agent_config, top):
    be, bu, gu = cid(), cid(), cid()
    pods = {be: pod("besteffort"), bu: pod("burstable"), gu: pod("guaranteed")}
    containerd.run(be, pods[be], IDLE, cpu_shares=2)
    containerd.run(bu, pods[bu], IDLE, cpu_shares=512)  # the kubelet: shares = request * 1024
    containerd.run(gu, pods[gu], IDLE, cpu_shares=256, cpu_quota=25000)  # 250m request = limit
    started += [be, bu, gu]
    agent = LiveAgent(agent_config(), cycles=1, dry_run=True)
    try:
        seen = containers(agent.next(), top)
    finally:
        agent.close()
    assert set(seen) == {be, bu, gu}  # the runtime's own ids, nothing else of ours
    for c, p in pods.items():
        assert (seen[c]["qos"], seen[c]["pod_uid"], seen[c]["runtime"]) == (p.qos, p.uid, "containerd")
        assert seen[c]["cgroup"] == f"{p.cgroup(top)}/{c}"
    assert (seen[bu]["request_mcpu"], seen[bu]["limit_mcpu"]) == (500, None)
    assert (seen[gu]["request_mcpu"], seen[gu]["limit_mcpu"]) == (250, 250)
    assert seen[be]["request_mcpu"] == 0
    # control: a deleted container is not reported by the next agent
    containerd.remove(bu)
    started.remove(bu)
    agent = LiveAgent(agent_config(), cycles=1, dry_run=True)
    try:
        assert set(containers(agent.next(), top)) == {be, gu}
    finally:
        agent.close()


def test_cpu_usage_comes_from_the_containers_processes(containerd, started, agent_config, top):
    busy, idle = cid(), cid()
    containerd.run(busy, pod("burstable"), BUSY, cpu_shares=102, cpu_quota=30000)  # at most 0.3 CPU
    containerd.run(idle, pod("burstable"), IDLE, cpu_shares=102)
    started += [busy, idle]
    agent = LiveAgent(agent_config(), cycles=3, dry_run=True)
    try:
        for _ in range(3):
            report = agent.next()
    finally:
        agent.close()
    seen = containers(report, top)
    assert 0.1 < seen[busy]["metrics"]["cpu_usage_cores"] <= 0.36  # its quota bounds it
    assert seen[idle]["metrics"]["cpu_usage_cores"] < 0.02  # control


def test_avx512_signal_from_a_container_process(containerd, started, agent_config, top):
    if "avx512f" not in Path("/proc/cpuinfo").read_text():
        pytest.skip("this CPU has no AVX-512 (no avx512f in /proc/cpuinfo): no 512-bit state to see")
    pytest.skip("busybox has no AVX-512 code; an AVX-512 workload needs a rootfs with numpy")


def test_exited_and_oom_killed_containers_are_released_within_one_cycle(containerd, started, agent_config, top):
    exits, oom, stays = cid(), cid(), cid()
    containerd.run(exits, pod("burstable"), ("/bin/sh", "-c", EXIT_ON.format(exits)), cpu_shares=102)
    containerd.run(oom, pod("burstable"), ("/bin/sh", "-c", LEAK_ON.format(oom)), cpu_shares=102,
                   memory_limit=32 << 20)
    containerd.run(stays, pod("burstable"), BUSY, cpu_shares=102, cpu_quota=10000)  # control
    started += [exits, oom, stays]
    cg = {c: _v2_id(top, c) for c in (exits, oom, stays)}
    rel = {c: _rel_in_top(top, c) for c in (exits, oom)}
    cfg = agent_config(bpf=True)
    agent = LiveAgent(cfg, cycles=8)
    port = int(_listen(cfg).rsplit(":", 1)[1])
    try:
        agent.next()
        first = agent.next()
        assert {exits, oom, stays} <= set(containers(first, top))
        metrics = scrape(f"http://127.0.0.1:{port}/metrics")
        assert all(series_with(metrics, c) > 0 for c in (exits, oom, stays))
        # both die; the runtime deletes their tasks as the CRI plugin does on a task exit
        for c in (exits, oom):
            (containerd.rootfs / "tmp" / c).touch()
        for c in (exits, oom):
            _wait_status(containerd, c, "STOPPED")
        codes = {c: _exit_status(containerd, c) for c in (exits, oom)}  # deletes the task
        after = agent.next_after(time.time())
        seen = containers(after, top)
        assert exits not in seen and oom not in seen and stays in seen
        assert not [e for e in after["errors"] if exits in e or oom in e]
        metrics = scrape(f"http://127.0.0.1:{port}/metrics")
        assert series_with(metrics, exits) == 0 and series_with(metrics, oom) == 0
        assert series_with(metrics, stays) > 0
        keys = set().union(*hash_map_keys(agent.pid).values())
        assert cg[exits] not in keys and cg[oom] not in keys
        assert cg[stays] in keys  # control: a running container keeps its key
        for c in (exits, oom):  # nothing re-created the dead cgroups
            assert not any((d / rel[c]).exists() for d in cgroup_dirs(top))
    finally:
        agent.close()
    assert codes[exits] == 3
    assert codes[oom] == 137  # SIGKILL from the OOM killer


def test_runtime_restart_loses_nothing(containerd, started, agent_config, top):
    a, b = cid(), cid()
    containerd.run(a, pod("besteffort"), IDLE)
    containerd.run(b, pod("guaranteed"), IDLE, cpu_shares=512, cpu_quota=50000)
    started += [a, b]
    pids = {c: containerd.pids(c) for c in (a, b)}
    agent = LiveAgent(agent_config(), cycles=6, dry_run=True)
    try:
        before = containers(agent.next(), top)
        containerd.kill()
        during = containers(agent.next_after(time.time()), top)
        containerd.start()
        after = containers(agent.next_after(time.time()), top)
    finally:
        agent.close()
    assert set(before) == set(during) == set(after) == {a, b}
    for c in (a, b):
        assert during[c]["qos"] == after[c]["qos"] == before[c]["qos"]
    assert {c: containerd.pids(c) for c in (a, b)} == pids  # the same processes, still managed
    assert {c: st for c, (_, st) in containerd.tasks().items() if c in (a, b)} == {a: "RUNNING", b: "RUNNING"}


# -- helpers ----------------------------------------------------------------------------------

def _listen(cfg: Path) -> str:
    import yaml
    return yaml.safe_load(cfg.read_text())["metrics"]["listen"]


def _rel_in_top(top: str, c: str) -> str:
    for d in cgroup_dirs(top):
        for p in d.rglob(c):
            return str(p.relative_to(d))
    raise AssertionError(f"no cgroup for {c}")


def _v2_id(top: str, c: str) -> int:
    """The container's v2 cgroup id (its directory's inode): what the BPF maps are keyed by."""
    for d in cgroup_dirs(top):
        if (d.parent / "cgroup.controllers").exists() or d.parts[3] == "unified":
            for p in d.rglob(c):
                return os.stat(p).st_ino
    raise AssertionError(f"no v2 cgroup for {c}")


def _exit_status(ctd: Containerd, c: str) -> int:
    """The task's exit status as containerd recorded it (ctr task delete prints it too)."""
    res = ctd.ctr("task", "ls")
    assert c in res.stdout
    out = ctd.ctr("task", "delete", c, check=False)
    # ctr prints "WARN... exit with non-zero exit code N" on stderr when it is not 0.
    for word in reversed(out.stderr.replace('"', " ").split()):
        if word.isdigit():
            return int(word)
    return 0
