"""Classes at creation in NRI mode: the real agent against a real containerd 1.7 with NRI and a
block-I/O class config of its own, pods run through CRI as the kubelet runs them, a loop device
as the throttled disk.

The agent's interval is 30 s and every check is made before its first cycle (`state.latest` is
still None), so the cycle cannot be what set a class: what does is either the runtime at
CreateContainer (a class name the operator listed in `runtime.nri_blockio_classes`: the OCI spec
containerd made at CreateContainer, read back through CRI before StartContainer, carries the
class's throttling, and runc writes it into the cgroup when it creates the container at
StartContainer) or the agent at StartContainer (agent/act/early.py). (CRI's CreateContainer makes
no cgroup yet: runc creates the container, and its cgroup, when the kubelet starts it.) Each case has
its control: a container without the annotation is throttled by nobody; with no names listed the
runtime is handed nothing; a name the runtime does not know is not handed over, the container is
created all the same and the agent puts it in the class after start.

The AVX-512 pre-classification annotation, end to end through the agent: a container annotated
AVX-512-heavy is created on the core no latency-sensitive container uses; the control without the
annotation gets the shared pool.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config import load_config
from agent.loop import Agent
from containerd_env import Containerd, missing, new_containerd, running
from rebalancer.admit import AVX_ANNOTATION, LATENCY_ANNOTATION
from test_containerd_plugin import allowed
from tests.node.agentproc import free_port, write_config
from tests.node.containerd import own_cgroup, remove_cgroups

pytestmark = [pytest.mark.root, pytest.mark.slow]

KEY = "blockio.perfbalance.io/class"  # blockio.annotation's default
SLOW_BPS = 1 << 20  # class "slow": write 1 MiB/s, in both perfbalance's and containerd's config
OTHER_IOPS = 77  # class "other": read 77 IOPS, perfbalance's only (containerd does not know it)
INTERVAL = 30.0  # no cycle runs during a test: what is set, the runtime or the start hand-off did


@pytest.fixture(scope="module")
def loop_device() -> Iterator[str]:
    if os.geteuid() != 0:
        pytest.skip("needs root (containerd, runc, cgroups, losetup)")
    if shutil.which("losetup") is None:
        pytest.skip("losetup (util-linux) not installed")
    if not Path("/sys/fs/cgroup/blkio").is_dir():
        pytest.skip("no blkio (v1) hierarchy: the checks read blkio.throttle.* files")
    backing = Path(f"/tmp/pbnri-loop-{os.getpid()}.img")
    with open(backing, "wb") as f:
        f.truncate(64 << 20)
    # containerd's goresctrl takes a device whose minor is not a multiple of 16 for a partition
    # and leaves it out of the class without a word: loop0, loop16, ... only
    dev, why = "", ""
    for n in range(0, 256, 16):
        out = subprocess.run(["losetup", f"/dev/loop{n}", str(backing)], capture_output=True, text=True)
        if out.returncode == 0:
            dev = f"/dev/loop{n}"
            break
        why = out.stderr.strip()
    if not dev:
        backing.unlink()
        pytest.skip(f"cannot attach a loop device with a minor that is a multiple of 16: {why}")
    try:
        yield dev
    finally:
        for _ in range(50):
            if subprocess.run(["losetup", "-d", dev], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        backing.unlink()


@pytest.fixture(scope="module")
def containerd(loop_device: str) -> Iterator[Containerd]:
    """containerd with its own block-I/O class config (goresctrl's format), class "slow" only."""
    why = missing()
    if why:
        pytest.skip(why)
    c = new_containerd("blk")
    (c.dir / "blockio.yaml").write_text(
        f"Classes:\n  slow:\n    - Devices:\n        - {loop_device}\n      ThrottleWriteBps: {SLOW_BPS}\n")
    # containerd 1.7 reads the class config in its tasks service, not in the CRI plugin's table
    c.extra_toml = f'[plugins."io.containerd.service.v1.tasks-service"]\n  blockio_config_file = "{c.dir}/blockio.yaml"\n'
    with running(c):
        yield c


@pytest.fixture
def kube(containerd: Containerd) -> Iterator[Any]:
    """Pods under <top>/kubepods/burstable/pod<uid>, where the agent's discovery finds them."""
    from cri import Kubelet
    top = f"pbnri-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    k = Kubelet(containerd.cri_address, f"{top}/kubepods/burstable")
    try:
        yield k
    finally:
        k.teardown()
        left = remove_cgroups(top)
        assert not left, f"cgroups left behind: {left}"


class Background:
    """agent.loop.Agent running in a thread of its own while the test acts as the kubelet."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.loop = asyncio.new_event_loop()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="agent-under-test", daemon=True)

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self.agent.run())
        except BaseException as e:  # re-raised by stop()
            self.error = e

    def __enter__(self) -> Agent:
        self.thread.start()
        assert wait_for(lambda: self.agent.parts is not None and self.agent.parts.nri.connected
                        and self.agent.parts.classes.ready, 60), "agent not connected to containerd"
        return self.agent

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.agent.request_stop)
        self.thread.join(60)
        assert not self.thread.is_alive(), "the agent did not stop"
        self.loop.close()
        if self.error is not None:
            raise self.error


def agent_for(tmp_path: Path, containerd: Containerd, loop_device: str, *, nri_blockio_classes: list[str],
              interval: float = INTERVAL) -> Agent:
    (tmp_path / "kubelet").mkdir()
    (tmp_path / "run").mkdir()
    cfg = write_config(tmp_path / "config.yaml", run_dir=tmp_path / "run", port=free_port(), extra={
        "agent": {"interval_seconds": interval},
        "host": {"kubelet_root": str(tmp_path / "kubelet")},
        "runtime": {"nri": "on", "nri_socket": containerd.nri_socket, "nri_plugin_index": "30",
                    "nri_backoff_max_seconds": 1.0, "nri_blockio_classes": nri_blockio_classes},
        "blockio": {"mode": "on", "classes": {
            "slow": {"devices": [{"path": loop_device, "write_bps": SLOW_BPS}]},
            "other": {"devices": [{"path": loop_device, "read_iops": OTHER_IOPS}]}}},
    })
    return Agent(load_config(str(cfg), node="node-test"), node="node-test", config_path=str(cfg))


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def majmin(dev: str) -> str:
    st = os.stat(dev)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def throttle(kube: Any, pod_cfg: Any, cid: str, which: str) -> str:
    """blkio.throttle.<which>_device of the container's cgroup (runc makes it at create)."""
    rel = f"{pod_cfg.linux.cgroup_parent}/{cid}"
    return (Path("/sys/fs/cgroup/blkio") / own_cgroup("blkio").strip("/") / rel /
            f"blkio.throttle.{which}_device").read_text()


def spec_blockio(kube: Any, cid: str) -> dict[str, Any]:
    """linux.resources.blockIO of the OCI spec containerd made for the container at creation."""
    from pbgen.cri import api_pb2 as cri
    st = kube.rt.ContainerStatus(cri.ContainerStatusRequest(container_id=cid, verbose=True), timeout=30)
    spec = json.loads(st.info["info"])["runtimeSpec"]
    return spec.get("linux", {}).get("resources", {}).get("blockIO") or {}


def create(kube: Any, name: str, annotations: dict[str, str] | None = None) -> tuple[Any, str]:
    cfg = kube.pod_config(name, annotations=annotations or {})
    pod = kube.run_pod(cfg)
    return cfg, kube.create(pod, cfg, "app")


def no_cycle_yet(agent: Agent) -> None:
    assert agent.state.latest is None, "a cycle ran: the test cannot tell who set the class"


def test_listed_class_is_set_by_the_runtime_at_creation_others_by_the_agent_at_start(
        containerd, kube, loop_device, tmp_path):
    dev = majmin(loop_device)
    agent = agent_for(tmp_path, containerd, loop_device, nri_blockio_classes=["slow"])
    with Background(agent):
        slow_cfg, slow = create(kube, "slow", {KEY: "slow"})
        # created, not started: the runtime made it in its class "slow" (the adjustment carried it)
        major, minor = (int(x) for x in dev.split(":"))
        assert spec_blockio(kube, slow).get("throttleWriteBpsDevice") == \
            [{"major": major, "minor": minor, "rate": SLOW_BPS}], spec_blockio(kube, slow)
        other_cfg, other = create(kube, "other", {KEY: "other"})  # not listed: not handed over,
        assert spec_blockio(kube, other) == {}  # and created all the same
        plain_cfg, plain = create(kube, "plain")  # control: no annotation, no class
        assert spec_blockio(kube, plain) == {}
        no_cycle_yet(agent)
        for cid in (slow, other, plain):
            kube.start(cid)
        assert agent.parts is not None
        # slow and other; plain concerns no class rule (not even a QoS default): not looked up
        assert wait_for(lambda: agent.parts.early.counters["admitted_total"] >= 2, 20), agent.parts.early.counters
        # the agent applied "other" itself right after start; "slow" stays; "plain" has nothing
        assert f"{dev} {OTHER_IOPS}" in throttle(kube, other_cfg, other, "read_iops")
        assert f"{dev} {SLOW_BPS}" in throttle(kube, slow_cfg, slow, "write_bps")
        for which in ("read_bps", "write_bps", "read_iops", "write_iops"):
            assert dev not in throttle(kube, plain_cfg, plain, which), which
        assert agent.parts.classes.manager.class_of("blockio", other) == "other"
        assert agent.parts.classes.manager.class_of("blockio", plain) == ""
        no_cycle_yet(agent)


def test_by_default_the_agent_applies_the_class_right_after_start(containerd, kube, loop_device, tmp_path):
    """Nothing listed: the runtime is handed no class (even one its config has), the agent puts
    the container in its class at StartContainer, long before its next cycle."""
    dev = majmin(loop_device)
    agent = agent_for(tmp_path, containerd, loop_device, nri_blockio_classes=[])
    with Background(agent):
        slow_cfg, slow = create(kube, "slow", {KEY: "slow"})
        assert spec_blockio(kube, slow) == {}  # the runtime was not asked
        plain_cfg, plain = create(kube, "plain")
        kube.start(slow)
        kube.start(plain)
        assert agent.parts is not None
        assert wait_for(lambda: f"{dev} {SLOW_BPS}" in throttle(kube, slow_cfg, slow, "write_bps"), 10)
        assert wait_for(lambda: agent.parts.early.counters["admitted_total"] >= 1, 10)
        assert dev not in throttle(kube, plain_cfg, plain, "write_bps")  # control: no annotation
        no_cycle_yet(agent)


def test_avx512_annotation_places_the_new_container_off_latency_sensitive_cores(
        containerd, kube, loop_device, tmp_path):
    """Placement at creation needs the agent's first snapshot: a short interval here."""
    agent = agent_for(tmp_path, containerd, loop_device, nri_blockio_classes=[], interval=0.5)
    with Background(agent):
        assert wait_for(lambda: agent.state.latest is not None, 30)  # the snapshot placement uses
        assert agent.parts is not None
        lat_cfg, lat = create(kube, "latency", {LATENCY_ANNOTATION: "true"})
        kube.start(lat)
        assert agent.parts.nri.move(lat, "0", "") == ""  # where the planner put it
        assert allowed(kube.pid(lat)) == "0"
        _, avx = create(kube, "crunch", {AVX_ANNOTATION: "true"})
        kube.start(avx)
        _, plain = create(kube, "plain")
        kube.start(plain)
        assert allowed(kube.pid(avx)) == "1"  # the whole core nobody latency-sensitive uses
        assert allowed(kube.pid(plain)) == "0-1"  # control: no annotation, the shared pool
        assert "AVX-512" in agent.parts.nri.policy.decisions[avx], agent.parts.nri.policy.decisions
