"""RDT as one controller of the class mechanism, in the running agent: pod annotations from the
API server (HTTPS stand-in) put a real process into its RDT class on the kernel-faithful resctrl
emulator (tests/resctrl/emulator; no RDT hardware here) beside an unannotated control, and a bad
annotation after a restart is reported naming pod, key and value while the container keeps its
class (before the mechanism, RDT fell back to the QoS default)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from agentkube import KubeNode, config_text, json_lines

from agent.config import parse_config
from agent.loop import Agent
from perfbalance.cgroupfs import Cgroupfs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "resctrl"))
from rchelpers import emulated_parts, full_emulator  # noqa: E402

pytestmark = [pytest.mark.root, pytest.mark.slow]

KEY = "rdt.perfbalance.io/class"
RDT = """
resctrl:
  rdt: "on"
  classes:
    gold: {l3: "60%", mb: "100%"}
    bulk: {l3: "20%", mb: "40%"}
    locked: {l3: "10%", allow_annotation: false}
rebalancer: {enabled: false}
"""


@pytest.fixture
def emu(tmp_path):
    with full_emulator(tmp_path / "emu") as e:
        yield e


@pytest.fixture
def node(api):
    k = KubeNode(Cgroupfs(root="/sys/fs/cgroup"), f"pbtest-agentrdt-{os.getpid()}", api)
    try:
        yield k
    finally:
        k.close()


async def test_rdt_classes_from_annotations_and_a_bad_one_keeps_the_class(emu, node, api, token_file, tmp_path,
                                                                        monkeypatch):
    gold = node.pod("gold", ["sleep", "600"], annotations={KEY: "gold"})
    plain = node.pod("plain", ["sleep", "600"])
    (tmp_path / "run").mkdir()
    for k, v in api.env.items():
        monkeypatch.setenv(k, v)
    text = config_text(tmp_path, api, token_file, RDT)
    mount = Path(emu.mount)

    def tasks(cls: str) -> set[int]:
        return {int(t) for t in (mount / f"perfbalance.{cls}" / "tasks").read_text().split()}

    async def run(cycles: int) -> list[dict]:
        out = io.StringIO()
        agent = Agent(parse_config(text, source="t.yaml", node="pbtest-node"), node="pbtest-node", cycles=cycles,
                      json_out=out, parts_factory=emulated_parts(emu))
        assert await agent.run() == 0
        return json_lines(out)

    lines = await run(2)
    assert gold.proc.pid in tasks("gold")
    assert plain.proc.pid not in tasks("gold") | tasks("bulk") | tasks("locked")  # control: no annotation
    assert lines[-1]["classes"]["containers"][gold.cid] == {"rdt": "gold"}
    assert plain.cid not in lines[-1]["classes"]["containers"]
    rdt = {c["id"]: c["rdt_class"] for c in lines[-1]["containers"]}
    assert rdt[gold.cid] == "gold" and rdt[plain.cid] == ""
    assert lines[-1]["classes"]["controllers"]["rdt"]["used"] is True

    node.annotate("gold", {KEY: "locked"})
    node.annotate("plain", {f"{KEY}.container.main": "platinum"})
    lines = await run(2)
    errors = [e for line in lines for e in line["errors"]]
    assert [e for e in errors if "'locked'" in e] == [
        f"rdt: pod pbtest/gold container main: annotation {KEY}='locked': class 'locked' does not allow annotations"]
    (unknown,) = [e for e in errors if "'platinum'" in e]
    assert f"pod pbtest/plain container main: annotation {KEY}.container.main='platinum': no configured class" in unknown
    assert gold.proc.pid in tasks("gold") and gold.proc.pid not in tasks("locked")  # keeps its class
    assert plain.proc.pid not in tasks("gold") | tasks("bulk") | tasks("locked")
    assert lines[-1]["classes"]["containers"][gold.cid] == {"rdt": "gold"}
