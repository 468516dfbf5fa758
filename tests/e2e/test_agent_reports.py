"""A real rebalance, seen from outside: MQTT events at a real mosquitto, metrics scraped by a real
Prometheus that evaluates the shipped alert rules, and the node view's JSON.

The agent is the real `perfbalance run` (subprocess) moving real workloads on real cgroups.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import urllib.request
from pathlib import Path

import aiomqtt
import pytest
import yaml

from tests.e2e.conftest import PERFBALANCE, free_port
from tests.ops.ops_servers import Mosquitto, Prometheus

pytestmark = [pytest.mark.root, pytest.mark.bpf, pytest.mark.slow]

RULES = Path(__file__).resolve().parents[2] / "deploy" / "alerts" / "perfbalance.rules.yaml"


def _start_agent(cfg: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([PERFBALANCE, "run", "--config", str(cfg), "--interval", "1", "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"NODE_NAME": "e2e-node", "PATH": "/usr/bin:/bin"})


def _until_moved(proc: subprocess.Popen[str], timeout: float = 60.0) -> list[dict]:
    """Read the agent's JSON lines until a cycle applied moves; returns those applied actions."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"agent exited: {proc.stderr.read() if proc.stderr else ''}")
        applied = [a for a in json.loads(line)["applied"] if a["ok"]]
        if applied:
            return applied
    raise AssertionError("no move within the timeout")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


@pytest.mark.avx512
async def test_real_rebalance_events_reach_mosquitto(demo_workloads, write_config, tmp_path):
    broker = Mosquitto(tmp_path).start()
    cfg = write_config({"mqtt": {"enabled": True, "host": "127.0.0.1", "port": broker.port}})
    received: list[dict] = []
    try:
        async with aiomqtt.Client("127.0.0.1", broker.port) as client:
            await client.subscribe("perfbalance/e2e-node/#", qos=1)
            agent = await asyncio.to_thread(_start_agent, cfg)
            try:
                applied = await asyncio.to_thread(_until_moved, agent)
                want = {a["event_id"] for a in applied}

                async def collect() -> None:
                    async for msg in client.messages:
                        if str(msg.topic).endswith("/events/rebalance"):
                            assert not msg.retain
                            received.append(json.loads(msg.payload))
                            if want <= {e["event_id"] for e in received}:
                                return

                await asyncio.wait_for(collect(), timeout=30)
            finally:
                await asyncio.to_thread(_stop, agent)
    finally:
        broker.stop()
    by_id = {e["event_id"]: e for e in received}
    for a in applied:
        event = by_id[a["event_id"]]
        assert event["from"] == a["from"] and event["to"] == a["to"]
        assert event["reason"] == a["reason"]
        assert event["container"]  # names the container


def _api(prom: Prometheus, path: str, **params: str) -> dict:
    import urllib.parse

    url = f"{prom.url}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)["data"]


@pytest.mark.avx512
def test_real_rebalance_is_scraped_and_fires_the_moved_alert(demo_workloads, write_config, tmp_path):
    port = free_port()
    cfg = write_config({"metrics": {"listen": f"127.0.0.1:{port}"}})
    doc = yaml.safe_load(RULES.read_text())  # the shipped rules, unchanged but for `for:`
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(doc))
    agent = _start_agent(cfg)
    prom = Prometheus(tmp_path, targets=[f"127.0.0.1:{port}"], rules=rules)
    try:
        prom.start()
        _until_moved(agent)
        deadline = time.monotonic() + 60
        firing: list[dict] = []
        while time.monotonic() < deadline and not firing:
            firing = [a for a in _api(prom, "alerts")["alerts"]
                      if a["labels"]["alertname"] == "PerfbalanceContainersMoved" and a["state"] == "firing"]
            time.sleep(0.5)
        assert firing, "PerfbalanceContainersMoved never fired"
        moves = _api(prom, "query", query='sum(perfbalance_rebalance_moves_total{kind="cpuset"})')["result"]
        assert moves and float(moves[0]["value"][1]) >= 2
        info = _api(prom, "query", query="perfbalance_container_info")["result"]
        assert {r["metric"].get("container") for r in info} >= {"avx512", "scalar"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/state", timeout=10) as r:
            state = json.load(r)
        assert state  # the node view's data source answers from the live agent
    finally:
        prom.stop()
        _stop(agent)
