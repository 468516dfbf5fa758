"""Block-I/O and real-time classes in the running agent, end to end: annotations from the API
server (the HTTPS stand-in of tests/podmeta) onto real pod cgroups with real processes, the
agent's own cycles deciding and applying the classes, `run --json` showing them and the I/O
rates, bad annotations reported once naming pod, key and value while the container keeps its
previous class (across a restart: the class checkpoint).

Each class is checked next to a control pod without the annotation, on the same device or CPU.
"""

from __future__ import annotations

import io
import os
import sys
import time

import pytest

from agentkube import KubeNode, config_text, json_lines

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.config import parse_config
from agent.export.prometheus import make_registry
from agent.loop import Agent
from agent.act.rt import RtController
from perfbalance.cgroupfs import Cgroupfs
from perfbalance.classes import RtSection

pytestmark = [pytest.mark.root, pytest.mark.slow]

LIMIT = 2 << 20  # 2 MiB/s
BLOCKIO = "blockio.perfbalance.io/class"
RT = "rt.perfbalance.io/class"

# Becomes SCHED_FIFO as soon as its group has a real-time budget (before, the kernel refuses:
# EPERM), then spins; pinned to one CPU so its share is a share of that CPU.
FIFO = """
import os, time
os.sched_setaffinity(0, {cpu})
while True:
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        break
    except PermissionError:
        time.sleep(0.05)
while True:
    pass
"""

CLASSES = """
blockio:
  mode: "on"
  classes:
    slow: {{devices: [{{path: {loop}, write_bps: {limit}}}]}}
    ghost: {{devices: [{{path: /dev/pbtest-no-such-disk, write_bps: 1MiB}}]}}
    locked: {{devices: [{{path: {loop}, write_bps: 1MiB}}], allow_annotation: false}}
rt:
  mode: "on"
  classes:
    capped: {{runtime_us: 100000}}
    locked: {{runtime_us: 50000, allow_annotation: false}}
    huge: {{runtime_us: 990000}}
rebalancer: {{enabled: false}}
"""


def writer(dev: str, seek_blocks: int) -> list[str]:
    dd = f"dd if=/dev/zero of={dev} bs=64k count=256 seek={seek_blocks} oflag=direct status=none"
    return ["sh", "-c", f"while {dd}; do :; done"]


def majmin(dev: str) -> str:
    st = os.stat(dev)
    return f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"


def policy(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[38])


def cpu_share(pid: int, seconds: float = 2.0) -> float:
    def used() -> float:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    c0, t0 = used(), time.monotonic()
    time.sleep(seconds)
    return (used() - c0) / (time.monotonic() - t0)


@pytest.fixture
def node(api, tmp_path):
    cgfs = Cgroupfs(root="/sys/fs/cgroup")
    if not (cgfs.has("blkio") or cgfs.has("io")):
        pytest.skip("no blkio (v1) or io (v2) cgroup controller on this machine")
    why = RtController(section=RtSection(), cgroupfs=cgfs).unavailable()
    if why:
        pytest.skip(why)
    k = KubeNode(cgfs, f"pbtest-agentcls-{os.getpid()}", api)
    try:
        yield k
    finally:
        k.close()


async def run_agent(text: str, cycles: int, monkeypatch, api) -> tuple[Agent, list[dict]]:
    for k, v in api.env.items():
        monkeypatch.setenv(k, v)
    out = io.StringIO()
    agent = Agent(parse_config(text, source="t.yaml", node="pbtest-node"), node="pbtest-node",
                  cycles=cycles, json_out=out)
    assert await agent.run() == 0
    return agent, json_lines(out)


def scrape(agent: Agent) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The agent's Prometheus exposition: (sample name, sorted labels) -> value."""
    text = generate_latest(make_registry(agent.state)).decode()
    return {(x.name, tuple(sorted(x.labels.items()))): x.value
            for f in text_string_to_metric_families(text) for x in f.samples}


def errors(lines: list[dict]) -> list[str]:
    return [e for line in lines for e in line["errors"]]


