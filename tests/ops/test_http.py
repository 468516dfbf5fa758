"""The agent's HTTP endpoint, served for real on 127.0.0.1 with a free port."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import ops_synth as s
import pytest

from agent.export.http import NodeServer, parse_listen, serve_http
from agent.export.report import AgentState
from perfbalance.errors import ConfigError


@pytest.fixture
def clock() -> list[float]:
    return [s.T0 + 75]  # 5 s after the synthetic report's window


@pytest.fixture
def state() -> AgentState:
    return s.state()


@pytest.fixture
def server(state: AgentState, clock: list[float]) -> Iterator[NodeServer]:
    srv = serve_http(state, "127.0.0.1:0", stale_after=30.0, clock=lambda: clock[0])
    try:
        yield srv
    finally:
        srv.stop()


def get(srv: NodeServer, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(srv.url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_metrics_are_served_in_the_text_format(server: NodeServer) -> None:
    code, headers, body = get(server, "/metrics")
    assert code == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert b'perfbalance_container_cpu_seconds_total{container="nginx"' in body


def test_metrics_are_served_as_openmetrics_when_asked(server: NodeServer) -> None:
    code, headers, body = get(server, "/metrics", Accept="application/openmetrics-text; version=1.0.0")
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_metrics_are_gzipped_when_the_scraper_accepts_it(server: NodeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    s.hold_memory(monkeypatch)
    _, _, plain = get(server, "/metrics")
    code, headers, packed = get(server, "/metrics", **{"Accept-Encoding": "gzip"})
    assert code == 200 and headers["Content-Encoding"] == "gzip" and headers["Vary"] == "Accept-Encoding"
    assert gzip.decompress(packed) == plain
    _, headers, _ = get(server, "/metrics", **{"Accept-Encoding": "identity"})  # control
    assert "Content-Encoding" not in headers


def test_healthz_is_ok_while_the_loop_ticks(server: NodeServer) -> None:
    assert get(server, "/healthz")[0] == 200


def test_healthz_fails_when_the_loop_stalls(server: NodeServer, clock: list[float]) -> None:
    clock[0] += 100
    code, _, body = get(server, "/healthz")
    assert code == 503 and b"stalled" in body


def test_healthz_is_ok_during_start_before_any_cycle(clock: list[float]) -> None:
    srv = serve_http(AgentState(node="n"), "127.0.0.1:0", stale_after=30.0, clock=lambda: clock[0])
    try:
        assert get(srv, "/healthz")[0] == 200
        clock[0] += 31
        assert get(srv, "/healthz")[0] == 503
    finally:
        srv.stop()


def test_readyz_waits_for_the_first_cycle(state: AgentState, clock: list[float]) -> None:
    srv = serve_http(AgentState(node="n"), "127.0.0.1:0", clock=lambda: clock[0])
    try:
        assert get(srv, "/readyz")[0] == 503
        srv.state.publish(s.report())
        assert get(srv, "/readyz")[0] == 200
    finally:
        srv.stop()


def test_readyz_fails_while_the_config_is_invalid(server: NodeServer, state: AgentState) -> None:
    state.config_valid, state.config_error = False, "config.yaml: agent.interval_seconds: must be >= 0.1"
    code, _, body = get(server, "/readyz")
    assert code == 503 and b"interval_seconds" in body


def test_api_state_is_the_latest_report_as_json(server: NodeServer) -> None:
    code, headers, body = get(server, "/api/state")
    doc = json.loads(body)
    assert code == 200 and headers["Content-Type"] == "application/json"
    assert doc["report"]["cycle"] == 7 and doc["view"]["decisions"][0]["event_id"] == "ev-1"


def test_node_view_is_served_with_a_strict_content_policy(server: NodeServer) -> None:
    code, headers, body = get(server, "/")
    assert code == 200 and b"<script src=\"app.js\">" in body
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert get(server, "/app.js")[0] == 200 and get(server, "/style.css")[0] == 200


@pytest.mark.parametrize("path", ["/nope", "/../agent/http.py", "/static/../http.py", "/%2e%2e/config.py"])
def test_other_paths_are_not_found(server: NodeServer, path: str) -> None:
    assert get(server, path)[0] == 404


def test_node_view_can_be_switched_off(state: AgentState) -> None:
    srv = serve_http(state, "127.0.0.1:0", node_view=False)
    try:
        assert get(srv, "/")[0] == 404 and get(srv, "/metrics")[0] == 200
    finally:
        srv.stop()


def test_a_busy_port_is_a_config_error_naming_the_address(server: NodeServer, state: AgentState) -> None:
    with pytest.raises(ConfigError, match=f"127.0.0.1:{server.port}"):
        NodeServer(state, listen=f"127.0.0.1:{server.port}").start()


@pytest.mark.parametrize(("text", "want"), [("127.0.0.1:9847", ("127.0.0.1", 9847)), (":9847", ("0.0.0.0", 9847)),
                                            ("[::1]:9", ("::1", 9))])
def test_listen_addresses_parse(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["9847", "host:", "host:99999", "host:http"])
def test_bad_listen_addresses_are_rejected(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_listen(text)


def test_server_starts_from_the_agent_config(state: AgentState) -> None:
    from agent.config import parse_config
    from agent.export.http import serve_from_config, stale_after
    cfg = parse_config("agent: {interval_seconds: 20}\nmetrics: {listen: '127.0.0.1:0', node_view: false}",
                       source="t", node="n")
    srv = serve_from_config(state, cfg)
    assert srv is not None
    try:
        assert srv.stale_after == stale_after(cfg) == 60.0
        assert get(srv, "/")[0] == 404 and get(srv, "/metrics")[0] == 200
    finally:
        srv.stop()
    assert serve_from_config(state, parse_config("metrics: {enabled: false}", source="t", node="n")) is None
