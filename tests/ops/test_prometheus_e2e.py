"""A real Prometheus scrapes the agent's /metrics and evaluates the alert rules.

The rules are the shipped ones with every `for:` set to 0s, so that an alert fires within the
test; the expressions are unchanged (their timing is pinned by the promtool unit tests).
A thread plays the agent loop: it publishes a new report every half second and counts the
moves it applied, exactly as agent/loop.py updates AgentState.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ops_synth as s
import pytest
import yaml

from agent.export.http import NodeServer, serve_http
from agent.export.report import AgentState, reason_code
from ops_servers import PROMETHEUS, Prometheus

RULES = Path(__file__).resolve().parents[2] / "deploy" / "alerts" / "perfbalance.rules.yaml"
pytestmark = pytest.mark.skipif(not Path(PROMETHEUS).exists(), reason="prometheus not installed")


class FakeLoop:
    """Publishes a report every `period` seconds with one applied move, counting moves like the loop."""

    def __init__(self, state: AgentState, period: float = 0.5) -> None:
        self.state, self.period = state, period
        self.samples = (s.TRAINER, s.WEB, s.DB)
        self.storm = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        cycle = 8
        while not self._stop.wait(self.period):
            rep = s.report(self.samples, cycle=cycle, with_move=self.storm)
            self.state.publish(rep)
            with self.state.lock:
                for a in rep.applied:
                    self.state.moves_total[(a.kind, reason_code(a.reason))] += 5
            cycle += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def agent() -> Iterator[tuple[NodeServer, FakeLoop]]:
    state = s.state()
    srv = serve_http(state, "127.0.0.1:0")
    loop = FakeLoop(state)
    try:
        yield srv, loop
    finally:
        loop.stop()
        srv.stop()


@pytest.fixture
def prometheus(tmp_path: Path, agent: tuple[NodeServer, FakeLoop]) -> Iterator[Prometheus]:
    doc = yaml.safe_load(RULES.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(doc))
    prom = Prometheus(tmp_path, targets=[f"127.0.0.1:{agent[0].port}"], rules=rules).start()
    try:
        yield prom
    finally:
        prom.stop()


def api(prom: Prometheus, path: str, **params: str) -> Any:
    url = f"{prom.url}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)["data"]


def eventually(check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def firing(prom: Prometheus, name: str) -> list[dict[str, Any]]:
    return [a for a in api(prom, "alerts")["alerts"] if a["labels"]["alertname"] == name and a["state"] == "firing"]


def query(prom: Prometheus, expr: str) -> list[dict[str, Any]]:
    return api(prom, "query", query=expr)["result"]


def test_prometheus_scrapes_the_agent(prometheus: Prometheus) -> None:
    up = eventually(lambda: query(prometheus, 'up{job="perfbalance"} == 1'))
    assert up, "target never came up"
    series = eventually(lambda: query(prometheus, "perfbalance_container_cpu_seconds_total"))
    assert {r["metric"]["container"] for r in series} == {"train", "nginx", "pg"}


def test_rebalance_storm_alert_fires(prometheus: Prometheus, agent: tuple[NodeServer, FakeLoop]) -> None:
    assert eventually(lambda: query(prometheus, "perfbalance_rebalance_moves_total"))
    assert not firing(prometheus, "PerfbalanceRebalanceStorm")
    agent[1].storm = True
    alerts = eventually(lambda: firing(prometheus, "PerfbalanceRebalanceStorm"))
    assert alerts, "storm alert did not fire"
    assert alerts[0]["labels"]["job"] == "perfbalance" and alerts[0]["labels"]["severity"] == "warning"


def test_config_invalid_alert_fires(prometheus: Prometheus, agent: tuple[NodeServer, FakeLoop]) -> None:
    assert eventually(lambda: query(prometheus, 'up{job="perfbalance"} == 1'))
    with agent[0].state.lock:
        agent[0].state.config_valid = False
    assert eventually(lambda: firing(prometheus, "PerfbalanceConfigInvalid"))


def test_departed_container_goes_stale_in_prometheus(prometheus: Prometheus, agent: tuple[NodeServer, FakeLoop]) -> None:
    expr = 'perfbalance_container_cpu_seconds_total{container="nginx"}'
    assert eventually(lambda: query(prometheus, expr))
    agent[1].samples = (s.TRAINER, s.DB)
    assert eventually(lambda: not query(prometheus, expr)), "nginx series still present"
    assert query(prometheus, 'perfbalance_container_cpu_seconds_total{container="pg"}')
