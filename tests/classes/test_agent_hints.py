"""Placement annotations in the running agent, end to end: pods on real cgroups with real
processes, their annotations and labels from the API server (the HTTPS stand-in), the agent's
planner showing in `run --json` what it made of them: an AVX-512 pre-classification (next to an
unannotated control), an anti-affinity pair with its scope (next to a pod the selector does not
match), and a bad expression reported once naming pod, key and value, then ignored."""

from __future__ import annotations

import io
import os

import pytest

from agentkube import KubeNode, config_text, json_lines

from agent.config import parse_config
from agent.loop import Agent
from perfbalance.cgroupfs import Cgroupfs

pytestmark = [pytest.mark.root, pytest.mark.slow]

AVX = "perfbalance.io/avx512"
ANTI = "perfbalance.io/anti-affinity"
IDLE = ["sh", "-c", "while :; do sleep 0.05; done"]


@pytest.fixture
def node(api):
    k = KubeNode(Cgroupfs(root="/sys/fs/cgroup"), f"pbtest-agenthints-{os.getpid()}", api)
    try:
        yield k
    finally:
        k.close()


async def test_avx512_and_anti_affinity_annotations_reach_the_plan(node, api, token_file, tmp_path, monkeypatch):
    avx = node.pod("avx", IDLE, annotations={AVX: "true"})
    plain = node.pod("plain", IDLE)
    anti = node.pod("cache", IDLE, labels={"app": "cache"}, annotations={ANTI: "app=db@core*0.5"})
    db = node.pod("db", IDLE, labels={"app": "db"})
    web = node.pod("web", IDLE, labels={"app": "web"})
    bad = node.pod("bad", IDLE, annotations={f"{ANTI}.container.main": "app=db@rack"})
    (tmp_path / "run").mkdir()
    for k, v in api.env.items():
        monkeypatch.setenv(k, v)
    text = config_text(tmp_path, api, token_file, "rebalancer: {dwell_seconds: 0.0}")
    out = io.StringIO()
    agent = Agent(parse_config(text, source="t.yaml", node="pbtest-node"), node="pbtest-node",
                  cycles=2, json_out=out, dry_run=True)
    assert await agent.run() == 0
    lines = json_lines(out)
    assert len(lines) == 2
    considered = lines[0]["considered"]

    notes = {c["container"]: c for c in considered if c.get("kind") == "avx512_annotation"}
    assert set(notes) == {avx.cid}  # control: the unannotated pod has none
    assert notes[avx.cid]["heavy"] is True  # heavy from the first cycle, before any measurement
    assert notes[avx.cid]["state"] in ("unmeasured", "preclassified")
    assert plain.cid not in notes

    pairs = [(c["container"], c["other"], c["scope"]) for c in considered if c.get("kind") == "anti-affinity"]
    assert pairs == [(anti.cid, db.cid, "core")]  # web (app=web) is not matched; bad's term ignored
    assert web.cid not in {p[1] for p in pairs}
    labels = {c["id"]: c.get("labels", {}) for c in lines[0]["containers"]}
    assert labels[db.cid] == {"app": "db"}

    problems = [e for line in lines for e in line["errors"] if "rack" in e]
    assert problems == [f"pod pbtest/bad container main: annotation {ANTI}.container.main='app=db@rack': "
                        "term 'app=db@rack': scope 'rack' is not one of core, l3, numa; ignored"]
    assert bad.cid not in {p[0] for p in pairs}