async def test_annotated_pods_get_their_classes_and_bad_annotations_keep_the_previous_one(
        node, loop_device, api, token_file, tmp_path, monkeypatch):
    cgfs, cpu = node.cgfs, os.cpu_count() - 1
    fifo_argv = [sys.executable, "-c", FIFO.format(cpu={cpu})]
    io_pod = node.pod("io", writer(loop_device, 0), annotations={BLOCKIO: "slow"})
    io_ctl = node.pod("io-control", writer(loop_device, 512))
    rt_pod = node.pod("fifo", fifo_argv, annotations={f"{RT}.container.main": "capped"})
    rt_ctl = node.pod("fifo-control", fifo_argv)
    bad = node.pod("bad", ["sleep", "600"], annotations={RT: "huge", BLOCKIO: "ghost"})
    text = config_text(tmp_path, api, token_file, CLASSES.format(loop=loop_device, limit=LIMIT))
    (tmp_path / "run").mkdir()  # `perfbalance run` makes it with its lock

    agent, lines = await run_agent(text, 4, monkeypatch, api)
    assert len(lines) == 4  # the agent ran every cycle
    dev = majmin(loop_device)
    throttle = lambda p: cgfs.read(p.rel, "blkio", "blkio.throttle.write_bps_device")  # noqa: E731
    assert f"{dev} {LIMIT}" in throttle(io_pod)
    assert dev not in throttle(io_ctl)  # control: same device, no annotation, no limit
    rates = {c["id"]: c["metrics"] for c in lines[-1]["containers"]}
    slow, fast = rates[io_pod.cid]["io_write_bytes_per_second"], rates[io_ctl.cid]["io_write_bytes_per_second"]
    assert 0.4 * LIMIT <= slow <= 1.4 * LIMIT, (slow, fast)
    assert fast > 3 * LIMIT, (slow, fast)
    assert rates[io_pod.cid]["io_write_ops_per_second"] > 0

    assert cgfs.read_int(rt_pod.rel, "cpu", "cpu.rt_runtime_us") == 100_000
    assert cgfs.read_int(rt_ctl.rel, "cpu", "cpu.rt_runtime_us") == 0
    assert policy(rt_pod.proc.pid) == 1  # SCHED_FIFO, and capped by its class's budget
    assert cpu_share(rt_pod.proc.pid) < 0.25
    assert policy(rt_ctl.proc.pid) == 0  # control: no class, no budget, never SCHED_FIFO

    classes = lines[-1]["classes"]
    assert classes["containers"][io_pod.cid] == {"blockio": "slow"}
    assert classes["containers"][rt_pod.cid] == {"rt": "capped"}
    assert io_ctl.cid not in classes["containers"] and bad.cid not in classes["containers"]
    assert classes["controllers"]["blockio"]["containers"]["slow"] == 1
    assert classes["controllers"]["rt"]["problems"] == 1
    refused = errors(lines)
    (huge,) = [e for e in refused if "'huge'" in e]  # reported once over four cycles
    assert "pod pbtest/bad container main" in huge and f"annotation {RT}" in huge and "budget cannot be given" in huge
    (ghost,) = [e for e in refused if "'ghost'" in e]
    assert "pod pbtest/bad container main" in ghost and f"annotation {BLOCKIO}" in ghost
    assert "'/dev/pbtest-no-such-disk' does not exist" in ghost
    assert cgfs.read_int(bad.rel, "cpu", "cpu.rt_runtime_us") == 0
    assert (tmp_path / "run" / "classes.json").exists()
    metrics = scrape(agent)
    assert metrics[("perfbalance_class_containers", (("class", "slow"), ("controller", "blockio")))] == 1
    assert metrics[("perfbalance_class_refusals_total", (("controller", "rt"),))] == 1
    assert metrics[("perfbalance_class_problems", (("controller", "blockio"),))] == 1
    info = {dict(k[1])["pod"]: dict(k[1])["class"] for k in metrics if k[0] == "perfbalance_container_class_info"}
    assert info == {"io": "slow", "fifo": "capped"}  # controls and the refused pod: no series
    io_rate = dict(((dict(k[1])["pod"], v) for k, v in metrics.items()
                    if k[0] == "perfbalance_container_io_write_bytes_per_second"))
    assert io_rate["io"] < io_rate["io-control"]

    # A restarted agent takes its classes back from the checkpoint; now the annotations are bad.
    node.annotate("io", {BLOCKIO: "gold"})
    node.annotate("fifo", {f"{RT}.container.main": "locked"})
    agent, lines = await run_agent(text, 2, monkeypatch, api)
    refused = errors(lines)
    (gold,) = [e for e in refused if "'gold'" in e]
    assert f"pod pbtest/io container main: annotation {BLOCKIO}='gold': no configured class 'gold'" in gold
    (locked,) = [e for e in refused if "'locked'" in e]
    assert f"pod pbtest/fifo container main: annotation {RT}.container.main='locked'" in locked
    assert "does not allow annotations" in locked
    assert f"{dev} {LIMIT}" in throttle(io_pod)  # the previous classes stay
    assert cgfs.read_int(rt_pod.rel, "cpu", "cpu.rt_runtime_us") == 100_000
    assert lines[-1]["classes"]["containers"][io_pod.cid] == {"blockio": "slow"}
    assert lines[-1]["classes"]["containers"][rt_pod.cid] == {"rt": "capped"}
    assert len(lines) == 2

